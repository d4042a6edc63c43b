"""The gate's informers (bootstrap/gate/cache.py ``inform``) against a scripted API: what is loaded
how, when a watch is resumed rather than the source loaded again, and when a source counts as
synced (no node is released otherwise). Each watch the informer opens takes the next script:
events, then how the stream ends (the server ends it, it breaks, or it stays open until the test
says). The kmock tests at the end run the whole gate."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kmock._internal import enums

from bootstrap.config import GateSettings
from bootstrap.gate import cache as cache_module
from bootstrap.gate import crindex
from bootstrap.gate.cache import ATTESTATION_SOURCE, NODES, Cache, Source
from bootstrap.kube import (
    INITIAL_EVENTS_END,
    Kube,
    KubeUnavailable,
    NotServed,
    WatchEvent,
    WatchExpired,
    WatchListRefused,
)
from tests.gate.test_gate import eventually, hold, hold_taints, make_gate, node_body, real_now, register, stop
from tests.support.kshim import ShimEmulator

SKYHOOK = "skyhook.nvidia.com"
END, HANG, BREAK = "end", "hang", "break"


def node(name: str, rv: str, **labels: str) -> dict[str, Any]:
    body = node_body(name, **labels)
    body["metadata"]["resourceVersion"] = rv
    return body


def skyhook(name: str, rv: str, version: str = "1") -> dict[str, Any]:
    return {
        "apiVersion": f"{SKYHOOK}/v1alpha1",
        "kind": "Skyhook",
        "metadata": {"name": name, "resourceVersion": rv},
        "spec": {
            "nodeSelectors": {"matchLabels": {"pool": "gpu"}},
            "packages": {"drv": {"version": version}},
        },
    }


def ev(kind: str, obj: dict[str, Any]) -> WatchEvent[dict[str, Any]]:
    return WatchEvent(kind, obj)


def bookmark(rv: str, *, end: bool = False) -> WatchEvent[dict[str, Any]]:
    meta: dict[str, Any] = {"resourceVersion": rv}
    if end:
        meta["annotations"] = {INITIAL_EVENTS_END: "true"}
    return WatchEvent("BOOKMARK", {"kind": "Node", "apiVersion": "v1", "metadata": meta})


@dataclass
class Script:
    """One watch: raise ``opens`` when it is opened, else deliver ``events``, then ``then``: END
    (the server ends it), BREAK (KubeUnavailable mid-stream), HANG (open until ``release``)."""

    events: list[WatchEvent[Any]] = field(default_factory=list)
    then: str = HANG
    opens: BaseException | None = None
    release: asyncio.Event = field(default_factory=asyncio.Event)  # HANG: deliver ``more``, then END
    more: list[WatchEvent[Any]] = field(default_factory=list)
    waiting: asyncio.Event = field(default_factory=asyncio.Event)  # set when HANG starts waiting


@dataclass
class Call:
    verb: str  # "list" or "watch"
    rv: str
    initial: bool
    synced: bool  # the source's synced flag when the call was made


class ScriptedKube:
    """The Kube calls the informer makes: lists answer ``listed``; watches take ``scripts`` in
    order (none left: a stream that stays open). Every call is recorded."""

    def __init__(self, listed: list[dict[str, Any]] | None = None, rv: str = "5") -> None:
        self.listed = listed or []
        self.list_rv = rv
        self.list_error: BaseException | None = None
        self.scripts: list[Script] = []
        self.calls: list[Call] = []
        self.source: Source | None = None

    def _record(self, verb: str, rv: str, initial: bool) -> None:
        self.calls.append(Call(verb, rv, initial, self.source.synced if self.source else False))

    def lists(self) -> int:
        return sum(1 for c in self.calls if c.verb == "list")

    async def list_nodes(self) -> tuple[list[dict[str, Any]], str]:
        self._record("list", "", initial=False)
        if self.list_error is not None:
            raise self.list_error
        return list(self.listed), self.list_rv

    async def list_cluster_objects_as(self, *_args: Any) -> tuple[list[Any], str]:
        self._record("list", "", initial=False)
        if self.list_error is not None:
            raise self.list_error
        return [crindex.DECODER.from_mapping(o) for o in self.listed], self.list_rv

    def watch_nodes(self, rv: str, *, initial_events: bool = False) -> AsyncGenerator[WatchEvent[Any], None]:
        self._record("watch", rv, initial_events)
        return self._stream(self.scripts.pop(0) if self.scripts else Script())

    def watch_cluster_objects(
        self, *args: Any, initial_events: bool = False
    ) -> AsyncGenerator[WatchEvent[Any], None]:
        self._record("watch", args[3], initial_events)
        return self._stream(self.scripts.pop(0) if self.scripts else Script())

    def watch_cluster_objects_as(
        self, *args: Any, initial_events: bool = False
    ) -> AsyncGenerator[WatchEvent[Any], None]:
        self._record("watch", args[3], initial_events)
        return self._stream(self.scripts.pop(0) if self.scripts else Script(), cr=True)

    @staticmethod
    async def _stream(script: Script, *, cr: bool = False) -> AsyncGenerator[WatchEvent[Any], None]:
        if script.opens is not None:
            raise script.opens
        for event in [*script.events, None, *script.more]:
            if event is None:
                if script.then == BREAK:
                    raise KubeUnavailable("watch: ServerDisconnectedError")
                if script.then == HANG:
                    script.waiting.set()
                    await script.release.wait()
                continue
            obj = event.object
            yield WatchEvent(event.type, crindex.DECODER.from_mapping(obj)) if cr else event


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """The informer's failure backoff in milliseconds: the tests wait on outcomes, not delays."""
    monkeypatch.setattr(cache_module, "failure_delay", lambda failures: 0.001 * failures)


