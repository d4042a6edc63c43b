"""Pure hold decisions: the completion rule on the operator's own report, the cross-check with the
node's annotation, blocked nodes, boot ids, the reasons, and the invariants as properties.

The objects are shaped as upstream writes them (NVIDIA/nodewright 71ca22b8):
``operator/internal/wrapper/node.go`` SetState/SetStatus (the annotation, then status.nodeState and
status.nodeStatus of the CR), ``k8s-tests/chainsaw/skyhook/simple-skyhook/assert.yaml`` (an entry),
``k8s-tests/chainsaw/skyhook/taint-scheduling/assert.yaml`` (status.nodeStatus blocked and condition
TaintNotTolerable), ``operator/internal/controller/cluster_state_v2.go`` (CheckTaintToleration,
CheckNodeIgnoreLabel)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bootstrap.gate import holds, nodewright

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
WINDOW = timedelta(seconds=30)
BOOT_A, BOOT_B = "0f8e5a7c-3c1b-4d2e-9a6f-2b7c1d0e4f5a", "6a1d2c3b-4e5f-4a7b-8c9d-0e1f2a3b4c5d"
GOOD = holds.AttestationView(False, NOW - timedelta(minutes=5), NOW + timedelta(hours=1))
KEY = "nodegate.io/hold"
HOLD_TOLERATIONS = [
    {"key": KEY, "operator": "Equal", "value": v, "effect": "NoSchedule"}
    for v in ("packages-pending", "validation-failed")
]


def entry(stage: str, state: str, version: str = "1.2.3") -> dict[str, Any]:
    return {"name": "dexter", "version": version, "image": "ghcr.io/nvidia/skyhook/agentless",
            "stage": stage, "state": state}  # fmt: skip


def cr(
    name: str = "drivers",
    *,
    interrupt: bool = False,
    selector: dict[str, Any] | None = None,
    reported: dict[str, Any] | None = None,
    node_status: str | None = None,
    tolerations: list[dict[str, Any]] | None = None,
    conditions: list[dict[str, Any]] | None = None,
    group: str = "skyhook.nvidia.com",
) -> holds.PackageCr:
    """A CR whose status reports node n1: ``reported`` is status.nodeState["n1"] (None: absent)."""
    pkg: dict[str, Any] = {"version": "1.2.3", "image": "ghcr.io/nvidia/skyhook/agentless"}
    if interrupt:
        pkg["interrupt"] = {"type": "reboot"}
    status: dict[str, Any] = {}
    if reported is not None:
        status["nodeState"] = {"n1": reported, "n2": {}}
    if node_status is not None:
        status["nodeStatus"] = {"n1": node_status}
    if conditions is not None:
        status["conditions"] = conditions
    return holds.parse_cr(
        {
            "apiVersion": f"{group}/v1alpha1",
            "kind": holds.GROUPS[group],
            "metadata": {"name": name},
            "spec": {
                "nodeSelectors": selector or {},
                "additionalTolerations": HOLD_TOLERATIONS if tolerations is None else tolerations,
                "packages": {"dexter": pkg},
            },
            "status": status,
        }
    )


def done_cr(**kw: Any) -> holds.PackageCr:
    stage = "post-interrupt" if kw.get("interrupt") else "config"
    return cr(reported={"dexter|1.2.3": entry(stage, "complete")}, node_status="complete", **kw)


def node(
    stage: str | None = None,
    state: str | None = None,
    prefix: str = "skyhook.nvidia.com",
    *,
    boot: str | None = None,
    taints: list[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    annotations = {}
    if stage is not None and state is not None:
        annotations[f"{prefix}/nodeState_drivers"] = json.dumps({"dexter|1.2.3": entry(stage, state)})
    out: dict[str, Any] = {
        "metadata": {"name": "n1", "labels": {"pool": "gpu", **(labels or {})}, "annotations": annotations},
        "spec": {"taints": taints or []},
    }
    if boot is not None:
        out["status"] = {"nodeInfo": {"bootID": boot}}
    return out


def decide(
    n: dict[str, Any], crs: list[holds.PackageCr], att: holds.AttestationView | None = GOOD, **kw: Any
) -> holds.Decision:
    args: dict[str, Any] = {"stability_window": WINDOW, "attestation_lifetime": None, "complete_since": None}
    args.update(kw)
    return holds.decide(node=n, attestation=att, crs=crs, now=NOW, **args)


def with_boot(boot: str | None, att: holds.AttestationView = GOOD) -> holds.AttestationView:
    return holds.AttestationView(att.revoked, att.attested_at, att.expires_at, boot, 3)


def test_reasons_in_order() -> None:
    revoked = holds.AttestationView(True, GOOD.attested_at, GOOD.expires_at)
    assert decide(node("config", "complete"), [done_cr()], revoked).reason == "quarantined"
    assert decide(node("config", "complete"), [done_cr()], None).reason == "unattested"
    failing = cr(reported={"dexter|1.2.3": entry("apply", "erroring")})
    assert decide(node("apply", "erroring"), [failing]).reason == "validation-failed"
    working = cr(reported={"dexter|1.2.3": entry("apply", "in_progress")})
    assert decide(node("apply", "in_progress"), [working]).reason == "packages-pending"
    held = decide(node("config", "complete"), [done_cr()])  # complete, but the window starts now
    assert held.reason == "packages-pending"
    assert held.requeue_at == NOW + WINDOW
    released = decide(node("config", "complete"), [done_cr()], complete_since=NOW - WINDOW)
    assert (released.reason, released.phase, released.problem) == (None, "Ready", None)


def test_without_a_node_the_phase_is_attested_or_says_why_not() -> None:
    def without(att: holds.AttestationView | None) -> holds.Decision:
        return holds.decide_without_node(attestation=att, now=NOW, attestation_lifetime=None)

    ok = without(with_boot(BOOT_A))  # no Node: no boot to compare, nothing to hold
    assert (ok.phase, ok.reason, ok.packages) == ("Attested", None, ())
    assert "no Node object" in ok.message
    assert ok.requeue_at == GOOD.expires_at  # the phase changes by time alone at expiry
    revoked = without(holds.AttestationView(True, GOOD.attested_at, GOOD.expires_at))
    assert (revoked.phase, revoked.reason) == ("Quarantined", "quarantined")
    assert (without(holds.AttestationView(False, None, None)).phase) == "Held"


def test_interrupt_needs_post_interrupt_and_new_prefix_wins() -> None:
    at_config = cr(interrupt=True, reported={"dexter|1.2.3": entry("config", "complete")})
    assert decide(node("config", "complete"), [at_config], complete_since=NOW - WINDOW).reason
    done = node("post-interrupt", "complete", prefix="nodewright.nvidia.com")
    done["metadata"]["annotations"]["skyhook.nvidia.com/nodeState_drivers"] = "{not json"
    assert decide(done, [done_cr(interrupt=True)], complete_since=NOW - WINDOW).reason is None


def test_selector_and_lifetime() -> None:
    other_pool = cr(selector={"matchLabels": {"pool": "cpu"}})
    assert decide(node(), [other_pool], complete_since=NOW - WINDOW).reason is None
    unknown_op = cr(selector={"matchExpressions": [{"key": "pool", "operator": "Near"}]})
    assert decide(node(), [unknown_op]).reason == "packages-pending"  # unreadable selector: held
    old = decide(node("config", "complete"), [done_cr()], attestation_lifetime=timedelta(minutes=1))
    assert old.reason == "quarantined"
    assert old.problem is not None
    assert old.problem.kind == "stale"
    assert "renewals stopped" in old.message


# -- the operator's report against the node's annotation ------------------------------------------


def test_an_annotation_alone_releases_nothing() -> None:
    """A node that rewrites its own annotation to complete, while the operator reports otherwise
    (or nothing), stays held and the message names the CR."""
    forged = node("config", "complete")
    for report in (None, {}, {"dexter|1.2.3": entry("apply", "in_progress")}):
        d = decide(forged, [cr(reported=report)], complete_since=NOW - WINDOW)
        assert d.reason == "packages-pending"
        assert "skyhook.nvidia.com/drivers: the node's nodeState annotation disagrees" in d.message
        assert "node config/complete, operator " in d.message
        (row,) = d.packages
        assert not row.complete
        assert (row.stage, row.state) == (
            (None, None) if not report else ("apply", "in_progress")
        )  # the rows are the operator's
    never = decide(forged, [cr(reported=None)], complete_since=NOW - WINDOW)
    assert "has not reported this node in the CR's status.nodeState" in never.message


def test_an_annotation_behind_the_operator_holds_too() -> None:
    for stale in (node("apply", "in_progress"), node(), node("config", "complete", "nodewright.nvidia.com")):
        if stale["metadata"]["annotations"].get("nodewright.nvidia.com/nodeState_drivers"):
            # the new prefix wins: make it disagree
            stale["metadata"]["annotations"]["nodewright.nvidia.com/nodeState_drivers"] = json.dumps({})
        d = decide(stale, [done_cr()], complete_since=NOW - WINDOW)
        assert d.reason == "packages-pending", stale
        assert "disagrees with the operator's status.nodeState" in d.message
        assert "held until they agree" in d.message


def test_a_malformed_annotation_holds_and_says_which() -> None:
    bad = node()
    bad["metadata"]["annotations"]["skyhook.nvidia.com/nodeState_drivers"] = "[1, 2"
    d = decide(bad, [done_cr()], complete_since=NOW - WINDOW)
    assert d.reason == "packages-pending"
    assert "skyhook.nvidia.com/nodeState_drivers is malformed" in d.message


def test_failure_is_read_from_the_operator() -> None:
    # The node claims erroring; the operator says in progress: pending, not validation-failed.
    d = decide(node("apply", "erroring"), [cr(reported={"dexter|1.2.3": entry("apply", "in_progress")})])
    assert d.reason == "packages-pending"


def test_uninstalled_packages_and_extra_entries() -> None:
    obj: dict[str, Any] = {
        "apiVersion": "nodewright.nvidia.com/v1alpha1",
        "kind": "NodeWright",
        "metadata": {"name": "drivers"},
        "spec": {
            "additionalTolerations": HOLD_TOLERATIONS,
            "packages": {
                "dexter": {"version": "1.2.3", "image": "x"},
                "gone": {"version": "2.0.0", "image": "y", "uninstall": {"enabled": True, "apply": True}},
            },
        },
        # an old version's entry and a package removed from the spec are ignored
        "status": {"nodeState": {"n1": {"dexter|1.2.3": entry("config", "complete"),
                                        "dexter|1.0.0": entry("config", "complete", "1.0.0"),
                                        "removed|9": entry("apply", "erroring", "9")}}},
    }  # fmt: skip
    parsed = holds.parse_cr(obj)
    n = node()
    n["metadata"]["annotations"]["nodewright.nvidia.com/nodeState_drivers"] = json.dumps(
        obj["status"]["nodeState"]["n1"]
    )
    d = decide(n, [parsed], complete_since=NOW - WINDOW)
    assert d.reason is None
    assert [(p.package, p.complete) for p in d.packages] == [("dexter", True), ("gone", True)]


def test_reports_are_indexed_once_and_shared() -> None:
    complete = {"dexter|1.2.3": entry("config", "complete")}
    status = {
        "nodeState": {f"n{i}": dict(complete) for i in range(1000)} | {"odd": "not an object"},
        "nodeStatus": {f"n{i}": "complete" for i in range(1000)} | {"lonely": "blocked"},
    }
    specs = [holds.PackageSpec("dexter", "1.2.3", False, (), False, False)]
    reports = nodewright.index_reports(status, specs)
    assert len(reports) == 1002
    assert len({id(r) for k, r in reports.items() if k.startswith("n")}) == 1  # one shared object
    assert reports["n7"] == holds.NodeReport("complete", (("config", "complete"),))
    assert reports["odd"].entries == (nodewright.MALFORMED,)
    assert reports["lonely"] == holds.NodeReport("blocked", None)
    assert nodewright.index_reports({"nodeState": "nope"}, specs) == {}


# -- blocked: the CR, the cause and the fix -------------------------------------------------------

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def test_blocked_by_a_taint_names_the_cr_the_taint_and_the_fix() -> None:
    conditions = [{"type": "TaintNotTolerable", "status": "True", "reason": "TaintNotTolerable",
                   "message": "Node [n1] has taints that are not tolerable. Skipping."}]  # fmt: skip
    blocked = cr(reported={}, node_status="blocked", conditions=conditions)
    d = decide(node(taints=[GPU_TAINT]), [blocked])
    assert d.reason == "packages-pending"
    assert (
        "skyhook.nvidia.com/drivers: NodeWright cannot schedule its package pods here (TaintNotTolerable): "
        "its package pods do not tolerate nvidia.com/gpu=present:NoSchedule; fix: tolerate "
        "nvidia.com/gpu=present:NoSchedule in the CR's spec.additionalTolerations or remove it from the "
        "node" in d.message
    )
    # Tolerated (Exists on the key): nothing to say, the node just waits for its packages.
    tolerant = cr(
        reported={}, tolerations=[*HOLD_TOLERATIONS, {"key": "nvidia.com/gpu", "operator": "Exists"}]
    )
    assert "TaintNotTolerable" not in decide(node(taints=[GPU_TAINT]), [tolerant]).message
    # Not yet reported blocked (outside the current batch): said all the same.
    early = decide(node(taints=[GPU_TAINT]), [cr(reported={})])
    assert "NodeWright cannot schedule its package pods here (TaintNotTolerable)" in early.message


def test_the_hold_taint_itself() -> None:
    pending = {"key": KEY, "value": "packages-pending", "effect": "NoSchedule"}
    bare = cr(reported={}, tolerations=[])
    d = decide(node(taints=[pending]), [bare])
    assert (
        f"fix: add to spec.additionalTolerations (operator Equal): {KEY}=packages-pending:NoSchedule, "
        f"{KEY}=validation-failed:NoSchedule; nodewright.inject_tolerations adds them on a spec change"
        in d.message
    )
    # Only the missing one is named.
    erroring = {"dexter|1.2.3": entry("apply", "erroring")}
    half = cr(reported=erroring, tolerations=[HOLD_TOLERATIONS[0]])
    d = decide(node("apply", "erroring"), [half])
    assert d.reason == "validation-failed"
    assert f"(operator Equal): {KEY}=validation-failed:NoSchedule; nodewright" in d.message
    unattested = {"key": KEY, "value": "unattested", "effect": "NoSchedule"}
    d = decide(node(taints=[unattested]), [cr(reported={})], None)
    assert "package pods wait until the node is attested" in d.message
    # runtimeRequired CRs tolerate NodeWright's own taint (both default keys), and the cordon is
    # always tolerated.
    rr = holds.parse_cr(
        {
            "apiVersion": "skyhook.nvidia.com/v1alpha1",
            "kind": "Skyhook",
            "metadata": {"name": "drivers"},
            "spec": {"runtimeRequired": True, "packages": {"dexter": {"version": "1.2.3"}}},
        }
    )
    own = [{"key": p, "value": "runtime-required", "effect": "NoSchedule"} for p in holds.PREFIXES]
    own.append({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"})
    assert nodewright.untolerated(rr, own) == []
    assert nodewright.untolerated(bare, own) == own[:2]


def test_ignored_and_unexplained_blocks() -> None:
    ignored = decide(
        node(labels={"skyhook.nvidia.com/ignore": "true"}), [cr(reported={}, node_status="blocked")]
    )
    assert (
        "skyhook.nvidia.com/drivers: NodeWright cannot schedule its package pods here (NodesIgnored): "
        "the node has label skyhook.nvidia.com/ignore=true; fix: remove it "
        "(kubectl label node n1 skyhook.nvidia.com/ignore-)" in ignored.message
    )
    why = [
        {"type": "skyhook.nvidia.com/TaintNotTolerable", "status": "True", "message": "12 nodes have taints"}
    ]
    odd = decide(node(), [cr(reported={}, node_status="blocked", conditions=why)])
    assert (
        "NodeWright reports the node blocked (TaintNotTolerable: 12 nodes have taints); fix: see the CR's "
        "status.conditions (kubectl describe skyhook drivers)" in odd.message
    )
    # A complete node is not held by a block (NodeWright has nothing left to do there).
    done = decide(node("config", "complete", taints=[GPU_TAINT]), [done_cr()], complete_since=NOW - WINDOW)
    assert done.reason is None


# -- boot ids -------------------------------------------------------------------------------------


def test_a_rebooted_node_is_unattested_until_the_new_boot_attests() -> None:
    n = node("config", "complete", boot=BOOT_B)
    d = decide(n, [done_cr()], with_boot(BOOT_A), complete_since=NOW - WINDOW)
    assert (d.reason, d.phase) == ("unattested", "Held")
    assert d.message.startswith(f"unattested: rebooted since its last attestation (boot {BOOT_B})")
    assert d.problem == holds.Problem(
        "unattested", "rebooted", f"rebooted since its last attestation (boot {BOOT_B})"
    )
    assert d.complete_since == NOW - WINDOW  # the packages' window is not restarted by the hold
    fresh = decide(n, [done_cr()], with_boot(BOOT_B), complete_since=NOW - WINDOW)
    assert fresh.reason is None
    no_boot_recorded = decide(n, [done_cr()], with_boot(None), complete_since=NOW - WINDOW)
    assert no_boot_recorded.reason is None  # old joins: today's behaviour
    silent = decide(node("config", "complete"), [done_cr()], with_boot(BOOT_A), complete_since=NOW - WINDOW)
    assert silent.reason == "unattested"
    assert silent.problem is not None
    assert silent.problem.kind == "no-boot-id"
    # Quarantine still comes first: the node must join again, not just attest its boot.
    expired = holds.AttestationView(False, NOW - timedelta(hours=2), NOW - timedelta(hours=1), BOOT_A)
    assert decide(n, [done_cr()], expired).reason == "quarantined"


def test_an_admins_quarantine_holds_the_node_whatever_its_packages() -> None:
    """spec.quarantine (nodegate nodes quarantine): held quarantined, with the admin's reason and
    how it ends; present but unreadable still holds (fail closed)."""
    view = holds.attestation_view(
        {"spec": {"revoked": False, "quarantine": {"reason": "shim CVE-2023-40547", "actor": "a"}},
         "status": {"attestedAt": "2026-12-03T11:55:00Z", "expiresAt": "2026-12-03T13:00:00Z"}}
    )  # fmt: skip
    assert view is not None
    assert view.quarantine == "shim CVE-2023-40547"
    d = decide(node("config", "complete"), [done_cr()], view, complete_since=NOW - WINDOW)
    assert (d.reason, d.phase) == ("quarantined", "Quarantined")
    assert (
        "quarantined by an admin (shim CVE-2023-40547): released when the node attests a new boot"
        in d.message
    )
    odd = holds.attestation_view({"spec": {"quarantine": "yes"}})
    assert odd is not None
    assert odd.quarantine == "(no reason given)"


def test_attestation_view_reads_boot_and_reset_count() -> None:
    obj = {"spec": {"revoked": False},
           "status": {"attestedAt": "2026-12-03T11:55:00Z", "expiresAt": "2026-12-03T13:00:00Z",
                      "bootID": BOOT_A, "resetCount": 7}}  # fmt: skip
    view = holds.attestation_view(obj)
    assert view is not None
    assert (view.boot_id, view.reset_count) == (BOOT_A, 7)
    odd = holds.attestation_view({"status": {"bootID": "", "resetCount": True}})
    assert odd is not None
    assert (odd.boot_id, odd.reset_count) == (None, None)
    assert holds.node_boot_id({"status": {"nodeInfo": {"bootID": 5}}}) is None
    # Long ids are compared whole: one prefix does not make one boot.
    long_a, long_b = "a" * 64 + "1", "a" * 64 + "2"
    n = node("config", "complete", boot=long_b)
    d = decide(n, [done_cr()], with_boot(long_a), complete_since=NOW - WINDOW)
    assert (d.reason, d.message) == (
        "unattested",
        f"unattested: rebooted since its last attestation (boot {'a' * 64})",
    )


# -- taints ----------------------------------------------------------------------------------------

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


# -- invariants -----------------------------------------------------------------------------------

stages = st.sampled_from([None, "apply", "config", "interrupt", "post-interrupt", "uninstall"])
states = st.sampled_from([None, "complete", "in_progress", "erroring", "unknown"])
# What a package's entry in the operator's status.nodeState may be: absent, a (stage, state), or junk;
# the complete ones first (hypothesis shrinks towards them) so that releases are common.
ENTRIES = [
    {"stage": "config", "state": "complete"},
    {"stage": "post-interrupt", "state": "complete"},
    {"stage": "apply", "state": "in_progress"},
    {"stage": "apply", "state": "erroring"},
    {"stage": "uninstall", "state": "complete"},
    {"state": "complete"},
]
reported_entry = st.one_of(
    st.sampled_from(ENTRIES),
    st.tuples(stages, states).map(lambda t: {k: v for k, v in zip(("stage", "state"), t, strict=True) if v}),
    st.none(),
    st.sampled_from(["junk", 3, []]),
)
# Whatever the node writes in its annotations (any prefix, any content, valid or not).
annotation_value = st.one_of(
    st.sampled_from(ENTRIES).map(lambda e: json.dumps({"dexter|1.2.3": e})),
    st.tuples(stages, states).map(lambda t: json.dumps({"dexter|1.2.3": {"stage": t[0], "state": t[1]}})),
    st.just(json.dumps({})),
    st.text(max_size=8),
)
annotations = st.dictionaries(
    st.sampled_from([f"{p}/nodeState_drivers" for p in holds.PREFIXES]), annotation_value, max_size=2
)


@settings(max_examples=400)
@given(
    report=st.one_of(st.none(), st.dictionaries(st.just("dexter|1.2.3"), reported_entry, max_size=1)),
    node_status=st.sampled_from([None, "complete", "in_progress", "blocked", "erroring"]),
    notes=annotations,
    interrupt=st.booleans(),
)
def test_never_released_unless_the_operator_reports_complete(
    report: dict[str, Any] | None, node_status: str | None, notes: dict[str, str], interrupt: bool
) -> None:
    """A node whose operator-written state is not complete is never released, whatever its
    annotations say."""
    n = node()
    n["metadata"]["annotations"] = dict(notes)
    d = decide(
        n, [cr(interrupt=interrupt, reported=report, node_status=node_status)], complete_since=NOW - WINDOW
    )
    if d.reason is None:
        assert report is not None
        got = report.get("dexter|1.2.3")
        assert isinstance(got, dict)
        assert got.get("state") == "complete"
        assert got.get("stage") == ("post-interrupt" if interrupt else "config")


@settings(max_examples=600)  # pure and fast: enough examples to reach every combination
@given(
    stage=stages,
    state=states,
    interrupt=st.booleans(),
    revoked=st.booleans(),
    quarantined=st.booleans(),
    attested=st.booleans(),
    since=st.sampled_from([None, NOW, NOW - WINDOW]),
    attested_boot=st.sampled_from([None, BOOT_A, BOOT_B]),
    node_boot=st.sampled_from([None, BOOT_A, BOOT_B]),
    expired=st.booleans(),
    done=st.booleans(),
)
def test_never_releases_an_unattested_rebooted_or_incomplete_node(
    stage: str | None,
    state: str | None,
    interrupt: bool,
    revoked: bool,
    quarantined: bool,
    attested: bool,
    since: datetime | None,
    attested_boot: str | None,
    node_boot: str | None,
    expired: bool,
    done: bool,
) -> None:
    """A node whose attestation is not valid is never released; a node is never released while
    its Node's boot id differs from its attested boot id; nor with incomplete packages."""
    if done:  # half the examples have every package complete and stable: the attestation decides
        stage, state = ("post-interrupt" if interrupt else "config"), "complete"
        since = NOW - WINDOW
    expires = NOW - timedelta(seconds=1) if expired else GOOD.expires_at
    held = "shim CVE" if quarantined else None
    att = (
        holds.AttestationView(revoked, GOOD.attested_at, expires, attested_boot, quarantine=held)
        if attested
        else None
    )
    reported = {"dexter|1.2.3": {"stage": stage, "state": state}} if stage and state else {}
    n = node(stage, state, boot=node_boot)
    d = decide(n, [cr(interrupt=interrupt, reported=reported)], att, complete_since=since)
    if d.reason is None:
        assert att is not None
        assert not att.revoked
        assert att.quarantine is None
        assert not expired
        assert att.boot_id is None or att.boot_id == node_boot
        assert state == "complete"
        assert stage == ("post-interrupt" if interrupt else "config")
        assert since is not None
        assert since + WINDOW <= NOW


