"""Admission of Node objects, CR updates and deletes, and DeploymentPolicies."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from admission import deploymentpolicy, nodes, rules
from tests.admission.test_admission_rules import SAMPLE, UNINSTALL, cr, policy

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
    bumped["spec"]["packages"]["tuning"]["version"] = "1.0.1"
    bumped["spec"]["packages"]["something-important"]["dependsOn"] = {"tuning": "1.0.1"}
    new = cr(bumped)
    assert rules.spec_changed(old, new)
    assert rules.new_reboots(old, new) == ["tuning"]  # a version bump of a rebooting package reboots again
    other = copy.deepcopy(SAMPLE)
    other["spec"]["packages"]["something-important"]["configMap"]["apply.sh"] = "changed"
    assert rules.new_reboots(old, cr(other)) == []
    assert rules.new_reboots(None, old) == ["tuning"]
    paused = copy.deepcopy(SAMPLE)
    paused["metadata"]["annotations"] = {"skyhook.nvidia.com/pause": "true"}
    assert rules.spec_changed(old, cr(paused))


def _with_status(doc: dict[str, Any], annotation: str | None) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    if annotation:
        doc["metadata"]["annotations"] = {annotation: "true"}
    doc["status"] = {"nodeState": {"gpu-1": {"mypkg|2.1.4": {"stage": "apply", "state": "complete"}}}}
    return doc


def test_delete_with_pending_uninstall_follows_upstream() -> None:
    assert rules.delete_violations(_with_status(UNINSTALL, None)) == []  # the operator will uninstall
    for gate in ("skyhook.nvidia.com/pause", "nodewright.nvidia.com/disable"):
        found = rules.delete_violations(_with_status(UNINSTALL, gate))
        assert [v.rule for v in found] == ["delete-pending-uninstall"]
        assert "mypkg" in found[0].message
    done = _with_status(UNINSTALL, "skyhook.nvidia.com/pause")
    done["status"]["nodeState"] = {}
    assert rules.delete_violations(done) == []
    assert rules.delete_violations({"kind": "nonsense"}) == []


# -- DeploymentPolicy ----------------------------------------------------------------------------

DP = {
    "apiVersion": "skyhook.nvidia.com/v1alpha1",
    "kind": "DeploymentPolicy",
    "metadata": {"name": "sample-policy"},
    "spec": {
        "default": {"budget": {"percent": 100}, "strategy": {"fixed": {"initialBatch": 1}}},
        "compartments": [
            {"name": "critical", "selector": {"matchLabels": {"priority": "critical"}},
             "budget": {"count": 1}, "strategy": {"fixed": {"initialBatch": 1}}},
            {"name": "test", "selector": {"matchLabels": {"env": "test"}}, "budget": {"percent": 50},
             "strategy": {"exponential": {"initialBatch": 2, "growthFactor": 2}}},
        ],
    },
}  # fmt: skip


def dp_rules(doc: dict[str, Any], *policies: Any) -> list[tuple[str, str]]:
    return [(v.rule, v.path) for v in deploymentpolicy.deployment_policy_violations(doc, list(policies))]


@pytest.mark.parametrize("group", ["skyhook.nvidia.com", "nodewright.nvidia.com"])
def test_upstream_deployment_policy_is_valid(group: str) -> None:
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
            lambda s: s["compartments"][0].update(name="test"),
            ("compartment-name", "spec.compartments[0].name"),
        ),
        (
            lambda s: s["compartments"][1].update(name="__default__"),
            ("compartment-name", "spec.compartments[1].name"),
        ),
        (
            lambda s: s["compartments"][1]["budget"].update(percent=0),
            ("budget", "spec.compartments[1].budget.percent"),
        ),
        (lambda s: s.pop("default"), ("default", "spec.default")),
    ],
)
def test_deployment_policy_shape_rules(change: Any, expected: tuple[str, str]) -> None:
    doc = copy.deepcopy(DP)
    change(doc["spec"])
    assert expected in dp_rules(doc)


def test_deployment_policy_budgets_within_every_pool_cap() -> None:
    capped = policy(
        "test-pool", nodeSelector={"matchLabels": {"env": "test"}}, maxInterruptionBudget={"percent": 25}
    )
    other = policy("critical-pool", nodeSelector={"matchLabels": {"priority": "critical"}},
                   maxInterruptionBudget={"count": 1})  # fmt: skip
    found = dp_rules(copy.deepcopy(DP), capped, other)
    # the default (100%) can reach every pool; "test" (50%) reaches test-pool; "critical" (count 1) is fine
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
