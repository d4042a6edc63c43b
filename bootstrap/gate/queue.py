"""The gate's work queue: node names to decide, each queued at most once and worked on by at most
one worker at a time, by several workers.

Several workers: a release is an API round trip (the taint; its Event, condition and status follow
on the node's next turn); one worker would release a rack that completes at once one node after
another, seconds to minutes behind (docs/gate.md, "Watching, and what is kept"). A node named
again while a worker has it is taken again once that worker is done (the decision then reads the
newer caches), never by a second worker at the same time: decisions and writes for one node stay
in order.

A failed node is retried after a backoff; a decision that must be taken again at a known time
(the end of a stability window, an attestation's expiry) schedules an event-loop timer for it,
so nothing polls.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime

from bootstrap.gate import holds
from bootstrap.gate.backoff import MAX_BACKOFF, failure_delay
from bootstrap.kube import Conflict, KubeUnavailable

log = logging.getLogger("nodegate.gate")

WORKERS = 32  # nodes decided and written at the same time


class WorkQueue:
    """Names are only taken while ``running`` (one-shot passes decide without the queue)."""

    def __init__(self, workers: int = WORKERS) -> None:
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()  # waiting in _queue, or to be queued when its worker is done
        self._processing: set[str] = set()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._failures: dict[str, int] = {}
        self._workers = max(1, workers)
        self.running = False
        self.errors = 0  # reconciles that failed (retried), for nodegate_gate_reconcile_errors_total

    def add(self, name: str) -> None:
        if not self.running or name in self._queued:
            return
        self._queued.add(name)
        if name not in self._processing:  # else queued again by _done
            self._queue.put_nowait(name)

    def add_all(self, names: Iterable[str]) -> None:
        for name in names:
            self.add(name)

    def empty(self) -> bool:
        """Nothing waiting (a node being worked on is no longer queued)."""
        return self._queue.empty()

    def idle(self) -> bool:
        """Nothing waiting and no node being worked on."""
        return self._queue.empty() and not self._processing

    def backlog(self) -> int:
        """Nodes waiting or being decided (timers not counted)."""
        return len(self._queued | self._processing)

    def add_later(self, name: str, delay: float) -> None:
        """Queue ``name`` after ``delay`` seconds, replacing its earlier timer."""
        old = self._timers.pop(name, None)
        if old is not None:
            old.cancel()
        loop = asyncio.get_running_loop()
        self._timers[name] = loop.call_later(max(delay, 0.0), self._fire, name)

    def _fire(self, name: str) -> None:
        self._timers.pop(name, None)
        self.add(name)

    def cancel_timers(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    def _take(self, name: str) -> None:
        self._queued.discard(name)
        self._processing.add(name)

    def _done(self, name: str) -> None:
        self._processing.discard(name)
        if name in self._queued:  # named again meanwhile
            self._queue.put_nowait(name)

    async def work(
        self,
        reconcile: Callable[[str], Awaitable[holds.Decision | None]],
        *,
        may_work: Callable[[], bool],
        now: Callable[[], datetime],
    ) -> None:
        """Forever: the workers take names and ``reconcile`` them. A name taken while ``may_work``
        says no is dropped: whoever makes it say yes queues every name again."""
        workers = [
            asyncio.create_task(self._worker(reconcile, may_work=may_work, now=now), name=f"gate-worker-{i}")
            for i in range(self._workers)
        ]
        try:
            await asyncio.gather(*workers)
        finally:
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)

    async def _worker(
        self,
        reconcile: Callable[[str], Awaitable[holds.Decision | None]],
        *,
        may_work: Callable[[], bool],
        now: Callable[[], datetime],
    ) -> None:
        while True:
            name = await self._queue.get()
            self._take(name)
            try:
                await self._one(name, reconcile, may_work=may_work, now=now)
            finally:
                self._done(name)

    async def _one(
        self,
        name: str,
        reconcile: Callable[[str], Awaitable[holds.Decision | None]],
        *,
        may_work: Callable[[], bool],
        now: Callable[[], datetime],
    ) -> None:
        if not may_work():
            return  # everything is queued again when the lease is won
        try:
            decision = await reconcile(name)
        except (KubeUnavailable, Conflict) as exc:
            self.errors += 1
            failures = self._failures[name] = self._failures.get(name, 0) + 1
            delay = failure_delay(failures)
            log.warning("node %s: %s; retrying in %.1f s", name, exc, delay)
            self.add_later(name, delay)
            return
        except Exception:  # the gate must keep running; the node is retried
            self.errors += 1
            log.exception("node %s: unexpected error", name)
            self.add_later(name, MAX_BACKOFF)
            return
        self._failures.pop(name, None)
        if decision is not None and decision.requeue_at is not None:
            # An event-loop timer, not polling; a small margin so the deadline has passed.
            self.add_later(name, (decision.requeue_at - now()).total_seconds() + 0.01)
