"""The gate with boot ids and the operator's own report, against kmock through tests/support/kshim.py:
a NodeWright reboot interrupt walked step by step (and its failure path), the event-driven reboot
hold and release in run(), and the caches (slim copies; a status-only CR change re-decides only the
nodes whose report changed).

The operator's side is played as upstream writes it (NVIDIA/nodewright 71ca22b8,
operator/internal/wrapper/node.go SetState/SetStatus, docs/interrupt_flow.md: apply, config,
interrupt, post-interrupt); the join service's side as DESIGN's NodeAttestation status (bootID,
resetCount at join and renewal)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from bootstrap.config import GateSettings
from bootstrap.gate import Gate, holds
from bootstrap.gate.cache import Cache
from bootstrap.kube import Kube, WatchEvent
from tests.gate.test_gate import (
    ATT,
    NODES,
    OTHER,
    Clock,
    add_cr,
    eventually,
    hold,
    hold_taints,
    joined,
    make_gate,
    operator_writes,
    real_now,
    register,
    stop,
    stored,
)
from tests.support.kshim import ShimEmulator

pytestmark = pytest.mark.kmock(cls=ShimEmulator)

SKY = "skyhook.nvidia.com"
BOOT_1 = "2d3c5e4f-1a2b-4c3d-8e9f-0a1b2c3d4e5f"
BOOT_2 = "7f6e5d4c-3b2a-4190-8f7e-6d5c4b3a2910"


@pytest.fixture
async def api(kmock: Any) -> AsyncIterator[Kube]:
    register(kmock)
    k = Kube.for_host(str(kmock.url), timeout=2.0)
    yield k
    await k.close()


@pytest.fixture
def clk() -> Clock:
    return Clock()


async def boot(kube: Kube, node: str, boot_id: str) -> None:
    """The kubelet reports the boot it runs (status.nodeInfo.bootID), as after every (re)boot."""
    await kube.patch_node_status(node, {"status": {"nodeInfo": {"bootID": boot_id}}})


async def attest(kube: Kube, node: str, boot_id: str, resets: int, clock: Clock) -> None:
    """What the join service records at join and renewal (`nodegate attest` at boot)."""
    status = {
        "attestedAt": clock().strftime("%Y-%m-%dT%H:%M:%SZ"),
        "expiresAt": (clock() + timedelta(days=1)).isoformat(),
        "bootID": boot_id,
        "resetCount": resets,
    }
    await kube.patch_cluster_object(
        "nodegate.io", "v1alpha1", "nodeattestations", node, {"status": status}, status=True
    )


async def decide(gate: Gate) -> str | None:
    report = await gate.reconcile_all()
    assert report.errors == []
    (reason,) = report.held or {None: 1}
    return reason


def message(kmock: Any) -> str:
    return str(stored(kmock, ATT, "w1")["status"]["message"])


async def released_on_boot_1(kmock: Any, kube: Kube, gate: Gate, clock: Clock) -> None:
    await joined(kube, at=clock())
    await boot(kube, "w1", BOOT_1)
    await attest(kube, "w1", BOOT_1, 3, clock)
    await add_cr(kube, SKY, "drivers", {"gpu-driver": "550.1"})
    await operator_writes(kube, "w1", "drivers", {"gpu-driver": ("550.1", "config", "complete")})
    await decide(gate)  # the stability window starts
    clock.advance(seconds=30)
    assert await decide(gate) is None
    assert hold_taints(kmock) == []


async def reboot_interrupt_until_the_reboot(kmock: Any, kube: Kube, gate: Gate, clock: Clock) -> None:
    """A driver upgrade with a reboot interrupt: held again, the operator works through the stages,
    reboots the node, and the kubelet comes back on a new boot."""
    await kube.patch_cluster_object(
        SKY,
        "v1alpha1",
        "skyhooks",
        "drivers",
        {"spec": {"packages": {"gpu-driver": {"version": "560.2", "interrupt": {"type": "reboot"}}}}},
    )
    assert await decide(gate) == "packages-pending"
    for stage, state in (("upgrade", "in_progress"), ("config", "complete"), ("interrupt", "in_progress")):
        await operator_writes(kube, "w1", "drivers", {"gpu-driver": ("560.2", stage, state)})
        clock.advance(seconds=10)  # a stage alone changed: written at most once per 10 s
        assert await decide(gate) == "packages-pending"
        assert f"gpu-driver 560.2 stage {stage} state {state}" in message(kmock)
    await boot(kube, "w1", BOOT_2)  # the interrupt pod ran `reboot`
    clock.advance(seconds=40)
    assert await decide(gate) == "unattested"
    assert hold_taints(kmock) == [hold("unattested")]
    assert message(kmock).startswith(f"unattested: rebooted since its last attestation (boot {BOOT_2})")
    # NodeWright's post-interrupt pod tolerates packages-pending and validation-failed only: the
    # gate says why it waits, and that nothing needs fixing.
    assert "package pods wait until the node is attested" in message(kmock)


async def test_a_nodewright_reboot_interrupt_is_held_until_the_new_boot_attests(
    kmock: Any, api: Kube, clk: Clock
) -> None:
    kube, clock = api, clk
    gate = make_gate(kube, clock)
    await released_on_boot_1(kmock, kube, gate, clock)
    await reboot_interrupt_until_the_reboot(kmock, kube, gate, clock)

    # `nodegate attest` from the new boot: a fresh quote, resetCount grown.
    await attest(kube, "w1", BOOT_2, 4, clock)
    assert await decide(gate) == "packages-pending"  # post-interrupt has not run yet
    assert hold_taints(kmock) == [hold("packages-pending")]  # package pods may run now
    await operator_writes(kube, "w1", "drivers", {"gpu-driver": ("560.2", "post-interrupt", "in_progress")})
    assert await decide(gate) == "packages-pending"
    await operator_writes(kube, "w1", "drivers", {"gpu-driver": ("560.2", "post-interrupt", "complete")})
    assert await decide(gate) == "packages-pending"  # the window
    clock.advance(seconds=30)
    assert await decide(gate) is None
    assert stored(kmock, NODES, "w1")["spec"]["taints"] == [OTHER]
    status = stored(kmock, ATT, "w1")["status"]
    assert (status["phase"], status["bootID"], status["resetCount"]) == ("Ready", BOOT_2, 4)


async def test_a_new_boot_that_fails_attestation_stays_held(kmock: Any, api: Kube, clk: Clock) -> None:
    """The new boot's quote fails policy: the join service records nothing, the node stays held,
    and NodeWright's work on it is not counted as complete, whatever is reported."""
    kube, clock = api, clk
    gate = make_gate(kube, clock)
    await released_on_boot_1(kmock, kube, gate, clock)
    await reboot_interrupt_until_the_reboot(kmock, kube, gate, clock)
    # Even a post-interrupt reported complete (by the node's annotation and the operator alike)
    # does not release a node whose boot nobody attested.
    await operator_writes(kube, "w1", "drivers", {"gpu-driver": ("560.2", "post-interrupt", "complete")})
    for _ in range(3):
        clock.advance(minutes=5)
        assert await decide(gate) == "unattested"
    assert hold_taints(kmock) == [hold("unattested")]
    status = stored(kmock, ATT, "w1")["status"]
    assert status["phase"] == "Held"
    assert status["bootID"] == BOOT_1  # what was last proved
    assert status["conditions"][0]["reason"] == "Unattested"


