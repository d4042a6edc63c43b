"""The gate's informer caches: Nodes, NodeAttestations and the NodeWright / Skyhook CRs.

Each source is listed, then watched from the list's resourceVersion; 410 or a broken stream
re-lists (the old cache stays in force until the new list replaces it), and so does every
``resync``. A package API group that is not served counts as empty and is looked for again each
resync. Every cached copy is slim: a Node keeps only what holds.decide reads; a package CR is kept
parsed, its ``status.nodeState`` (thousands of nodes, megabytes) indexed per node (crindex: each
event decoded once, only the nodes whose report's JSON changed decoded again) and the object
itself dropped. Every change names the nodes whose decision it can change to ``changed``: for a
CR whose spec is unchanged, only the nodes whose report in its status changed; a re-list names
them all.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from bootstrap.config import GateSettings
from bootstrap.gate import crindex, holds
from bootstrap.gate.backoff import failure_delay
from bootstrap.gate.fields import dict_at, list_at, name_of
from bootstrap.kube import Kube, KubeUnavailable, NotServed, WatchEvent, WatchExpired

log = logging.getLogger("nodegate.gate")

ATTESTATIONS = ("nodegate.io", "v1alpha1", "nodeattestations")
PACKAGE_RESOURCES = {
    "nodewright.nvidia.com": ("nodewright.nvidia.com", "v1alpha1", "nodewrights"),
    "skyhook.nvidia.com": ("skyhook.nvidia.com", "v1alpha1", "skyhooks"),
}
NODES, ATTESTATION_SOURCE = "nodes", "nodeattestations"
_NODE_META = ("name", "uid", "resourceVersion", "labels")
_CR_META = ("name", "uid", "resourceVersion")


@dataclass(slots=True)
class Source:
    """One informer: its cache and where its watch stands."""

    key: str  # "nodes", "nodeattestations" or a package API group
    optional: bool  # a package group: not served counts as empty
    objects: dict[str, dict[str, Any]] | None = None  # name -> object; None until the first list
    rv: str = ""
    synced: bool = False  # listed, and no watch failure since
    served: bool = True
    relist: bool = True


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

    def _watch(self, src: Source) -> AsyncIterator[WatchEvent[Any]]:
        if src.key == NODES:
            return self._kube.watch_nodes(src.rv)
        if src.key == ATTESTATION_SOURCE:
            return self._kube.watch_cluster_objects(*ATTESTATIONS, src.rv)
        return self._kube.watch_cluster_objects_as(*PACKAGE_RESOURCES[src.key], src.rv, crindex.DECODER)

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
            self._reports.pop((src.key, name), None)
        src.rv, src.synced, src.relist = rv, True, False
        for name in self.names():
            self._changed(name)

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
        """Forever: list, watch from the list's resourceVersion, re-list on 410, on failure
        (after a backoff) and every ``resync`` (which also decides every node again)."""
        failures = 0
        resync = self._settings.resync.total_seconds()
        while True:
            try:
                if src.relist or src.objects is None:
                    await self.relist(src)
                if not src.served:
                    await asyncio.sleep(resync)  # look again whether the CRD was installed
                    src.relist = True
                    continue
                try:
                    async with asyncio.timeout(resync):
                        async for event in self._watch(src):
                            self.apply_event(src, event)
                except TimeoutError:
                    src.relist = True
                failures = 0
            except WatchExpired:
                src.relist = True  # the cache stays in force until the re-list replaces it
            except Exception as exc:  # KubeUnavailable, or a surprise: never end the informer
                src.synced, src.relist = False, True
                failures += 1
                delay = failure_delay(failures)
                if isinstance(exc, KubeUnavailable):
                    log.warning("%s: %s; listing again in %.1f s", src.key, exc, delay)
                else:
                    log.exception("%s: unexpected error; listing again in %.1f s", src.key, delay)
                await asyncio.sleep(delay)
