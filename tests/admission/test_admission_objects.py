"""Admission of Node objects, CR updates and deletes, and DeploymentPolicies."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from admission.hold import nodes
from admission.policies import deploymentpolicy, rules
from tests.admission.test_admission_rules import cr, policy
from tests.support.package_crs import SAMPLE, UNINSTALL

NODEGATE = "system:serviceaccount:nodegate:nodegate"
HOLD = {"key": "nodegate.io/hold", "value": "unattested", "effect": "NoSchedule"}


def node(*taints: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "gpu-1"},
        "spec": {"taints": list(taints)},
    }


def node_rules(op: str, new: Any, old: Any = None, user: str = "system:node:gpu-1") -> list[str]:
    return [v.rule for v in nodes.node_violations(op, new, old, username=user, owner=NODEGATE)]


def test_node_create_needs_the_hold_taint() -> None:
    assert node_rules("CREATE", node()) == ["node-hold-taint"]
    assert node_rules("CREATE", node({"key": "other", "effect": "NoSchedule"})) == ["node-hold-taint"]
    assert node_rules("CREATE", {"kind": "Node", "spec": "garbage"}) == ["node-hold-taint"]
    assert node_rules("CREATE", node(HOLD)) == []


@pytest.mark.parametrize(
    "after",
    [
        node(),  # removed
        node({**HOLD, "value": "packages-pending"}),  # changed reason
        node({**HOLD, "effect": "PreferNoSchedule"}),  # weakened
    ],
)
def test_only_nodegate_may_remove_or_change_the_hold_taint(after: dict[str, Any]) -> None:
    before = node(HOLD, {"key": "nvidia.com/gpu", "effect": "NoSchedule"})
    assert node_rules("UPDATE", after, before) == ["node-hold-taint"]
    assert node_rules("UPDATE", after, before, user="kubernetes-admin") == ["node-hold-taint"]
    assert node_rules("UPDATE", after, before, user=NODEGATE) == []


def test_other_node_updates_pass() -> None:
    before = node(HOLD)
    after = copy.deepcopy(before)
    after["metadata"]["labels"] = {"a": "b"}
    after["spec"]["taints"].append({"key": "x", "effect": "NoSchedule"})
    assert node_rules("UPDATE", after, before) == []
    assert node_rules("UPDATE", node(HOLD), node()) == []  # adding the taint is always fine
    assert node_rules("DELETE", None, before) == []


def test_update_changes() -> None:
    old = cr(SAMPLE)
    same = cr(SAMPLE)
    assert not rules.spec_changed(old, same)
    bumped = copy.deepcopy(SAMPLE)
    bumped["spec"]["packages"]["node-tuning"]["version"] = "1.3.1"
    bumped["spec"]["packages"]["boot-marker"]["dependsOn"] = {"node-tuning": "1.3.1"}
    new = cr(bumped)
    assert rules.spec_changed(old, new)
    # a version bump of a rebooting package reboots again
    assert rules.new_reboots(old, new) == ["node-tuning"]
    other = copy.deepcopy(SAMPLE)
    other["spec"]["packages"]["boot-marker"]["configMap"]["apply.sh"] = "changed"
    assert rules.new_reboots(old, cr(other)) == []
    assert rules.new_reboots(None, old) == ["node-tuning"]
    paused = copy.deepcopy(SAMPLE)
    paused["metadata"]["annotations"] = {"skyhook.nvidia.com/pause": "true"}
    assert rules.spec_changed(old, cr(paused))


def _status(*entries: str) -> dict[str, Any]:
    return {
        "nodeState": {"gpu-1": {e: {"stage": "apply", "state": "complete"} for e in entries}, "gpu-2": {}}
    }


def _uninstall_rules(
    old_pkg: dict[str, Any] | None, new_pkg: dict[str, Any] | None, status: Any
) -> tuple[list[str], list[str]]:
    old_doc, new_doc = copy.deepcopy(UNINSTALL), copy.deepcopy(UNINSTALL)
    for doc, pkg in ((old_doc, old_pkg), (new_doc, new_pkg)):
        if pkg is None:
            del doc["spec"]["packages"]["collector"]
        else:
            doc["spec"]["packages"]["collector"].update(pkg)
    if status is not None:
        old_doc["status"] = status
    old, new = rules.read_package_cr(old_doc), rules.read_package_cr(new_doc)
    assert isinstance(old, rules.CrView)
    assert isinstance(new, rules.CrView)
    found, warnings = rules.update_rules(old_doc, old, new)
    return [v.path for v in found], warnings


ENABLED, APPLYING = (
    {"uninstall": {"enabled": True, "apply": False}},
    {"uninstall": {"enabled": True, "apply": True}},
)
OFF = {"uninstall": {"enabled": False, "apply": False}}


@pytest.mark.parametrize(
    ("old", "new", "status", "refused"),
    [
        # removing an uninstall-enabled package before it is gone from every node
        (ENABLED, None, _status("collector|3.0.2"), ["spec.packages.collector"]),
        (APPLYING, None, _status("collector|3.0.2"), ["spec.packages.collector"]),
        (APPLYING, None, _status(), []),  # uninstalled everywhere
        (ENABLED, None, None, []),  # no node state at all: nothing to uninstall
        (ENABLED, None, {"nodeState": {}}, []),
        (ENABLED, None, {"nodeState": "garbage"}, ["spec.packages.collector"]),  # unreadable: not uninstalled
        # without uninstall support, removal is upstream's old way
        (OFF, None, _status("collector|3.0.2"), []),
        (ENABLED, None, _status("collector|1.0.0"), []),  # another version is what the node has
        # downgrades of an uninstall-enabled package
        (
            ENABLED,
            {**ENABLED, "version": "3.0.1"},
            None,
            ["spec.packages.collector.version"],
        ),  # apply not set first
        (
            APPLYING,
            {**APPLYING, "version": "3.0.1"},
            _status("collector|3.0.2"),
            ["spec.packages.collector.version"],
        ),
        (APPLYING, {**ENABLED, "version": "v3.0"}, _status(), []),  # uninstalled: allowed (a warning)
        (ENABLED, {**ENABLED, "version": "3.1"}, _status("collector|3.0.2"), []),  # an upgrade
        (ENABLED, {**ENABLED, "version": "not-semver"}, _status("collector|3.0.2"), []),  # not comparable
        (OFF, {**OFF, "version": "1.0.0"}, _status("collector|3.0.2"), []),
        (
            ENABLED,
            {**ENABLED, "version": "3.0.2-rc.1"},
            None,
            ["spec.packages.collector.version"],
        ),  # a pre-release is older
    ],
)
def test_uninstall_rules_on_update(old: Any, new: Any, status: Any, refused: list[str]) -> None:
    """NodeWright's rules, from the old object's spec and its status.nodeState."""
    assert _uninstall_rules(old, new, status)[0] == refused


def test_cancelling_an_uninstall_is_a_warning() -> None:
    found, warnings = _uninstall_rules(APPLYING, ENABLED, _status("collector|3.0.2"))
    assert found == []
    assert warnings == [
        "package collector: uninstall cancelled; nodes where it completed will install it again"
    ]
    assert _uninstall_rules(ENABLED, APPLYING, None) == ([], [])


# -- DeploymentPolicy ----------------------------------------------------------------------------

# The project's own DeploymentPolicy, in the shape of upstream's sample (public test data, replayed
# by test_upstream_corpus): a default with a percent budget and a fixed strategy, then a
# one-node-at-a-time compartment and a percent compartment that grows exponentially.
DP = {
    "apiVersion": "skyhook.nvidia.com/v1alpha1",
    "kind": "DeploymentPolicy",
    "metadata": {"name": "staged-rollout"},
    "spec": {
        "default": {"budget": {"percent": 80}, "strategy": {"fixed": {"initialBatch": 2}}},
        "compartments": [
            {"name": "canary", "selector": {"matchLabels": {"rollout": "canary"}},
             "budget": {"count": 1}, "strategy": {"fixed": {"initialBatch": 1}}},
            {"name": "bulk", "selector": {"matchLabels": {"rollout": "bulk"}}, "budget": {"percent": 40},
             "strategy": {"exponential": {"initialBatch": 3, "growthFactor": 3}}},
        ],
    },
}  # fmt: skip


def dp_rules(doc: dict[str, Any], *policies: Any) -> list[tuple[str, str]]:
    return [(v.rule, v.path) for v in deploymentpolicy.deployment_policy_violations(doc, list(policies))]


@pytest.mark.parametrize("group", ["skyhook.nvidia.com", "nodewright.nvidia.com"])
def test_a_deployment_policy_is_valid(group: str) -> None:
    doc = {**copy.deepcopy(DP), "apiVersion": f"{group}/v1alpha1"}
    assert dp_rules(doc) == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda s: s["default"]["budget"].update(count=3), ("budget", "spec.default.budget")),
        (
            lambda s: s["default"].update(strategy={"fixed": {}, "linear": {}}),
            ("strategy", "spec.default.strategy"),
        ),
        (
            lambda s: s["compartments"][0].update(name="bulk"),
            ("compartment-name", "spec.compartments[1].name"),  # the second use of a name
        ),
        (
            lambda s: s["compartments"][1].update(name="__default__"),
            ("compartment-name", "spec.compartments[1].name"),
        ),
        (
            lambda s: s["compartments"][1]["budget"].update(percent=0),
            ("budget", "spec.compartments[1].budget.percent"),
        ),
        (lambda s: s.pop("default"), ("budget", "spec.default.budget")),
        (lambda s: s["default"].update(strategy={}), ("strategy", "spec.default.strategy")),
        (
            lambda s: s["compartments"][1].update(selector={"matchLabels": {"rollout": "canary"}}),
            ("compartment-selector", "spec.compartments[1].selector"),
        ),
        (
            lambda s: s["compartments"][1].update(selector={"matchLabels": {"-rollout": "bulk"}}),
            ("selector", "spec.compartments[1].selector.matchLabels.-rollout"),
        ),
        (
            lambda s: s["compartments"][0].update(selector={}) or s["compartments"][1].pop("selector"),
            ("compartment-selector", "spec.compartments[1].selector"),  # absent and {} are the same
        ),
    ],
)
def test_deployment_policy_shape_rules(change: Any, expected: tuple[str, str]) -> None:
    doc = copy.deepcopy(DP)
    change(doc["spec"])
    assert expected in dp_rules(doc)


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s["compartments"][0].pop("strategy"),  # a compartment's strategy is optional
        lambda s: s["default"].pop("strategy"),  # NodeWright's webhook too (its CRD requires it)
        # overlapping but different selectors, and the same requirements in another order
        lambda s: s["compartments"][1].update(selector={"matchLabels": {"rollout": "canary", "zone": "a"}}),
        lambda s: s["compartments"][1].update(selector={"matchLabels": {}}),  # {} matchLabels is not absent
    ],
)
def test_deployment_policy_shapes_upstream_allows(change: Any) -> None:
    doc = copy.deepcopy(DP)
    change(doc["spec"])
    assert dp_rules(doc) == []


def test_deployment_policy_budgets_within_every_pool_cap() -> None:
    capped = policy(
        "bulk-pool", nodeSelector={"matchLabels": {"rollout": "bulk"}}, maxInterruptionBudget={"percent": 25}
    )
    other = policy("canary-pool", nodeSelector={"matchLabels": {"rollout": "canary"}},
                   maxInterruptionBudget={"count": 1})  # fmt: skip
    found = dp_rules(copy.deepcopy(DP), capped, other)
    # the default (80%) can reach every pool; "bulk" (40%) reaches bulk-pool; "canary" (count 1) is fine
    assert ("budget-cap", "spec.default.budget") in found
    assert ("budget-cap", "spec.compartments[1].budget") in found
    assert ("budget-cap", "spec.compartments[0].budget") not in found


def test_could_overlap() -> None:
    sel = rules.Selector.model_validate
    assert deploymentpolicy.could_overlap({"env": "test"}, sel({}))
    assert not deploymentpolicy.could_overlap({"env": "test"}, sel({"matchLabels": {"env": "prod"}}))
    assert not deploymentpolicy.could_overlap(
        {"env": "test"}, sel({"matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["test"]}]})
    )
    assert deploymentpolicy.could_overlap({"env": "test"}, sel({"matchLabels": {"zone": "a"}}))


@pytest.mark.parametrize("prefix", ["skyhook.nvidia.com", "nodewright.nvidia.com"])
def test_a_node_may_not_rewrite_its_package_state(prefix: str) -> None:
    """The operator rebuilds the CR's status.nodeState from these annotations at its next
    reconcile, so a kubelet that could rewrite them could forge "complete" for the gate."""
    key = f"{prefix}/nodeState_gpu-stack"
    before = node(HOLD)
    before["metadata"]["annotations"] = {key: '{"gpu-driver|550.54.15":{"state":"in_progress"}}'}
    forged = copy.deepcopy(before)
    forged["metadata"]["annotations"][key] = '{"gpu-driver|550.54.15":{"state":"complete"}}'
    dropped = copy.deepcopy(before)
    del dropped["metadata"]["annotations"][key]
    for after in (forged, dropped):
        assert node_rules("UPDATE", after, before) == ["node-package-state"]
    operator = "system:serviceaccount:skyhook:skyhook-operator-controller-manager"
    assert node_rules("UPDATE", forged, before, user=operator) == []
    other = copy.deepcopy(before)
    other["metadata"]["annotations"]["example.com/x"] = "y"  # the node's own annotations: fine
    assert node_rules("UPDATE", other, before) == []