@contextlib.asynccontextmanager
async def informing(
    kube: ScriptedKube, key: str = NODES, **gate: Any
) -> AsyncIterator[tuple[Cache, Source, list[str]]]:
    changed: list[str] = []
    cache = Cache(kube, GateSettings(**gate), changed=changed.append)  # type: ignore[arg-type]
    src = cache.sources[key]
    kube.source = src
    task = asyncio.create_task(cache.inform(src))
    try:
        yield cache, src, changed
    finally:
        await stop(task)


# -- loading, resuming, resync ------------------------------------------------------------------


async def test_a_streaming_list_loads_and_is_not_synced_before_its_end_bookmark() -> None:
    kube = ScriptedKube()
    first = Script([ev("ADDED", node("a", "3")), ev("ADDED", node("b", "4"))], more=[bookmark("9", end=True)])
    kube.scripts = [first]
    async with informing(kube) as (cache, src, changed):
        await eventually(first.waiting.is_set, "the initial events delivered, not the end bookmark")
        assert src.objects is None
        assert not src.synced
        assert changed == []
        first.release.set()  # the end bookmark
        await eventually(lambda: src.synced, "synced after the end bookmark")
        assert sorted(cache.nodes()) == ["a", "b"]
        assert src.rv == "9"
        assert sorted(changed) == ["a", "b"]
        assert [(c.verb, c.initial) for c in kube.calls[:1]] == [("watch", True)]
        assert kube.lists() == 0


async def test_a_stream_the_server_ends_is_resumed_from_its_last_version_with_no_list() -> None:
    kube = ScriptedKube()
    kube.scripts = [
        Script(
            [ev("ADDED", node("a", "3")), bookmark("9", end=True), ev("MODIFIED", node("a", "11"))], then=END
        ),
        Script([ev("ADDED", node("b", "12")), bookmark("20")], then=END),  # the bookmark's version
        Script([ev("DELETED", node("b", "21"))], then=END),
    ]
    async with informing(kube) as (cache, src, _changed):
        await eventually(lambda: len(kube.calls) >= 4, "the watch resumed three times")
        watches = [(c.verb, c.rv, c.initial) for c in kube.calls[:4]]
        assert watches == [
            ("watch", "", True),
            ("watch", "11", False),
            ("watch", "20", False),
            ("watch", "21", False),
        ]
        assert all(c.synced for c in kube.calls[1:4])  # never unsynced by a clean end
        assert kube.lists() == 0
        assert sorted(cache.nodes()) == ["a"]
        assert src.synced


