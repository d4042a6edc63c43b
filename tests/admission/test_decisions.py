"""Decisions on package CRs since NodeWright compatibility: the unchanged-spec path, pause and
disable, DELETE, the uninstall rules, nodegate's toleration rules, the new PackagePolicy limits and
the warnings."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from admission.hold.holdtolerations import hold_tolerations
from admission.webhook import Decider
from tests.admission.test_admission_rules import DIGEST, policy
from tests.admission.test_webhook import NODEGATE, decide, decider, gpu_policies, no_reboot, review
from tests.admission.upstream.gotypes import encode_skyhook_spec
from tests.support.package_crs import SAMPLE, UNINSTALL

NODEGATE_HOLD = "nodegate.io/hold"

NODEWRIGHT = ("nodewright.nvidia.com", "NodeWright")


def _operator_update(doc: dict[str, Any]) -> dict[str, Any]:
    """What the operator's finalizer UPDATE sends: its Go re-encoding of the CR, finalizer added."""
    new = copy.deepcopy(doc)
    new["metadata"]["finalizers"] = ["skyhook.nvidia.com/skyhook"]
    new["spec"] = encode_skyhook_spec(doc["spec"], decode=True, skyhook_repo=False)
    return new


def _as_nodewright(doc: dict[str, Any]) -> dict[str, Any]:
    return {**copy.deepcopy(doc), "apiVersion": "nodewright.nvidia.com/v1alpha1", "kind": "NodeWright"}


async def test_the_operators_re_encoding_passes_for_anyone() -> None:
    old = copy.deepcopy(SAMPLE)
    old["spec"]["packages"]["node-tuning"]["image"] = "ghcr.io/nvidia/skyhook-packages/tuning:1.3.0"
    new = _operator_update(old)
    assert new["spec"]["interruptionBudget"] == {"percent": 25}
    assert new["spec"]["packages"]["node-tuning"]["name"] == "node-tuning"
    assert new["spec"]["packages"]["node-tuning"]["image"] == "ghcr.io/nvidia/skyhook-packages/tuning"  # cut
    d = await decide(decider(), review(new, op="UPDATE", old=old, user="system:serviceaccount:x:y"))
    assert d.allowed
    assert d.audit == {"decision": "allow", "reason": "spec unchanged"}
    assert d.warnings == []  # nothing was judged


async def test_an_unchanged_spec_passes_even_if_it_would_now_be_refused() -> None:
    """A CR admitted under older rules (or before nodegate) stays editable by its operator."""
    old = copy.deepcopy(SAMPLE)
    old["spec"]["additionalTolerations"] = [{"operator": "Exists"}]  # nodegate would refuse this now
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"team": "ml"}
    d = await decide(decider(), review(new, op="UPDATE", old=old, user="mallory"))
    assert d.allowed
    assert d.audit["reason"] == "spec unchanged"


async def test_a_tag_the_operator_drops_is_no_change_for_skyhook_but_is_for_nodewright() -> None:
    old = no_reboot(SAMPLE)
    new = copy.deepcopy(old)
    new["spec"]["packages"]["node-tuning"]["image"] += ":anything"
    d = await decide(decider(), review(new, op="UPDATE", old=old, user="mallory"))
    assert d.audit.get("reason") == "spec unchanged"
    old_nw, new_nw = _as_nodewright(old), _as_nodewright(new)
    d = await decide(decider(), review(new_nw, op="UPDATE", old=old_nw, user="mallory", kind=NODEWRIGHT))
    assert not d.allowed
    assert [v.rule for v in d.violations] == ["image"]  # NodeWright refuses inline tags


