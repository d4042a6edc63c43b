"""bootstrap/gate/queue.py: several workers, one node at a time per node, a node named again while
it is worked on is worked on again afterwards (never lost, never twice at once)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from bootstrap.gate import holds
from bootstrap.gate.queue import WorkQueue


async def test_workers_run_nodes_concurrently_but_each_node_once_at_a_time() -> None:
    queue = WorkQueue(workers=3)
    queue.running = True
    gates = {name: asyncio.Event() for name in ("a", "b", "c")}
    started: list[str] = []
    running: set[str] = set()
    overlaps: list[str] = []
    all_started = asyncio.Event()

    async def reconcile(name: str) -> holds.Decision | None:
        if name in running:
            overlaps.append(name)
        running.add(name)
        started.append(name)
        if len(started) == 3:
            all_started.set()
        try:
            await gates[name].wait()
        finally:
            running.discard(name)
        return None

    work = asyncio.create_task(queue.work(reconcile, may_work=lambda: True, now=lambda: datetime.now(UTC)))
    queue.add_all(["a", "b", "c"])
    async with asyncio.timeout(10):
        await all_started.wait()  # three workers hold three nodes at once
        assert sorted(started) == ["a", "b", "c"]
        queue.add("a")  # named again while a worker has it: not taken by another worker
        queue.add("a")  # and queued once
        await asyncio.sleep(0)
        assert started.count("a") == 1
        for event in gates.values():
            event.set()  # the first pass of each ends; "a" is taken again after its first
        while not (queue.idle() and started.count("a") == 2):
            await asyncio.sleep(0)
    work.cancel()
    assert started.count("a") == 2
    assert overlaps == []


async def test_a_name_is_not_lost_when_it_is_named_during_its_own_decision() -> None:
    queue = WorkQueue(workers=2)
    queue.running = True
    seen: list[int] = []
    version = {"n": 0}

    async def reconcile(name: str) -> holds.Decision | None:
        seen.append(version["n"])
        if version["n"] < 3:
            version["n"] += 1
            queue.add(name)  # an event arrives while the node is decided
        await asyncio.sleep(0)
        return None

    work = asyncio.create_task(queue.work(reconcile, may_work=lambda: True, now=lambda: datetime.now(UTC)))
    queue.add("n")
    async with asyncio.timeout(10):
        while not (queue.idle() and version["n"] == 3 and len(seen) == 4):
            await asyncio.sleep(0)
    work.cancel()
    assert seen == [0, 1, 2, 3]  # the last state was decided


async def test_report_turns_wait_for_every_urgent_name() -> None:
    queue = WorkQueue(workers=1)
    queue.running = True
    taken: list[str] = []

    async def reconcile(name: str) -> holds.Decision | None:
        taken.append(name)
        if taken == ["u1"]:  # named while u1 is decided: a change for r2 and a report turn for u1
            queue.add("r2")
            queue.add_report("u1")
        return None

    queue.add_report("r1")
    queue.add_report("r2")
    queue.add("u1")
    queue.add_report("u2")
    queue.add("u2")  # a change names a node waiting for its report turn: it becomes urgent
    queue.add_report("u2")  # and a report turn does not demote it
    assert queue.backlog() == 4
    work = asyncio.create_task(queue.work(reconcile, may_work=lambda: True, now=lambda: datetime.now(UTC)))
    async with asyncio.timeout(10):
        while not queue.idle():
            await asyncio.sleep(0)
    work.cancel()
    # urgent first, in the order named (r2 promoted behind u2); then the report turns in order
    assert taken == ["u1", "u2", "r2", "r1", "u1"]
