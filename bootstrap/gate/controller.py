"""The hold gate: keeps ``<taint_key>=<reason>`` on every node until bootstrap/holds.py says the
node may run workloads, and publishes why (NodeAttestation status, a Node condition, Events).

What decides is holds.py; this module only reads the cluster and writes the outcome:

- reads Nodes, NodeAttestations and the NodeWright / Skyhook CRs (a package API group that is not
  served counts as empty) into an in-memory cache (list, then watch from the list's
  resourceVersion; 410 or a broken stream re-lists; every ``resync`` re-lists and re-decides all);
- writes the taint by read-modify-write with the node's resourceVersion (merge patches replace the
  whole list, so a write from a stale read must fail with 409 and be redone on a fresh read);
  taints with other keys are never changed;
- fails closed: nothing is decided before every list has loaded, and no node is released while
  any cache may be stale (a watch broke and the re-list has not succeeded yet);
- in ``run()`` only the holder of a coordination.k8s.io Lease writes; the flag is checked before
  every write, and lapses on its own when renewals stop succeeding.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import secrets
import socket
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from bootstrap.config import GateSettings, Settings
from bootstrap.gate import holds
from bootstrap.kube import Conflict, Kube, KubeUnavailable, NotFound, NotServed, WatchEvent, WatchExpired
from bootstrap.times import micro_time, parse_time, rfc3339

log = logging.getLogger("nodegate.gate")

ATTESTATIONS = ("nodegate.io", "v1alpha1", "nodeattestations")
PACKAGE_RESOURCES = {
    "nodewright.nvidia.com": ("nodewright.nvidia.com", "v1alpha1", "nodewrights"),
    "skyhook.nvidia.com": ("skyhook.nvidia.com", "v1alpha1", "skyhooks"),
}
NODES, ATTESTATION_SOURCE = "nodes", "nodeattestations"
CONDITION_TYPE = "NodegateReady"
HELD_CONDITION = "Held"
CONFLICT_ATTEMPTS = 6
MAX_BACKOFF = 30.0
_GATE_STATUS_KEYS = ("phase", "reason", "message", "packages", "completeSince", "conditions")


@dataclass(slots=True)
class GateReport:
    """What one pass did (``reconcile_all``)."""

    nodes: int = 0
    held: dict[str, int] = field(default_factory=dict)  # reason -> nodes
    released: int = 0
    writes: int = 0
    errors: list[str] = field(default_factory=list)


class _NotLeader(Exception):
    """Another replica holds the lease: the write was not made."""


class LeaseHeld(Exception):
    """``once()``: another gate holds the Lease and is reconciling already."""

    def __init__(self, holder: str) -> None:
        super().__init__(f"the gate is running as {holder!r} (it holds the lease); nothing was done")
        self.holder = holder


@dataclass(slots=True)
class _Source:
    key: str  # "nodes", "nodeattestations" or a package API group
    optional: bool  # a package group: not served counts as empty
    objects: dict[str, dict[str, Any]] | None = None  # name -> object; None until the first list
    rv: str = ""
    synced: bool = False  # listed, and no watch failure since
    served: bool = True
    relist: bool = True


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    return str(meta.get("name", "")) if isinstance(meta, Mapping) else ""


def _dict(obj: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    cur: Any = obj
    for key in keys:
        cur = cur.get(key) if isinstance(cur, Mapping) else None
    return cur if isinstance(cur, dict) else {}


def _list(obj: Mapping[str, Any], *keys: str) -> list[Any]:
    cur: Any = obj
    for key in keys:
        cur = cur.get(key) if isinstance(cur, Mapping) else None
    return cur if isinstance(cur, list) else []


_NODE_META = ("name", "uid", "resourceVersion", "labels", "annotations")


def _slim_node(node: dict[str, Any]) -> dict[str, Any]:
    """What the gate reads of a Node: its name, uid, resourceVersion, labels, annotations,
    taints and conditions. A watched Node also carries images, addresses, capacity and
    managedFields (tens of KB each); at 10,000 nodes keeping them costs hundreds of MB."""
    meta = _dict(node, "metadata")
    return {
        "metadata": {k: meta[k] for k in _NODE_META if k in meta},
        "spec": {"taints": _list(node, "spec", "taints")},
        "status": {"conditions": _list(node, "status", "conditions")},
    }


def camel(reason: str | None) -> str:
    """``packages-pending`` -> ``PackagesPending``; None (released) -> ``Released``."""
    if reason is None:
        return "Released"
    return "".join(part.capitalize() for part in reason.split("-"))


def identity() -> str:
    """This replica's Lease holder name: the pod (or host) name, the process and a random
    suffix, so two processes on one host never both believe they hold the lease."""
    base = os.environ.get("POD_NAME") or socket.gethostname() or "nodegate"
    return f"{base[:200]}_{os.getpid()}_{secrets.token_hex(4)}"


def _invalid_cr(group: str, obj: Mapping[str, Any], why: str) -> holds.PackageCr:
    """A CR the gate cannot read still holds what it may select: it becomes a CR with one
    package no node can complete, so holds.decide keeps those nodes pending and says why."""
    spec = obj.get("spec")
    raw = spec.get("nodeSelectors") if isinstance(spec, Mapping) else None
    # An unreadable selector matches every node (holds.selector_matches fails closed on it).
    selector: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {"matchExpressions": [None]}
    label = f"(invalid CR: {why})"[:300]
    pkg = holds.PackageSpec(label, "-", False, (), False, False)
    return holds.PackageCr(group, _name(obj) or "?", selector, {label: pkg}, False, False, {}, None)


class Gate:
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
        self._events_namespace = events_namespace
        self._now = now
        self._identity = identity
        self._sources: dict[str, _Source] = {
            NODES: _Source(NODES, optional=False),
            ATTESTATION_SOURCE: _Source(ATTESTATION_SOURCE, optional=False),
            **{group: _Source(group, optional=True) for group in PACKAGE_RESOURCES},
        }
        self._parsed: dict[tuple[str, str], holds.PackageCr] = {}
        self._complete_since: dict[str, datetime | None] = {}
        self._writes = 0
        self._not_served_logged: set[str] = set()
        # Leader election: off for one-shot use (reconcile_all); run() turns it on.
        self._election = False
        self._lease_until: datetime | None = None
        self.lease_holder = ""  # the other replica's identity when elect() last lost
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._failures: dict[str, int] = {}
        self._running = False

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
        return self._writes

    @property
    def not_served(self) -> frozenset[str]:
        """Package API groups the cluster does not serve (counted as having no CRs)."""
        return frozenset(s.key for s in self._sources.values() if s.optional and not s.served)

    def is_leader(self) -> bool:
        """May this gate write now? Always without election; with it, only within the lease."""
        if not self._election:
            return True
        return self._lease_until is not None and self._now() < self._lease_until

    def _loaded(self) -> bool:
        return all(s.objects is not None for s in self._sources.values())

    def _can_release(self) -> bool:
        return all(s.synced for s in self._sources.values())

    def _nodes(self) -> dict[str, dict[str, Any]]:
        return self._sources[NODES].objects or {}

    def _attestation(self, name: str) -> dict[str, Any] | None:
        return (self._sources[ATTESTATION_SOURCE].objects or {}).get(name)

    def _package_crs(self) -> list[holds.PackageCr]:
        return [self._parsed[k] for k in sorted(self._parsed)]

    # -- lists and watches ---------------------------------------------------------------------

    async def _list_source(self, src: _Source) -> tuple[list[dict[str, Any]], str]:
        if src.key == NODES:
            return await self._kube.list_nodes()
        group, version, plural = ATTESTATIONS if src.key == ATTESTATION_SOURCE else PACKAGE_RESOURCES[src.key]
        return await self._kube.list_cluster_objects(group, version, plural)

    def _watch_source(self, src: _Source) -> AsyncIterator[WatchEvent]:
        if src.key == NODES:
            return self._kube.watch_nodes(src.rv)
        group, version, plural = ATTESTATIONS if src.key == ATTESTATION_SOURCE else PACKAGE_RESOURCES[src.key]
        return self._kube.watch_cluster_objects(group, version, plural, src.rv)

    async def _relist(self, src: _Source) -> None:
        """List one source and replace its cache; every node is then decided again."""
        src.synced = False
        try:
            items, rv = await self._list_source(src)
        except NotServed:
            if not src.optional:
                raise
            if src.key not in self._not_served_logged:
                self._not_served_logged.add(src.key)
                log.info("%s is not served by this cluster: no %s CRs", src.key, holds.GROUPS[src.key])
            items, rv, src.served = [], "", False
        else:
            if src.optional and not src.served:
                log.info("%s is served now", src.key)
                self._not_served_logged.discard(src.key)
            src.served = True
        before = src.objects or {}
        src.objects = {}
        for obj in items:
            self._store(src, obj)
        for name in set(before) - set(src.objects):
            self._parsed.pop((src.key, name), None)
        src.rv, src.synced, src.relist = rv, True, False
        self._enqueue_all()

    def _store(self, src: _Source, obj: dict[str, Any]) -> None:
        name = _name(obj)
        if not name or src.objects is None:
            return
        src.objects[name] = _slim_node(obj) if src.key == NODES else obj
        if src.optional:
            # Lists do not always repeat apiVersion/kind on items; parse_cr checks them.
            obj.setdefault("apiVersion", f"{src.key}/v1alpha1")
            obj.setdefault("kind", holds.GROUPS[src.key])
            try:
                self._parsed[(src.key, name)] = holds.parse_cr(obj)
            except holds.CrInvalid as exc:
                log.warning(
                    "%s/%s cannot be read (%s): the nodes it may select stay held", src.key, name, exc
                )
                self._parsed[(src.key, name)] = _invalid_cr(src.key, obj, str(exc))

    def _apply_event(self, src: _Source, event: WatchEvent) -> None:
        rv = str(_dict(event.object, "metadata").get("resourceVersion", ""))
        if event.type != "BOOKMARK" and src.objects is not None:
            name = _name(event.object)
            affected = self._affected(src, name)
            if event.type == "DELETED":
                src.objects.pop(name, None)
                self._parsed.pop((src.key, name), None)
            elif event.type in ("ADDED", "MODIFIED"):
                self._store(src, event.object)
            for node in affected | self._affected(src, name):
                self._enqueue(node)
        if rv:
            src.rv = rv

    def _affected(self, src: _Source, name: str) -> set[str]:
        """The nodes whose decision an object can change (call before and after the change)."""
        if not src.optional:
            return {name}
        cr = self._parsed.get((src.key, name))
        if cr is None:
            return set()
        return {
            n
            for n, node in self._nodes().items()
            if holds.selector_matches(cr.selector, _dict(node, "metadata", "labels"))
        }

    async def load(self) -> list[str]:
        """List every source once; the errors of those that failed (their caches are kept)."""
        errors: list[str] = []
        results = await asyncio.gather(
            *(self._relist(s) for s in self._sources.values()), return_exceptions=True
        )
        for src, result in zip(self._sources.values(), results, strict=True):
            if isinstance(result, KubeUnavailable):
                errors.append(f"list {src.key}: {result}")
            elif isinstance(result, BaseException):
                raise result
        return errors

    # -- deciding and writing ------------------------------------------------------------------

    def decide(self, node: Mapping[str, Any]) -> holds.Decision:
        """holds.decide over the cache; completeSince carries over from the last decision, or
        after a restart from the NodeAttestation status this gate wrote."""
        name = _name(node)
        attestation = self._attestation(name)
        if name in self._complete_since:
            since = self._complete_since[name]
        else:
            since = parse_time(_dict(attestation or {}, "status").get("completeSince"))
        return holds.decide(
            node=node,
            attestation=holds.attestation_view(attestation),
            crs=self._package_crs(),
            now=self._now(),
            stability_window=self._settings.stability_window,
            attestation_lifetime=self._settings.attestation_lifetime,
            complete_since=since,
        )

    def _decide_without_node(self, name: str) -> holds.Decision:
        return holds.decide_without_node(
            attestation=holds.attestation_view(self._attestation(name)),
            now=self._now(),
            attestation_lifetime=self._settings.attestation_lifetime,
        )

    async def reconcile(self, node_name: str, *, cached: bool = False) -> holds.Decision | None:
        """Decide one node from the cache and write the outcome. The Node itself is read fresh,
        or with ``cached`` taken from the node watch (see _reconcile). None when nothing was
        decided: the caches are not loaded, the node is gone, or this gate is not the leader.
        Raises KubeUnavailable / Conflict when a write could not be made."""
        if not self._loaded():
            log.info("not every list has loaded yet: %s is not decided", node_name)
            return None
        try:
            return await self._reconcile(node_name, cached=cached)
        except _NotLeader:
            return None

    async def _reconcile(self, name: str, *, cached: bool) -> holds.Decision | None:
        # cached: decide on the watched copy when the node watch is in sync (a resync of 10k
        # nodes then costs its lists, not 10k GETs). Safe for the taint because every write
        # carries the resourceVersion of the copy it was decided on: a stale copy gets 409 and
        # the retry reads fresh; a copy behind an event that needs no write is decided again
        # when that event arrives.
        copy = self._nodes().get(name) if cached and self._sources[NODES].synced else None
        read = copy if copy is not None else await self._kube.get_node(name)
        attempt = 0
        while True:
            if read is None:
                self._complete_since.pop(name, None)
                await self._write_attestation(name, self._decide_without_node(name))
                return None
            attempt += 1
            decision = self.decide(read)  # on the node as read: a 409 means decide again
            self._complete_since[name] = decision.complete_since
            if decision.reason is None and not self._can_release():
                log.info("node %s would be released, but a cache may be stale: not yet", name)
                return None
            try:
                node = await self._write_taint(read, decision)
                break
            except Conflict:
                if attempt >= CONFLICT_ATTEMPTS:
                    raise
                await _jitter(attempt)
                read = await self._kube.get_node(name)
            except NotFound:  # deleted since the copy was taken
                read = await self._kube.get_node(name)
        await self._write_condition(node, decision)
        await self._write_attestation(name, decision)
        return decision

    def _check_leader(self) -> None:
        if not self.is_leader():
            raise _NotLeader

    async def _write_taint(self, node: dict[str, Any], decision: holds.Decision) -> dict[str, Any]:
        """One attempt; the node as stored afterwards. Conflict when the node changed since read."""
        key = self._settings.taint_key
        taints = [t for t in _list(node, "spec", "taints") if isinstance(t, dict)]
        reason = decision.reason
        effect = holds.effect_for(reason, self._settings.quarantine_effect) if reason else "NoSchedule"
        new = holds.apply_decision(taints, key=key, reason=reason, effect=effect)
        if new is None:
            return node
        name = _name(node)
        patch: dict[str, Any] = {"spec": {"taints": new}}
        rv = _dict(node, "metadata").get("resourceVersion")
        if rv:
            patch["metadata"] = {"resourceVersion": rv}
        self._check_leader()
        out = await self._kube.patch_node(name, patch)
        self._writes += 1
        before = next((t.get("value") for t in taints if t.get("key") == key), None)
        log.info("node %s: hold %s -> %s", name, before or "none", reason or "released")
        if before != reason:
            await self._event(out, decision)
        return out

    async def _event(self, node: Mapping[str, Any], decision: holds.Decision) -> None:
        if decision.reason is None:
            reason, type_ = "NodegateReleased", "Normal"
        elif decision.reason == "quarantined":
            reason, type_ = "NodegateQuarantined", "Warning"
        else:
            reason = "NodegateHeld"
            type_ = "Warning" if decision.reason == "validation-failed" else "Normal"
        meta = _dict(node, "metadata")
        involved = {"kind": "Node", "apiVersion": "v1", "name": _name(node), "uid": str(meta.get("uid", ""))}
        self._check_leader()
        try:
            await self._kube.create_event(
                involved=involved,
                reason=reason,
                message=decision.message,
                type_=type_,
                namespace=self._events_namespace,
            )
        except (KubeUnavailable, Conflict) as exc:  # an Event is a courtesy: the taint is what counts
            log.warning("event %s for node %s not recorded: %s", reason, _name(node), exc)
            return
        self._writes += 1

    async def _write_condition(self, node: dict[str, Any], decision: holds.Decision) -> None:
        """The NodegateReady condition, read-modify-write of status.conditions (a merge patch
        replaces the list, so other conditions are sent back exactly as read)."""
        name = _name(node)
        for attempt in range(1, CONFLICT_ATTEMPTS + 1):
            conditions = _list(node, "status", "conditions")
            index = next(
                (
                    i
                    for i, c in enumerate(conditions)
                    if isinstance(c, dict) and c.get("type") == CONDITION_TYPE
                ),
                None,
            )
            old = conditions[index] if index is not None else None
            status = "True" if decision.reason is None else "False"
            want = {
                "type": CONDITION_TYPE,
                "status": status,
                "reason": camel(decision.reason),
                "message": decision.message,
            }
            if old is not None and all(old.get(k) == v for k, v in want.items()):
                return
            now = rfc3339(self._now())
            kept = old.get("lastTransitionTime") if old is not None and old.get("status") == status else None
            want["lastTransitionTime"] = kept or now
            want["lastHeartbeatTime"] = now
            new = list(conditions)
            if index is None:
                new.append(want)
            else:
                new[index] = want
            patch: dict[str, Any] = {"status": {"conditions": new}}
            rv = _dict(node, "metadata").get("resourceVersion")
            if rv:
                patch["metadata"] = {"resourceVersion": rv}
            self._check_leader()
            try:
                await self._kube.patch_node_status(name, patch)
            except NotFound:
                return
            except Conflict:
                if attempt >= CONFLICT_ATTEMPTS:
                    raise
                await _jitter(attempt)
                fresh = await self._kube.get_node(name)
                if fresh is None:
                    return
                node = fresh
                continue
            self._writes += 1
            return

    def attestation_status(self, decision: holds.Decision, current: Mapping[str, Any]) -> dict[str, Any]:
        """The gate's keys of NodeAttestation status for ``decision`` (``current`` = the status
        now: the Held condition keeps its lastTransitionTime while its status stays)."""
        held = "False" if decision.reason is None else "True"
        conditions = [c for c in _list(current, "conditions") if isinstance(c, dict)]
        old = next((c for c in conditions if c.get("type") == HELD_CONDITION), None)
        now = rfc3339(self._now())
        condition = {
            "type": HELD_CONDITION,
            "status": held,
            "reason": camel(decision.reason),
            "message": decision.message,
            "lastTransitionTime": str(old.get("lastTransitionTime", now))
            if old is not None and old.get("status") == held
            else now,
        }
        return {
            "phase": decision.phase,
            "reason": decision.reason or "",
            "message": decision.message,
            "packages": [p.to_json() for p in decision.packages[: holds.MAX_STATUS_PACKAGES]],
            "completeSince": rfc3339(decision.complete_since) if decision.complete_since else None,
            "conditions": [c if c.get("type") != HELD_CONDITION else condition for c in conditions]
            if old is not None
            else [*conditions, condition],
            "observedAt": now,
        }

    async def _write_attestation(self, name: str, decision: holds.Decision) -> None:
        obj = self._attestation(name)
        if obj is None:
            return  # the join service creates NodeAttestations; the gate only reports on them
        current = _dict(obj, "status")
        want = self.attestation_status(decision, current)
        if all(current.get(k) == want[k] for k in _GATE_STATUS_KEYS):
            return
        self._check_leader()
        group, version, plural = ATTESTATIONS
        try:
            out = await self._kube.patch_cluster_object(
                group, version, plural, name, {"status": want}, status=True
            )
        except NotFound:
            objects = self._sources[ATTESTATION_SOURCE].objects
            if objects is not None:
                objects.pop(name, None)
            return
        self._writes += 1
        objects = self._sources[ATTESTATION_SOURCE].objects
        # Until the watch brings it, the answer stands in (no second write); but a watch event
        # that arrived meanwhile may be newer (a revocation), and it must not be overwritten.
        if objects is not None and objects.get(name) is obj and _name(out) == name:
            objects[name] = out

    async def reconcile_all(self) -> GateReport:
        """List everything and decide every node once (``nodegate gate --once``). Nothing is
        written when any list fails."""
        report = GateReport()
        start = self._writes
        report.errors += await self.load()
        if report.errors or not self._loaded():
            report.errors.append("not every list loaded: no node was decided")
            return report
        nodes = self._nodes()
        for name in sorted(self._sources[ATTESTATION_SOURCE].objects or {}):
            if name in nodes:
                continue
            try:  # no Node of this name: the status says Attested (or why not), nothing to hold
                await self._write_attestation(name, self._decide_without_node(name))
            except _NotLeader:
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
        report.writes = self._writes - start
        if self._election and not self.is_leader():
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
        if not await self.elect():
            raise LeaseHeld(self.lease_holder or "another replica")
        renewing = asyncio.create_task(self._lead(delay_first=True), name="gate-once-lease")
        try:
            return await self.reconcile_all()
        finally:
            renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewing
            await self.release_lease()

    # -- leader election -----------------------------------------------------------------------

    def _lease_body(self, now: datetime, *, acquired: str, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self._identity,
            "leaseDurationSeconds": max(1, int(self._settings.lease_duration.total_seconds())),
            "acquireTime": acquired,
            "renewTime": micro_time(now),
            "leaseTransitions": transitions,
        }

    async def elect(self) -> bool:
        """Acquire or renew the Lease once; whether this gate may write afterwards. Writing stops
        at two thirds of the lease duration after the last successful renewal, before any other
        replica can take the lease over."""
        self._election = True
        ns, name = self._settings.lease_namespace, self._settings.lease_name
        now = self._now()
        was = self.is_leader()
        try:
            lease = await self._kube.get_lease(ns, name)
            if lease is None:
                body = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": name, "namespace": ns},
                    "spec": self._lease_body(now, acquired=micro_time(now), transitions=0),
                }
                await self._kube.create_lease(ns, body)
            else:
                spec = _dict(lease, "spec")
                holder = spec.get("holderIdentity") or ""
                renewed = parse_time(spec.get("renewTime"))
                duration = spec.get("leaseDurationSeconds")
                expired = (
                    renewed is None
                    or not isinstance(duration, int)
                    or renewed + timedelta(seconds=duration) <= now
                )
                if holder != self._identity and holder and not expired:
                    self._lease_until = None
                    self.lease_holder = str(holder)[:256]
                    if was:
                        log.warning("lost the lease %s/%s to %s: writes stop", ns, name, holder)
                    return False
                ours = holder == self._identity
                transitions = spec.get("leaseTransitions")
                count = transitions if isinstance(transitions, int) else 0
                new_spec = self._lease_body(
                    now,
                    acquired=str(spec.get("acquireTime"))
                    if ours and spec.get("acquireTime")
                    else micro_time(now),
                    transitions=count if ours else count + 1,
                )
                await self._kube.replace_lease(ns, name, {**lease, "spec": new_spec})
        except (Conflict, NotFound):
            self._lease_until = None  # someone else wrote (or deleted) it first
            return False
        except KubeUnavailable as exc:
            log.warning("lease %s/%s not renewed: %s", ns, name, exc)
            return self.is_leader()  # keeps writing until the renew deadline passes
        self._lease_until = now + self._settings.lease_duration * 2 / 3
        if not was:
            log.info("acquired the lease %s/%s as %s", ns, name, self._identity)
            self._enqueue_all()
        return True

    async def release_lease(self) -> None:
        """Give the Lease up (on shutdown) so another replica need not wait for it to expire.
        Best effort: a failure only means the others wait out the duration."""
        if not self.is_leader():
            return
        self._lease_until = None  # no write from here on
        ns, name = self._settings.lease_namespace, self._settings.lease_name
        try:
            lease = await self._kube.get_lease(ns, name)
            spec = _dict(lease or {}, "spec")
            if lease is None or spec.get("holderIdentity") != self._identity:
                return
            spec = {
                **spec,
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "renewTime": micro_time(self._now()),
            }
            await self._kube.replace_lease(ns, name, {**lease, "spec": spec})
        except (KubeUnavailable, Conflict, NotFound) as exc:
            log.info("lease %s/%s not released: %s", ns, name, exc)

    # -- the controller loop -------------------------------------------------------------------

    def _enqueue(self, name: str) -> None:
        if self._running and name not in self._queued:
            self._queued.add(name)
            self._queue.put_nowait(name)

    def _enqueue_all(self) -> None:
        for name in sorted(self._nodes().keys() | (self._sources[ATTESTATION_SOURCE].objects or {}).keys()):
            self._enqueue(name)

    def _requeue_at(self, name: str, delay: float) -> None:
        old = self._timers.pop(name, None)
        if old is not None:
            old.cancel()
        loop = asyncio.get_running_loop()
        self._timers[name] = loop.call_later(max(delay, 0.0), self._fire, name)

    def _fire(self, name: str) -> None:
        self._timers.pop(name, None)
        self._enqueue(name)

    async def _work(self) -> None:
        while True:
            name = await self._queue.get()
            self._queued.discard(name)
            if not self.is_leader():
                continue  # everything is queued again when the lease is won
            try:
                decision = await self.reconcile(name, cached=True)
            except (KubeUnavailable, Conflict) as exc:
                failures = self._failures[name] = self._failures.get(name, 0) + 1
                delay = min(MAX_BACKOFF, 0.5 * 2**failures) * random.uniform(0.5, 1.0)  # noqa: S311
                log.warning("node %s: %s; retrying in %.1f s", name, exc, delay)
                self._requeue_at(name, delay)
                continue
            except Exception:  # the gate must keep running; the node is retried
                log.exception("node %s: unexpected error", name)
                self._requeue_at(name, MAX_BACKOFF)
                continue
            self._failures.pop(name, None)
            if decision is not None and decision.requeue_at is not None:
                # An event-loop timer, not polling; a small margin so the deadline has passed.
                self._requeue_at(name, (decision.requeue_at - self._now()).total_seconds() + 0.01)

    async def _inform(self, src: _Source) -> None:
        """Forever: list, watch from the list's resourceVersion, re-list on 410, on failure
        (after a backoff) and every ``resync`` (which also decides every node again)."""
        failures = 0
        resync = self._settings.resync.total_seconds()
        while True:
            try:
                if src.relist or src.objects is None:
                    await self._relist(src)
                if not src.served:
                    await asyncio.sleep(resync)  # look again whether the CRD was installed
                    src.relist = True
                    continue
                try:
                    async with asyncio.timeout(resync):
                        async for event in self._watch_source(src):
                            self._apply_event(src, event)
                except TimeoutError:
                    src.relist = True
                failures = 0
            except WatchExpired:
                src.relist = True  # the cache stays in force until the re-list replaces it
            except Exception as exc:  # KubeUnavailable, or a surprise: never end the informer
                src.synced, src.relist = False, True
                failures += 1
                delay = min(MAX_BACKOFF, 0.5 * 2**failures) * random.uniform(0.5, 1.0)  # noqa: S311
                if isinstance(exc, KubeUnavailable):
                    log.warning("%s: %s; listing again in %.1f s", src.key, exc, delay)
                else:
                    log.exception("%s: unexpected error; listing again in %.1f s", src.key, delay)
                await asyncio.sleep(delay)

    async def _lead(self, *, delay_first: bool = False) -> None:
        period = self._settings.lease_duration.total_seconds() / 3
        if delay_first:
            await asyncio.sleep(period)
        while True:
            try:
                await self.elect()
            except Exception:  # elect() handles API failures; this is a bug: keep electing
                self._lease_until = None
                log.exception("lease: unexpected error")
            await asyncio.sleep(period)

    async def run(self) -> None:
        """The controller: elect, inform, work, until cancelled. API failures are logged and
        retried; they never end it."""
        self._election = True
        self._running = True
        tasks = [asyncio.create_task(self._lead(), name="gate-lease")]
        tasks += [asyncio.create_task(self._inform(s), name=f"gate-{s.key}") for s in self._sources.values()]
        tasks.append(asyncio.create_task(self._work(), name="gate-work"))
        try:
            await asyncio.gather(*tasks)
        finally:
            self._running = False
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            for timer in self._timers.values():
                timer.cancel()
            self._timers.clear()
            await self.release_lease()
            self._lease_until = None


async def _jitter(attempt: int) -> None:
    """A short random pause before re-reading after a 409, so racing writers spread out."""
    await asyncio.sleep(random.uniform(0, 0.02 * 2**attempt))  # noqa: S311