async def test_a_resync_decides_every_node_again_and_calls_nothing() -> None:
    kube = ScriptedKube()
    kube.scripts = [
        Script([ev("ADDED", node("a", "3")), ev("ADDED", node("b", "4")), bookmark("9", end=True)])
    ]
    async with informing(kube) as (cache, src, changed):
        await eventually(lambda: src.synced, "loaded")
        calls, changed[:] = len(kube.calls), []
        cache.resync()
        cache.resync()
        assert changed == ["a", "b", "a", "b"]
        assert len(kube.calls) == calls == 1
        assert src.synced


async def test_resync_forever_decides_every_node_again_with_no_api_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube = ScriptedKube()
    kube.scripts = [Script([ev("ADDED", node("a", "3")), bookmark("9", end=True)])]
    async with informing(kube, resync=timedelta(milliseconds=20)) as (cache, src, changed):
        await eventually(lambda: src.synced, "loaded")
        caplog.set_level(logging.INFO, "nodegate.gate")
        resyncing = asyncio.create_task(cache.resync_forever())
        try:
            await eventually(lambda: changed.count("a") >= 4, "three resyncs")
        finally:
            await stop(resyncing)
        assert [c.verb for c in kube.calls] == ["watch"]  # the first load's stream, still open
        assert "resync: 1 nodes decided again from the caches" in caplog.messages


async def test_410_loads_again_and_drops_what_disappeared() -> None:
    kube = ScriptedKube()
    kube.scripts = [
        Script([ev("ADDED", node("a", "3")), ev("ADDED", node("b", "4")), bookmark("9", end=True)], then=END),
        Script(opens=WatchExpired("too old")),
        Script([ev("ADDED", node("b", "30")), ev("ADDED", node("c", "31")), bookmark("40", end=True)]),
    ]
    async with informing(kube) as (cache, src, changed):
        await eventually(lambda: len(kube.calls) >= 3 and src.synced, "loaded again")
        assert [(c.rv, c.initial) for c in kube.calls] == [("", True), ("9", False), ("", True)]
        assert not kube.calls[2].synced  # unsynced from the 410 until the new load's end
        assert sorted(cache.nodes()) == ["b", "c"]  # a disappeared meanwhile
        assert {"a", "b", "c"} <= set(changed[2:])  # a too: gone, its attestation says so
        assert src.rv == "40"


async def test_a_failure_unsyncs_until_the_resumed_watch_delivers() -> None:
    kube = ScriptedKube()
    resumed = Script([], more=[ev("MODIFIED", node("a", "12"))])
    kube.scripts = [
        Script(
            [ev("ADDED", node("a", "3")), bookmark("9", end=True), ev("MODIFIED", node("a", "10"))],
            then=BREAK,
        ),
        resumed,
    ]
    async with informing(kube) as (cache, src, _changed):
        await eventually(lambda: len(kube.calls) >= 2, "the watch resumed after the failure")
        assert (kube.calls[1].verb, kube.calls[1].rv, kube.calls[1].initial) == ("watch", "10", False)
        assert not kube.calls[1].synced
        await eventually(resumed.waiting.is_set, "the resumed watch open, no event yet")
        assert not src.synced  # open, but nothing shows the server took the version yet
        assert not cache.in_sync()
        resumed.release.set()
        await eventually(lambda: src.synced, "synced by the resumed watch's event")
        assert cache.nodes()["a"]["metadata"]["resourceVersion"] == "12"
        assert kube.lists() == 0


