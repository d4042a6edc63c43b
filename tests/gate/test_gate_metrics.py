"""The gate's metrics: held nodes by reason and pool (from the node watch), the time from
attestation to release, and failed reconciles."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from bootstrap.gate import Gate
from bootstrap.gate.queue import WorkQueue
from bootstrap.kube import Kube, KubeUnavailable
from tests.gate.test_gate import T0, Clock, add_cr, clock, joined, kube, make_gate  # noqa: F401  (fixtures)
from tests.support.kshim import ShimEmulator

pytestmark = pytest.mark.kmock(cls=ShimEmulator)


async def test_held_by_reason_and_pool_and_time_to_release(kube: Kube, clock: Clock) -> None:  # noqa: F811
    gate: Gate = make_gate(kube, clock, stability_window=timedelta(0))
    released: list[float] = []
    gate.on_release = released.append
    await joined(kube, "w1", at=T0)
    await add_cr(kube, "skyhook.nvidia.com", "drivers", {"gpu-driver": "1.0.0"})
    clock.t = T0 + timedelta(minutes=7)
    report = await gate.reconcile_all()
    assert report.errors == []
    assert gate.held_nodes("pool") == {("packages-pending", "gpu"): 1}
    assert gate.held_nodes("nodegate.io/pool") == {("packages-pending", ""): 1}
    assert released == []
    await kube.delete_cluster_object("skyhook.nvidia.com", "v1alpha1", "skyhooks", "drivers")
    report = await gate.reconcile_all()
    assert report.released == 1
    assert released == [420.0]  # seven minutes after the attestation
    await gate.reconcile_all()  # lists again (the watch copy of a one-shot pass is the listed one)
    assert released == [420.0]  # a node already free is not counted again
    assert gate.held_nodes("pool") == {}


async def test_failed_reconciles_are_counted() -> None:
    queue = WorkQueue()
    queue.running = True
    failed = asyncio.Event()

    async def reconcile(name: str) -> Any:
        failed.set()
        raise KubeUnavailable("the API is down")

    queue.add("w1")
    task = asyncio.create_task(queue.work(reconcile, may_work=lambda: True, now=lambda: T0))
    await failed.wait()
    for _ in range(5):  # let the except branch run
        if queue.errors:
            break
        await asyncio.sleep(0)
    task.cancel()
    queue.cancel_timers()
    assert queue.errors == 1


async def test_backlog_counts_nodes_waiting_and_being_decided() -> None:
    queue = WorkQueue(workers=1)
    queue.running = True
    taken, go = asyncio.Event(), asyncio.Event()

    async def reconcile(name: str) -> Any:
        taken.set()
        await go.wait()
        return None

    assert queue.backlog() == 0
    queue.add_all(["w1", "w2"])
    assert queue.backlog() == 2
    task = asyncio.create_task(queue.work(reconcile, may_work=lambda: True, now=lambda: T0))
    await taken.wait()  # w1 being decided, w2 waiting
    assert queue.backlog() == 2
    queue.add("w1")  # named again while decided: still one node
    assert queue.backlog() == 2
    go.set()
    while not queue.idle():
        await asyncio.sleep(0)
    task.cancel()
    assert queue.backlog() == 0


async def test_synced_only_after_every_list(kube: Kube, clock: Clock) -> None:  # noqa: F811
    gate: Gate = make_gate(kube, clock, stability_window=timedelta(0))
    assert not gate.in_sync()  # nothing listed yet: its decisions would be on empty caches
    assert await gate.load() == []
    assert gate.in_sync()
