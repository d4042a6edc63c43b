"""The gate's work queue: node names to decide, each queued at most once, worked one at a time.

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


class WorkQueue:
    """Names are only taken while ``running`` (one-shot passes decide without the queue)."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._failures: dict[str, int] = {}
        self.running = False
        self.errors = 0  # reconciles that failed (retried), for nodegate_gate_reconcile_errors_total

    def add(self, name: str) -> None:
        if self.running and name not in self._queued:
            self._queued.add(name)
            self._queue.put_nowait(name)

    def add_all(self, names: Iterable[str]) -> None:
        for name in names:
            self.add(name)

    def empty(self) -> bool:
        """Nothing waiting (a node being worked on is no longer queued)."""
        return self._queue.empty()

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

    async def work(
        self,
        reconcile: Callable[[str], Awaitable[holds.Decision | None]],
        *,
        may_work: Callable[[], bool],
        now: Callable[[], datetime],
    ) -> None:
        """Forever: take a name and ``reconcile`` it. A name taken while ``may_work`` says no is
        dropped: whoever makes it say yes queues every name again."""
        while True:
            name = await self._queue.get()
            self._queued.discard(name)
            if not may_work():
                continue  # everything is queued again when the lease is won
            try:
                decision = await reconcile(name)
            except (KubeUnavailable, Conflict) as exc:
                self.errors += 1
                failures = self._failures[name] = self._failures.get(name, 0) + 1
                delay = failure_delay(failures)
                log.warning("node %s: %s; retrying in %.1f s", name, exc, delay)
                self.add_later(name, delay)
                continue
            except Exception:  # the gate must keep running; the node is retried
                self.errors += 1
                log.exception("node %s: unexpected error", name)
                self.add_later(name, MAX_BACKOFF)
                continue
            self._failures.pop(name, None)
            if decision is not None and decision.requeue_at is not None:
                # An event-loop timer, not polling; a small margin so the deadline has passed.
                self.add_later(name, (decision.requeue_at - now()).total_seconds() + 0.01)
