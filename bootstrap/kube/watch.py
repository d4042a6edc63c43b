"""Watch streams: events after a resourceVersion until the server ends the stream.

A stream resumes from the last resourceVersion the caller saw; 410 Gone (the version is too old)
is raised as :class:`WatchExpired` so the caller lists again.

With ``initial_events`` the watch is a streaming list (Kubernetes WatchList: ``sendInitialEvents``):
the server sends every current object as ADDED, then a BOOKMARK annotated
:data:`INITIAL_EVENTS_END`, then the changes, all on the one stream, served from its watch cache
(no LIST built in memory). A server that does not serve it answers 400 or 422 (the WatchList
feature off; before 1.27, ``resourceVersionMatch`` on a watch is invalid): :class:`WatchListRefused`,
and the caller lists instead.

The stream is read here rather than by kubernetes_asyncio's ``Watch``, which decodes every event
three times (JSON, re-encoded, decoded again for a typed model nobody uses here) and breaks on an
event over 4 MiB (``LineTooLong``: its client's read buffer). Each event line is read whole, up to
:data:`MAX_EVENT_BYTES`, and decoded once: the envelope by msgspec, the object by the caller's
decoder (plain dicts unless it asks for its own form).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import aiohttp
import msgspec

from bootstrap.kube.decode import ObjectDecoder, loads
from bootstrap.kube.errors import KubeUnavailable, NotServed, WatchExpired, WatchListRefused

WATCH_SECONDS = 300  # server-side watch timeout; the stream is reopened from the last rv
# The annotation (value "true") on the BOOKMARK that ends a streaming list's initial events.
INITIAL_EVENTS_END = "k8s.io/initial-events-end"
# One event line. etcd stores objects up to its --max-request-bytes (1.5 MiB by default, raised on
# large clusters; etcd warns above 10 MiB) and the API server's JSON of a stored object can be
# larger than its stored form: 64 MiB bounds what one event may cost without refusing any object a
# real cluster keeps.
MAX_EVENT_BYTES = 64 << 20
_ERROR_BODY_LIMIT = 4096

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class WatchEvent(Generic[T]):
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK
    object: T


class _Envelope(msgspec.Struct):
    type: str = ""
    object: msgspec.Raw = msgspec.Raw()  # empty when the event has none


_ENVELOPE = msgspec.json.Decoder(_Envelope)


def watch_arguments(resource_version: str, *, initial_events: bool = False) -> dict[str, Any]:
    """The list call's watch arguments: bookmarks on, the server-side timeout, the start version;
    ``initial_events``: a streaming list of the most recent state (no start version: a
    consistent read, the API's meaning of NotOlderThan without one)."""
    kwargs: dict[str, Any] = {"allow_watch_bookmarks": True, "timeout_seconds": WATCH_SECONDS}
    if initial_events:
        kwargs["send_initial_events"] = True
        kwargs["resource_version_match"] = "NotOlderThan"
    elif resource_version:
        kwargs["resource_version"] = resource_version
    return kwargs


def ends_initial_events(event: WatchEvent[Any], obj: Mapping[str, Any]) -> bool:
    """Is this (``obj``: the event's object as a mapping) the BOOKMARK that ends a streaming
    list's initial events?"""
    if event.type != "BOOKMARK":
        return False
    meta = obj.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    return isinstance(annotations, Mapping) and annotations.get(INITIAL_EVENTS_END) == "true"


async def watch_events(
    what: str,
    list_call: Any,
    *args: Any,
    resource_version: str,
    decoder: ObjectDecoder[T],
    label_selector: str | None = None,
    initial_events: bool = False,
) -> AsyncGenerator[WatchEvent[T], None]:
    """Events of ``list_call(*args)`` after ``resource_version`` (``initial_events``: a streaming
    list, see the module), objects in ``decoder``'s form. Raises WatchExpired on 410 Gone,
    NotServed on 404, WatchListRefused when a streaming list is refused, and KubeUnavailable on
    other failures."""
    kwargs = watch_arguments(resource_version, initial_events=initial_events)
    if label_selector:
        kwargs["label_selector"] = label_selector
    try:
        resp = await list_call(*args, watch=True, _preload_content=False, **kwargs)
    except (aiohttp.ClientError, OSError) as exc:
        raise KubeUnavailable(f"watch {what}: {type(exc).__name__}: {exc}"[:300]) from None
    try:
        if not 200 <= resp.status < 300:
            body = await resp.content.read(_ERROR_BODY_LIMIT)
            if resp.status == 410:
                raise WatchExpired(f"{resp.reason}: {_message(body)}"[:300])
            detail = f"watch {what}: HTTP {resp.status} {resp.reason}{_message(body)}"[:300]
            if resp.status == 404:
                raise NotServed(detail)
            if initial_events and resp.status in (400, 422):
                raise WatchListRefused(detail)
            raise KubeUnavailable(detail)
        async for line in _lines(resp.content, what):
            event = _event(what, line, decoder)
            if event is not None:
                yield event
    except (aiohttp.ClientError, OSError, ValueError) as exc:  # a broken stream or a malformed line
        raise KubeUnavailable(f"watch {what}: {type(exc).__name__}: {exc}"[:300]) from None
    finally:
        resp.release()


async def _lines(content: aiohttp.StreamReader, what: str) -> AsyncIterator[bytes]:
    """The stream's newline-terminated lines, each joined once from the chunks that carry it."""
    parts: list[bytes] = []
    size = 0
    async for chunk in content.iter_any():
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            if size + end - start > MAX_EVENT_BYTES:
                raise KubeUnavailable(f"watch {what}: an event over {MAX_EVENT_BYTES:,} bytes")
            line = b"".join((*parts, chunk[start:end])) if parts else chunk[start:end]
            parts, size, start = [], 0, end + 1
            if line.strip():
                yield line
        if start < len(chunk):
            parts.append(chunk[start:])
            size += len(chunk) - start
            if size > MAX_EVENT_BYTES:
                raise KubeUnavailable(f"watch {what}: an event over {MAX_EVENT_BYTES:,} bytes")
    if parts and b"".join(parts).strip():  # the stream ended inside an event
        raise KubeUnavailable(f"watch {what}: the stream ended inside an event")


def _event(what: str, line: bytes, decoder: ObjectDecoder[T]) -> WatchEvent[T] | None:
    """One event line; None for an event without an object (nothing to apply)."""
    try:
        envelope = _ENVELOPE.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError):
        whole = loads(line)  # ValueError when it is not JSON at all
        if not isinstance(whole, dict):
            raise ValueError("a watch event that is not a JSON object") from None  # noqa: TRY004
        kind, obj = str(whole.get("type", "")), whole.get("object")
        if kind == "ERROR":
            _raise_watch_error(what, obj)
        return WatchEvent(kind, decoder.from_mapping(obj)) if isinstance(obj, dict) else None
    if envelope.type == "ERROR":
        _raise_watch_error(what, loads(envelope.object) if len(envelope.object) else None)
    if bytes(memoryview(envelope.object)[:1]) != b"{":
        return None
    return WatchEvent(envelope.type, decoder.from_json(envelope.object))


def _message(body: bytes) -> str:
    """The message of a Kubernetes Status body, briefly."""
    try:
        data = loads(body)
    except ValueError:
        return ""
    message = data.get("message") if isinstance(data, dict) else None
    return f": {message}"[:300] if isinstance(message, str) and message else ""


def _raise_watch_error(what: str, obj: object) -> None:
    if isinstance(obj, Mapping) and obj.get("code") == 410:
        raise WatchExpired(str(obj.get("message", "resourceVersion too old")))
    raise KubeUnavailable(f"watch {what}: error event {obj!r}"[:300])
