"""nodegate's hold and NodeWright's own runtime-required taint (``runtimeRequired`` +
``autoTaintNewNodes``) on the same node, against the emulated API: each is lifted by its owner, in
either order, and the gate never adds, changes or removes the operator's taint (nor its autoTaint
marker). The operator's side is played from its code (NVIDIA/nodewright 71ca22b8,
``skyhook_controller.go``: ``HandleAutoTaint`` adds ``<key>=runtime-required:NoSchedule`` and the
annotation ``<prefix>/autoTaint_<key>`` to a matching node without the taint; ``HandleRuntimeRequired``
removes the taint once every runtimeRequired CR is complete on the node), and its node picker from
:mod:`tests.admission.upstream.picker`: with both taints on the node, the mutated CR is picked."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from bootstrap.gate import Gate
from bootstrap.kube import Kube
from tests.admission.upstream import picker
from tests.gate.test_gate import (
    KEY,
    NODES,
    OTHER,
    SKYHOOKS,
    Clock,
    add_cr,
    hold,
    hold_taints,
    joined,
    make_gate,
    operator_writes,
    register,
    stored,
)
from tests.support.kshim import ShimEmulator

pytestmark = pytest.mark.kmock(cls=ShimEmulator)


@pytest.fixture
async def kube(kmock: Any) -> AsyncIterator[Kube]:
    register(kmock)
    k = Kube.for_host(str(kmock.url), timeout=2.0)
    yield k
    await k.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def gate(kube: Kube, clock: Clock) -> Gate:
    return make_gate(kube, clock)


RUNTIME = {"key": "skyhook.nvidia.com", "value": "runtime-required", "effect": "NoSchedule"}
MARKER = "skyhook.nvidia.com/autoTaint_skyhook.nvidia.com"


def runtime_taints(kmock: Any, name: str = "w1") -> list[dict[str, Any]]:
    return [
        t for t in stored(kmock, NODES, name)["spec"].get("taints") or [] if t.get("key") == RUNTIME["key"]
    ]


async def operator_auto_taints(kube: Kube, name: str = "w1") -> None:
    """HandleAutoTaint: the taint appended, the marker annotation set (one merge patch each, as the
    operator's client does; resourceVersion guarded by reading first)."""
    node = await kube.get_node(name)
    assert node is not None
    taints = [*(node["spec"].get("taints") or []), RUNTIME]
    await kube.patch_node(
        name,
        {
            "metadata": {
                "resourceVersion": node["metadata"]["resourceVersion"],
                "annotations": {MARKER: "true"},
            },
            "spec": {"taints": taints},
        },
    )


async def operator_lifts(kube: Kube, name: str = "w1") -> None:
    """HandleRuntimeRequired: the operator's taint removed, every other taint kept."""
    node = await kube.get_node(name)
    assert node is not None
    taints = [t for t in node["spec"].get("taints") or [] if t.get("key") != RUNTIME["key"]]
    await kube.patch_node(
        name,
        {"metadata": {"resourceVersion": node["metadata"]["resourceVersion"]}, "spec": {"taints": taints}},
    )


@pytest.mark.parametrize("first", ["operator", "gate"])
async def test_both_holds_are_lifted_by_their_owners_in_either_order(
    kmock: Any, kube: Kube, gate: Gate, clock: Clock, first: str
) -> None:
    await joined(kube)  # pre-created with the hold (and another team's taint)
    await add_cr(kube, "skyhook.nvidia.com", "drivers", {"gpu-driver": "550.1"})  # runtimeRequired, mutated
    await operator_auto_taints(kube)
    await gate.reconcile_all()
    assert hold_taints(kmock) == [hold("packages-pending")]
    assert runtime_taints(kmock) == [RUNTIME]
    assert stored(kmock, NODES, "w1")["metadata"]["annotations"][MARKER] == "true"

    # NodeWright's picker reaches the node through both taints (and the other team's, tolerated here).
    cr = stored(kmock, SKYHOOKS, "drivers")
    cr["spec"]["additionalTolerations"].append({"key": OTHER["key"], "operator": "Exists"})
    node = stored(kmock, NODES, "w1")
    for operator in picker.OPERATORS:
        assert picker.runs_on(cr, node, operator), operator.name
    bare = {
        **cr,
        "spec": {**cr["spec"], "additionalTolerations": [{"key": OTHER["key"], "operator": "Exists"}]},
    }
    assert not picker.selects(bare, node)  # without the hold tolerations: TaintNotTolerable

    await operator_writes(kube, "w1", "drivers", {"gpu-driver": ("550.1", "config", "complete")})
    await gate.load()
    await gate.reconcile_all()  # complete: the stability window starts; both taints stay
    assert hold_taints(kmock) == [hold("packages-pending")]
    assert runtime_taints(kmock) == [RUNTIME]

    if first == "operator":
        await operator_lifts(kube)
        await gate.reconcile_all()
        assert hold_taints(kmock) == [hold("packages-pending")]  # the window is the gate's own
        clock.advance(seconds=30)
        report = await gate.reconcile_all()
        assert report.released == 1
        assert runtime_taints(kmock) == []  # and the gate did not put it back
    else:
        clock.advance(seconds=30)
        report = await gate.reconcile_all()
        assert report.released == 1
        assert hold_taints(kmock) == []
        assert runtime_taints(kmock) == [RUNTIME]  # the operator's, untouched by the release
        await operator_lifts(kube)
        await gate.reconcile_all()
        assert runtime_taints(kmock) == []
    node = stored(kmock, NODES, "w1")
    assert node["spec"]["taints"] == [OTHER]
    assert node["metadata"]["annotations"][MARKER] == "true"  # the operator's marker, kept
    assert stored(kmock, "nodegate.io/v1alpha1/nodeattestations", "w1")["status"]["phase"] == "Ready"


async def test_the_gate_holds_again_without_touching_the_operators_taint(
    kmock: Any, kube: Kube, gate: Gate, clock: Clock
) -> None:
    """A revoked attestation: the gate quarantines the node; the operator's taint stays as it was."""
    await joined(kube, "w1", hold("packages-pending"))
    await add_cr(kube, "skyhook.nvidia.com", "drivers", {"gpu-driver": "550.1"})
    await operator_auto_taints(kube)
    await kube.patch_cluster_object(
        "nodegate.io", "v1alpha1", "nodeattestations", "w1", {"spec": {"revoked": True}}
    )
    await gate.load()
    await gate.reconcile_all()
    assert [t["value"] for t in hold_taints(kmock)] == ["quarantined"]
    assert runtime_taints(kmock) == [RUNTIME]
    assert not picker.selects(stored(kmock, SKYHOOKS, "drivers"), stored(kmock, NODES, "w1"))
    assert KEY not in str(runtime_taints(kmock))
