"""bootstrap/kube/watch.py: the watch stream read and decoded once, events larger than the 4 MiB
that kubernetes_asyncio's Watch could read, 410 as a status and as an event, bookmarks, malformed
lines, and the caller's own decoder."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bootstrap.kube import Kube, KubeUnavailable, WatchExpired
from bootstrap.kube import watch as watch_mod
from bootstrap.kube.decode import PLAIN, decode_list, loads
from tests.support.kshim import ShimEmulator

pytestmark = pytest.mark.kmock(cls=ShimEmulator)

G, V, P = "nodegate.io", "v1alpha1", "nodeattestations"
RES = f"{G}/{V}/{P}"


@pytest.fixture
async def kube(kmock: Any) -> AsyncIterator[Kube]:
    k = Kube.for_host(str(kmock.url), timeout=5.0)
    yield k
    await k.close()


def _object(name: str, rv: str, filler: int = 0) -> dict[str, Any]:
    return {
        "apiVersion": f"{G}/{V}",
        "kind": "NodeAttestation",
        "metadata": {"name": name, "resourceVersion": rv, "annotations": {"big": "x" * filler}},
        "spec": {"revoked": False},
    }


async def _events(kube: Kube, rv: str = "1") -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    async with asyncio.timeout(30):
        async for event in kube.watch_cluster_objects(G, V, P, rv):
            out.append((event.type, event.object))
    return out


async def test_an_event_over_4_mib_is_read_whole(kmock: Any, kube: Kube) -> None:
    # 6 MiB: more than kubernetes_asyncio's Watch reads (its LineTooLong at 4 MiB).
    big = _object("a", "7", filler=6 << 20)
    kmock.script(
        "watch", RES, [{"type": "MODIFIED", "object": big}, {"type": "DELETED", "object": _object("b", "8")}]
    )
    seen = await _events(kube)
    assert [(t, o["metadata"]["name"]) for t, o in seen] == [("MODIFIED", "a"), ("DELETED", "b")]
    assert seen[0][1] == big


async def test_an_event_over_the_limit_is_refused(kmock: Any, kube: Kube, monkeypatch: Any) -> None:
    monkeypatch.setattr(watch_mod, "MAX_EVENT_BYTES", 64 << 10)
    kmock.script("watch", RES, [{"type": "MODIFIED", "object": _object("a", "7", filler=100 << 10)}])
    with pytest.raises(KubeUnavailable, match="an event over"):
        await _events(kube)


async def test_bookmarks_and_resource_versions(kmock: Any, kube: Kube) -> None:
    bookmark = {
        "type": "BOOKMARK",
        "object": {"kind": "NodeAttestation", "metadata": {"resourceVersion": "9"}},
    }
    kmock.script("watch", RES, [{"type": "ADDED", "object": _object("a", "7")}, bookmark])
    seen = await _events(kube, "5")
    assert [(t, o["metadata"]["resourceVersion"]) for t, o in seen] == [("ADDED", "7"), ("BOOKMARK", "9")]
    assert kmock[f"watch {RES}"][-1].params["resourceVersion"] == "5"
    assert kmock[f"watch {RES}"][-1].params["allowWatchBookmarks"] in ("true", "True")  # Go ParseBool


async def test_410_as_an_event_and_as_a_status(kmock: Any, kube: Kube) -> None:
    expired = {
        "type": "ERROR",
        "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"},
    }
    kmock.script("watch", RES, [{"type": "ADDED", "object": _object("a", "7")}, expired])
    with pytest.raises(WatchExpired, match="too old"):
        await _events(kube)
    kmock.script("watch", RES, 410)
    with pytest.raises(WatchExpired):
        await _events(kube)
    other = {"type": "ERROR", "object": {"kind": "Status", "code": 500, "message": "etcd"}}
    kmock.script("watch", RES, [other])
    with pytest.raises(KubeUnavailable, match="error event"):
        await _events(kube)
    kmock.script("watch", RES, 403)
    with pytest.raises(KubeUnavailable, match="403"):
        await _events(kube)


def test_lines_that_msgspec_refuses_take_the_standard_way() -> None:
    # An escaped lone surrogate is JSON (the API server passes it through); msgspec refuses it.
    line = b'{"type":"ADDED","object":{"metadata":{"name":"a","annotations":{"x":"\\ud800"}}}}'
    event = watch_mod._event("t", line, PLAIN)
    assert event is not None
    assert event.object["metadata"]["annotations"]["x"] == "\ud800"
    assert math.isnan(loads(b'{"a":NaN}')["a"])  # parsed as the standard library does, not refused
    with pytest.raises(ValueError, match=r"\S"):
        watch_mod._event("t", b'{"type":"ADDED","object":{"metadata":', PLAIN)
    with pytest.raises(ValueError, match="not a JSON object"):
        watch_mod._event("t", b"[1, 2]", PLAIN)
    # An event whose object is not an object carries nothing to apply.
    assert watch_mod._event("t", b'{"type":"ADDED","object":[1]}', PLAIN) is None


def test_list_answers_decoded_once() -> None:
    body = (
        b'{"kind":"List","metadata":{"resourceVersion":"12"},'
        b'"items":[{"metadata":{"name":"a"}},7,{"b":"\\ud800"}]}'
    )
    assert decode_list(body, PLAIN) == ([{"metadata": {"name": "a"}}, {"b": "\ud800"}], "12")
    assert decode_list(b'{"items":null}', PLAIN) == ([], "")
    with pytest.raises(ValueError, match="not a JSON object"):
        decode_list(b"[]", PLAIN)


class _Names:
    """A caller's own decoder: only the name."""

    def from_json(self, data: bytes | msgspec.Raw) -> str:
        return str(loads(data)["metadata"]["name"]) + "/json"

    def from_mapping(self, obj: dict[str, Any]) -> str:
        return str(obj["metadata"]["name"]) + "/mapping"


