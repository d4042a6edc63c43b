"""What the join and admin handlers read of a request: the JSON body (within the protocol's size
limit, as ``application/json``, without duplicate keys), the client certificate, the client
address."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from cryptography import x509

from attest.errors import MalformedInput
from bootstrap.problems import UnsupportedMediaType
from bootstrap.service.state import SERVICE


async def read_json(request: web.Request) -> Any:
    limit = request.app[SERVICE].settings.limits.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=request.content_length)
    if request.content_type != "application/json":
        raise UnsupportedMediaType("send application/json")
    # The app's client_max_size is the webhook's (AdmissionReviews carry whole objects); the join
    # API keeps the protocol's 64 KiB, also for bodies without Content-Length.
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(16 * 1024):
        size += len(chunk)
        if size > limit:
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=size)
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        return json.loads(raw, object_pairs_hook=_no_duplicates)
    except (ValueError, RecursionError) as exc:
        raise MalformedInput(f"body is not JSON: {str(exc)[:120]}") from None


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("duplicate key in a JSON object")
    return out


def peer_certificate(request: web.Request) -> x509.Certificate | None:
    obj = request.transport.get_extra_info("ssl_object") if request.transport is not None else None
    if obj is None:
        return None
    der = obj.getpeercert(binary_form=True)
    return x509.load_der_x509_certificate(der) if der else None


def client_address(request: web.Request) -> str:
    peer = request.transport.get_extra_info("peername") if request.transport is not None else None
    return str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"
