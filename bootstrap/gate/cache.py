"""The gate's informer caches: Nodes, NodeAttestations and the NodeWright / Skyhook CRs.

Each source is loaded once by a streaming list where the server serves one (a watch that starts
with every object and goes on with the changes: nothing for the API server to build as one LIST),
else by a LIST, then watched. When the server ends a stream (every few minutes) the watch is
resumed from the last resourceVersion, which bookmarks keep fresh: no LIST. The cache is loaded
again only on 410 (the version is too old) and when resuming after a failure did not work; the old
cache stays in force until the new load replaces it. ``resync`` decides every node again from the
caches and makes no API call. A package API group that is not served counts as empty and is looked
for again each resync.

Fail closed: a source counts as synced (``Source.synced``, see ``Cache.in_sync``) only once loaded,
and no longer from a watch failure on (events may have been missed) until a load replaces the
cache or the watch resumed from its resourceVersion delivers an event, which proves the server
accepted that version: the events since follow it (a too-old version is an ERROR event first).

Every cached copy is slim: a Node keeps only what holds.decide reads; a package CR is kept
parsed, its ``status.nodeState`` (thousands of nodes, megabytes) indexed per node (crindex: each
event decoded once, only the nodes whose report's JSON changed decoded again) and the object
itself dropped. Every change names the nodes whose decision it can change to ``changed``: for a
CR whose spec is unchanged, only the nodes whose report in its status changed; a re-list names
them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bootstrap.config import GateSettings
from bootstrap.gate import crindex, holds
from bootstrap.gate.backoff import failure_delay
from bootstrap.gate.fields import dict_at, list_at, name_of
from bootstrap.kube import (
    Kube,
    KubeUnavailable,
    NotServed,
    WatchEvent,
    WatchExpired,
    WatchListRefused,
    ends_initial_events,
)
from bootstrap.kube.watch import WATCH_SECONDS

log = logging.getLogger("nodegate.gate")

ATTESTATIONS = ("nodegate.io", "v1alpha1", "nodeattestations")
PACKAGE_RESOURCES = {
    "nodewright.nvidia.com": ("nodewright.nvidia.com", "v1alpha1", "nodewrights"),
    "skyhook.nvidia.com": ("skyhook.nvidia.com", "v1alpha1", "skyhooks"),
}
NODES, ATTESTATION_SOURCE = "nodes", "nodeattestations"
_NODE_META = ("name", "uid", "resourceVersion", "labels")
_CR_META = ("name", "uid", "resourceVersion")
# A stream the server has not ended this long after its own timeout is taken for hung: closed and
# resumed from its resourceVersion.
STREAM_GUARD = WATCH_SECONDS + 60.0
# Failures in a row after which the watch is no longer resumed but the source loaded again, and
# the load is a LIST (a streaming list can fail where a LIST does not: 429 while the API server's
# watch cache of a new CRD initializes); the next load tries a streaming list again.
RESUME_ATTEMPTS = 2


@dataclass(slots=True)
class Source:
    """One informer: its cache and where its watch stands."""

    key: str  # "nodes", "nodeattestations" or a package API group
    optional: bool  # a package group: not served counts as empty
    objects: dict[str, dict[str, Any]] | None = None  # name -> object; None until the first list
    rv: str = ""
    synced: bool = False  # loaded, and since any watch failure loaded again or resumed (an event came)
    served: bool = True
    relist: bool = True  # load again (first load, 410, resuming after failures did not work)
    streaming: bool = True  # load by a streaming list; False once the server did not serve one


def slim_node(node: dict[str, Any]) -> dict[str, Any]:
    """What the gate reads of a Node: its name, uid, resourceVersion, labels, the annotations
    under NodeWright's prefixes, taints, conditions and boot id. A watched Node also carries
    images, addresses, capacity and managedFields (tens of KB each); at 10,000 nodes keeping them
    costs hundreds of MB."""
    meta = dict_at(node, "metadata")
    slim_meta = {k: meta[k] for k in _NODE_META if k in meta}
    annotations = dict_at(node, "metadata", "annotations")
    slim_meta["annotations"] = {k: v for k, v in annotations.items() if k.split("/", 1)[0] in holds.PREFIXES}
    out: dict[str, Any] = {
        "metadata": slim_meta,
        "spec": {"taints": list_at(node, "spec", "taints")},
        "status": {"conditions": list_at(node, "status", "conditions")},
    }
    boot = dict_at(node, "status", "nodeInfo").get("bootID")
    if boot is not None:
        out["status"]["nodeInfo"] = {"bootID": boot}
    return out


def slim_attestation(obj: dict[str, Any]) -> dict[str, Any]:
    """What the gate reads of a NodeAttestation: who it is, spec, and status without the boot
    record. The join service's bookkeeping annotations (audit trail, used sessions, the boot
    record) and status.boot are several KB per node that the gate never reads."""
    meta = dict_at(obj, "metadata")
    status = {k: v for k, v in dict_at(obj, "status").items() if k != "boot"}
    return {
        "metadata": {k: meta[k] for k in _NODE_META if k in meta},
        "spec": dict_at(obj, "spec"),
        "status": status,
    }


def slim_cr(group: str, obj: Mapping[str, Any]) -> dict[str, Any]:
    """What is kept of a package CR besides its parse: who it is (the status is not kept)."""
    meta = dict_at(obj, "metadata")
    return {
        "apiVersion": f"{group}/v1alpha1",
        "kind": holds.GROUPS[group],
        "metadata": {k: meta[k] for k in _CR_META if k in meta},
    }


def _invalid_cr(group: str, obj: Mapping[str, Any], why: str) -> holds.PackageCr:
    """A CR the gate cannot read still holds what it may select: it becomes a CR with one
    package no node can complete, so holds.decide keeps those nodes pending and says why."""
    spec = obj.get("spec")
    raw = spec.get("nodeSelectors") if isinstance(spec, Mapping) else None
    # An unreadable selector matches every node (holds.selector_matches fails closed on it).
    selector: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {"matchExpressions": [None]}
    label = f"(invalid CR: {why})"[:300]
    pkg = holds.PackageSpec(label, "-", False, (), False, False)
    return holds.PackageCr(
        group=group,
        name=name_of(obj) or "?",
        selector=selector,
        packages={label: pkg},
        paused=False,
        disabled=False,
        config_updates={},
        mirrored_from=None,
    )


class Cache:
    """The informers' caches, and the package CRs parsed once per change."""

    def __init__(self, kube: Kube, settings: GateSettings, *, changed: Callable[[str], None]) -> None:
        self._kube = kube
        self._settings = settings
        self._changed = changed
        self.sources: dict[str, Source] = {
            NODES: Source(NODES, optional=False),
            ATTESTATION_SOURCE: Source(ATTESTATION_SOURCE, optional=False),
            **{group: Source(group, optional=True) for group in PACKAGE_RESOURCES},
        }
        self._parsed: dict[tuple[str, str], holds.PackageCr] = {}
        self._reports: dict[tuple[str, str], crindex.Reports] = {}  # what each CR's index was built from
        self._not_served_logged: set[str] = set()

    # -- reading -------------------------------------------------------------------------------

    @property
    def not_served(self) -> frozenset[str]:
        """Package API groups the cluster does not serve (counted as having no CRs)."""
        return frozenset(s.key for s in self.sources.values() if s.optional and not s.served)

    def loaded(self) -> bool:
        """Has every source been listed at least once? Nothing is decided before."""
        return all(s.objects is not None for s in self.sources.values())

    def in_sync(self) -> bool:
        """Is every cache current (no watch broke since its last list)? No node is released
        otherwise."""
        return all(s.synced for s in self.sources.values())

    def nodes(self) -> dict[str, dict[str, Any]]:
        return self.sources[NODES].objects or {}

    def watched_node(self, name: str) -> dict[str, Any] | None:
        """The node's watched copy, when the node watch is in sync; else None (read it fresh)."""
        return self.nodes().get(name) if self.sources[NODES].synced else None

    def attestations(self) -> dict[str, dict[str, Any]]:
        return self.sources[ATTESTATION_SOURCE].objects or {}

    def attestation(self, name: str) -> dict[str, Any] | None:
        return self.attestations().get(name)

    def names(self) -> list[str]:
        """Every node and NodeAttestation name, sorted: what a full pass decides."""
        return sorted(self.nodes().keys() | self.attestations().keys())

    def package_crs(self) -> list[holds.PackageCr]:
        return [self._parsed[k] for k in sorted(self._parsed)]

    # -- the gate's own writes -----------------------------------------------------------------

    def drop_attestation(self, name: str) -> None:
        """The NodeAttestation is gone (a write found it deleted)."""
        objects = self.sources[ATTESTATION_SOURCE].objects
        if objects is not None:
            objects.pop(name, None)

    def wrote_node(self, name: str, read: Mapping[str, Any], written: dict[str, Any]) -> None:
        """The gate's own Node write stands in for the copy it was decided on, until the watch
        brings it: the writes that follow (the condition) then carry its resourceVersion, not a
        stale one that would fail with 409. A copy the watch replaced meanwhile is newer: kept."""
        objects = self.sources[NODES].objects
        if objects is not None and objects.get(name) is read and name_of(written) == name:
            objects[name] = slim_node(written)

    def wrote_attestation(self, name: str, read: dict[str, Any], written: dict[str, Any]) -> None:
        """Until the watch brings it, the written object stands in (no second write); but a
        watch event that arrived meanwhile may be newer (a revocation), and it must not be
        overwritten."""
        objects = self.sources[ATTESTATION_SOURCE].objects
        if objects is not None and objects.get(name) is read and name_of(written) == name:
            objects[name] = slim_attestation(written)

    # -- lists and watches ---------------------------------------------------------------------

    async def _list(self, src: Source) -> tuple[list[Any], str]:
        if src.key == NODES:
            return await self._kube.list_nodes()
        if src.key == ATTESTATION_SOURCE:
            return await self._kube.list_cluster_objects(*ATTESTATIONS)
        return await self._kube.list_cluster_objects_as(*PACKAGE_RESOURCES[src.key], crindex.DECODER)

    def _watch(self, src: Source, *, initial: bool = False) -> AsyncGenerator[WatchEvent[Any], None]:
        """The source's watch from its resourceVersion; ``initial``: a streaming list."""
        rv = "" if initial else src.rv
        if src.key == NODES:
            return self._kube.watch_nodes(rv, initial_events=initial)
        if src.key == ATTESTATION_SOURCE:
            return self._kube.watch_cluster_objects(*ATTESTATIONS, rv, initial_events=initial)
        return self._kube.watch_cluster_objects_as(
            *PACKAGE_RESOURCES[src.key], rv, crindex.DECODER, initial_events=initial
        )

    async def load(self) -> list[str]:
        """List every source once; the errors of those that failed (their caches are kept)."""
        errors: list[str] = []
        results = await asyncio.gather(
            *(self.relist(s) for s in self.sources.values()), return_exceptions=True
        )
        for src, result in zip(self.sources.values(), results, strict=True):
            if isinstance(result, KubeUnavailable):
                errors.append(f"list {src.key}: {result}")
            elif isinstance(result, BaseException):
                raise result
        return errors

    async def relist(self, src: Source) -> None:
        """List one source and replace its cache; every node is then decided again."""
        src.synced = False
        try:
            items, rv = await self._list(src)
        except NotServed as exc:
            self._not_served(src, exc)
            items, rv = [], ""
        else:
            self._served(src)
        self._replace(src, items, rv)

    def _not_served(self, src: Source, exc: NotServed) -> None:
        """404 on a source: a package group counts as empty; the others must be served."""
        if not src.optional:
            raise exc
        if src.key not in self._not_served_logged:
            self._not_served_logged.add(src.key)
            log.info("%s is not served by this cluster: no %s CRs", src.key, holds.GROUPS[src.key])
        src.served = False

    def _served(self, src: Source) -> None:
        if src.optional and not src.served:
            log.info("%s is served now", src.key)
            self._not_served_logged.discard(src.key)
        src.served = True

    def _replace(self, src: Source, items: Iterable[Any], rv: str) -> None:
        """A load's objects (all of them, at ``rv``) replace the cache; every node is then
        decided again."""
        before = src.objects or {}
        src.objects = {}
        for obj in items:
            self._store(src, obj)
        gone = set(before) - set(src.objects)
        for name in gone:
            self._parsed.pop((src.key, name), None)
            self._reports.pop((src.key, name), None)
        src.rv, src.synced, src.relist = rv, True, False
        # A node or attestation gone meanwhile is decided too: its leftovers are cleared.
        for name in sorted({*self.names(), *(() if src.optional else gone)}):
            self._changed(name)

    def resync(self) -> None:
        """Decide every node again from the caches (``gate.resync``): no API call; the watches
        keep running."""
        names = self.names()
        log.info("resync: %d nodes decided again from the caches", len(names))
        for name in names:
            self._changed(name)

    async def resync_forever(self) -> None:
        """``resync`` every ``gate.resync``."""
        while True:
            await asyncio.sleep(self._settings.resync.total_seconds())
            self.resync()

    def _store(self, src: Source, obj: Any) -> set[str]:
        """Cache one object; for a package CR, the nodes whose report in it changed."""
        if not src.optional:
            name = name_of(obj)
            if name and src.objects is not None:
                src.objects[name] = slim_node(obj) if src.key == NODES else slim_attestation(obj)
            return set()
        # A CR comes decoded by crindex.DECODER from the API; as a plain dict from elsewhere.
        doc = obj if isinstance(obj, crindex.CrDoc) else crindex.DECODER.from_mapping(obj)
        name = name_of(doc.obj)
        if not name or src.objects is None:
            return set()
        key = (src.key, name)
        src.objects[name] = slim_cr(src.key, doc.obj)
        # Lists do not always repeat apiVersion/kind on items; parse_cr checks them.
        light = {"apiVersion": f"{src.key}/v1alpha1", "kind": holds.GROUPS[src.key], **doc.obj}
        try:
            parsed = holds.parse_cr(light)  # without status.nodeState: the index below reads it
        except holds.CrInvalid as exc:
            log.warning("%s/%s cannot be read (%s): the nodes it may select stay held", src.key, name, exc)
            self._parsed[key] = _invalid_cr(src.key, light, str(exc))
            self._reports.pop(key, None)
            return set()
        keys = [f"{p.name}|{p.version}" for p in parsed.packages.values()]
        reports, changed = crindex.update(self._reports.get(key), doc.states, doc.statuses, keys)
        self._reports[key] = reports
        self._parsed[key] = dataclasses.replace(parsed, reports=reports.by_node)
        return changed

    def apply_event(self, src: Source, event: WatchEvent[Any]) -> None:
        """One watch event into the cache; the nodes it can change are named to ``changed``."""
        obj = event.object.obj if isinstance(event.object, crindex.CrDoc) else event.object
        rv = str(dict_at(obj, "metadata").get("resourceVersion", ""))
        if event.type != "BOOKMARK" and src.objects is not None:
            name = name_of(obj)
            before = self._parsed.get((src.key, name)) if src.optional else None
            changed: set[str] = set()
            if event.type == "DELETED":
                src.objects.pop(name, None)
                self._parsed.pop((src.key, name), None)
                self._reports.pop((src.key, name), None)
            elif event.type in ("ADDED", "MODIFIED"):
                changed = self._store(src, event.object)
            after = self._parsed.get((src.key, name)) if src.optional else None
            for node in self._affected(src, name, before, after, changed):
                self._changed(node)
        if rv:
            src.rv = rv

    def _affected(
        self,
        src: Source,
        name: str,
        before: holds.PackageCr | None,
        after: holds.PackageCr | None,
        changed: set[str],
    ) -> set[str]:
        """The nodes whose decision a change of one object can change (``changed``: the nodes
        whose report in a CR changed)."""
        if not src.optional:
            return {name}
        if before is not None and after is not None and before == after:
            # Only the operator's status changed (the usual event): the nodes whose report did.
            nodes = self.nodes()
            return {n for n in changed if n in nodes}
        affected: set[str] = set()
        for cr in (before, after):
            if cr is not None:
                affected |= {
                    n
                    for n, node in self.nodes().items()
                    if holds.selector_matches(cr.selector, dict_at(node, "metadata", "labels"))
                }
        return affected

    async def inform(self, src: Source) -> None:
        """Forever: load the source (a streaming list where served, else a LIST), then follow its
        watch, resumed from the last resourceVersion whenever the server ends the stream. Loaded
        again on 410, and after a failure when resuming did not work (after a backoff). A package
        group that is not served is looked for again every ``resync``."""
        failures = 0  # failures in a row: none since a stream last delivered an event
        quiet = 0  # streams in a row that the server ended without an event
        while True:
            loading = src.relist or src.objects is None
            try:
                if loading:
                    src.synced = False
                    if src.streaming and failures < RESUME_ATTEMPTS and await self._stream_list(src):
                        failures = quiet = 0
                        continue  # loaded, and that stream followed until the server ended it
                    if src.relist or src.objects is None:
                        await self.relist(src)
                if not src.served:
                    await asyncio.sleep(self._settings.resync.total_seconds())  # installed since?
                    src.relist = True
                    continue
                if await self._follow(src, initial=False):
                    failures = quiet = 0
                else:  # ended without any event, not even a bookmark: do not spin
                    quiet += 1
                    await asyncio.sleep(failure_delay(quiet))
            except WatchExpired:
                src.synced, src.relist = False, True  # the old cache stays in force until reloaded
                if loading:  # a load itself expired (not expected of a server): do not spin
                    failures += 1
                    await asyncio.sleep(failure_delay(failures))
            except Exception as exc:  # KubeUnavailable, or a surprise: never end the informer
                src.synced = False
                failures += 1
                if failures >= RESUME_ATTEMPTS or not src.rv:
                    src.relist = True
                delay = failure_delay(failures)
                then = "loading it again" if src.relist or src.objects is None else "resuming"
                if isinstance(exc, KubeUnavailable):
                    log.warning("%s: %s; %s in %.1f s", src.key, exc, then, delay)
                else:
                    log.exception("%s: unexpected error; %s in %.1f s", src.key, then, delay)
                await asyncio.sleep(delay)

    async def _stream_list(self, src: Source) -> bool:
        """Load the source by a streaming list and follow that watch until the server ends it.
        False when this server does not serve streaming lists (then the source is listed, now
        and from now on). A package group that is not served is loaded empty."""
        try:
            if await self._follow(src, initial=True):
                return True
        except WatchListRefused as exc:
            log.info("%s: streaming lists are not served (%s): listing instead", src.key, exc)
        except NotServed as exc:
            self._not_served(src, exc)
            self._replace(src, (), "")
            return True
        else:
            log.warning(
                "%s: the streaming list ended before its initial events did: listing instead", src.key
            )
        src.streaming = False
        return False

    async def _follow(self, src: Source, *, initial: bool) -> bool:
        """One watch stream into the cache until the server ends it (or it outlives
        STREAM_GUARD); whether it delivered an event. ``initial``: a streaming list, whose
        objects replace the cache at the bookmark that ends them; then whether that came."""
        pending: dict[str, Any] | None = {} if initial else None  # the initial events so far
        came = False
        with contextlib.suppress(TimeoutError):
            async with (
                asyncio.timeout(STREAM_GUARD),
                contextlib.aclosing(self._watch(src, initial=initial)) as events,
            ):
                async for event in events:
                    came = True
                    if pending is None:
                        if not src.synced:
                            # Resumed after a failure: an event means the server took the version
                            # (a too-old one is an ERROR first), so every event since follows.
                            src.synced = True
                            log.info("%s: the watch resumed from resourceVersion %s", src.key, src.rv)
                        self.apply_event(src, event)
                        continue
                    obj = event.object.obj if isinstance(event.object, crindex.CrDoc) else event.object
                    if ends_initial_events(event, obj):
                        self._served(src)
                        self._replace(
                            src, pending.values(), str(dict_at(obj, "metadata").get("resourceVersion", ""))
                        )
                        pending = None
                    elif event.type in ("ADDED", "MODIFIED"):
                        pending[name_of(obj)] = self._kept(src, event.object)
                    elif event.type == "DELETED":
                        pending.pop(name_of(obj), None)
        return pending is None if initial else came

    def _kept(self, src: Source, obj: Any) -> Any:
        """What a streaming list holds of an initial object until its end: the slim copy (a
        package CR stays decoded as it came: its index is built at the end)."""
        if src.key == NODES:
            return slim_node(obj)
        if src.key == ATTESTATION_SOURCE:
            return slim_attestation(obj)
        return obj