@pytest.mark.parametrize(
    "edit",
    [
        lambda s: s.update(interruptionBudget={"count": 0}),
        lambda s: s["packages"]["boot-marker"].update(version="2.0.1"),
        lambda s: s["packages"]["node-tuning"]["configMap"].update({"grub.conf": "other"}),
        lambda s: s["nodeSelectors"].update(matchLabels={"agentpool": "gpu", "zone": "a"}),
    ],
)
async def test_a_real_change_needs_rights(edit: Any) -> None:
    old = no_reboot(SAMPLE)
    new = copy.deepcopy(old)
    edit(new["spec"])
    d = await decide(decider(), review(new, op="UPDATE", old=old, user="mallory"))
    assert not d.allowed
    assert {v.rule for v in d.violations} == {"rbac"}


async def test_pause_and_disable_need_deploy_on_the_pool_and_nothing_else() -> None:
    """alice may deploy to the gpu pool but not reboot: the CR (with a reboot interrupt) is beyond
    what she may create, yet she may pause and resume it; mallory may not."""
    old = copy.deepcopy(SAMPLE)
    for gate in ("skyhook.nvidia.com/pause", "skyhook.nvidia.com/disable", "nodewright.nvidia.com/pause"):
        new = copy.deepcopy(old)
        new["metadata"]["annotations"] = {gate: "true"}
        d = await decide(decider(), review(new, op="UPDATE", old=old, user="alice"))
        assert d.allowed, d.message
        assert d.audit == {"decision": "allow", "policy": "gpu", "reason": "pause/disable"}
        d = await decide(decider(), review(new, op="UPDATE", old=old, user="mallory"))
        assert not d.allowed
        assert {v.rule for v in d.violations} == {"rbac"}
        assert "pause/disable refused" in d.message
        d = await decide(decider(), review(old, op="UPDATE", old=new, user="alice"))  # resuming
        assert d.allowed


async def test_pausing_a_cr_admitted_under_older_rules_needs_deploy_only() -> None:
    old = no_reboot(SAMPLE)
    old["spec"]["additionalTolerations"] = [{"operator": "Exists"}]  # nodegate refuses this today
    old["spec"]["interruptionBudget"] = {"percent": 90}  # beyond the gpu pool's cap
    paused = copy.deepcopy(old)
    paused["metadata"]["annotations"] = {"skyhook.nvidia.com/pause": "true"}
    d = await decide(decider(), review(paused, op="UPDATE", old=old, user="alice"))
    assert d.allowed, d.message
    assert not (await decide(decider(), review(paused, op="UPDATE", old=old, user="mallory"))).allowed


async def test_pause_with_a_spec_change_is_judged_as_a_change() -> None:
    old = no_reboot(SAMPLE)
    new = copy.deepcopy(old)
    new["metadata"]["annotations"] = {"skyhook.nvidia.com/pause": "true"}
    new["spec"]["packages"]["node-tuning"]["image"] = "docker.io/evil/tuning"
    d = await decide(decider(), review(new, op="UPDATE", old=old, user="alice"))
    assert not d.allowed
    assert "registry" in {v.rule for v in d.violations}


async def test_delete_needs_deploy_but_nothing_about_pending_uninstalls() -> None:
    """Upstream's e2e tests delete paused and disabled CRs with uninstalls pending: the operator's
    finalizer keeps them until the uninstalls ran, so nodegate asks nothing about them. Since issue
    33 (finding 5) a DELETE needs deploy on a pool that contains the CR, like a change."""
    paused = copy.deepcopy(UNINSTALL)
    paused["metadata"]["annotations"] = {"skyhook.nvidia.com/pause": "true"}
    paused["status"] = {"nodeState": {"gpu-1": {"collector|3.0.2": {"state": "complete"}}}}
    d = await decide(decider(), review(None, op="DELETE", old=paused, user="mallory"))
    assert not d.allowed
    d = await decide(decider(), review(None, op="DELETE", old=paused, user="root"))
    assert d.allowed, d.message


