"""JSON of the API server, decoded once: msgspec for speed, the standard library where msgspec
refuses what JSON allows.

Watch events and lists of large objects (a package CR's status holds a report per node: megabytes)
are decoded here once, by a decoder the caller chooses: plain dicts (``PLAIN``) or the caller's own
typed form, which may skip or keep undecoded (``msgspec.Raw``) what it does not need.
"""

from __future__ import annotations

import json
from typing import Any, Protocol, TypeVar

import msgspec

T_co = TypeVar("T_co", covariant=True)


class ObjectDecoder(Protocol[T_co]):
    """Turns one Kubernetes object into the caller's form."""

    def from_json(self, data: bytes | msgspec.Raw) -> T_co:
        """From the object's JSON; raises ValueError when it is not JSON."""
        ...

    def from_mapping(self, obj: dict[str, Any]) -> T_co:
        """From the object already decoded (the fallback when msgspec refused the bytes)."""
        ...


def loads(data: bytes | msgspec.Raw) -> Any:
    """Any JSON value. msgspec refuses a few things JSON and the API server allow (an escaped lone
    surrogate in a string); those take the standard library's slower way. ValueError when the
    bytes are not JSON at all."""
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError:
        return json.loads(bytes(data))


class _Plain:
    """Plain dicts, as the API server's JSON reads."""

    def from_json(self, data: bytes | msgspec.Raw) -> dict[str, Any]:
        out = loads(data)
        if not isinstance(out, dict):
            raise ValueError("not a JSON object")  # noqa: TRY004  (callers map ValueError)
        return out

    def from_mapping(self, obj: dict[str, Any]) -> dict[str, Any]:
        return obj


PLAIN: ObjectDecoder[dict[str, Any]] = _Plain()


class _List(msgspec.Struct):
    """A list answer: its items left undecoded (each goes through the caller's decoder)."""

    items: list[msgspec.Raw] | None = None
    metadata: dict[str, Any] | None = None


_LIST = msgspec.json.Decoder(_List)


def decode_list(data: bytes, decoder: ObjectDecoder[T_co]) -> tuple[list[T_co], str]:
    """A list answer's objects in the decoder's form (what is not an object is dropped) and its
    resourceVersion. ValueError when the body is not a list answer."""
    try:
        answer = _LIST.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        whole = loads(data)
        if not isinstance(whole, dict):
            raise ValueError("the response is not a JSON object") from None  # noqa: TRY004  (callers map ValueError)
        items = whole.get("items")
        meta = whole.get("metadata")
        objects = (
            [decoder.from_mapping(i) for i in items if isinstance(i, dict)] if isinstance(items, list) else []
        )
        return objects, str(meta.get("resourceVersion", "")) if isinstance(meta, dict) else ""
    out: list[T_co] = []
    for raw in answer.items or ():
        if bytes(memoryview(raw)[:1]) == b"{":  # a list item that is not an object is dropped
            out.append(decoder.from_json(raw))
    meta = answer.metadata or {}
    return out, str(meta.get("resourceVersion", ""))
