"""The admission webhooks' own app, served on their own listener (``admission.listen``, see
``bootstrap.service.serve``) apart from the join API, so that a flood of reviews can take neither
the join listener's connections nor its in-flight slots (issue 21, finding 8).

``POST /admission/validate`` and ``POST /admission/mutate`` (AdmissionReview v1 in and out), and
``GET /readyz`` (200 once PackagePolicies are loaded). The API server is the only client, so the
protections are the ones that matter for it, at as little cost per review as possible:

- body size: at most ``MAX_REVIEW_BYTES`` (413), no ``Content-Encoding`` (415), JSON only;
- the body first: a review takes nothing shared until its whole body is in. It must arrive within
  ``body_seconds`` of the app asking for it (a timer armed by the connection only when the body
  is not in yet), else 408 and the connection is closed (issue 41, findings 1 and 2: stalled
  bodies held every review slot and the heavy lane);
- in flight: at most ``max_inflight`` reviews per route, taken once the body is in; a review
  beyond it waits up to ``queue_seconds`` for a slot, then gets 503 ``unavailable``
  (``nodegate_admission_busy_total``);
- large bodies (over ``heavy_bytes``) take the one heavy lane after their slot: their parse
  holds the interpreter for tens of milliseconds (pydantic-core keeps the GIL, so a thread
  would not free the event loop: measured, docs/benchmarks.md), so they run one at a time, give
  the loop back before the parse, and the lane rests as long as the last one took before the
  next (at most half of the loop for large reviews);
- memory: the bytes of the bodies held across the listener's connections, from their first
  byte to their answer, have a cap (``bootstrap.service.webhook.protocol.BodyBytes``): past it
  a body larger than a connection's buffer that is still being read gets 503 ``unavailable``;
- time: besides the body's own deadline, the listener's (handshake, the whole request from its
  first byte, idle keep-alive) are per connection (``bootstrap.service.http.listener``).

The app knows nothing of HTTP framing: ``bootstrap.service.webhook.protocol`` reads requests off
the connection and writes the :class:`Answer` (issue 35: aiohttp's request machinery cost more
per review than the decision, docs/admission.md). Refusals are ``application/problem+json`` from
the service's one builder.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from admission.decision.decider import Decider
from admission.decision.decisioncache import DecisionCache
from admission.decision.response import Decision
from admission.hold.mutate import CrMutator
from admission.webhook import (
    MAX_REVIEW_BYTES,
    WebhookProblem,
    check_media,
    make_mutation,
    make_validator,
    too_large,
)
from bootstrap.problems import MethodNotAllowed, NotFound
from bootstrap.service.http.framing import RequestHead
from bootstrap.service.http.problemjson import CONTENT_TYPE as PROBLEM
from bootstrap.service.http.problemjson import problem_body, retry_after_value
from bootstrap.service.metrics import Metrics
from bootstrap.service.webhook.policywatch import WAITING_FOR_POLICIES

JSON: Final = "application/json; charset=utf-8"
Judge = Callable[[bytes], Awaitable[bytes]]
# ``read(seconds)``: the request's body, whole; BodyLate when it is not in within ``seconds``,
# NoRoom when the listener holds too many bodies' bytes to read it.
ReadBody = Callable[[float], Awaitable[bytes]]

VALIDATE: Final = "/admission/validate"
MUTATE: Final = "/admission/mutate"


@dataclass(frozen=True, slots=True)
class WebhookLimits:
    max_inflight: int = 32  # per route (config admission.max_inflight)
    queue_seconds: float = 2.0  # a review waits this long for a slot, then 503
    heavy_bytes: int = 256 * 1024  # larger bodies go one at a time (the heavy lane)
    # A body must be in whole this long after its head, else 408 and closed: the chart's
    # webhook timeoutSeconds (5) is as long as the API server waits for the whole answer.
    body_seconds: float = 5.0

    def __post_init__(self) -> None:
        if min(self.max_inflight, self.heavy_bytes) < 1 or min(self.queue_seconds, self.body_seconds) <= 0:
            raise ValueError(
                "webhook limits: max_inflight >= 1, queue_seconds > 0, heavy_bytes >= 1, body_seconds > 0"
            )


class _Busy(Exception):
    pass


class BodyLate(Exception):
    """The body was not in whole within the time ``read`` was given."""


class NoRoom(Exception):
    """``read`` refused a large body: the listener holds as many bodies' bytes as it may."""


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
        """A slot, handed over by ``give``; _Busy after ``seconds`` (one timer per waiter)."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append(waiter)
        timer = loop.call_later(self._seconds, self._expire, waiter)
        try:
            await waiter
        except BaseException:  # the time ran out, or the request was cancelled
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.give()  # handed over just as it ended: pass it on
            else:
                waiter.cancel()
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)  # a stale waiter would keep take() failing
            raise
        finally:
            timer.cancel()

    def _expire(self, waiter: asyncio.Future[None]) -> None:
        if not waiter.done():
            waiter.set_exception(_Busy())

    def give(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes to the next in line
                return
        self._free += 1


class Reviews(Protocol):
    """What the listener serves: an answer per request (``ReviewApp``; the benchmark's floor)."""

    async def answer(self, head: RequestHead, read: ReadBody) -> Answer: ...


@dataclass(frozen=True, slots=True)
class Answer:
    """What the connection writes back: status, body, its type; ``close`` ends the connection
    after it; ``retry_after`` (seconds) is sent as Retry-After."""

    status: int
    body: bytes
    content_type: str = JSON
    close: bool = False
    retry_after: str | None = None


def problem_answer(
    status: int, code: str, detail: str, *, close: bool = False, retry_after: float | None = None
) -> Answer:
    return Answer(
        status,
        problem_body(status, code, detail),
        PROBLEM,
        close,
        None if retry_after is None else retry_after_value(retry_after),
    )


def _sync(judge: Callable[[bytes], bytes]) -> Judge:
    async def run(body: bytes) -> bytes:
        return judge(body)

    return run


@dataclass(slots=True)
class _Route:
    path: str
    endpoint: str  # the route's label in nodegate_requests_total / nodegate_request_seconds
    judge: Judge
    lane: _Lane
    # The metric children, looked up once (``labels()`` costs more than the increment).
    latency: Any = None
    counts: dict[str, Any] = field(default_factory=dict)


class ReviewApp:
    """The routes, their review slots and the heavy lane; ``answer`` judges one request.
    ``cache``, ``on_cached``, ``allowed_level`` and ``audit`` go to the validating route
    (``admission.webhook.make_validator``)."""

    def __init__(
        self,
        decider: Decider,
        mutator: CrMutator | None = None,
        *,
        limits: WebhookLimits | None = None,
        metrics: Metrics | None = None,
        cache: DecisionCache | None = None,
        on_cached: Callable[[Decision], None] | None = None,
        allowed_level: int = logging.INFO,
        audit: Callable[..., None] | None = None,
    ) -> None:
        self.limits = limits = limits or WebhookLimits()
        self.metrics = metrics
        self._decider = decider
        self._heavy = _Lane(1, limits.queue_seconds)
        validate = make_validator(
            decider, cache=cache, on_cached=on_cached, allowed_level=allowed_level, audit=audit
        )
        self._routes: dict[str, _Route] = {
            VALIDATE: _Route(
                VALIDATE, "admission", validate, _Lane(limits.max_inflight, limits.queue_seconds)
            )
        }
        if mutator is not None:
            self._routes[MUTATE] = _Route(
                MUTATE,
                "admission_mutate",
                _sync(make_mutation(mutator)),
                _Lane(limits.max_inflight, limits.queue_seconds),
            )
        if metrics is not None:
            for route in self._routes.values():
                route.latency = metrics.latency.labels(route.endpoint)

    async def answer(self, head: RequestHead, read: ReadBody) -> Answer:
        """The answer to ``head``; ``read`` gives its body (called at most once: a request
        answered without it is answered with ``close``, its body unread; one whose body came
        late too)."""
        route = self._routes.get(head.path)
        if route is None or head.method != "POST":
            return await self._elsewhere(head, read)
        if self.metrics is None:
            return (await self._review(route, head, read))[0]
        started = time.perf_counter()
        answer, code = await self._review(route, head, read)
        if code is None:
            return answer  # counted as busy or as a client error, as on the join listener
        counter = route.counts.get(code)
        if counter is None:
            counter = route.counts[code] = self.metrics.requests.labels(route.endpoint, code)
        counter.inc()
        route.latency.observe(time.perf_counter() - started)
        return answer

    async def _review(self, route: _Route, head: RequestHead, read: ReadBody) -> tuple[Answer, str | None]:
        """The answer to a review on ``route`` and its code (``ok`` or the problem's; None for a
        review refused as busy, late or whose client went away, which other counters count)."""
        try:
            check_media(head.content_type, head.content_encoding)
            if head.content_length > MAX_REVIEW_BYTES:
                raise too_large()
            # The whole body before any slot: a client that sends it slowly, or never, holds
            # its own connection until body_seconds, and nothing shared.
            data = await read(self.limits.body_seconds)
            lane = route.lane
            if not lane.take():
                await lane.wait()
            try:
                if head.content_length <= self.limits.heavy_bytes:
                    body = await route.judge(data)
                else:
                    body = await self._heavily(route, data)
            finally:
                lane.give()
        except WebhookProblem as exc:
            return problem_answer(exc.status, exc.code, exc.detail, close=exc.status == 413), exc.code
        except (_Busy, NoRoom) as exc:
            if self.metrics is not None:
                self.metrics.admission_busy.labels(route.path).inc()
            if isinstance(exc, NoRoom):
                detail = f"{route.path}: the listener holds as many review bodies as it may; retry"
            else:
                detail = f"{route.path}: every review slot is busy; retry"
            return problem_answer(503, "unavailable", detail, close=True, retry_after=1), None
        except BodyLate:
            if self.metrics is not None:
                self.metrics.client_errors.labels("admission", "body_timeout").inc()
            detail = f"the body did not arrive within {self.limits.body_seconds:g} s"
            return problem_answer(408, "malformed_request", detail, close=True), None
        except ConnectionError:
            if self.metrics is not None:
                self.metrics.client_errors.labels("admission", "aborted").inc()
            answer = problem_answer(400, "malformed_request", "the body did not arrive whole", close=True)
            return answer, None
        return Answer(200, body), "ok"

    async def _heavily(self, route: _Route, data: bytes) -> bytes:
        heavy = self._heavy
        if not heavy.take():
            await heavy.wait()
        try:
            await asyncio.sleep(0)  # joins get the loop between the read and the parse
            started = time.perf_counter()
            body = await route.judge(data)
            # As long again before the next large one: large reviews get at most half of the
            # loop, joins the rest (python -m tests.bench joinload).
            await asyncio.sleep(time.perf_counter() - started)
            return body
        finally:
            heavy.give()

    async def _elsewhere(self, head: RequestHead, read: ReadBody) -> Answer:
        if head.path == "/readyz" and head.method in ("GET", "HEAD"):
            # A body, if any, is not read: the connection closes after the answer.
            if self._decider.policy_source.policies() is None:
                return Answer(503, f"PackagePolicies not loaded: {WAITING_FOR_POLICIES}\n".encode(), TEXT)
            return Answer(200, b"ok\n", TEXT)
        if head.path in self._routes or head.path == "/readyz":
            detail = f"{head.method} is not allowed on {head.path}"
            return problem_answer(405, MethodNotAllowed.code, detail, close=True)
        detail = f"no endpoint {head.path} on the admission listener"
        return problem_answer(404, NotFound.code, detail, close=True)


TEXT: Final = "text/plain; charset=utf-8"


# The name ``compose`` and the tests build the app by: the routes (``/admission/mutate`` when a
# mutator is given) and ``/readyz`` (200 once PackagePolicies are loaded, 503 before).
make_app = ReviewApp