def _uninstalling(apply: bool, *, on_nodes: bool) -> dict[str, Any]:
    doc = copy.deepcopy(UNINSTALL)
    doc["metadata"]["annotations"] = {}
    doc["spec"]["nodeSelectors"] = {"matchLabels": {"agentpool": "gpu"}}
    doc["spec"]["packages"]["collector"]["uninstall"] = {"enabled": True, "apply": apply}
    doc["status"] = {"nodeState": {"gpu-1": {"collector|3.0.2": {"state": "complete"}} if on_nodes else {}}}
    return doc


async def test_removing_a_package_before_its_uninstall_is_refused_even_for_the_owner() -> None:
    old = _uninstalling(True, on_nodes=True)
    new = copy.deepcopy(old)
    new["spec"]["packages"] = {}
    d = await decide(decider(), review(new, op="UPDATE", old=old, user="bob", groups=("ml-platform",)))
    assert not d.allowed
    assert [(v.rule, v.path) for v in d.violations] == [("uninstall-pending", "spec.packages.collector")]
    done = _uninstalling(True, on_nodes=False)
    d = await decide(decider(), review(new, op="UPDATE", old=done, user="bob", groups=("ml-platform",)))
    assert d.allowed, d.message


async def test_cancelling_an_uninstall_warns() -> None:
    old = _uninstalling(True, on_nodes=True)
    new = _uninstalling(False, on_nodes=True)
    d = await decide(decider(), review(new, op="UPDATE", old=old, user="bob", groups=("ml-platform",)))
    assert d.allowed, d.message
    assert d.warnings[0].startswith("package collector: uninstall cancelled")


@pytest.mark.parametrize(
    ("toleration", "rule"),
    [
        ({"operator": "Exists"}, "toleration-wildcard"),
        ({"key": "nodegate.io/hold", "operator": "Exists"}, "hold-toleration"),
        ({"key": "nodegate.io/hold", "value": "quarantined", "effect": "NoExecute"}, "hold-toleration"),
    ],
)
async def test_nodegates_toleration_rules_hold_under_every_policy(
    toleration: dict[str, Any], rule: str
) -> None:
    doc = no_reboot(SAMPLE)
    doc["spec"]["additionalTolerations"] = [toleration]
    d = await decide(decider(), review(doc, user="bob", groups=("ml-platform",)))
    assert not d.allowed
    assert [v.rule for v in d.violations] == [rule]
    assert d.message == "package CR refused by nodegate"


async def test_a_runtime_required_cr_needs_no_hold_toleration() -> None:
    """The old workaround is gone: the mutating webhook gives package pods their tolerations."""
    doc = no_reboot(SAMPLE)
    doc["spec"]["runtimeRequired"] = True
    lenient = [policy("gpu", **{**_gpu_spec(), "allowRuntimeRequired": True})]
    d = await decide(decider(lenient), review(doc))
    assert d.allowed, d.message


def _gpu_spec(**extra: Any) -> dict[str, Any]:
    return {**gpu_policies()[0].spec.model_dump(by_alias=True, exclude_none=True), **extra}


async def _judge(
    doc: dict[str, Any], *, kind: tuple[str, str] = ("skyhook.nvidia.com", "Skyhook"), **spec: Any
) -> Any:
    return await decide(decider([policy("gpu", **_gpu_spec(**spec))]), review(doc, user="alice", kind=kind))


async def test_strict_versions_are_a_policy_choice() -> None:
    doc = no_reboot(SAMPLE)
    doc["spec"]["packages"]["node-tuning"]["version"] = "1.3"
    doc["spec"]["packages"]["boot-marker"]["dependsOn"] = {"node-tuning": "1.3"}
    assert (await _judge(doc)).allowed  # what NodeWright accepts
    d = await _judge(doc, versions="semver")
    assert [(v.rule, v.path) for v in d.violations] == [("semver", "spec.packages.node-tuning.version")]