# -- the Node object the attestation labelled (issue 33, finding 4 follow-up) ------------------------

EK = "cd" * 32
UID_A, UID_B = "5f0c9a3e-1b2d-4c6e-8f7a-9b0c1d2e3f4a", "8a7b6c5d-4e3f-4a1b-9c8d-7e6f5a4b3c2d"
ATTESTED_LABELS = {
    "node-restriction.kubernetes.io/nodegate.io-attested": "true",
    "node-restriction.kubernetes.io/nodegate.io-ek-sha256": EK[:63],
}


def with_uid(uid: str | None, ek: str | None = EK, boot: str | None = None) -> holds.AttestationView:
    return holds.AttestationView(False, GOOD.attested_at, GOOD.expires_at, boot, 3 if boot else None, uid, ek)


def labelled(
    uid: str | None, labels: dict[str, str] | None = None, boot: str | None = None
) -> dict[str, Any]:
    """A Node with NodeWright's complete report, the given uid and labels (default: the attested
    ones nodegate writes)."""
    n = node("config", "complete", boot=boot, labels=ATTESTED_LABELS if labels is None else labels)
    if uid is not None:
        n["metadata"]["uid"] = uid
    return n


def test_a_recreated_node_is_held_unattested_with_the_cause() -> None:
    """The kubelet re-registered the Node after someone deleted it: another uid, its own labels,
    the attested boot. Held, whatever CRs select it."""
    recreated = labelled(UID_B, {"team": "mine"}, boot=BOOT_A)
    d = decide(recreated, [], with_uid(UID_A, boot=BOOT_A), complete_since=NOW - WINDOW)
    assert (d.reason, d.phase) == ("unattested", "Held")
    assert d.problem is not None
    assert d.problem.kind == "recreated"
    assert d.message.startswith(
        f"unattested: the Node is not the object nodegate attested (uid {UID_B}, attested {UID_A}): "
        "it was deleted and re-created since; the node must attest again (nodegate attest, or its next "
        "renewal), which relabels it"
    )
    # Even with the attested labels copied by an administrator: another object.
    assert decide(labelled(UID_B), [done_cr()], with_uid(UID_A), complete_since=NOW - WINDOW).reason == (
        "unattested"
    )
    assert decide(labelled(None), [], with_uid(UID_A), complete_since=NOW - WINDOW).reason == "unattested"
    # Once the re-attestation recorded this Node (and wrote its labels): released as any other.
    assert decide(labelled(UID_B), [done_cr()], with_uid(UID_B), complete_since=NOW - WINDOW).reason is None


