"""bootstrap/store/kube/watched.py: the periodic passes read a watched copy of every
NodeAttestation, listed once; a stream the server ends is resumed from the last resourceVersion
(no LIST), 410 Gone and failures list again, and the copy is not served while it may be stale."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from bootstrap.kube import Kube, KubeUnavailable, WatchEvent, WatchExpired
from bootstrap.store.kube import KubeStore
from bootstrap.store.kube.watched import WatchedNodes
from tests.store.common import RES, Ticker, commit, make_att
from tests.support.kshim import ShimEmulator


def _obj(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv}, "spec": {}}


class ScriptedKube:
    """Lists what ``items`` holds; each watch plays the next script: events, then the end of the
    stream or an exception."""

    def __init__(self, items: list[dict[str, Any]], rv: str) -> None:
        self.items, self.rv = items, rv
        self.lists = 0
        self.watched_from: list[str] = []
        self.scripts: asyncio.Queue[tuple[list[WatchEvent[dict[str, Any]]], BaseException | None]] = (
            asyncio.Queue()
        )

    async def list_cluster_objects(
        self, group: str, version: str, plural: str, *, label_selector: str | None = None
    ) -> tuple[list[dict[str, Any]], str]:
        self.lists += 1
        return list(self.items), self.rv

    async def watch_cluster_objects(
        self, group: str, version: str, plural: str, resource_version: str
    ) -> AsyncIterator[WatchEvent[dict[str, Any]]]:
        self.watched_from.append(resource_version)
        events, end = await self.scripts.get()
        for event in events:
            yield event
        if end is not None:
            raise end


async def _until(check: Any) -> None:
    async with asyncio.timeout(10):
        while not check():
            await asyncio.sleep(0)


async def test_listed_once_then_resumed_from_the_last_version() -> None:
    kube = ScriptedKube([_obj("a", "5")], rv="10")
    watched = WatchedNodes(kube, retry=0.0)  # type: ignore[arg-type]
    assert watched.objects() is None  # nothing listed yet: the passes list themselves
    task = asyncio.create_task(watched.run())
    await kube.scripts.put(
        ([WatchEvent("ADDED", _obj("b", "11")), WatchEvent("BOOKMARK", _obj("", "15"))], None)
    )
    await kube.scripts.put(([WatchEvent("DELETED", _obj("a", "16"))], None))
    await _until(lambda: len(kube.watched_from) == 3)
    task.cancel()
    assert kube.lists == 1  # two ends of stream, no LIST
    assert kube.watched_from == ["10", "15", "16"]  # each resumed where the last ended (bookmark too)
    objects = watched.objects()
    assert objects is not None
    assert [o.name for o in objects] == ["b"]


@pytest.mark.parametrize("failure", [WatchExpired("too old"), KubeUnavailable("connection reset")])
async def test_gone_or_broken_is_not_served_until_listed_again(failure: BaseException) -> None:
    kube = ScriptedKube([_obj("a", "5")], rv="10")
    watched = WatchedNodes(kube, retry=0.0)  # type: ignore[arg-type]
    task = asyncio.create_task(watched.run())
    await _until(lambda: kube.watched_from == ["10"])
    assert watched.objects() is not None
    kube.items, kube.rv = [_obj("a", "5"), _obj("c", "30")], "30"  # what the watch would have missed
    gate = asyncio.Event()
    real_list = kube.list_cluster_objects

    async def held_list(*args: Any, **kwargs: Any) -> tuple[list[dict[str, Any]], str]:
        await gate.wait()
        return await real_list(*args, **kwargs)

    kube.list_cluster_objects = held_list  # type: ignore[method-assign]
    await kube.scripts.put(([], failure))
    await _until(lambda: watched.objects() is None)  # may have missed events: not served
    gate.set()
    await _until(lambda: kube.watched_from == ["10", "30"])
    task.cancel()
    assert kube.lists == 2
    objects = watched.objects()
    assert objects is not None
    assert sorted(o.name for o in objects) == ["a", "c"]


@pytest.mark.kmock(cls=ShimEmulator)
async def test_the_store_s_passes_read_the_copy_and_one_shot_reads_list(kmock: Any) -> None:
    kmock.resources[RES] = {"kind": "NodeAttestation", "namespaced": False}

    class Counting(Kube):
        lists = 0

        async def list_cluster_objects(
            self, group: str, version: str, plural: str, *, label_selector: str | None = None
        ) -> tuple[list[dict[str, Any]], str]:
            if plural == "nodeattestations" and label_selector is None:
                Counting.lists += 1
            return await super().list_cluster_objects(group, version, plural, label_selector=label_selector)

    kube = Counting.for_host(str(kmock.url), timeout=2.0)
    store = KubeStore(kube, clock=Ticker(), backoff=0.0)
    try:
        assert await store.list_nodes(recent=True) == []  # no copy yet: listed
        assert Counting.lists == 1
        keeping = asyncio.create_task(store.keep_current())
        await commit(store, make_att(), "s1")
        async with asyncio.timeout(10):
            while [r.node_name for r in await store.list_nodes(recent=True)] != ["gpu-1"]:
                await asyncio.sleep(0.01)  # the watch brings the commit
        listed = Counting.lists
        for _ in range(5):
            assert [r.node_name for r in await store.list_nodes(recent=True)] == ["gpu-1"]
        assert Counting.lists == listed  # the passes' reads: no LIST
        assert [r.node_name for r in await store.list_nodes()] == ["gpu-1"]
        assert Counting.lists == listed + 1  # anyone else's: a LIST, as before
        keeping.cancel()
    finally:
        await kube.close()
