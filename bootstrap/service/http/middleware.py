"""The one middleware around every route: the body is read first, within its route's limits
(``bootstrap.service.http.bodies``), each failure becomes ``application/problem+json`` with a machine
code (nothing reaches the client as a 500 or a traceback), and the join and admin endpoints are
counted and timed. Clients that go away or stall are counted apart
(``nodegate_client_errors_total``): they are not service failures."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from attest.errors import AttestationError
from bootstrap.problems import MethodNotAllowed, NotFound, PayloadTooLarge, ServiceError, attestation_status
from bootstrap.service.http.bodies import BodyRefused, ClientGone, read_body
from bootstrap.service.http.guarded import connection_of
from bootstrap.service.http.plumbing import PLUMBING, Plumbing
from bootstrap.service.http.problemjson import problem

log = logging.getLogger("nodegate.server")

JOIN_ENDPOINTS = frozenset({"join_start", "join_finish", "renew", "disk_start", "disk_finish"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def problems(request: web.Request, handler: Handler) -> web.StreamResponse:
    service: Plumbing = request.app[PLUMBING]
    endpoint = _endpoint(request)
    conn = connection_of(request)
    started = time.perf_counter()
    code = "ok"
    try:
        if endpoint != "other":  # routing failures (404, 405) are answered without reading
            request = await read_body(request, endpoint, service.settings.limits, conn)
        resp = await handler(request)
    except ClientGone as exc:
        # The connection is gone or about to be closed: nobody reads this answer.
        service.metrics.client_errors.labels(endpoint, exc.reason).inc()
        log.debug("client gone", extra={"endpoint": endpoint, "code": exc.reason})
        resp = problem(408, "malformed_request", exc.detail)
        resp.force_close()
        if conn is not None:
            conn.answered()
        return resp
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001  (every failure becomes a problem document)
        code, resp = _problem_for(exc, request, service, endpoint)
    if endpoint in JOIN_ENDPOINTS or endpoint.startswith("admin"):
        service.metrics.requests.labels(endpoint, code).inc()
        service.metrics.latency.labels(endpoint).observe(time.perf_counter() - started)
    if conn is not None and not conn.answered():
        resp.force_close()  # the connection's last request (max_age or max_requests)
    return resp


def _problem_for(
    exc: Exception, request: web.Request, service: Plumbing, endpoint: str
) -> tuple[str, web.Response]:
    """The machine code and the problem document for a failure."""
    if isinstance(exc, BodyRefused):
        resp = problem(exc.status, exc.code, exc.detail)
        resp.force_close()  # the unread body would otherwise keep the connection busy
        return exc.code, resp
    if isinstance(exc, AttestationError):
        return exc.code, problem(attestation_status(exc), exc.code, exc.detail, retry_after=_retry(exc))
    if isinstance(exc, ServiceError):
        return exc.code, problem(exc.status, exc.code, exc.detail, retry_after=exc.retry_after)
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        limit = service.settings.limits.max_body_bytes
        resp = problem(413, PayloadTooLarge.code, f"request bodies are limited to {limit} bytes")
    elif isinstance(exc, web.HTTPMethodNotAllowed):
        resp = problem(405, MethodNotAllowed.code, f"{request.method} is not allowed on {request.path}")
    elif isinstance(exc, web.HTTPNotFound):
        resp = problem(404, NotFound.code, f"no endpoint {request.path}")
    elif isinstance(exc, web.HTTPException):  # other routing answers (e.g. 400 from the parser)
        code = "malformed_request" if exc.status < 500 else "unavailable"
        return code, problem(exc.status if exc.status < 500 else 503, code, exc.reason)
    else:  # a bug: never a 500 with a traceback; the log has it
        log.error("unexpected error", exc_info=exc, extra={"endpoint": endpoint})
        return "unavailable", problem(
            503, "unavailable", "internal error; the request changed nothing, retry later", retry_after=5
        )
    resp.force_close()  # a body may be left unread
    return _code_of(resp.status), resp


def _code_of(status: int) -> str:
    return {413: PayloadTooLarge.code, 405: MethodNotAllowed.code, 404: NotFound.code}[status]


def _endpoint(request: web.Request) -> str:
    route = request.match_info.route
    return route.name or "other" if route is not None else "other"


def _retry(exc: AttestationError) -> float | None:
    return getattr(exc, "retry_after", None)
