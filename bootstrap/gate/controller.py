"""The hold gate: keeps ``<taint_key>=<reason>`` on every node until holds.py says the node may
run workloads, and publishes why (NodeAttestation status, a Node condition, Events); see
docs/gate.md.

What decides is holds.py; the Gate here composes the parts that read the cluster and write the
outcome:

- cache.py: Nodes, NodeAttestations and the NodeWright / Skyhook CRs in memory (a streaming list
  or a LIST, then a watch resumed from its resourceVersion whenever the server ends it; 410 loads
  again; every ``resync`` re-decides all from the caches, without an API call);
- writes.py: the taint by read-modify-write with the node's resourceVersion (a write from a stale
  read fails with 409 and is decided again on a fresh read), the condition, status and Events;
- lease.py: in ``run()`` only the holder of a coordination.k8s.io Lease writes; the flag is
  checked before every write, and lapses on its own when renewals stop succeeding;
- queue.py: the nodes to decide, with timers for decisions due again later.

It fails closed: nothing is decided before every list has loaded, and no node is released while
any cache may be stale (a watch broke and neither a new load nor the resumed watch has shown the
cache current yet).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from bootstrap.config import GateSettings, Settings
from bootstrap.gate import holds, podfailure
from bootstrap.gate.backoff import CONFLICT_ATTEMPTS, jitter
from bootstrap.gate.cache import Cache, Source
from bootstrap.gate.fields import dict_at, name_of
from bootstrap.gate.lease import Lease, LeaseHeld, NotLeader, identity
from bootstrap.gate.queue import WorkQueue
from bootstrap.gate.writes import PACE, Writer
from bootstrap.kube import Conflict, Kube, KubeUnavailable, NotFound, WatchEvent
from bootstrap.times import parse_time

log = logging.getLogger("nodegate.gate")


@dataclass(slots=True)
class GateReport:
    """What one pass did (``reconcile_all``)."""

    nodes: int = 0
    held: dict[str, int] = field(default_factory=dict)  # reason -> nodes
    released: int = 0
    writes: int = 0
    errors: list[str] = field(default_factory=list)


class Gate:
    """One gate replica: the caches, the Lease, the writer and the work queue, and the passes
    that decide nodes with them (``reconcile``, ``reconcile_all``, ``once``, ``run``)."""

    def __init__(
        self,
        kube: Kube,
        settings: GateSettings,
        *,
        events_namespace: str,
        now: Callable[[], datetime],
        identity: str,
    ) -> None:
        self._kube = kube
        self._settings = settings
        self._now = now
        self._queue = WorkQueue()
        self._cache = Cache(kube, settings, changed=self._queue.add)
        # Leader election: off for one-shot use (reconcile_all); run() and once() turn it on.
        self._lease = Lease(kube, settings, now=now, identity=identity, acquired=self._enqueue_all)
        self._writer = Writer(
            kube, settings, self._cache, self._lease, events_namespace=events_namespace, now=now
        )
        self._complete_since: dict[str, datetime | None] = {}
        self._pending_events: dict[str, holds.Decision] = {}  # hold changes not yet told by an Event
        # per node: the failing packages last looked up, when, and what their pods said
        self._pods_read: dict[
            str, tuple[tuple[tuple[str, str, str], ...], datetime, list[podfailure.PackageFailure]]
        ] = {}
        self.on_release: Callable[[float], None] | None = None  # seconds from attestation to release
        self._sources: dict[str, Source] = self._cache.sources  # by key; tests peek at the caches

    @classmethod
    def for_settings(cls, kube: Kube, settings: Settings) -> Gate:
        """The gate as `serve` and `nodegate gate` run it: the config's gate and events settings,
        the real clock and this replica's Lease identity."""
        return cls(
            kube,
            settings.gate,
            events_namespace=settings.kubernetes.events_namespace,
            now=lambda: datetime.now(UTC),
            identity=identity(),
        )

    # -- state ---------------------------------------------------------------------------------

    @property
    def writes(self) -> int:
        """API writes made so far (taints, conditions, statuses, events, leases not counted)."""
        return self._writer.count

    @property
    def not_served(self) -> frozenset[str]:
        """Package API groups the cluster does not serve (counted as having no CRs)."""
        return self._cache.not_served

    @property
    def lease_holder(self) -> str:
        """The other replica's identity when elect() last lost."""
        return self._lease.holder

    def is_leader(self) -> bool:
        """May this gate write now? Always without election; with it, only within the lease."""
        return self._lease.is_leader()

    async def elect(self) -> bool:
        """Acquire or renew the Lease once; whether this gate may write afterwards."""
        return await self._lease.elect()

    async def release_lease(self) -> None:
        """Give the Lease up so another replica need not wait for it to expire (best effort)."""
        await self._lease.release()

    async def load(self) -> list[str]:
        """List every source once; the errors of those that failed (their caches are kept)."""
        return await self._cache.load()

    def _apply_event(self, src: Source, event: WatchEvent[Any]) -> None:
        self._cache.apply_event(src, event)

    def _enqueue_all(self) -> None:
        self._queue.add_all(self._cache.names())

    # -- deciding ------------------------------------------------------------------------------

    def decide(self, node: Mapping[str, Any]) -> holds.Decision:
        """holds.decide over the cache; completeSince carries over from the last decision, or
        after a restart from the NodeAttestation status this gate wrote."""
        name = name_of(node)
        attestation = self._cache.attestation(name)
        if name in self._complete_since:
            since = self._complete_since[name]
        else:
            since = parse_time(dict_at(attestation or {}, "status").get("completeSince"))
        return holds.decide(
            node=node,
            attestation=holds.attestation_view(attestation),
            crs=self._cache.package_crs(),
            now=self._now(),
            stability_window=self._settings.stability_window,
            attestation_lifetime=self._settings.attestation_lifetime,
            complete_since=since,
            taint_key=self._settings.taint_key,
        )

    def _decide_without_node(self, name: str) -> holds.Decision:
        return holds.decide_without_node(
            attestation=holds.attestation_view(self._cache.attestation(name)),
            now=self._now(),
            attestation_lifetime=self._settings.attestation_lifetime,
        )

    def attestation_status(self, decision: holds.Decision, current: Mapping[str, Any]) -> dict[str, Any]:
        """The gate's keys of NodeAttestation status for ``decision`` (``current`` = the status
        now: the Held condition keeps its lastTransitionTime while its status stays)."""
        return self._writer.attestation_status(decision, current)

    async def reconcile(self, node_name: str, *, cached: bool = False) -> holds.Decision | None:
        """Decide one node from the cache and write the outcome. The Node itself is read fresh,
        or with ``cached`` taken from the node watch (see _reconcile). None when nothing was
        decided: the caches are not loaded, the node is gone, or this gate is not the leader.
        Raises KubeUnavailable / Conflict when a write could not be made."""
        if not self._cache.loaded():
            # debug: at a start every node is named before the last source has loaded (10,000
            # lines at info); each is decided when that load completes and names them all again
            log.debug("not every list has loaded yet: %s is not decided", node_name)
            return None
        try:
            return await self._reconcile(node_name, cached=cached)
        except NotLeader:
            return None

    async def _reconcile(self, name: str, *, cached: bool) -> holds.Decision | None:
        # cached: decide on the watched copy when the node watch is in sync (a resync of 10k
        # nodes then costs no API call, not 10k GETs). Safe for the taint because every write
        # carries the resourceVersion of the copy it was decided on: a stale copy gets 409 and
        # the retry reads fresh; a copy behind an event that needs no write is decided again
        # when that event arrives.
        copy = self._cache.watched_node(name) if cached else None
        read = copy if copy is not None else await self._kube.get_node(name)
        attempt = 0
        while True:
            if read is None:
                self._complete_since.pop(name, None)
                self._writer.forget(name)
                self._pending_events.pop(name, None)
                self._pods_read.pop(name, None)
                due = await self._writer.attestation(name, self._decide_without_node(name))
                if due is not None and self._queue.running:
                    self._queue.add_later(name, (due - self._now()).total_seconds() + 0.01)
                return None
            attempt += 1
            decision = self.decide(read)  # on the node as read: a 409 means decide again
            failing = podfailure.erroring(decision)
            if failing:
                decision = podfailure.with_failures(decision, await self._pod_failures(name, failing))
            self._complete_since[name] = decision.complete_since
            if decision.reason is None and not self._cache.in_sync():
                log.info("node %s would be released, but a cache may be stale: not yet", name)
                return None
            try:
                node = await self._writer.taint(read, decision)
                break
            except Conflict:
                if attempt >= CONFLICT_ATTEMPTS:
                    raise
                await jitter(attempt)
                read = await self._kube.get_node(name)
            except NotFound:  # deleted since the copy was taken
                read = await self._kube.get_node(name)
        self._count_release(name, read, decision)
        if self._writer.hold(node) != self._writer.hold(read):
            self._pending_events[name] = decision  # the newest change's Event (coalesced)
            if self._queue.running:
                # The taint is the release (or the hold). Condition, NodeAttestation and Event
                # follow on the node's report turn, after every node a change named: a burst of
                # completions is released first, reported after.
                self._queue.add_report(name)
                return decision
        return await self._report(name, node, decision)

    async def _report(self, name: str, node: dict[str, Any], decision: holds.Decision) -> holds.Decision:
        """After the taint: the Event of a hold change, the condition, the NodeAttestation."""
        pending = self._pending_events.pop(name, None)
        if pending is not None and pending.reason == decision.reason:
            await self._writer.event(node, decision)
        await self._writer.condition(node, decision)
        due = await self._writer.attestation(name, decision)
        if due is not None and (decision.requeue_at is None or due < decision.requeue_at):
            decision = replace(decision, requeue_at=due)  # decided again when the pace allows
        return decision

    async def _pod_failures(
        self, name: str, failing: tuple[tuple[str, str, str], ...]
    ) -> list[podfailure.PackageFailure]:
        """Why the failing packages failed, from the node's pods: listed again when the set of
        failing packages changes, else at most once per pace (a crash-looping pod's restarts)."""
        now = self._now()
        known = self._pods_read.get(name)
        if known is not None and known[0] == failing and now < known[1] + PACE:
            return known[2]
        try:
            pods = await self._kube.list_node_pods(name)
        except KubeUnavailable as exc:  # asked again after the pace, not on every decision
            log.warning("the pods on %s could not be read: %s", name, exc)
            why = podfailure.clean(str(exc), 120)
            found = [podfailure.PackageFailure(cr, pkg, v, unread=why) for cr, pkg, v in failing]
        else:
            found = [podfailure.failure(pods, cr, pkg, version) for cr, pkg, version in failing]
        self._pods_read[name] = (failing, now, found)
        return found

    def _count_release(self, name: str, before: Mapping[str, Any], decision: holds.Decision) -> None:
        """A hold just lifted: how long since the attestation that released the node."""
        if self.on_release is None or decision.reason is not None:
            return
        taints = (before.get("spec") or {}).get("taints") or ()
        if not any(isinstance(t, dict) and t.get("key") == self._settings.taint_key for t in taints):
            return  # it was not held
        status = (self._cache.attestation(name) or {}).get("status") or {}
        attested = parse_time(status.get("attestedAt"))
        if attested is not None:
            self.on_release(max(0.0, (self._now() - attested).total_seconds()))

    @property
    def reconcile_errors(self) -> int:
        return self._queue.errors

    @property
    def backlog(self) -> int:
        """Nodes waiting to be decided or being decided now."""
        return self._queue.backlog()

    def in_sync(self) -> bool:
        """Every source listed and its watch current: what the gate decides is what the cluster
        says (with ``backlog`` 0: every node decided since)."""
        return self._cache.loaded() and self._cache.in_sync()

    def held_nodes(self, pool_label: str) -> dict[tuple[str, str], int]:
        """(reason, pool) -> nodes carrying the hold taint now, from the node watch (for the
        metrics: every replica reports what it sees, the leader or not)."""
        out: dict[tuple[str, str], int] = {}
        for node in self._cache.nodes().values():
            spec, meta = node.get("spec") or {}, node.get("metadata") or {}
            for taint in spec.get("taints") or ():
                if isinstance(taint, dict) and taint.get("key") == self._settings.taint_key:
                    key = (str(taint.get("value") or ""), str((meta.get("labels") or {}).get(pool_label, "")))
                    out[key] = out.get(key, 0) + 1
                    break
        return out

    # -- passes --------------------------------------------------------------------------------

    async def reconcile_all(self) -> GateReport:
        """List everything and decide every node once (``nodegate gate --once``). Nothing is
        written when any list fails."""
        report = GateReport()
        start = self._writer.count
        report.errors += await self._cache.load()
        if report.errors or not self._cache.loaded():
            report.errors.append("not every list loaded: no node was decided")
            return report
        nodes = self._cache.nodes()
        for name in sorted(self._cache.attestations()):
            if name in nodes:
                continue
            try:  # no Node of this name: the status says Attested (or why not), nothing to hold
                await self._writer.attestation(name, self._decide_without_node(name))
            except NotLeader:
                break
            except (KubeUnavailable, Conflict) as exc:
                report.errors.append(f"nodeattestation {name}: {exc}")
        for name in sorted(nodes):
            report.nodes += 1
            try:
                decision = await self.reconcile(name, cached=True)  # just listed
            except (KubeUnavailable, Conflict) as exc:
                report.errors.append(f"node {name}: {exc}")
                continue
            if decision is None:
                continue
            if decision.reason is None:
                report.released += 1
            else:
                report.held[decision.reason] = report.held.get(decision.reason, 0) + 1
        report.writes = self._writer.count - start
        if self._lease.electing and not self._lease.is_leader():
            report.errors.append("the lease lapsed during the pass: the nodes after that were not written")
        return report

    async def once(self, *, lease: bool = True) -> GateReport:
        """``nodegate gate --once``: one ``reconcile_all`` as the leader. It takes the Lease (and
        renews it through the pass, which can outlast two thirds of a lease at 10k nodes), so a
        gate running in the cluster and a script never write at the same time, and gives it back
        afterwards. Raises LeaseHeld when another gate holds it. ``lease=False`` skips the
        election (a cluster without the gate's Lease RBAC, or tests)."""
        if not lease:
            return await self.reconcile_all()
        if not await self._lease.elect():
            raise LeaseHeld(self._lease.holder or "another replica")
        renewing = asyncio.create_task(self._lease.keep(delay_first=True), name="gate-once-lease")
        try:
            return await self.reconcile_all()
        finally:
            renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewing
            await self._lease.release()

    async def run(self) -> None:
        """The controller: elect, inform, work, until cancelled. API failures are logged and
        retried; they never end it."""
        self._lease.electing = True
        self._queue.running = True
        tasks = [asyncio.create_task(self._lease.keep(), name="gate-lease")]
        tasks += [
            asyncio.create_task(self._cache.inform(s), name=f"gate-{s.key}")
            for s in self._cache.sources.values()
        ]
        tasks.append(asyncio.create_task(self._cache.resync_forever(), name="gate-resync"))
        work = self._queue.work(
            lambda name: self.reconcile(name, cached=True), may_work=self._lease.is_leader, now=self._now
        )
        tasks.append(asyncio.create_task(work, name="gate-work"))
        try:
            await asyncio.gather(*tasks)
        finally:
            self._queue.running = False
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            self._queue.cancel_timers()
            await self._lease.release()
            self._lease.drop()
