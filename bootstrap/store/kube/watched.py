"""A watched copy of every NodeAttestation, for the service's periodic passes over the store.

Three passes read every node: the boot metrics (every 5 minutes), SPIRE's ban pass (every
``spire.ban_interval``, 30 s) and the session prune. Each was a LIST of every NodeAttestation, tens
of MB at 10,000 nodes for the API server to build and for nodegate to decode, over and over. The
service instead lists once and watches (bookmarks on; a stream the server ends is resumed from the
last resourceVersion, as client-go's reflector does), and the passes read this copy.

Fail closed on staleness: the copy is served only while it is current. After a broken stream it is
not (events may have been missed) until a fresh list replaced it; callers then list themselves, as
before. A one-shot command never starts the watch and always lists.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

from bootstrap.kube import Kube, KubeUnavailable, WatchEvent, WatchExpired
from bootstrap.store.kube.objects import GROUP, PLURAL, VERSION, NodeObject, field, parse

log = logging.getLogger("nodegate.store")

_FIRST_DELAY, _MAX_DELAY = 1.0, 30.0


class WatchedNodes:
    """``objects()`` is every NodeAttestation as parsed by the store, or None while not current."""

    def __init__(self, kube: Kube, *, retry: float = _FIRST_DELAY) -> None:
        self._kube = kube
        self._retry = retry
        self._objects: dict[str, NodeObject] = {}
        self._rv = ""
        self._current = False
        self.lists = 0  # how many times it listed (the first, then only 410s and failures)

    def objects(self) -> list[NodeObject] | None:
        return list(self._objects.values()) if self._current else None

    def _keep(self, obj: NodeObject) -> None:
        # The audit trail is read per node (``audit``), never by the passes: not kept.
        self._objects[obj.name] = dataclasses.replace(obj, audit=())

    async def _list(self) -> None:
        items, rv = await self._kube.list_cluster_objects(GROUP, VERSION, PLURAL)
        self.lists += 1
        self._objects = {}
        for raw in items:
            self._keep(parse(raw))
        self._rv, self._current = rv, True

    def apply(self, event: WatchEvent[dict[str, Any]]) -> None:
        rv = str(field(event.object, "metadata").get("resourceVersion", ""))
        if event.type in ("ADDED", "MODIFIED"):
            self._keep(parse(event.object))
        elif event.type == "DELETED":
            self._objects.pop(str(field(event.object, "metadata").get("name", "")), None)
        if rv:
            self._rv = rv

    async def run(self) -> None:
        """Forever (until cancelled): list, then watch and resume; list again on 410 Gone or after
        a failure, with a growing delay."""
        delay = self._retry
        relist = True
        while True:
            try:
                if relist:
                    await self._list()
                    relist = False
                async for event in self._kube.watch_cluster_objects(GROUP, VERSION, PLURAL, self._rv):
                    self.apply(event)
                delay = self._retry  # the server ended the stream: resume from the last version
            except WatchExpired:
                self._current, relist = False, True
            except Exception as exc:  # KubeUnavailable, or a surprise: the passes then list themselves
                self._current, relist = False, True
                if isinstance(exc, KubeUnavailable):
                    log.warning("NodeAttestation watch failed (%s); listing again in %.0f s", exc, delay)
                else:
                    log.exception("NodeAttestation watch: unexpected error; listing again in %.0f s", delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _MAX_DELAY)
