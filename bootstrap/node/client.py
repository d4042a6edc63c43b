"""The node's HTTP client for the join service: TLS trust, size-capped answers, retries.

    async with http_session(tls_context(ca_bundle), timeout, "nodegate-join") as s:
        client = ServiceClient(s, base_url(server), ca_bundle)
        start = await with_retries(lambda: client.post(path, body, StartResponse), ...)

Transient failures (network, timeouts, 429/5xx, expired sessions) are retried with capped
exponential backoff and full jitter, or after the server's Retry-After; every other refusal is
final (:class:`JoinFailed`) and carries the server's machine code.
"""

from __future__ import annotations

import email.utils
import logging
import math
import random
import ssl
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aiohttp
from pydantic import BaseModel, ValidationError

from attest import validation
from bootstrap.names import is_loopback
from bootstrap.node import tlsnames
from bootstrap.node.errors import DETAIL_LIMIT, JoinFailed, JoinGaveUp, JoinUsageError, one_line
from bootstrap.protocol import FinishResponse, Problem

__all__ = [
    "BACKOFF_CAP",
    "JOIN_FINISH_PATH",
    "JOIN_START_PATH",
    "MAX_RESPONSE",
    "ServiceClient",
    "base_url",
    "check_retry_options",
    "http_session",
    "post_finish",
    "tls_context",
    "with_retries",
]

JOIN_START_PATH = "/v1/join/start"
JOIN_FINISH_PATH = "/v1/join/finish"

BACKOFF_CAP = 30.0
MAX_RESPONSE = 1024 * 1024
_NAMES_TIMEOUT = 5.0  # the second handshake that reads the certificate's names
_TRANSIENT_STATUS = frozenset({429, 502, 503, 504})
_RESTART_CODES = frozenset({"session_expired", "session_unknown"})
_STATUS_CODES = {
    429: "rate_limited",
    502: "server_unavailable",
    503: "server_unavailable",
    504: "server_unavailable",
}

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


def check_retry_options(attempts: int, backoff: float, timeout: float) -> None:
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise JoinUsageError("attempts must be a positive integer")
    if not (math.isfinite(backoff) and backoff >= 0):
        raise JoinUsageError("backoff must be a non-negative number of seconds")
    if not (math.isfinite(timeout) and timeout > 0):
        raise JoinUsageError("timeout must be a positive number of seconds")


def base_url(server: str) -> str:
    """``server`` without a trailing slash, once it is https://host[:port] (or http:// to a
    loopback host: the --insecure-plaintext dev server)."""
    if not isinstance(server, str):
        raise JoinUsageError("server must be a URL string")
    try:
        parts = urlsplit(server)
        host = parts.hostname
        parts.port  # noqa: B018  (raises on a bad port)
    except ValueError as exc:
        raise JoinUsageError(f"server URL {one_line(server, 100)!r} does not parse: {exc}") from None
    if parts.scheme not in ("https", "http") or not host:
        raise JoinUsageError(f"server must be https://host[:port], not {one_line(server, 100)!r}")
    if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
        raise JoinUsageError("server URL must not carry credentials, a query or a fragment")
    if parts.scheme == "http" and not is_loopback(host):
        raise JoinUsageError(
            "plain http:// is only allowed to a loopback host (the dev server); use https://"
        )
    return server.rstrip("/")


def tls_context(ca_bundle: Path) -> ssl.SSLContext:
    """Trust exactly the roots in ``ca_bundle``: with an explicit cafile the stdlib does not load
    the system roots. Hostnames are checked."""
    try:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca_bundle))
    except FileNotFoundError:
        raise JoinUsageError(f"CA bundle {ca_bundle} does not exist") from None
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise JoinUsageError(f"CA bundle {ca_bundle} holds no usable PEM certificates ({exc})") from None
    if not ctx.get_ca_certs():
        raise JoinUsageError(f"CA bundle {ca_bundle} holds no CA certificates")
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = True
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def http_session(ssl_ctx: ssl.SSLContext | bool, timeout: float, user_agent: str) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=timeout),
        connector=aiohttp.TCPConnector(ssl=ssl_ctx),
        headers={"User-Agent": user_agent},
    )


class _Transient(Exception):
    """A failure worth another try; ``restart_now`` skips the backoff (a fresh session fixes it)."""

    def __init__(
        self,
        code: str,
        detail: str,
        status: int | None = None,
        *,
        retry_after: float | None = None,
        restart_now: bool = False,
    ) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = one_line(detail)
        self.status = status
        self.retry_after = retry_after
        self.restart_now = restart_now


class _TooLarge(Exception):
    pass