async def test_old_joins_without_a_boot_id_keep_todays_behaviour(kmock: Any, api: Kube, clk: Clock) -> None:
    kube, clock = api, clk
    gate = make_gate(kube, clock)
    await joined(kube, at=clock())  # an attestation without bootID
    await boot(kube, "w1", BOOT_1)
    await add_cr(kube, SKY, "drivers", {"gpu-driver": "550.1"})
    await operator_writes(kube, "w1", "drivers", {"gpu-driver": ("550.1", "config", "complete")})
    await decide(gate)
    clock.advance(seconds=30)
    assert await decide(gate) is None
    await boot(kube, "w1", BOOT_2)
    assert await decide(gate) is None  # nothing to compare with: not held for the reboot


async def test_run_holds_at_the_reboot_and_releases_at_the_attestation(kmock: Any, api: Kube) -> None:
    """Event-driven: the Node's boot id change is a node event, the fresh attestation a
    NodeAttestation event; no resync or timer is involved (the resync is 10 minutes)."""
    kube = api
    gate = make_gate(kube, real_now, stability_window=timedelta(0))
    clock = Clock(real_now())
    await released_on_boot_1(kmock, kube, make_gate(kube, clock, stability_window=timedelta(0)), clock)
    task = asyncio.create_task(gate.run())
    try:
        await eventually(gate.is_leader, "the lease")
        await boot(kube, "w1", BOOT_2)
        await eventually(lambda: hold_taints(kmock) == [hold("unattested")], "the hold at the reboot")
        await attest(kube, "w1", BOOT_2, 4, Clock(real_now()))
        await eventually(lambda: hold_taints(kmock) == [], "the release at the attestation")
    finally:
        await stop(task)


