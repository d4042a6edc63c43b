"""Holds and rights that could be side-stepped (issue 21): the admission half of findings 3, 4 and 6.

3. Adding or changing a NodeWright's ``nodewright.nvidia.com/mirrored-from`` claim stands the named
   Skyhook down in the gate; it was an annotation-only UPDATE ("spec unchanged") anyone could send.
4. A node's own credentials set NodeWright's ``nodeState_*`` annotations on a Node CREATE, and the
   rule must hold for reviews of the ``nodes/status`` subresource too.
6. Moving a CR with reboot packages to another pool (``nodeSelectors`` changed, packages not) needed
   only ``deploy`` there.
"""

from __future__ import annotations

import copy
import functools
import json
from typing import Any

import pytest

from admission.rbac.evaluator import RbacEvaluator
from admission.reading.policy import PackagePolicy
from admission.webhook import Decider, LocalRbac, StaticPolicies
from tests.admission.test_admission_rules import policy
from tests.admission.test_webhook import (
    NODEGATE,
    RBAC,
    _binding,
    _role,
    decide,
    decider,
    gpu_policies,
    no_reboot,
    review,
)
from tests.support.package_crs import SAMPLE

NODEWRIGHT = ("nodewright.nvidia.com", "NodeWright")
NODE = ("", "Node")
CLAIM = {
    "nodewright.nvidia.com/mirrored-from": SAMPLE["metadata"]["name"],  # as the mirror names it
    "nodewright.nvidia.com/mirrored-generation": "1",
}
OPERATOR = "system:serviceaccount:skyhook:skyhook-operator-controller-manager"


def texts(d: Any) -> list[str]:
    return [v.message for v in d.violations]


def nodewright(doc: dict[str, Any], **annotations: str) -> dict[str, Any]:
    out = {**copy.deepcopy(doc), "apiVersion": "nodewright.nvidia.com/v1alpha1", "kind": "NodeWright"}
    out["metadata"]["annotations"] = dict(annotations)
    return out


# -- 3: the mirrored-from claim ------------------------------------------------------------


async def test_adding_a_mirror_claim_is_not_an_unchanged_update() -> None:
    """The finding: mallory (no rights at all) annotated a NodeWright, and the gate then skipped the
    Skyhook it names."""
    old = nodewright(SAMPLE)
    new = nodewright(SAMPLE, **CLAIM)
    d = await decide(decider(), review(new, op="UPDATE", old=old, user="mallory", kind=NODEWRIGHT))
    assert not d.allowed
    assert {v.rule for v in d.violations} == {"rbac"}


async def test_a_claim_needs_the_reboot_right_for_every_reboot_package() -> None:
    """alice may deploy to the gpu pool but not reboot: the claim stands down a Skyhook of the same
    spec, whose reboot packages are the NodeWright's, so it is judged as if the CR were new."""
    old, new = nodewright(SAMPLE), nodewright(SAMPLE, **CLAIM)
    d = await decide(decider(), review(new, op="UPDATE", old=old, user="alice", kind=NODEWRIGHT))
    assert not d.allowed
    assert "alice lacks verb reboot on packagepolicies/gpu in nodegate.io (reboots: node-tuning)" in texts(d)
    ok = await decide(
        decider(), review(new, op="UPDATE", old=old, user="bob", groups=("ml-platform",), kind=NODEWRIGHT)
    )
    assert ok.allowed, ok.message
    assert ok.audit["reboot"] == "node-tuning"
    quiet_old, quiet_new = nodewright(no_reboot(SAMPLE)), nodewright(no_reboot(SAMPLE), **CLAIM)
    d = await decide(decider(), review(quiet_new, op="UPDATE", old=quiet_old, user="alice", kind=NODEWRIGHT))
    assert d.allowed, d.message


async def test_changing_a_claim_is_judged_too_and_a_claim_is_judged_against_the_limits() -> None:
    old = nodewright(SAMPLE, **CLAIM)
    new = nodewright(SAMPLE, **{**CLAIM, "nodewright.nvidia.com/mirrored-from": "other"})
    d = await decide(decider(), review(new, op="UPDATE", old=old, user="mallory", kind=NODEWRIGHT))
    assert not d.allowed
    # A CR admitted before nodegate (its budget above the pool's cap) cannot take on a claim either.
    wide = nodewright(SAMPLE)
    wide["spec"]["interruptionBudget"] = {"percent": 90}
    claimed = copy.deepcopy(wide)
    claimed["metadata"]["annotations"] = dict(CLAIM)
    d = await decide(
        decider(),
        review(claimed, op="UPDATE", old=wide, user="bob", groups=("ml-platform",), kind=NODEWRIGHT),
    )
    assert not d.allowed
    assert "budget-cap" in {v.rule for v in d.violations}


