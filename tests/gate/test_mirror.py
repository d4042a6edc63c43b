"""A NodeWright's ``mirrored-from`` claim un-gates a Skyhook only when it really mirrors it
(issue 21, finding 3; bootstrap/gate/mirror.py).

Upstream's mirror controller (NVIDIA/nodewright, formerly NVIDIA/skyhook, at 273d50a0:
operator/internal/controller/mirror_controller.go, and its test mirror_controller_test.go at
5e754602) creates the NodeWright under the Skyhook's own name, with the spec converted field by
field and the annotations ``nodewright.nvidia.com/mirrored-from: <name>`` and
``nodewright.nvidia.com/mirrored-generation: <generation>``. Before the fix the gate skipped every
Skyhook named in any NodeWright's claim: a decoy NodeWright that selects no node released the
nodes of any Skyhook."""

from __future__ import annotations

import copy
import json
from datetime import timedelta
from typing import Any

import pytest

from bootstrap.gate import holds
from bootstrap.gate.mirror import mirror_claim
from tests.gate.test_holds import HOLD_TOLERATIONS, NOW, decide, entry

SKY, NW = "skyhook.nvidia.com", "nodewright.nvidia.com"
STAMPS = {f"{NW}/mirrored-from": "drivers", f"{NW}/mirrored-generation": "3"}
SPEC: dict[str, Any] = {
    "nodeSelectors": {"matchLabels": {"pool": "gpu"}},
    "additionalTolerations": HOLD_TOLERATIONS,
    "interruptionBudget": {"percent": 25},
    "packages": {"dexter": {"version": "1.2.3", "image": "ghcr.io/nvidia/skyhook/agentless"}},
}
DONE = {"dexter|1.2.3": entry("config", "complete")}


def parse(
    group: str,
    name: str = "drivers",
    *,
    spec: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
    reported: dict[str, Any] | None = None,
) -> holds.PackageCr:
    status = {"nodeState": {"n1": reported}, "nodeStatus": {"n1": "complete"}} if reported else {}
    return holds.parse_cr(
        {
            "apiVersion": f"{group}/v1alpha1",
            "kind": holds.GROUPS[group],
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": copy.deepcopy(SPEC if spec is None else spec),
            "status": status,
        }
    )


def legacy() -> holds.PackageCr:
    """The frozen Skyhook: its status was last written by the pre-rename operator (not for n1)."""
    spec = copy.deepcopy(SPEC)
    spec["packages"]["dexter"]["image"] += ":1.2.3"  # the legacy decoder cuts the tag
    return parse(SKY, spec=spec)


def node() -> dict[str, Any]:
    """n1 as the post-rename operator leaves it: its NodeWright report complete."""
    annotations = {f"{NW}/nodeState_drivers": json.dumps(DONE)}
    return {"metadata": {"name": "n1", "labels": {"pool": "gpu"}, "annotations": annotations}}


def released(crs: list[holds.PackageCr]) -> holds.Decision:
    return decide(node(), crs, complete_since=NOW - timedelta(minutes=5))


def test_the_mirror_upstream_writes_stands_in_for_the_skyhook() -> None:
    d = released([legacy(), parse(NW, annotations=STAMPS, reported=DONE)])
    assert d.reason is None, d.message
    assert [p.cr for p in d.packages] == [f"{NW}/drivers"]


def test_the_operators_re_encoding_of_the_mirror_is_the_same_spec() -> None:
    spec = copy.deepcopy(SPEC)
    spec["packages"]["dexter"]["name"] = "dexter"  # what Go's encoding adds
    spec.update(podNonInterruptLabels={}, priority=200)
    d = released([legacy(), parse(NW, spec=spec, annotations=STAMPS, reported=DONE)])
    assert d.reason is None, d.message


def test_a_decoy_claim_does_not_ungate_a_skyhook() -> None:
    """The finding: a NodeWright of another name, selecting no node, claims the Skyhook."""
    decoy = parse(
        NW,
        "decoy",
        spec={**SPEC, "nodeSelectors": {"matchLabels": {"pool": "none"}}},
        annotations={f"{NW}/mirrored-from": "drivers", f"{NW}/mirrored-generation": "1"},
    )
    d = released([legacy(), decoy])
    assert d.reason == "packages-pending"
    assert f"{SKY}/drivers" in d.message


@pytest.mark.parametrize(
    ("spec_edit", "annotations"),
    [
        (lambda s: s["packages"]["dexter"].update(version="9.9.9"), STAMPS),  # other packages
        (lambda s: s["nodeSelectors"]["matchLabels"].update(pool="cpu"), STAMPS),  # other nodes
        (lambda s: s["packages"]["dexter"].update(image="ghcr.io/evil/x"), STAMPS),  # other image
        (lambda s: None, {f"{NW}/mirrored-from": "drivers"}),  # no generation stamp
        (lambda s: None, {**STAMPS, f"{NW}/mirrored-generation": "three"}),
        (lambda s: None, {**STAMPS, f"{NW}/mirrored-generation": "3\n"}),
    ],
)
def test_a_claim_that_is_not_a_mirror_leaves_the_skyhook_judged(spec_edit: Any, annotations: Any) -> None:
    spec = copy.deepcopy(SPEC)
    spec_edit(spec)
    done = {"dexter|9.9.9": entry("config", "complete", "9.9.9")} if "9.9.9" in json.dumps(spec) else DONE
    claimant = parse(NW, spec=spec, annotations=annotations, reported=done)
    d = released([legacy(), claimant])
    assert d.reason == "packages-pending"
    assert f"{SKY}/drivers" in {p.cr for p in d.packages}


def test_the_message_says_why_a_claimed_skyhook_is_still_judged() -> None:
    spec = copy.deepcopy(SPEC)
    spec["interruptionBudget"] = {"percent": 50}  # edited on the NodeWright after the migration
    d = released([legacy(), parse(NW, spec=spec, annotations=STAMPS, reported=DONE)])
    assert d.reason == "packages-pending"
    assert "claims to mirror it" in d.message
    assert "kubectl delete skyhooks.skyhook.nvidia.com drivers" in d.message


@pytest.mark.parametrize(
    ("group", "name", "annotations", "claim"),
    [
        (NW, "drivers", STAMPS, "drivers"),
        (SKY, "drivers", STAMPS, None),  # only a NodeWright mirrors
        (NW, "other", STAMPS, None),  # upstream names the target after its source
        (NW, "drivers", {f"{NW}/mirrored-from": "drivers", f"{NW}/mirrored-generation": ""}, None),
        (NW, "drivers", {f"{NW}/mirrored-from": "drivers", f"{NW}/mirrored-generation": "1" * 21}, None),
    ],
)
def test_the_shape_of_a_claim(group: str, name: str, annotations: dict[str, str], claim: str | None) -> None:
    assert mirror_claim(group, name, annotations) == claim
