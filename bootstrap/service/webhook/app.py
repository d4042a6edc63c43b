"""The admission webhooks' own app, served on their own listener (``admission.listen``, see
``bootstrap.service.serve``) apart from the join API, so that a flood of reviews can take neither
the join listener's connections nor its in-flight slots (issue 21, finding 8).

``POST /admission/validate`` and ``POST /admission/mutate`` (AdmissionReview v1 in and out), and
``GET /readyz`` (200 once PackagePolicies are loaded). The API server is the only client, so the
protections are the ones that matter for it, at as little cost per review as possible:

- body size: at most ``MAX_REVIEW_BYTES`` (413), no ``Content-Encoding`` (415), JSON only;
- in flight: at most ``max_inflight`` reviews per route; a review beyond it waits up to
  ``queue_seconds`` for a slot, then gets 503 ``unavailable`` (``nodegate_admission_busy_total``);
- large bodies (over ``heavy_bytes``, or of unknown length) take the one heavy lane before their
  body is read: their parse holds the interpreter for tens of milliseconds (pydantic-core keeps
  the GIL, so a thread would not free the event loop: measured, docs/benchmarks.md), so they run
  one at a time, give the loop back between read and parse, and the lane rests as long as the
  last one took before the next (at most half of the loop for large reviews);
- time: the listener's deadlines (handshake, the whole request from its first byte, idle
  keep-alive) are per connection (``bootstrap.service.http.listener``); nothing here arms a timer.

No middleware, no per-request metrics, no body copy: the join API's per-request accounting is for
nodes. Refusals of bodies are ``application/problem+json`` from the service's one builder.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from aiohttp import hdrs, web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from admission.decider import Decider
from admission.decisioncache import DecisionCache
from admission.mutate import CrMutator
from admission.response import Decision
from admission.webhook import MAX_REVIEW_BYTES, WebhookProblem, make_handler, make_mutate_handler
from bootstrap.problems import MethodNotAllowed, NotFound
from bootstrap.service.http.listener import connection_of
from bootstrap.service.http.problemjson import problem, webhook_problem
from bootstrap.service.metrics import Metrics
from bootstrap.service.webhook.policywatch import WAITING_FOR_POLICIES

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

VALIDATE: Final = "/admission/validate"
MUTATE: Final = "/admission/mutate"


@dataclass(frozen=True, slots=True)
class WebhookLimits:
    max_inflight: int = 32  # per route (config admission.max_inflight)
    queue_seconds: float = 2.0  # a review waits this long for a slot, then 503
    heavy_bytes: int = 256 * 1024  # larger bodies go one at a time (the heavy lane)

    def __post_init__(self) -> None:
        if self.max_inflight < 1 or self.queue_seconds <= 0 or self.heavy_bytes < 1:
            raise ValueError("webhook limits: max_inflight >= 1, queue_seconds > 0, heavy_bytes >= 1")


class _Busy(Exception):
    pass


class _Lane:
    """At most ``size`` holders; others wait in order up to ``seconds``. Taking a free slot is a
    counter decrement: no coroutine, no timer (the usual review)."""

    def __init__(self, size: int, seconds: float) -> None:
        self._free = size
        self._seconds = seconds
        self._waiters: deque[asyncio.Future[None]] = deque()

    def take(self) -> bool:
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return True
        return False

    async def wait(self) -> None:
        """A slot, handed over by ``give``; _Busy after ``seconds``."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(self._seconds):
                await waiter
        except BaseException as exc:  # the time ran out, or the request was cancelled
            if waiter.done() and not waiter.cancelled():
                self.give()  # handed over just as it ended: pass it on
            else:
                waiter.cancel()
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)  # a stale waiter would keep take() failing
            if isinstance(exc, TimeoutError):
                raise _Busy from None
            raise

    def give(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes to the next in line
                return
        self._free += 1


def _check_encoding(request: web.Request) -> None:
    encoding = request.headers.get(hdrs.CONTENT_ENCODING)
    if encoding is not None and encoding.strip().lower() not in ("", "identity"):
        detail = f"Content-Encoding {encoding[:32]!r} is not accepted; send the body as is"
        raise WebhookProblem(415, "malformed_request", detail)


def _guarded(
    route: str, handler: Handler, lane: _Lane, heavy: _Lane, limits: WebhookLimits, metrics: Metrics | None
) -> Handler:
    async def serve(request: web.Request) -> web.StreamResponse:
        conn = connection_of(request)
        try:
            _check_encoding(request)
            length = request.content_length
            if not lane.take():
                await lane.wait()
            try:
                if length is not None and (length <= limits.heavy_bytes or length > MAX_REVIEW_BYTES):
                    resp = await handler(request)  # small, or refused (413) before it is read
                else:
                    if not heavy.take():
                        await heavy.wait()
                    try:
                        await request.read()  # the body, within the heavy lane (read() is cached)
                        await asyncio.sleep(0)  # joins get the loop between the read and the parse
                        started = time.perf_counter()
                        resp = await handler(request)
                        # As long again before the next large one: large reviews get at most
                        # half of the loop, joins the rest (python -m tests.bench joinload).
                        await asyncio.sleep(time.perf_counter() - started)
                    finally:
                        heavy.give()
            finally:
                lane.give()
        except WebhookProblem as exc:
            resp = webhook_problem(exc)
        except web.HTTPRequestEntityTooLarge:
            resp = webhook_problem(
                WebhookProblem(413, "payload_too_large", f"reviews are limited to {MAX_REVIEW_BYTES} bytes")
            )
        except _Busy:
            if metrics is not None:
                metrics.admission_busy.labels(route).inc()
            resp = problem(503, "unavailable", f"{route}: every review slot is busy; retry", retry_after=1)
            resp.force_close()  # its body was not read
        except (ConnectionError, asyncio.IncompleteReadError, RequestPayloadError, HttpProcessingError):
            if metrics is not None:
                metrics.client_errors.labels("admission", "aborted").inc()
            resp = problem(400, "malformed_request", "the body did not arrive whole")
            resp.force_close()
        if conn is not None and not conn.answered():
            resp.force_close()
        return resp

    return serve


def make_app(
    decider: Decider,
    mutator: CrMutator | None = None,
    *,
    limits: WebhookLimits | None = None,
    metrics: Metrics | None = None,
    cache: DecisionCache | None = None,
    on_cached: Callable[[Decision], None] | None = None,
    allowed_level: int = logging.INFO,
    audit: Callable[..., None] | None = None,
) -> web.Application:
    """The webhook routes (``/admission/mutate`` when a mutator is given) and ``/readyz``: 200
    once PackagePolicies are loaded, 503 before (the webhook denies meanwhile). ``cache``,
    ``on_cached``, ``allowed_level`` and ``audit`` go to the validating handler
    (``admission.webhook``)."""
    limits = limits or WebhookLimits()
    # auto_decompress off: bodies are taken as sent; an encoded one is refused above.
    app = web.Application(client_max_size=MAX_REVIEW_BYTES, handler_args={"auto_decompress": False})
    heavy = _Lane(1, limits.queue_seconds)
    validate = make_handler(
        decider, cache=cache, on_cached=on_cached, allowed_level=allowed_level, audit=audit
    )
    routes: list[tuple[str, Handler]] = [(VALIDATE, validate)]
    if mutator is not None:
        routes.append((MUTATE, make_mutate_handler(mutator)))
    for path, handler in routes:
        lane = _Lane(limits.max_inflight, limits.queue_seconds)
        app.router.add_post(path, _guarded(path, handler, lane, heavy, limits, metrics))

    async def readyz(_request: web.Request) -> web.Response:
        if decider.policy_source.policies() is None:
            return web.Response(status=503, text=f"PackagePolicies not loaded: {WAITING_FOR_POLICIES}\n")
        return web.Response(text="ok\n")

    async def elsewhere(request: web.Request) -> web.Response:
        if request.path in (VALIDATE, MUTATE):
            resp = problem(405, MethodNotAllowed.code, f"{request.method} is not allowed on {request.path}")
        else:
            resp = problem(404, NotFound.code, f"no endpoint {request.path} on the admission listener")
        resp.force_close()  # a body may be left unread
        return resp

    app.router.add_get("/readyz", readyz)
    app.router.add_route("*", "/{tail:.*}", elsewhere)  # after the routes above: what they do not take
    return app