async def test_the_mirrors_own_updates_and_removing_a_claim_need_no_rights() -> None:
    """Upstream's mirror re-sync rewrites the generation stamp under an unchanged claim; dropping a
    claim only makes the gate judge the Skyhook again."""
    old = nodewright(SAMPLE, **CLAIM)
    resync = nodewright(SAMPLE, **{**CLAIM, "nodewright.nvidia.com/mirrored-generation": "2"})
    d = await decide(decider(), review(resync, op="UPDATE", old=old, user=OPERATOR, kind=NODEWRIGHT))
    assert d.audit == {"decision": "allow", "reason": "spec unchanged"}
    d = await decide(
        decider(), review(nodewright(SAMPLE), op="UPDATE", old=old, user="mallory", kind=NODEWRIGHT)
    )
    assert d.audit == {"decision": "allow", "reason": "spec unchanged"}


async def test_a_skyhooks_annotation_of_that_name_is_no_claim() -> None:
    """Only a NodeWright's claim counts in the gate (the mirror stamps the NodeWright)."""
    old = copy.deepcopy(SAMPLE)
    new = copy.deepcopy(SAMPLE)
    new["metadata"]["annotations"] = dict(CLAIM)
    d = await decide(decider(), review(new, op="UPDATE", old=old, user="mallory"))
    assert d.audit == {"decision": "allow", "reason": "spec unchanged"}


async def test_a_claim_naming_another_object_is_admitted_with_a_warning() -> None:
    """Upstream's webhook does not look at the annotation; its mirror names the target after the
    source, so a claim naming anything else is ignored by the gate, and the requester is told."""
    doc = nodewright(no_reboot(SAMPLE), **{**CLAIM, "nodewright.nvidia.com/mirrored-from": "drivers"})
    d = await decide(decider(), review(doc, user="alice", kind=NODEWRIGHT))
    assert d.allowed, d.message
    assert any("gate ignores this claim" in w for w in d.warnings)
    own = nodewright(no_reboot(SAMPLE), **CLAIM)
    d = await decide(decider(), review(own, user="alice", kind=NODEWRIGHT))
    assert d.allowed
    assert not any("mirrored-from" in w for w in d.warnings)


# -- 4: nodeState_* on a Node CREATE, and through nodes/status --------------------------------

HOLD = {"key": "nodegate.io/hold", "value": "unattested", "effect": "NoSchedule"}
STATE = {"skyhook.nvidia.com/nodeState_drivers": json.dumps({"dexter|1.2.3": {"state": "complete"}})}


def node(annotations: dict[str, str] | None = None, boot: str = "b-1") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "w1", "annotations": dict(annotations or {})},
        "spec": {"taints": [HOLD]},
        "status": {"nodeInfo": {"bootID": boot}},
    }


def node_review(obj: Any, *, op: str = "UPDATE", old: Any = None, user: str, status: bool = False) -> Any:
    body = review(obj, op=op, old=old, user=user, kind=NODE)
    body["request"]["resource"] = {"group": "", "version": "v1", "resource": "nodes"}
    body["request"]["requestKind"] = body["request"]["kind"]
    if status:
        body["request"]["subResource"] = "status"
    return body


@pytest.mark.parametrize("prefix", ["skyhook.nvidia.com", "nodewright.nvidia.com"])
async def test_a_kubelet_may_not_create_its_node_with_package_state(prefix: str) -> None:
    forged = {f"{prefix}/nodeState_drivers": STATE["skyhook.nvidia.com/nodeState_drivers"]}
    d = await decide(decider(), node_review(node(forged), op="CREATE", user="system:node:w1"))
    assert not d.allowed
    assert [v.rule for v in d.violations] == ["node-package-state"]
    assert d.audit["rule"] == "node-package-state"
    plain = await decide(decider(), node_review(node(), op="CREATE", user="system:node:w1"))
    assert plain.allowed, plain.message
    restored = await decide(decider(), node_review(node(forged), op="CREATE", user=NODEGATE))
    assert restored.allowed  # not a node's own credentials (a backup restore, the operator)