def test_a_node_without_the_attested_labels_is_held() -> None:
    def problem(n: dict[str, Any], view: holds.AttestationView) -> str | None:
        d = decide(n, [done_cr()], view, complete_since=NOW - WINDOW)
        return d.problem.kind if d.problem is not None else d.reason

    assert problem(labelled(UID_A), with_uid(UID_A)) is None
    assert problem(labelled(UID_A, {}), with_uid(UID_A)) == "unlabelled"
    other_ek = {**ATTESTED_LABELS, "node-restriction.kubernetes.io/nodegate.io-ek-sha256": "ab" * 31 + "a"}
    assert problem(labelled(UID_A, other_ek), with_uid(UID_A)) == "unlabelled"
    not_true = {**ATTESTED_LABELS, "node-restriction.kubernetes.io/nodegate.io-attested": "false"}
    assert problem(labelled(UID_A, not_true), with_uid(UID_A)) == "unlabelled"
    assert problem(labelled(UID_A), with_uid(UID_A, ek=None)) == "unlabelled"  # no EK to match
    d = decide(labelled(UID_A, {}), [], with_uid(UID_A))
    assert "the Node lacks the attested labels nodegate wrote" in d.message


def test_without_a_recorded_uid_the_node_object_is_not_compared() -> None:
    """Attestations recorded before nodegate recorded the uid keep today's behaviour (as for boot
    ids); the reboot check still applies; quarantine still comes first; no Node: Attested."""
    plain = node("config", "complete")  # no uid, no attested labels
    assert decide(plain, [done_cr()], with_uid(None), complete_since=NOW - WINDOW).reason is None
    rebooted = labelled(UID_A, boot=BOOT_B)
    d = decide(rebooted, [done_cr()], with_uid(UID_A, boot=BOOT_A), complete_since=NOW - WINDOW)
    assert d.problem is not None
    assert d.problem.kind == "rebooted"
    revoked = holds.AttestationView(True, GOOD.attested_at, GOOD.expires_at, None, None, UID_A, EK)
    assert decide(labelled(UID_B), [], revoked).reason == "quarantined"
    gone = holds.decide_without_node(attestation=with_uid(UID_A), now=NOW, attestation_lifetime=None)
    assert (gone.phase, gone.reason) == ("Attested", None)