async def test_tags_must_equal_the_version_when_the_policy_says_so() -> None:
    doc = no_reboot(SAMPLE)
    doc["spec"]["packages"]["node-tuning"]["image"] += ":latest"
    d = await _judge(doc)
    assert d.allowed, d.message
    assert any("drops ':latest'" in w for w in d.warnings)
    d = await _judge(doc, images={"registries": ["ghcr.io/nvidia"], "tagMustEqualVersion": True})
    assert [(v.rule, v.path) for v in d.violations] == [("tag-version", "spec.packages.node-tuning.image")]
    doc["spec"]["packages"]["node-tuning"]["image"] = "ghcr.io/nvidia/skyhook-packages/tuning:1.3.0"
    assert (await _judge(doc, images={"registries": ["ghcr.io/nvidia"], "tagMustEqualVersion": True})).allowed


async def test_registries_judge_what_the_operator_pulls() -> None:
    """skyhook.nvidia.com cuts the image at its first ':', so a ported registry becomes a Docker Hub
    name; nodewright.nvidia.com keeps it."""
    ported = {"registries": ["registry.example.com:5000/nodewright"]}
    doc = no_reboot(SAMPLE)
    for pkg in doc["spec"]["packages"].values():
        pkg["image"] = "registry.example.com:5000/nodewright/pkg"
    d = await _judge(doc, images=ported)
    assert {v.rule for v in d.violations} == {"registry"}
    assert "the operator pulls 'registry.example.com'" in d.violations[0].message
    d = await _judge(_as_nodewright(doc), images=ported, kind=NODEWRIGHT)
    assert d.allowed, d.message


async def test_an_image_that_does_not_parse_is_under_no_registry() -> None:
    doc = no_reboot(SAMPLE)
    doc["spec"]["packages"]["node-tuning"]["image"] = ""
    d = await _judge(doc)
    assert [(v.rule, v.path) for v in d.violations] == [("registry", "spec.packages.node-tuning.image")]
    assert (await _judge(doc, images={"registries": ["*"]})).allowed  # "*": any image at all


async def test_require_digest_wants_a_real_digest() -> None:
    doc = no_reboot(SAMPLE)
    for pkg in doc["spec"]["packages"].values():
        pkg["containerSHA"] = DIGEST
    pinned = {"registries": ["ghcr.io/nvidia"], "requireDigest": True}
    assert (await _judge(doc, images=pinned)).allowed
    doc["spec"]["packages"]["node-tuning"]["containerSHA"] = "sha256:abc"
    d = await _judge(doc, images=pinned)
    assert [(v.rule, v.path) for v in d.violations] == [
        ("require-digest", "spec.packages.node-tuning.containerSHA")
    ]
    d = await _judge(doc)
    assert any("is not sha256:<64 hex>" in w for w in d.warnings)


async def test_a_dependency_cycle_warns() -> None:
    doc = no_reboot(SAMPLE)
    doc["spec"]["packages"]["node-tuning"]["dependsOn"] = {"boot-marker": "2.0.0"}
    doc["spec"]["additionalTolerations"] = hold_tolerations(NODEGATE_HOLD)  # as the mutation leaves it
    d = await _judge(doc)
    assert d.allowed, d.message
    assert d.warnings[0].startswith("dependsOn cycle ")


async def test_the_unchanged_path_reads_nothing_else() -> None:
    """A policy source that is not ready and no authorizer at all: an unchanged UPDATE still passes
    (no policy, RBAC or structural check runs), a changed one is refused."""

    class NotReady:
        def policies(self) -> None:
            return None

    class NoAuthorizer:
        async def allowed(self, user: Any, attrs: Any) -> bool:
            raise AssertionError("asked")

    d_ = Decider(NotReady(), NoAuthorizer(), NODEGATE)
    old = copy.deepcopy(SAMPLE)
    old["spec"]["packages"]["node-tuning"]["version"] = "not a version"  # structurally refused
    d = await decide(d_, review(_operator_update(old), op="UPDATE", old=old, user="x"))
    assert d.allowed
    new = copy.deepcopy(SAMPLE)
    d = await decide(d_, review(new, op="UPDATE", old=old, user="x"))
    assert not d.allowed