async def test_a_watch_that_fails_again_after_resuming_loads_again() -> None:
    kube = ScriptedKube([node("a", "50")], rv="60")
    kube.scripts = [
        Script([ev("ADDED", node("a", "3")), bookmark("9", end=True)], then=BREAK),
        Script(opens=KubeUnavailable("HTTP 503")),  # resuming fails too: a LIST (two failures)
    ]
    async with informing(kube) as (cache, src, _changed):
        await eventually(lambda: len(kube.calls) >= 3 and src.synced, "loaded again")
        assert [(c.verb, c.rv, c.initial, c.synced) for c in kube.calls[:4]] == [
            ("watch", "", True, False),
            ("watch", "9", False, False),
            ("list", "", False, False),
            ("watch", "60", False, True),
        ][: len(kube.calls)]
        assert cache.nodes()["a"]["metadata"]["resourceVersion"] == "50"


async def test_a_resumed_watch_that_expires_loads_again_and_stays_unsynced_meanwhile() -> None:
    kube = ScriptedKube()
    reload = Script([ev("ADDED", node("a", "70"))], more=[bookmark("80", end=True)])
    kube.scripts = [
        Script([ev("ADDED", node("a", "3")), bookmark("9", end=True)], then=BREAK),
        Script(opens=WatchExpired("too old")),  # the 200 and then the ERROR event, as the server does
        reload,
    ]
    async with informing(kube) as (_cache, src, _changed):
        await eventually(reload.waiting.is_set, "loading again, its end bookmark not yet sent")
        assert not src.synced  # never synced between the failure and the new load's end
        reload.release.set()
        await eventually(lambda: src.synced, "loaded")


# -- streaming lists refused, cut short, not served -----------------------------------------------


async def test_a_refused_streaming_list_falls_back_to_list_and_is_not_asked_again() -> None:
    kube = ScriptedKube([node("a", "3")], rv="9")
    kube.scripts = [
        Script(opens=WatchListRefused("HTTP 422: sendInitialEvents is forbidden")),
        Script([ev("MODIFIED", node("a", "10"))], then=END),
        Script(opens=WatchExpired("too old")),
    ]
    async with informing(kube) as (cache, src, _changed):
        await eventually(lambda: len(kube.calls) >= 6, "listed again after the 410")
        assert [(c.verb, c.rv, c.initial) for c in kube.calls[:6]] == [
            ("watch", "", True),
            ("list", "", False),
            ("watch", "9", False),
            ("watch", "10", False),
            ("list", "", False),  # after the 410: a LIST, no streaming list asked again
            ("watch", "9", False),
        ]
        assert not src.streaming
        assert sorted(cache.nodes()) == ["a"]


async def test_a_streaming_list_that_keeps_failing_gives_way_to_one_list() -> None:
    kube = ScriptedKube([node("a", "3")], rv="9")
    kube.scripts = [
        Script(opens=KubeUnavailable("HTTP 429: storage is (re)initializing")),
        Script(opens=KubeUnavailable("HTTP 429: storage is (re)initializing")),
        Script([ev("MODIFIED", node("a", "10"))], then=END),  # the watch from the LIST's version
        Script(opens=WatchExpired("too old")),
        Script([ev("ADDED", node("a", "20")), bookmark("30", end=True)]),
    ]
    async with informing(kube) as (_cache, src, _changed):
        await eventually(lambda: src.rv == "30" and src.synced, "loaded by a streaming list again")
        assert (
            [(c.verb, c.rv, c.initial) for c in kube.calls]
            == [
                ("watch", "", True),
                ("watch", "", True),
                ("list", "", False),
                ("watch", "9", False),
                ("watch", "10", False),
                ("watch", "", True),  # streaming lists were not given up
                ("watch", "30", False),
            ][: len(kube.calls)]
        )
        assert src.streaming


async def test_a_streaming_list_cut_before_its_end_is_not_trusted() -> None:
    kube = ScriptedKube([node("b", "4")], rv="9")
    kube.scripts = [Script([ev("ADDED", node("a", "3"))], then=END)]  # no end bookmark
    async with informing(kube) as (cache, src, _changed):
        await eventually(lambda: src.synced, "listed instead")
        assert [(c.verb, c.initial) for c in kube.calls[:2]] == [("watch", True), ("list", False)]
        assert sorted(cache.nodes()) == ["b"]  # the cut stream's objects were never used
        assert not src.streaming