def test_attestation_view_reads_the_node_uid_and_the_ek() -> None:
    obj = {"spec": {"revoked": False, "ekSha256": EK},
           "status": {"attestedAt": "2026-12-03T11:55:00Z", "expiresAt": "2026-12-03T13:00:00Z",
                      "nodeUID": UID_A}}  # fmt: skip
    view = holds.attestation_view(obj)
    assert view is not None
    assert (view.node_uid, view.ek_sha256) == (UID_A, EK)
    odd = holds.attestation_view({"spec": {"ekSha256": 5}, "status": {"nodeUID": ""}})
    assert odd is not None
    assert (odd.node_uid, odd.ek_sha256) == (None, None)
    assert holds.node_identity({"metadata": {"uid": 7, "labels": {"a": "b"}}}) == holds.NodeIdentity(
        None, None, None
    )


@settings(max_examples=400)
@given(
    node_uid=st.sampled_from([None, UID_A, UID_B, ""]),
    attested=st.sampled_from([None, "true", "false", ""]),
    ek=st.sampled_from([None, EK[:63], "ab" * 31 + "a", EK]),
    extra=st.dictionaries(
        st.sampled_from(["pool", "team", "kubernetes.io/hostname"]), st.just("x"), max_size=2
    ),
    recorded_ek=st.sampled_from([None, EK]),
)
def test_never_releases_another_node_object_than_the_attested_one(
    node_uid: str | None, attested: str | None, ek: str | None, extra: dict[str, str], recorded_ek: str | None
) -> None:
    """With a recorded uid, a Node is released only when it is that object and carries the
    attested labels of the bound EK, whatever else it carries and whatever selects it."""
    labels = dict(extra)
    if attested is not None:
        labels["node-restriction.kubernetes.io/nodegate.io-attested"] = attested
    if ek is not None:
        labels["node-restriction.kubernetes.io/nodegate.io-ek-sha256"] = ek
    n = labelled(node_uid, labels)
    crs = [done_cr(), done_cr(name="other", selector={"matchLabels": {"pool": "x"}})]
    d = decide(n, crs, with_uid(UID_A, ek=recorded_ek), complete_since=NOW - WINDOW)
    same = node_uid == UID_A and attested == "true" and recorded_ek is not None and ek == recorded_ek[:63]
    if not same:
        assert d.reason == "unattested"
    if d.reason is None:
        assert same