async def test_a_forged_annotation_does_not_release(kmock: Any, api: Kube, clk: Clock) -> None:
    """The node's kubelet credentials rewrite nodeState_<cr> to complete; the operator's status
    says apply in progress: held, and the message names the CR."""
    kube, clock = api, clk
    gate = make_gate(kube, clock)
    await joined(kube, at=clock())
    await add_cr(kube, SKY, "drivers", {"gpu-driver": "550.1"})
    await operator_writes(kube, "w1", "drivers", {"gpu-driver": ("550.1", "apply", "in_progress")})
    await operator_writes(
        kube, "w1", "drivers", {"gpu-driver": ("550.1", "config", "complete")}, status=False
    )
    for _ in range(2):
        clock.advance(minutes=1)
        assert await decide(gate) == "packages-pending"
    assert (
        "skyhook.nvidia.com/drivers: the node's nodeState annotation disagrees with the operator's "
        "status.nodeState (gpu-driver 550.1: node config/complete, operator apply/in_progress)"
        in message(kmock)
    )
    assert stored(kmock, ATT, "w1")["status"]["packages"][0]["state"] == "in_progress"  # the operator's


async def test_a_blocked_node_says_which_cr_why_and_the_fix(kmock: Any, api: Kube, clk: Clock) -> None:
    kube, clock = api, clk
    gate = make_gate(kube, clock)
    await joined(kube, at=clock())
    await add_cr(kube, SKY, "drivers", {"gpu-driver": "550.1"}, tolerations=[])
    await operator_writes(kube, "w1", "drivers", {}, node_status="blocked")
    assert await decide(gate) == "packages-pending"
    text = message(kmock)
    assert (
        "skyhook.nvidia.com/drivers: NodeWright cannot schedule its package pods here (TaintNotTolerable): "
        "its package pods do not tolerate example.com/keep=x:NoExecute, "
        "nodegate.io/hold=packages-pending:NoSchedule; fix: tolerate example.com/keep=x:NoExecute in the "
        "CR's spec.additionalTolerations or remove it from the node; add to spec.additionalTolerations "
        "(operator Equal): nodegate.io/hold=packages-pending:NoSchedule, "
        "nodegate.io/hold=validation-failed:NoSchedule; nodewright.inject_tolerations adds them" in text
    )


# -- the caches ------------------------------------------------------------------------------------


def cr_object(version: str, reports: dict[str, tuple[str, str]], rv: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{SKY}/v1alpha1",
        "kind": "Skyhook",
        "metadata": {"name": "drivers", "resourceVersion": rv},
        "spec": {"nodeSelectors": {}, "packages": {"pkg": {"version": version, "image": "x"}}},
        "status": {
            "nodeState": {
                n: {f"pkg|{version}": {"name": "pkg", "version": version, "stage": s, "state": t}}
                for n, (s, t) in reports.items()
            },
            "nodeStatus": {n: "in_progress" for n in reports},
        },
    }


def test_a_status_change_redecides_only_the_nodes_whose_report_changed() -> None:
    changed: list[str] = []
    cache = Cache(Kube.__new__(Kube), GateSettings(), changed=changed.append)  # no API call is made
    nodes, crs = cache.sources["nodes"], cache.sources[SKY]
    nodes.objects, crs.objects = {}, {}
    names = [f"n{i}" for i in range(50)]
    for i, name in enumerate(names):
        node = {
            "metadata": {"name": name, "labels": {}, "annotations": {"other.io/x": "y" * 100}},
            "status": {"nodeInfo": {"bootID": f"b{i}", "kernelVersion": "6.8"}, "images": [1] * 50},
        }
        cache.apply_event(nodes, WatchEvent("ADDED", node))
    changed.clear()
    reports = dict.fromkeys(names, ("apply", "in_progress"))
    cache.apply_event(crs, WatchEvent("ADDED", cr_object("1.0", reports, "1")))
    assert sorted(changed) == sorted(names)  # a new CR: every node it selects
    changed.clear()
    reports["n7"] = ("config", "complete")
    cache.apply_event(crs, WatchEvent("MODIFIED", cr_object("1.0", reports, "2")))
    assert changed == ["n7"]  # the usual event: one node's progress
    changed.clear()
    cache.apply_event(crs, WatchEvent("MODIFIED", cr_object("1.0", reports, "3")))
    assert changed == []  # nothing the gate reads changed
    cache.apply_event(crs, WatchEvent("MODIFIED", cr_object("2.0", reports, "4")))
    assert sorted(changed) == sorted(names)  # a spec change: every node it selects

    # What is kept: the parse (reports shared between equal nodes), not the object.
    assert crs.objects["drivers"] == {
        "apiVersion": f"{SKY}/v1alpha1",
        "kind": "Skyhook",
        "metadata": {"name": "drivers", "resourceVersion": "4"},
    }
    (parsed,) = cache.package_crs()
    assert len({id(r) for r in parsed.reports.values()}) == 2
    assert parsed.reports["n7"] == holds.NodeReport("in_progress", (("config", "complete"),))
    assert nodes.objects["n3"] == {
        "metadata": {"name": "n3", "labels": {}, "annotations": {}},
        "spec": {"taints": []},
        "status": {"conditions": [], "nodeInfo": {"bootID": "b3"}},
    }
