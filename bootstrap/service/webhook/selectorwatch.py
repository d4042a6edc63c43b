"""The package CRs' selectors for the webhook: list, then watch, the NodeWrights and Skyhooks
(``admission.hold.selection``: a node's own label change may not take it out of a CR's selection).

Only each CR's name and ``spec.nodeSelectors`` are decoded; the status (a report per node,
megabytes at fleet scale) is skipped by the decoder. ``package_selectors()`` is None until both
groups were listed once (the webhook then refuses a node's label changes: fail closed). A group
the cluster does not serve counts as having no CRs and is looked for again every ``recheck``
seconds; 410 and broken streams re-list, as the PackagePolicy watch does.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import msgspec

from admission.hold.selection import PackageSelector
from bootstrap.gate.backoff import failure_delay
from bootstrap.kube import Kube, KubeUnavailable, NotServed, WatchExpired
from bootstrap.kube.decode import loads

log = logging.getLogger("nodegate.selectors")

RESOURCES = {
    "nodewright.nvidia.com": ("nodewright.nvidia.com", "v1alpha1", "nodewrights"),
    "skyhook.nvidia.com": ("skyhook.nvidia.com", "v1alpha1", "skyhooks"),
}


class _Spec(msgspec.Struct):
    nodeSelectors: Any = None  # the CRD's field name


class _Cr(msgspec.Struct):
    metadata: Any = None
    spec: _Spec | None = None  # status: not a field, so msgspec skips it undecoded


_DECODE = msgspec.json.Decoder(_Cr)
Named = tuple[str, str, Any]  # (name, resourceVersion, spec.nodeSelectors as stored)


def _named(metadata: Any, selector: Any) -> Named:
    meta = metadata if isinstance(metadata, dict) else {}
    name, rv = meta.get("name"), meta.get("resourceVersion")
    # A selector that is not an object is kept as given: selector_matches reads it as "every node".
    return (name if isinstance(name, str) else "", rv if isinstance(rv, str) else "", selector)


class SelectorDecoder:
    """A package CR as (name, ``spec.nodeSelectors``) (bootstrap.kube.decode.ObjectDecoder)."""

    def from_json(self, data: bytes | msgspec.Raw) -> Named:
        try:
            cr = _DECODE.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            whole = loads(data)  # a spec that is not an object, JSON msgspec refuses: read whole
            if not isinstance(whole, dict):
                raise ValueError("a package CR that is not a JSON object") from None  # noqa: TRY004
            return self.from_mapping(whole)
        return _named(cr.metadata, None if cr.spec is None else cr.spec.nodeSelectors)

    def from_mapping(self, obj: dict[str, Any]) -> Named:
        spec = obj.get("spec")
        selector = spec.get("nodeSelectors") if isinstance(spec, dict) else {"matchExpressions": [None]}
        return _named(obj.get("metadata"), selector)


_DECODER = SelectorDecoder()


class _Group:
    def __init__(self, group: str) -> None:
        self.group = group
        self.items: dict[str, Any] | None = None  # name -> selector; None until listed
        self.rv = ""
        self.served = True


class SelectorWatcher:
    def __init__(self, kube: Kube, *, recheck: float = 60.0) -> None:
        self._kube = kube
        self._recheck = recheck
        self._groups = {g: _Group(g) for g in RESOURCES}
        self._snapshot: tuple[PackageSelector, ...] | None = None

    def package_selectors(self) -> tuple[PackageSelector, ...] | None:
        if self._snapshot is None and all(g.items is not None for g in self._groups.values()):
            self._snapshot = tuple(
                PackageSelector(f"{g.group}/{name}", selector)
                for g in self._groups.values()
                for name, selector in sorted((g.items or {}).items())
            )
        return self._snapshot

    @property
    def ready(self) -> bool:
        return self.package_selectors() is not None

    async def relist(self, group: str) -> None:
        src = self._groups[group]
        try:
            items, rv = await self._kube.list_cluster_objects_as(*RESOURCES[group], _DECODER)
        except NotServed:
            if src.served:
                log.info("%s is not served by this cluster: no CRs of it select nodes", group)
            items, rv, src.served = [], "", False
        else:
            src.served = True
        src.items, src.rv = {name: selector for name, _rv, selector in items}, rv
        self._snapshot = None

    async def watch_once(self, group: str) -> None:
        """Follow the group's stream until it ends; raises WatchExpired / KubeUnavailable."""
        src = self._groups[group]
        assert src.items is not None  # noqa: S101  (relist() first)
        stream = self._kube.watch_cluster_objects_as(*RESOURCES[group], src.rv, _DECODER)
        async for event in stream:
            name, rv, selector = event.object
            if event.type == "DELETED":
                src.items.pop(name, None)
                self._snapshot = None
            elif event.type in ("ADDED", "MODIFIED") and src.items.get(name, self) != selector:
                src.items[name] = selector  # a status report (the usual event) changes nothing here
                self._snapshot = None
            if rv:
                src.rv = rv

    async def run_group(self, group: str) -> None:
        """Forever: list, watch, re-list on 410 or failure (with jittered backoff on failures)."""
        src = self._groups[group]
        failures = 0
        while True:
            try:
                if src.items is None or not src.rv or not src.served:
                    await self.relist(group)
                if not src.served:
                    await asyncio.sleep(self._recheck)
                    continue
                await self.watch_once(group)
                failures = 0
            except WatchExpired:
                src.rv = ""  # forces a re-list; the current snapshot stays in force meanwhile
            except KubeUnavailable as exc:
                failures += 1
                delay = failure_delay(failures)  # the exponent capped: a long outage cannot overflow
                log.warning("%s watch failed (%s); retrying in %.1f s", group, exc, delay)
                await asyncio.sleep(delay)

    async def run(self) -> None:
        await asyncio.gather(*(self.run_group(g) for g in RESOURCES))
