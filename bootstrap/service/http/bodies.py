"""Every request body is read here, by the middleware, before its handler runs: a join's in-flight
slot (``Service.join_slot``) is taken only once the whole body is in, so a client that sends its
body slowly, or never, holds nothing but its own connection, and not for long.

The rules (docs/protocol.md, docs/troubleshooting.md):

- size per route: the finish bodies (``/v1/join/finish``, ``/v1/nodes/self/renew``,
  ``/v1/disk/finish``) may carry a measured-boot event log, so at most 1.5 MiB; every other
  body ``limits.max_body_bytes`` (64 KiB). Over it: 413 ``payload_too_large``. (The webhooks
  have their own listener and limits: ``bootstrap.service.webhook.app``.)
- no ``Content-Encoding`` (other than ``identity``): no client of this protocol compresses, and
  nothing is decompressed on the server (no decompression bombs): 415.
- time: ``BASE_SECONDS`` plus the body's size at ``MIN_RATE``; later: 408, the connection closed,
  counted as a client error (``nodegate_client_errors_total``), not as a service failure.
- a client that closes mid-body is counted the same way and logged at debug level only.
"""

from __future__ import annotations

import asyncio
from typing import Final

from aiohttp import hdrs, web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from bootstrap.config import Limits
from bootstrap.service.http.listener import Connection

# /v1/join/finish and the renewal's finish step: base64 of a raw event log of at most 1 MiB plus
# the quote and the PCR values.
EVIDENCE_BODY_BYTES: Final = 1536 * 1024
EVIDENCE_ENDPOINTS: Final = frozenset({"join_finish", "renew", "disk_finish"})
BASE_SECONDS: Final = 10.0
MIN_RATE: Final = 32 * 1024  # bytes per second a client must sustain beyond BASE_SECONDS


class BodyRefused(Exception):
    """A body the service does not read: the middleware answers ``status`` with ``code``."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail


class ClientGone(Exception):
    """The client did not complete its body: ``reason`` is ``aborted`` or ``body_timeout``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def body_limit(endpoint: str, limits: Limits) -> int:
    if endpoint in EVIDENCE_ENDPOINTS:
        return max(EVIDENCE_BODY_BYTES, limits.max_body_bytes)
    return limits.max_body_bytes


def body_seconds(size: int) -> float:
    return BASE_SECONDS + size / MIN_RATE


def too_large(limit: int) -> BodyRefused:
    return BodyRefused(413, "payload_too_large", f"request bodies are limited to {limit} bytes here")


async def read_body(
    request: web.Request, endpoint: str, limits: Limits, conn: Connection | None
) -> web.Request:
    """The request with its body read (``await request.read()`` answers from memory), or
    BodyRefused / ClientGone."""
    encoding = request.headers.get(hdrs.CONTENT_ENCODING, "").strip().lower()
    if encoding not in ("", "identity"):
        raise BodyRefused(
            415,
            "unsupported_media_type",
            f"Content-Encoding {encoding[:32]!r} is not accepted; send the body as is",
        )
    limit = body_limit(endpoint, limits)
    length = request.content_length
    if length is not None and length > limit:
        raise too_large(limit)
    seconds = body_seconds(limit if length is None else length)
    if conn is not None:
        conn.reading_body(seconds)
    clone = request.clone(client_max_size=limit)
    try:
        async with asyncio.timeout(seconds):
            await clone.read()
    except web.HTTPRequestEntityTooLarge:
        raise too_large(limit) from None
    except TimeoutError:
        raise ClientGone("body_timeout", f"the body did not arrive within {seconds:.0f} s") from None
    except (ConnectionError, asyncio.IncompleteReadError) as exc:
        raise ClientGone(
            "aborted", f"the client closed the connection mid-body ({type(exc).__name__})"
        ) from None
    except (RequestPayloadError, HttpProcessingError):
        raise BodyRefused(400, "malformed_request", "the body's HTTP framing is broken") from None
    except RuntimeError:
        # aiohttp's payload raises RuntimeError("Connection closed.") when the connection was
        # already lost as the read began (a client that closed right after sending its head).
        transport = request.transport
        if transport is not None and not transport.is_closing():
            raise
        raise ClientGone("aborted", "the client closed the connection mid-body (closed)") from None
    if conn is not None:
        conn.working()
    return clone