async def test_the_callers_decoder(kmock: Any, kube: Kube) -> None:
    kmock.script("watch", RES, [{"type": "ADDED", "object": _object("a", "7")}])
    seen = []
    async with asyncio.timeout(30):
        async for event in kube.watch_cluster_objects_as(G, V, P, "1", _Names()):
            seen.append(event.object)
    assert seen == ["a/json"]
    await kube.create_cluster_object(G, V, P, _object("b", ""))
    items, rv = await kube.list_cluster_objects_as(G, V, P, _Names())
    assert items == ["b/json"]
    assert rv


class _Reader:
    """Stands in for aiohttp's StreamReader: the chunks as the network cut them."""

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks

    async def iter_any(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk


@settings(max_examples=200, deadline=None)
@given(
    lines=st.lists(st.binary(min_size=1, max_size=40).map(lambda b: b.replace(b"\n", b"x")), max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=10),
)
def test_lines_survive_any_chunking(lines: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(line + b"\n" for line in lines)
    points = sorted({c for c in cuts if c < len(stream)} | {0, len(stream)})
    chunks = [stream[a:b] for a, b in itertools.pairwise(points)]

    async def read() -> list[bytes]:
        return [line async for line in watch_mod._lines(_Reader(chunks), "t")]  # type: ignore[arg-type]

    assert asyncio.run(read()) == [line for line in lines if line.strip()]


def test_a_stream_cut_inside_an_event_is_an_error() -> None:
    async def read() -> list[bytes]:
        return [line async for line in watch_mod._lines(_Reader([b'{"a":1}\n{"b"']), "t")]  # type: ignore[arg-type]

    with pytest.raises(KubeUnavailable, match="ended inside"):
        asyncio.run(read())


def test_a_large_line_in_small_chunks_is_joined_once() -> None:
    line = json.dumps({"x": "y" * (5 << 20)}).encode()
    chunks = [line[i : i + 65536] for i in range(0, len(line), 65536)] + [b"\n"]

    async def read() -> list[bytes]:
        return [x async for x in watch_mod._lines(_Reader(chunks), "t")]  # type: ignore[arg-type]

    assert asyncio.run(read()) == [line]
