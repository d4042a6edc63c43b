"""The gate's work queue: node names to decide, each queued at most once and worked on by at most
one worker at a time, by several workers.

Several workers: a release is an API round trip (the taint; its Event, condition and status follow
on the node's next turn); one worker would release a rack that completes at once one node after
another, seconds to minutes behind (docs/gate.md, "Watching, and what is kept"). A node named
again while a worker has it is taken again once that worker is done (the decision then reads the
newer caches), never by a second worker at the same time: decisions and writes for one node stay
in order.

Two levels: a name named by a change (an event, a timer, a re-list) is urgent; a node's report
turn (its condition, NodeAttestation and Event after its taint changed) waits until no urgent name
does. A burst of completions spread over several CR events is then released first and reported
after, instead of each CR's nodes waiting behind the reports of the CRs before it. A report turn
named again by a change becomes urgent.

A failed node is retried after a backoff; a decision that must be taken again at a known time
(the end of a stability window, an attestation's expiry) schedules an event-loop timer for it,
so nothing polls.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
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
        # name -> urgent?, for every name waiting, or to be queued again when its worker is done
        self._level: dict[str, bool] = {}
        self._urgent: deque[str] = deque()
        self._later: deque[str] = deque()  # may hold names promoted or taken since: skipped
        self._wake = asyncio.Event()
        self._processing: set[str] = set()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._failures: dict[str, int] = {}
        self._workers = max(1, workers)
        self.running = False
        self.errors = 0  # reconciles that failed (retried), for nodegate_gate_reconcile_errors_total

    def add(self, name: str, *, urgent: bool = True) -> None:
        if not self.running:
            return
        level = self._level.get(name)
        if level is not None and (level or not urgent):
            return  # queued already, at this level or above
        self._level[name] = urgent
        if name not in self._processing:  # else queued again by _done
            (self._urgent if urgent else self._later).append(name)
            self._wake.set()

    def add_report(self, name: str) -> None:
        """The node's report turn: after every urgent name."""
        self.add(name, urgent=False)

    def add_all(self, names: Iterable[str]) -> None:
        for name in names:
            self.add(name)

    def empty(self) -> bool:
        """Nothing waiting (a node being worked on is no longer queued)."""
        return all(name in self._processing for name in self._level)

    def idle(self) -> bool:
        """Nothing waiting and no node being worked on."""
        return not self._level and not self._processing

    def backlog(self) -> int:
        """Nodes waiting or being decided (timers not counted)."""
        return len(self._level.keys() | self._processing)

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

    def _next(self) -> str | None:
        """The next name to take: urgent ones first; entries left behind by a promotion or an
        earlier take are skipped."""
        for waiting, urgent in ((self._urgent, True), (self._later, False)):
            while waiting:
                name = waiting.popleft()
                if self._level.get(name) is urgent and name not in self._processing:
                    return name
        return None

    def pop(self) -> str | None:
        """The next waiting name, removed as a worker would take and finish it; None when
        nothing waits (to inspect the queue without workers)."""
        name = self._next()
        if name is not None:
            self._take(name)
            self._done(name)
        return name

    def _take(self, name: str) -> None:
        del self._level[name]
        self._processing.add(name)

    def _done(self, name: str) -> None:
        self._processing.discard(name)
        level = self._level.get(name)
        if level is not None:  # named again meanwhile
            (self._urgent if level else self._later).append(name)
            self._wake.set()

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
            name = self._next()
            if name is None:
                self._wake.clear()  # no await since _next: nothing was added in between
                await self._wake.wait()
                continue
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
