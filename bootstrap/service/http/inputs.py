"""What the join and admin handlers read of a request: the JSON body (already read by the
middleware within its route's size limit, ``bootstrap.service.http.bodies``; here: ``application/json``,
no duplicate keys), the client certificate, the client address."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from cryptography import x509

from attest.errors import MalformedInput
from bootstrap.problems import PayloadTooLarge, UnsupportedMediaType
from bootstrap.service.http.bodies import body_limit
from bootstrap.service.http.plumbing import PLUMBING


async def read_json(request: web.Request) -> Any:
    limits = request.app[PLUMBING].settings.limits
    endpoint = request.match_info.route.name or ""
    limit = body_limit(endpoint, limits)
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(f"request bodies are limited to {limit} bytes here")
    if request.content_type != "application/json":
        raise UnsupportedMediaType("send application/json")
    raw = await request.read()  # from memory: the middleware read it (and refused a larger one)
    if len(raw) > limit:
        raise PayloadTooLarge(f"request bodies are limited to {limit} bytes here")
    try:
        doc = json.loads(raw, object_pairs_hook=_no_duplicates)
    except (ValueError, RecursionError) as exc:
        raise MalformedInput(f"body is not JSON: {str(exc)[:120]}") from None
    # The renewal's first step shares the finish step's route but carries only a CSR: 64 KiB.
    if (
        endpoint == "renew"
        and isinstance(doc, dict)
        and "session" not in doc
        and len(raw) > limits.max_body_bytes
    ):
        raise PayloadTooLarge(f"a renewal's first step is limited to {limits.max_body_bytes} bytes")
    return doc


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("duplicate key in a JSON object")
    return out


def peer_certificate(request: web.Request) -> x509.Certificate | None:
    """The client certificate as the client sent it. The TLS layer asks for one but does not judge
    it (``bootstrap.service.http.clientcert``): whoever uses it verifies it (``svid.verify_svid``)."""
    obj = request.transport.get_extra_info("ssl_object") if request.transport is not None else None
    if obj is None:
        return None
    der = obj.getpeercert(binary_form=True)
    if not der:
        return None
    try:
        return x509.load_der_x509_certificate(der)
    except ValueError:
        return None  # TLS accepted bytes that are no certificate we can read: as if none was sent


def client_address(request: web.Request) -> str:
    peer = request.transport.get_extra_info("peername") if request.transport is not None else None
    return str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"