async def test_a_package_group_not_served_is_empty_and_looked_for_each_resync() -> None:
    kube = ScriptedKube()
    kube.scripts = [
        Script(opens=NotServed("HTTP 404")),
        Script([ev("ADDED", skyhook("drivers", "5")), bookmark("9", end=True)]),
    ]
    async with informing(kube, SKYHOOK, resync=timedelta(milliseconds=30)) as (cache, src, _changed):
        await eventually(lambda: len(kube.calls) >= 2 and src.synced and src.served, "served now")
        assert [(c.verb, c.initial) for c in kube.calls] == [("watch", True), ("watch", True)]
        assert [cr.name for cr in cache.package_crs()] == ["drivers"]


async def test_a_required_source_not_served_is_a_failure() -> None:
    kube = ScriptedKube()
    kube.scripts = [Script(opens=NotServed("HTTP 404")), Script([bookmark("9", end=True)])]
    async with informing(kube, ATTESTATION_SOURCE) as (cache, src, _changed):
        await eventually(lambda: src.synced, "loaded after the failure")
        assert cache.attestations() == {}
        assert [c.initial for c in kube.calls] == [True, True]


async def test_a_package_cr_gone_from_a_new_load_is_dropped() -> None:
    kube = ScriptedKube()
    kube.scripts = [
        Script(
            [ev("ADDED", skyhook("a", "3")), ev("ADDED", skyhook("b", "4")), bookmark("9", end=True)],
            then=END,
        ),
        Script(opens=WatchExpired("too old")),
        # initial events may carry a deletion (a client must cope): b is gone as well
        Script(
            [ev("ADDED", skyhook("b", "30")), ev("DELETED", skyhook("b", "31")), bookmark("40", end=True)]
        ),
    ]
    async with informing(kube, SKYHOOK) as (cache, src, _changed):
        await eventually(lambda: len(kube.calls) >= 3 and src.synced, "loaded again")
        assert cache.package_crs() == []
        assert src.objects == {}


# -- the streaming list gives what a LIST gives (property) ----------------------------------------

names = st.sampled_from(["a", "b", "c", "d"])
steps = st.lists(
    st.tuples(st.sampled_from(["ADDED", "MODIFIED", "DELETED"]), names, st.sampled_from(["1", "2"]))
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=st.sets(names), initial=steps)
def test_a_streaming_load_leaves_what_a_list_of_the_same_objects_leaves(
    before: set[str], initial: list[tuple[str, str, str]]
) -> None:
    """Whatever was cached before, the cache and the parsed CRs after a streaming load are those
    of a LIST of the objects its initial events leave (in order: the last word on a name counts)."""
    final: dict[str, dict[str, Any]] = {}
    for kind, name, version in initial:
        if kind == "DELETED":
            final.pop(name, None)
        else:
            final[name] = skyhook(name, "7", version)

    async def run(streaming: bool) -> tuple[Any, Any]:
        kube = ScriptedKube([skyhook(n, "1") for n in sorted(before)], rv="2")
        kube.listed = [skyhook(n, "1") for n in sorted(before)]
        cache = Cache(kube, GateSettings(), changed=lambda _n: None)  # type: ignore[arg-type]
        src = cache.sources[SKYHOOK]
        await cache.relist(src)  # what was cached before
        if streaming:
            events = [ev(k, skyhook(n, "7", v)) for k, n, v in initial]
            kube.scripts = [Script([*events, bookmark("9", end=True)], then=END)]
            await cache._follow(src, initial=True)
        else:
            kube.listed = list(final.values())
            await cache.relist(src)
        return src.objects, cache.package_crs()

    async def both() -> None:
        streamed, listed = await run(True), await run(False)
        assert streamed == listed

    asyncio.run(both())


# -- the whole gate on kmock: no LIST after the first load, streaming when served ------------------


on_kmock = pytest.mark.kmock(cls=ShimEmulator)


@pytest.fixture
async def kube(kmock: Any) -> AsyncIterator[Kube]:
    register(kmock)
    k = Kube.for_host(str(kmock.url), timeout=2.0)
    yield k
    await k.close()


