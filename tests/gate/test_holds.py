"""Pure hold decisions: the completion rule, the reasons, and two invariants as properties."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from bootstrap.gate import holds

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
WINDOW = timedelta(seconds=30)
GOOD = holds.AttestationView(False, NOW - timedelta(minutes=5), NOW + timedelta(hours=1))


def cr(
    name: str = "drivers", *, interrupt: bool = False, selector: dict[str, Any] | None = None
) -> holds.PackageCr:
    pkg: dict[str, Any] = {"version": "1.2.3", "image": "ghcr.io/nvidia/skyhook/agentless"}
    if interrupt:
        pkg["interrupt"] = {"type": "reboot"}
    return holds.parse_cr(
        {
            "apiVersion": "skyhook.nvidia.com/v1alpha1",
            "kind": "Skyhook",
            "metadata": {"name": name},
            "spec": {"nodeSelectors": selector or {}, "packages": {"dexter": pkg}},
        }
    )


def node(
    stage: str | None = None, state: str | None = None, prefix: str = "skyhook.nvidia.com"
) -> dict[str, Any]:
    annotations = {}
    if stage is not None:
        entry = {"name": "dexter", "version": "1.2.3", "image": "x", "stage": stage, "state": state}
        annotations[f"{prefix}/nodeState_drivers"] = json.dumps({"dexter|1.2.3": entry})
    return {"metadata": {"name": "n1", "labels": {"pool": "gpu"}, "annotations": annotations}}


def decide(
    n: dict[str, Any], crs: list[holds.PackageCr], att: holds.AttestationView | None = GOOD, **kw: Any
) -> holds.Decision:
    args: dict[str, Any] = {"stability_window": WINDOW, "attestation_lifetime": None, "complete_since": None}
    args.update(kw)
    return holds.decide(node=n, attestation=att, crs=crs, now=NOW, **args)


def test_reasons_in_order() -> None:
    revoked = holds.AttestationView(True, GOOD.attested_at, GOOD.expires_at)
    assert decide(node("config", "complete"), [cr()], revoked).reason == "quarantined"
    assert decide(node("config", "complete"), [cr()], None).reason == "unattested"
    assert decide(node("apply", "erroring"), [cr()]).reason == "validation-failed"
    assert decide(node("apply", "in_progress"), [cr()]).reason == "packages-pending"
    held = decide(node("config", "complete"), [cr()])  # complete, but the window starts now
    assert held.reason == "packages-pending"
    assert held.requeue_at == NOW + WINDOW
    released = decide(node("config", "complete"), [cr()], complete_since=NOW - WINDOW)
    assert (released.reason, released.phase) == (None, "Ready")


def test_without_a_node_the_phase_is_attested_or_says_why_not() -> None:
    def without(att: holds.AttestationView | None) -> holds.Decision:
        return holds.decide_without_node(attestation=att, now=NOW, attestation_lifetime=None)

    ok = without(GOOD)
    assert (ok.phase, ok.reason, ok.packages) == ("Attested", None, ())
    assert "no Node object" in ok.message
    assert ok.requeue_at == GOOD.expires_at  # the phase changes by time alone at expiry
    revoked = without(holds.AttestationView(True, GOOD.attested_at, GOOD.expires_at))
    assert (revoked.phase, revoked.reason) == ("Quarantined", "quarantined")
    assert (without(holds.AttestationView(False, None, None)).phase) == "Held"


def test_interrupt_needs_post_interrupt_and_new_prefix_wins() -> None:
    assert decide(node("config", "complete"), [cr(interrupt=True)], complete_since=NOW - WINDOW).reason
    done = node("post-interrupt", "complete", prefix="nodewright.nvidia.com")
    done["metadata"]["annotations"]["skyhook.nvidia.com/nodeState_drivers"] = "{not json"
    assert decide(done, [cr(interrupt=True)], complete_since=NOW - WINDOW).reason is None


def test_selector_and_lifetime() -> None:
    other_pool = cr(selector={"matchLabels": {"pool": "cpu"}})
    assert decide(node(), [other_pool], complete_since=NOW - WINDOW).reason is None
    unknown_op = cr(selector={"matchExpressions": [{"key": "pool", "operator": "Near"}]})
    assert decide(node(), [unknown_op]).reason == "packages-pending"  # unreadable selector: held
    old = decide(node("config", "complete"), [cr()], attestation_lifetime=timedelta(minutes=1))
    assert old.reason == "quarantined"


taint = st.fixed_dictionaries(
    {
        "key": st.sampled_from(["nodegate.io/hold", "a", "b", "node.kubernetes.io/not-ready"]),
        "value": st.text(max_size=5),
    },
    optional={"effect": st.sampled_from(["NoSchedule", "NoExecute"])},
)


@given(taints=st.lists(taint, max_size=6), reason=st.sampled_from([None, *holds.HOLD_REASONS]))
def test_apply_decision_never_touches_other_taints(
    taints: list[dict[str, Any]], reason: holds.Reason | None
) -> None:
    key = "nodegate.io/hold"
    out = holds.apply_decision(taints, key=key, reason=reason, effect="NoSchedule")
    result = taints if out is None else out
    assert [t for t in result if t["key"] != key] == [t for t in taints if t["key"] != key]
    mine = [t for t in result if t["key"] == key]
    if reason is None:
        assert mine == []
    else:
        assert mine == [{"key": key, "value": reason, "effect": "NoSchedule"}]


stages = st.sampled_from([None, "apply", "config", "interrupt", "post-interrupt", "uninstall"])
states = st.sampled_from([None, "complete", "in_progress", "erroring", "unknown"])


@given(
    stage=stages,
    state=states,
    interrupt=st.booleans(),
    revoked=st.booleans(),
    attested=st.booleans(),
    since=st.sampled_from([None, NOW, NOW - WINDOW]),
)
def test_never_releases_an_unattested_or_incomplete_node(
    stage: str | None,
    state: str | None,
    interrupt: bool,
    revoked: bool,
    attested: bool,
    since: datetime | None,
) -> None:
    att = holds.AttestationView(revoked, GOOD.attested_at, GOOD.expires_at) if attested else None
    d = decide(node(stage, state), [cr(interrupt=interrupt)], att, complete_since=since)
    if d.reason is None:
        assert att is not None
        assert not att.revoked
        assert state == "complete"
        assert stage == ("post-interrupt" if interrupt else "config")
        assert since is not None
        assert since + WINDOW <= NOW
