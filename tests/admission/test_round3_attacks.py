"""Issue 33, findings 4, 5 and 7, as an attacker tries them, each next to the honest request that
must keep passing.

The attacks go through the decider exactly as the webhook calls it (an AdmissionReview on the
wire). The package CRs' selectors and the operator's accounts are given to the decider as
attributes (``selector_source``, ``operators``) after it is built, so these tests also run against
the code before the fix and fail there on the verdict (docs/threat-model.md, "Round 3").
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import Any

import pytest

from admission.hold import nodes
from admission.rbac.evaluator import RbacEvaluator
from admission.reading.policy import PackagePolicy
from admission.webhook import Decider, LocalRbac, StaticPolicies
from tests.admission.test_admission_rules import policy
from tests.admission.test_webhook import NODEGATE, _binding, _role, decide, no_reboot, review
from tests.support.package_crs import SAMPLE

NODE = ("", "Node")
KUBELET = "system:node:gpu-1"
OPERATOR = "system:serviceaccount:nodewright:nodewright-controller-manager"
HOLD = {"key": "nodegate.io/hold", "value": "packages-pending", "effect": "NoSchedule"}


@dataclass(frozen=True)
class Sel:
    """A package CR's selector as the service's watch hands it to the decider."""

    ref: str
    selector: dict[str, Any] | None


class Selectors:
    def __init__(self, items: list[Sel] | None) -> None:
        self.items = items

    def package_selectors(self) -> list[Sel] | None:
        return self.items


@functools.cache
def team_policies() -> list[PackagePolicy]:
    """Validated when a test first asks (functools.cache), not at import: a refusal by the installed
    pydantic or the policy model fails those tests, not the collection."""
    return [
        policy(
            "gpu",
            nodeSelector={"matchLabels": {"agentpool": "gpu"}},
            images={"registries": ["ghcr.io/nvidia"]},
        ),
        policy(
            "cpu",
            nodeSelector={"matchLabels": {"agentpool": "cpu"}},
            images={"registries": ["ghcr.io/nvidia"]},
        ),
    ]


RBAC = [
    _role("deploy-gpu", "deploy", ["gpu"]),
    _role("deploy-cpu", "deploy", ["cpu"]),
    _binding("alice-deploys-gpu", "deploy-gpu", "User", "alice"),
    _binding("bob-deploys-cpu", "deploy-cpu", "User", "bob"),
]


def deciding(selectors: list[Sel] | None = None, operators: tuple[str, ...] = (OPERATOR,)) -> Decider:
    d = Decider(StaticPolicies(team_policies()), LocalRbac(RbacEvaluator.from_objects(RBAC)), NODEGATE)
    d.selector_source = Selectors(selectors)
    d.operators = frozenset(operators)
    return d


# -- 4: a kubelet un-selects its own Node ---------------------------------------------------------

DRIVERS = Sel("skyhook.nvidia.com/drivers", {"matchLabels": {"nvidia.com/gpu.product": "H100"}})
NOT_CORDONED = Sel(
    "nodewright.nvidia.com/firmware",
    {"matchExpressions": [{"key": "example.com/maintenance", "operator": "DoesNotExist"}]},
)
NOT_LAB = Sel(
    "nodewright.nvidia.com/hardening",
    {"matchExpressions": [{"key": "example.com/env", "operator": "NotIn", "values": ["lab"]}]},
)
CRS = [DRIVERS, NOT_CORDONED, NOT_LAB]


def gpu_node(labels: dict[str, str], boot: str = "b-1") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "gpu-1",
            "labels": {"kubernetes.io/hostname": "gpu-1", **labels},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"taints": [HOLD]},
        "status": {"nodeInfo": {"bootID": boot}},
    }


SELECTED = gpu_node({"nvidia.com/gpu.product": "H100"})


def node_update(new: dict[str, Any], old: dict[str, Any], user: str = KUBELET, status: bool = False) -> Any:
    body = review(new, op="UPDATE", old=old, user=user, kind=NODE)
    body["request"]["resource"] = {"group": "", "version": "v1", "resource": "nodes"}
    if status:
        body["request"]["subResource"] = "status"
    return body


@pytest.mark.parametrize("status", [False, True], ids=["nodes", "nodes/status"])
@pytest.mark.parametrize(
    ("labels", "leaves"),
    [
        ({}, "skyhook.nvidia.com/drivers"),  # the label the CR selects by, removed
        ({"nvidia.com/gpu.product": "A100"}, "skyhook.nvidia.com/drivers"),  # changed
        (
            {"nvidia.com/gpu.product": "H100", "example.com/maintenance": "x"},
            "nodewright.nvidia.com/firmware",
        ),
        ({"nvidia.com/gpu.product": "H100", "example.com/env": "lab"}, "nodewright.nvidia.com/hardening"),
    ],
    ids=["removed", "changed", "does-not-exist", "not-in"],
)
async def test_a_kubelet_may_not_take_its_node_out_of_a_crs_selection(
    labels: dict[str, str], leaves: str, status: bool
) -> None:
    d = await decide(deciding(CRS), node_update(gpu_node(labels), SELECTED, status=status))
    assert not d.allowed
    assert [v.rule for v in d.violations] == ["node-package-selection"]
    assert d.audit["rule"] == "node-package-selection"
    assert leaves in d.violations[0].message
    # The same change by an administrator is not the node's own doing: judged by RBAC, not here.
    admin = await decide(deciding(CRS), node_update(gpu_node(labels), SELECTED, user="kubernetes-admin"))
    assert admin.allowed, admin.message


async def test_a_kubelets_honest_writes_pass() -> None:
    """Its well-known labels added to the Node nodegate pre-created (more CRs may select it: the
    node is held longer, never released earlier), a label no CR reads, a status report."""
    precreated = gpu_node(
        {"nvidia.com/gpu.product": "H100", "node-restriction.kubernetes.io/nodegate.io-attested": "true"}
    )
    registered = copy.deepcopy(precreated)
    registered["metadata"]["labels"].update({"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"})
    for new, old in [
        (registered, precreated),
        (gpu_node({"nvidia.com/gpu.product": "H100", "example.com/rack": "r7"}), SELECTED),
        (gpu_node({"nvidia.com/gpu.product": "H100"}, boot="b-2"), SELECTED),
    ]:
        d = await decide(deciding(CRS), node_update(new, old))
        assert d.allowed, d.message
    # A CR that newly selects the node: it only holds it longer.
    joins = await decide(
        deciding(CRS), node_update(gpu_node({"nvidia.com/gpu.product": "H100"}), gpu_node({}))
    )
    assert joins.allowed, joins.message


async def test_a_selector_nobody_can_read_never_lets_a_node_go() -> None:
    unreadable = Sel("skyhook.nvidia.com/odd", {"matchExpressions": [{"key": "a", "operator": "Near"}]})
    d = await decide(deciding([unreadable]), node_update(gpu_node({}), SELECTED))
    assert d.allowed  # it selects every node, before and after


async def test_label_changes_fail_closed_while_the_crs_are_not_listed() -> None:
    d = await decide(deciding(None), node_update(gpu_node({}), SELECTED))
    assert not d.allowed
    assert [v.rule for v in d.violations] == ["node-package-selection"]
    assert "has not listed the NodeWright/Skyhook CRs yet" in d.violations[0].message
    same_labels = await decide(
        deciding(None), node_update(gpu_node({"nvidia.com/gpu.product": "H100"}, "b-2"), SELECTED)
    )
    assert same_labels.allowed  # nothing to know for a write that keeps the labels


# -- 5: DELETE (and NodeWright's finalizer) un-gates another team's pool ----------------------------

CPU_CR = no_reboot(SAMPLE)
CPU_CR["metadata"]["name"] = "cpu-tuning"
CPU_CR["spec"]["nodeSelectors"] = {"matchLabels": {"agentpool": "cpu"}}
SKYHOOK = ("skyhook.nvidia.com", "Skyhook")
NODEWRIGHT = ("nodewright.nvidia.com", "NodeWright")


def stored(kind: tuple[str, str], finalizer: str | None = None, deleting: bool = False) -> dict[str, Any]:
    doc = copy.deepcopy(CPU_CR)
    doc["apiVersion"], doc["kind"] = f"{kind[0]}/v1alpha1", kind[1]
    if finalizer:
        doc["metadata"]["finalizers"] = [finalizer]
    if deleting:
        doc["metadata"]["deletionTimestamp"] = "2026-12-05T10:00:00Z"
    return doc


@pytest.mark.parametrize("kind", [SKYHOOK, NODEWRIGHT], ids=["skyhook", "nodewright"])
async def test_deleting_another_pools_cr_needs_deploy_there(kind: tuple[str, str]) -> None:
    """alice may deploy to the gpu pool; her pause of the cpu pool's CR is refused, and so is its
    DELETE, which would release the cpu nodes without their packages."""
    cr = stored(kind, "skyhook.nvidia.com/skyhook")
    paused = copy.deepcopy(cr)
    paused["metadata"]["annotations"] = {"skyhook.nvidia.com/pause": "true"}
    assert not (
        await decide(deciding(), review(paused, op="UPDATE", old=cr, user="alice", kind=kind))
    ).allowed
    d = await decide(deciding(), review(None, op="DELETE", old=cr, user="alice", kind=kind))
    assert not d.allowed
    assert [v.rule for v in d.violations] == ["rbac"]
    assert "alice lacks verb deploy on packagepolicies/cpu in nodegate.io" in str(d.violations[0])
    assert "package CR delete refused" in d.message
    ok = await decide(deciding(), review(None, op="DELETE", old=cr, user="bob", kind=kind))
    assert ok.allowed, ok.message
    assert ok.audit == {"decision": "allow", "policy": "cpu", "reason": "delete"}


@pytest.mark.parametrize("kind", [SKYHOOK, NODEWRIGHT], ids=["skyhook", "nodewright"])
@pytest.mark.parametrize("finalizer", ["skyhook.nvidia.com/skyhook", "nodewright.nvidia.com/nodewright"])
async def test_taking_nodewrights_finalizer_off_is_a_removal(kind: tuple[str, str], finalizer: str) -> None:
    before = stored(kind, finalizer, deleting=True)
    after = copy.deepcopy(before)
    after["metadata"]["finalizers"] = []
    d = await decide(deciding(), review(after, op="UPDATE", old=before, user="alice", kind=kind))
    assert not d.allowed
    assert [v.rule for v in d.violations] == ["rbac"]
    assert "finalizer removal refused" in d.message
    ok = await decide(deciding(), review(after, op="UPDATE", old=before, user="bob", kind=kind))
    assert ok.allowed, ok.message
    assert ok.audit == {"decision": "allow", "policy": "cpu", "reason": "finalizer removal"}


@pytest.mark.parametrize("kind", [SKYHOOK, NODEWRIGHT], ids=["skyhook", "nodewright"])
async def test_the_operators_own_removals_pass_without_a_check(kind: tuple[str, str]) -> None:
    """The operator takes its finalizer off once the uninstalls ran (and strips the legacy one from a
    migrated Skyhook); upstream's chart deletes every CR with the operator's account before an
    uninstall. No policy need be loaded for either."""
    before = stored(kind, "nodewright.nvidia.com/nodewright", deleting=True)
    after = copy.deepcopy(before)
    after["metadata"]["finalizers"] = []
    d = deciding()
    d.policy_source = StaticPolicies([])
    for body in (
        review(after, op="UPDATE", old=before, user=OPERATOR, kind=kind),
        review(None, op="DELETE", old=stored(kind), user=OPERATOR, kind=kind),
    ):
        decision = await decide(d, body)
        assert decision.allowed, decision.message
    # Another account of the operator's namespace is nobody special.
    other = "system:serviceaccount:nodewright:default"
    refused = await decide(d, review(after, op="UPDATE", old=before, user=other, kind=kind))
    assert not refused.allowed


async def test_adding_the_finalizer_and_other_metadata_still_pass_for_anyone() -> None:
    cr = stored(SKYHOOK)
    finalized = stored(SKYHOOK, "skyhook.nvidia.com/skyhook")
    d = await decide(deciding(), review(finalized, op="UPDATE", old=cr, user="mallory"))
    assert d.allowed
    assert d.audit["reason"] == "spec unchanged"


# -- 7: Node CREATE with a hold value package pods tolerate --------------------------------------------


@pytest.mark.parametrize("value", ["packages-pending", "validation-failed", "released", ""])
def test_a_node_created_by_anyone_but_nodegate_carries_unattested(value: str) -> None:
    taint = {"key": "nodegate.io/hold", "value": value, "effect": "NoSchedule"}
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1"}, "spec": {"taints": [taint]}}
    for user in (KUBELET, "kubernetes-admin", "system:serviceaccount:kube-system:cloud-node-manager"):
        found = nodes.node_violations("CREATE", node, None, username=user, owner=NODEGATE)
        assert [v.rule for v in found] == ["node-hold-value"], user
        assert "must carry nodegate.io/hold=unattested" in found[0].message
    assert nodes.node_violations("CREATE", node, None, username=NODEGATE, owner=NODEGATE) == []
    both = copy.deepcopy(node)
    both["spec"]["taints"].insert(0, {**taint, "value": "unattested"})
    assert [
        v.rule for v in nodes.node_violations("CREATE", both, None, username=KUBELET, owner=NODEGATE)
    ] == ["node-hold-value"]
    honest = copy.deepcopy(node)
    honest["spec"]["taints"] = [{**taint, "value": "unattested"}]
    assert nodes.node_violations("CREATE", honest, None, username=KUBELET, owner=NODEGATE) == []


async def test_the_webhook_refuses_a_kubelet_registering_with_packages_pending() -> None:
    node = gpu_node({})
    d = await decide(deciding(CRS), review(node, op="CREATE", user=KUBELET, kind=NODE))
    assert not d.allowed
    assert d.audit == {"decision": "deny", "rule": "node-hold-value"}
    precreated = await decide(deciding(CRS), review(node, op="CREATE", user=NODEGATE, kind=NODE))
    assert precreated.allowed  # nodegate's own pre-created Node at join


async def test_a_stored_cr_nodegate_cannot_read_may_select_every_node() -> None:
    """Its removal needs deploy on a policy of the pool of every node, as the gate holds it."""
    odd = stored(SKYHOOK)
    odd["spec"]["packages"] = "not a map"
    d = await decide(deciding(), review(None, op="DELETE", old=odd, user="bob"))
    assert not d.allowed
    assert [v.rule for v in d.violations] == ["pool"]
    everything = deciding()
    everything.policy_source = StaticPolicies([*team_policies(), policy("all", images={"registries": ["*"]})])
    everything.authorizer = LocalRbac(
        RbacEvaluator.from_objects(
            [*RBAC, _role("deploy-all", "deploy", ["all"]), _binding("r", "deploy-all", "User", "root")]
        )
    )
    assert not (await decide(everything, review(None, op="DELETE", old=odd, user="bob"))).allowed
    ok = await decide(everything, review(None, op="DELETE", old=odd, user="root"))
    assert ok.allowed, ok.message
    assert ok.audit["policy"] == "all"