def _retry_after(value: str | None) -> float | None:
    """Retry-After as delta-seconds or an HTTP date, never negative."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(int(value[:12]))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _problem(content_type: str, raw: bytes) -> Problem | None:
    if content_type not in ("application/problem+json", "application/json"):
        return None
    try:
        return Problem.model_validate_json(raw)
    except ValidationError:
        return None


async def _read_limited(resp: aiohttp.ClientResponse) -> bytes:
    if resp.content_length is not None and resp.content_length > MAX_RESPONSE:
        raise _TooLarge
    chunks: list[bytes] = []
    total = 0
    async for chunk in resp.content.iter_chunked(64 * 1024):
        total += len(chunk)
        if total > MAX_RESPONSE:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


class ServiceClient:
    """POSTs to one join service; answers are parsed with the wire models of bootstrap.protocol."""

    def __init__(self, session: aiohttp.ClientSession, base: str, ca_bundle: Path) -> None:
        self.session = session
        self.base = base
        self.ca_bundle = ca_bundle

    async def post(self, path: str, body: dict[str, Any], model: type[M]) -> M:
        """POST JSON; return the parsed 2xx answer, raise JoinFailed (final) or a transient
        failure that :func:`with_retries` retries."""
        url = self.base + path
        try:
            async with self.session.post(
                url, json=body, allow_redirects=False, headers={"Accept": "application/json"}
            ) as resp:
                raw = await _read_limited(resp)
                status = resp.status
                content_type = resp.content_type
                retry_after = _retry_after(resp.headers.get("Retry-After"))
        except aiohttp.ClientConnectorCertificateError as exc:
            if tlsnames.is_name_mismatch(exc.certificate_error):
                names = await tlsnames.certificate_names(self.base, self.ca_bundle, _NAMES_TIMEOUT)
                host = urlsplit(self.base).hostname or self.base
                raise JoinFailed(
                    "tls_untrusted", f"{path}: {tlsnames.mismatch_detail(host, names)}"
                ) from None
            raise JoinFailed(
                "tls_untrusted",
                f"{path}: the server's TLS certificate is not trusted by {self.ca_bundle} "
                f"or does not name the host ({exc.certificate_error})",
            ) from None
        except aiohttp.ClientSSLError as exc:
            raise JoinFailed("tls_error", f"{path}: TLS handshake with the server failed ({exc})") from None
        except TimeoutError:
            raise _Transient("timeout", f"{path}: no complete answer within the request timeout") from None
        except _TooLarge:
            raise _Transient(
                "bad_response", f"{path}: the answer is larger than {MAX_RESPONSE} bytes"
            ) from None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise _Transient("server_unreachable", f"{path}: {type(exc).__name__}: {exc}") from None
        if 200 <= status < 300:
            try:
                return model.model_validate_json(raw)
            except ValidationError as exc:
                reason = validation.summary(exc, model, 1)
                raise _Transient(
                    "bad_response", f"{path}: HTTP {status} answer is not protocol JSON ({reason})"
                ) from None
        problem = _problem(content_type, raw)
        if status in _TRANSIENT_STATUS or status >= 500:
            code = problem.code if problem else _STATUS_CODES.get(status, "server_error")
            detail = (problem.detail or problem.title) if problem else None
            raise _Transient(
                code, f"{path}: HTTP {status}: {detail or code}", status, retry_after=retry_after
            )
        if problem is None:
            raise _Transient("bad_response", f"{path}: HTTP {status} without a problem document", status)
        raise JoinFailed(problem.code, problem.detail or problem.title or problem.code, status)


async def post_finish(
    client: ServiceClient,
    path: str,
    body: dict[str, Any],
    model: type[M] = FinishResponse,  # type: ignore[assignment]
) -> M:
    """The second request of a join, renewal or disk-key release; a session the server no longer
    knows (it restarted with a new session key, or the session outlived its 60 s) means starting
    over at once."""
    try:
        return await client.post(path, body, model)
    except JoinFailed as exc:
        if exc.code in _RESTART_CODES:
            raise _Transient(exc.code, f"{path}: {exc.detail}", exc.status, restart_now=True) from None
        raise


async def with_retries(
    attempt: Callable[[], Awaitable[T]],
    *,
    what: str,
    attempts: int,
    backoff: float,
    sleep: Callable[[float], Awaitable[None]],
    rng: random.Random,
    logger: logging.Logger,
) -> T:
    """Run ``attempt`` until it succeeds, a final JoinFailed, or ``attempts`` transient failures
    (then JoinGaveUp with the last one)."""
    failures = 0
    while True:
        try:
            return await attempt()
        except _Transient as exc:
            failures += 1
            if failures >= attempts:
                suffix = f" (after {failures} attempts)"
                raise JoinGaveUp(
                    exc.code, one_line(exc.detail, DETAIL_LIMIT - len(suffix)) + suffix, exc.status
                ) from None
            if exc.restart_now:
                logger.warning(
                    "%s: %s; starting a new session (attempt %d/%d)", what, exc.detail, failures + 1, attempts
                )
                continue
            delay = _delay(failures, backoff, rng, exc.retry_after)
            logger.warning(
                "%s: %s; retrying in %.1f s (attempt %d/%d)", what, exc.detail, delay, failures + 1, attempts
            )
            await sleep(delay)


def _delay(failures: int, backoff: float, rng: random.Random, retry_after: float | None) -> float:
    """Full jitter: uniform in [0, min(cap, backoff * 2^(n-1))]; a server's Retry-After wins, capped."""
    if retry_after is not None:
        return min(BACKOFF_CAP, retry_after)
    ceiling = min(BACKOFF_CAP, backoff * 2.0 ** min(failures - 1, 32))
    return rng.uniform(0.0, ceiling)
