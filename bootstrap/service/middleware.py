"""The one middleware around every route: each failure becomes ``application/problem+json`` with
a machine code (nothing reaches the client as a 500 or a traceback), and the join and admin
endpoints are counted and timed."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from admission.webhook import WebhookProblem
from attest.errors import AttestationError
from bootstrap.problems import MethodNotAllowed, NotFound, PayloadTooLarge, ServiceError, attestation_status
from bootstrap.service.problemjson import problem, webhook_problem
from bootstrap.service.state import SERVICE, Service

log = logging.getLogger("nodegate.server")

JOIN_ENDPOINTS = frozenset({"join_start", "join_finish", "renew"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def problems(request: web.Request, handler: Handler) -> web.StreamResponse:
    service: Service = request.app[SERVICE]
    endpoint = _endpoint(request)
    started = time.perf_counter()
    code = "ok"
    try:
        resp = await handler(request)
    except AttestationError as exc:
        code = exc.code
        resp = problem(attestation_status(exc), exc.code, exc.detail, retry_after=_retry(exc))
    except ServiceError as exc:
        code = exc.code
        resp = problem(exc.status, exc.code, exc.detail, retry_after=exc.retry_after)
    except WebhookProblem as exc:
        code = exc.code
        resp = webhook_problem(exc)
    except web.HTTPRequestEntityTooLarge:
        code = PayloadTooLarge.code
        resp = problem(
            413, code, f"request bodies are limited to {service.settings.limits.max_body_bytes} bytes"
        )
        resp.force_close()
    except web.HTTPMethodNotAllowed:
        code = MethodNotAllowed.code
        resp = problem(405, code, f"{request.method} is not allowed on {request.path}")
    except web.HTTPNotFound:
        code = NotFound.code
        resp = problem(404, code, f"no endpoint {request.path}")
    except web.HTTPException as exc:  # other routing answers (e.g. 400 from the parser)
        code = "malformed_request" if exc.status < 500 else "unavailable"
        resp = problem(exc.status if exc.status < 500 else 503, code, exc.reason)
    except asyncio.CancelledError:
        raise
    except Exception:  # a bug: never a 500 with a traceback; the log has it
        log.exception("unexpected error", extra={"endpoint": endpoint})
        code = "unavailable"
        resp = problem(503, code, "internal error; the request changed nothing, retry later", retry_after=5)
    if endpoint in JOIN_ENDPOINTS or endpoint.startswith("admin"):
        service.metrics.requests.labels(endpoint, code).inc()
        service.metrics.latency.labels(endpoint).observe(time.perf_counter() - started)
    return resp


def _endpoint(request: web.Request) -> str:
    route = request.match_info.route
    return route.name or "other" if route is not None else "other"


def _retry(exc: AttestationError) -> float | None:
    return getattr(exc, "retry_after", None)