def requests(kmock: Any, action: Any) -> list[Any]:
    return list(kmock[action])


def initial_watches(kmock: Any) -> list[str]:
    return [
        r.url.path
        for r in kmock[enums.action.WATCH]
        if r.params.get("sendInitialEvents") == "True"
        and r.params.get("resourceVersionMatch") == "NotOlderThan"
    ]


SOURCES = [
    "/api/v1/nodes",
    "/apis/nodegate.io/v1alpha1/nodeattestations",
    "/apis/nodewright.nvidia.com/v1alpha1/nodewrights",
    "/apis/skyhook.nvidia.com/v1alpha1/skyhooks",
]


@on_kmock
async def test_the_gate_loads_by_streaming_lists_and_resyncs_with_no_request(
    kmock: Any, kube: Kube, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "nodegate.gate")
    gate = make_gate(kube, real_now, resync=timedelta(milliseconds=50))
    await kube.create_node(node_body("w1"))
    task = asyncio.create_task(gate.run())
    try:
        await eventually(lambda: hold_taints(kmock) == [hold("unattested")], "the first decision")
        await eventually(gate._cache.in_sync, "every source synced")
        await eventually(
            lambda: sum(m.startswith("resync: 1 nodes") for m in caplog.messages) >= 3, "three resyncs"
        )
    finally:
        await stop(task)
    assert requests(kmock, enums.action.LIST) == []  # not one LIST, first load included
    assert sorted(initial_watches(kmock)) == SOURCES
    assert len(requests(kmock, enums.action.WATCH)) == 4  # the resyncs opened none


@on_kmock
async def test_the_gate_lists_where_streaming_lists_are_refused(kmock: Any, kube: Kube) -> None:
    kmock.watch_list = False
    gate = make_gate(kube, real_now)
    await kube.create_node(node_body("w1"))
    task = asyncio.create_task(gate.run())
    try:
        await eventually(lambda: hold_taints(kmock) == [hold("unattested")], "the first decision")
        await eventually(gate._cache.in_sync, "every source synced")
        await kube.create_node(node_body("w2"))
        await eventually(lambda: hold_taints(kmock, "w2") == [hold("unattested")], "a node after the list")
    finally:
        await stop(task)
    assert sorted(r.url.path for r in requests(kmock, enums.action.LIST)) == SOURCES
    assert sorted(initial_watches(kmock)) == SOURCES  # each asked once, refused with 422


@on_kmock
async def test_kube_streaming_list_of_nodes_and_crs(kmock: Any, kube: Kube) -> None:
    await kube.create_node(node_body("a"))
    await kube.create_cluster_object(SKYHOOK, "v1alpha1", "skyhooks", skyhook("s", "1"))
    seen: list[tuple[str, str]] = []
    async for event in kube.watch_nodes("", initial_events=True):
        seen.append((event.type, event.object["metadata"].get("name", "")))
        if event.type == "BOOKMARK":
            assert event.object["metadata"]["annotations"] == {INITIAL_EVENTS_END: "true"}
            break
    assert seen == [("ADDED", "a"), ("BOOKMARK", "")]
    async for cr in kube.watch_cluster_objects_as(
        SKYHOOK, "v1alpha1", "skyhooks", "", crindex.DECODER, initial_events=True
    ):
        assert cr.type == "ADDED"
        assert cr.object.obj["metadata"]["name"] == "s"
        break
    for request in requests(kmock, enums.action.WATCH):
        assert request.params["sendInitialEvents"] == "True"
        assert request.params["resourceVersionMatch"] == "NotOlderThan"
        assert request.params["allowWatchBookmarks"] == "True"
        assert "resourceVersion" not in request.params
    with pytest.raises(NotServed):
        async for _ in kube.watch_cluster_objects("example.com", "v1", "unknowns", "", initial_events=True):
            pass
    kmock.watch_list = False
    with pytest.raises(WatchListRefused, match="422"):
        async for _ in kube.watch_nodes("", initial_events=True):
            pass