@pytest.mark.parametrize("status", [False, True])
async def test_nodes_and_nodes_status_are_judged_alike(status: bool) -> None:
    before = node(STATE)
    forged = node({k: v.replace("complete", "erroring") for k, v in STATE.items()})
    d = await decide(decider(), node_review(forged, old=before, user="system:node:w1", status=status))
    assert not d.allowed
    assert [v.rule for v in d.violations] == ["node-package-state"]
    added = await decide(
        decider(), node_review(node(STATE), old=node(), user="system:node:w1", status=status)
    )
    assert not added.allowed
    removed = await decide(decider(), node_review(node(), old=before, user="system:node:w1", status=status))
    assert not removed.allowed
    # The kubelet's own status updates (a new boot id) and the operator's reports pass.
    heartbeat = await decide(
        decider(), node_review(node(STATE, boot="b-2"), old=before, user="system:node:w1", status=status)
    )
    assert heartbeat.allowed, heartbeat.message
    report = await decide(decider(), node_review(forged, old=before, user=OPERATOR, status=status))
    assert report.allowed


# -- 6: moving reboot packages to another pool -------------------------------------------------


@functools.cache
def gpu_b() -> PackagePolicy:
    """Validated when a test first asks, not at import (a refusal fails the tests, not the collection)."""
    return policy(
        "gpu-b",
        nodeSelector={"matchLabels": {"agentpool": "gpu-b"}},
        images={"registries": ["ghcr.io/nvidia"]},
        interrupts={"allowed": ["noop", "service", "restartAllServices", "reboot"]},
        maxInterruptionBudget={"percent": 50},
    )


MOVERS = [
    *RBAC,
    _role("deploy-gpu-b", "deploy", ["gpu-b"]),
    _role("reboot-gpu-b", "reboot", ["gpu-b"]),
    _binding("dave-deploys-gpu", "deploy-gpu", "User", "dave"),
    _binding("dave-reboots-gpu", "reboot-gpu", "User", "dave"),
    _binding("dave-deploys-gpu-b", "deploy-gpu-b", "User", "dave"),
    _binding("erin-deploys-gpu", "deploy-gpu", "User", "erin"),
    _binding("erin-deploys-gpu-b", "deploy-gpu-b", "User", "erin"),
    _binding("erin-reboots-gpu-b", "reboot-gpu-b", "User", "erin"),
]


def movers() -> Decider:
    return Decider(
        StaticPolicies([*gpu_policies(), gpu_b()]), LocalRbac(RbacEvaluator.from_objects(MOVERS)), NODEGATE
    )


def moved(doc: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    out["spec"]["nodeSelectors"] = {"matchLabels": labels}
    return out


async def test_moving_reboot_packages_to_another_pool_needs_reboot_there() -> None:
    """dave may reboot the gpu pool, deploy (not reboot) to gpu-b; the same packages moved to gpu-b
    would reboot gpu-b's nodes."""
    old, new = SAMPLE, moved(SAMPLE, {"agentpool": "gpu-b"})
    d = await decide(movers(), review(new, op="UPDATE", old=old, user="dave"))
    assert not d.allowed
    assert "dave lacks verb reboot on packagepolicies/gpu-b in nodegate.io (reboots: node-tuning)" in texts(d)
    ok = await decide(movers(), review(new, op="UPDATE", old=old, user="erin"))
    assert ok.allowed, ok.message
    assert ok.audit == {"decision": "allow", "policy": "gpu-b", "reboot": "node-tuning"}


async def test_narrowing_a_selector_inside_the_pool_still_asks_for_reboot() -> None:
    new = moved(SAMPLE, {"agentpool": "gpu", "zone": "a"})
    assert (await decide(movers(), review(new, op="UPDATE", old=SAMPLE, user="dave"))).allowed
    d = await decide(movers(), review(new, op="UPDATE", old=SAMPLE, user="alice"))
    assert not d.allowed
    assert "alice lacks verb reboot on packagepolicies/gpu in nodegate.io (reboots: node-tuning)" in texts(d)


async def test_moving_a_cr_without_reboots_needs_deploy_only() -> None:
    old = no_reboot(SAMPLE)
    d = await decide(movers(), review(moved(old, {"agentpool": "gpu-b"}), op="UPDATE", old=old, user="dave"))
    assert d.allowed, d.message
    assert "reboot" not in d.audit


async def test_an_unchanged_selector_keeps_reboots_to_what_changed() -> None:
    """The rule did not become "every update of a rebooting CR needs reboot"."""
    new = copy.deepcopy(SAMPLE)
    new["spec"]["packages"]["boot-marker"]["version"] = "2.0.1"
    d = await decide(movers(), review(new, op="UPDATE", old=SAMPLE, user="alice"))
    assert d.allowed, d.message
    assert "reboot" not in d.audit
