"""Hostile clients on the admission listener (an adversarial review of issue 35's HTTP/1.1): each
test is a way a client could hold the listener longer, make it work harder or keep a connection
it should lose, and the behaviour that stops it (issue 41, findings 1 and 2: bodies that stall
hold no review slot and not the heavy lane, and have a deadline of their own)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp

from admission.rbac.evaluator import RbacEvaluator
from admission.webhook import Decider, LocalRbac, StaticPolicies
from bootstrap.service.http.framing import RequestHead, parse_head
from bootstrap.service.http.limits import ConnectionLimits
from bootstrap.service.http.listener import Connection, Connections
from bootstrap.service.metrics import Metrics
from bootstrap.service.webhook.app import Answer, ReadBody, ReviewApp, WebhookLimits
from bootstrap.service.webhook.protocol import Clock, OpenSet, ReviewProtocol
from tests.service.test_admission_listener import review
from tests.service.test_review_protocol import Echo, Wire, answers, connect, request, settle
from tests.support.reviewserver import listening

WAIT = 30.0
NODEGATE = "system:serviceaccount:nodegate:nodegate"


class Socket(Wire):
    """A Wire in front of which the listener's Connection sits (as on a real socket)."""

    def __init__(self) -> None:
        super().__init__()
        self.protocol: Any = None

    def get_protocol(self) -> Any:
        return self.protocol

    def close(self) -> None:
        if not self.closed and self.protocol is not None:
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)
        super().close()

    def abort(self) -> None:
        self.close()


def guarded(app: Any, limits: ConnectionLimits) -> tuple[Connections, Connection, Socket]:
    """A connection through the listener's limits to a ReviewProtocol, on an in-memory socket."""
    clock, protocols = Clock(), OpenSet()
    connections = Connections(limits, Metrics(), lambda: ReviewProtocol(app, clock, protocols), None)
    conn = connections.protocol()
    sock = Socket()
    sock.protocol = conn
    conn.connection_made(sock)
    return connections, conn, sock


def limits() -> ConnectionLimits:
    """The admission listener's limits, checked by ConnectionLimits when a test asks (not at import)."""
    return ConnectionLimits(
        header_timeout=35.0, idle_timeout=120.0, max_age=None, max_requests=None, sweep=1.0
    )


async def test_a_pipelined_request_is_under_the_request_deadline() -> None:
    """A request already buffered behind the previous answer is a request, not an idle
    connection: it gets the request deadline (not the idle one, 3x longer, while it holds a
    review slot waiting for a body that never comes) and cannot be evicted as idle."""
    app = Echo()
    connections, conn, sock = guarded(app, limits())
    second = request(body=b"q" * 100)[:-100]  # its head, and no body: it waits for it
    conn.data_received(request() + second)
    await settle()
    assert len(answers(sock)) == 1  # the first is answered; the second waits for its body
    assert connections.idle_count() == 0  # busy: not a candidate for eviction
    connections.sweep(time.monotonic() + limits().header_timeout + 1)
    assert sock.closed  # cut at the request deadline


async def test_empty_lines_before_a_request_are_bounded() -> None:
    """Empty lines before a request line are allowed (RFC 9112 section 2.2), but not without end:
    a stream of CRLFs was skipped two bytes per Python step for the whole request deadline (about
    50 ns a byte: a fast client kept the loop busy). Past the head limit it is refused."""
    proto, wire = connect(Echo())
    for _ in range(8):
        proto.data_received(b"\r\n" * 4096)  # 8 KiB a read, 64 KiB in all
    (got,) = answers(wire)
    assert got.startswith(b"HTTP/1.1 400 ")
    assert json.loads(got.split(b"\r\n\r\n", 1)[1])["code"] == "malformed_request"
    assert wire.closed
    proto, wire = connect(Echo())  # a few, in pieces, are still skipped
    for piece in (b"\r\n\r\n", b"\r\n", request()):
        proto.data_received(piece)
    await settle()
    (ok,) = answers(wire)
    assert ok.startswith(b"HTTP/1.1 200 ")


async def test_a_connection_that_arrives_during_a_stop_is_closed_at_once() -> None:
    """A connection whose accept (or TLS handshake) completes after the stop began was never
    told to drain: it stayed open, serving, until the stop's 10 s ran out."""
    app = Echo()
    app.gate = asyncio.Event()
    async with listening(app) as site:
        reader, writer = await asyncio.open_connection("127.0.0.1", site.port)
        writer.write(request())
        await writer.drain()
        await app.entered.wait()  # an answer in flight keeps the stop waiting
        stopping = asyncio.create_task(site.stop())
        await asyncio.sleep(0)  # the stop has begun
        assert site.connections is not None
        late = site.connections.protocol()  # accepted just now (its accept task ran late)
        sock = Socket()
        sock.protocol = late
        late.connection_made(sock)
        assert sock.closed
        app.gate.set()
        await stopping
        assert (await reader.read()).startswith(b"HTTP/1.1 200 OK\r\n")
        writer.close()


async def test_an_http10_request_gets_no_100_continue() -> None:
    """RFC 9110 section 10.1.1: an expectation in an HTTP/1.0 request is ignored; a 1.0 client
    would take a ``100 Continue`` for its answer (and the real answer for junk after it)."""
    assert not parse_head(b"POST / HTTP/1.0\r\nExpect: 100-continue").expect_continue
    assert not parse_head(b"POST / HTTP/1.0\r\nExpect: 200-ok").expect_continue  # not a 417
    proto, wire = connect(Echo())
    head = request(body=b"", extra=b"Expect: 100-continue\r\n").replace(b"Length: 0", b"Length: 4")
    proto.data_received(head.replace(b"HTTP/1.1\r\n", b"HTTP/1.0\r\n", 1))
    await settle()
    assert bytes(wire.out) == b""  # waiting for the body, nothing written
    proto.data_received(b"abcd")
    await settle()
    (got,) = answers(wire)
    assert got.startswith(b"HTTP/1.1 200 OK\r\n")


async def test_an_empty_line_after_a_body_leaves_the_connection_idle() -> None:
    """Some clients send CRLF after a POST body: that is no request, the connection is idle."""
    connections, conn, sock = guarded(Echo(), limits())
    conn.data_received(request() + b"\r\n")
    await settle()
    assert len(answers(sock)) == 1
    assert connections.idle_count() == 1
    conn.data_received(request())  # the next request after the empty line is answered
    await settle()
    assert len(answers(sock)) == 2


# -- issue 41, findings 1 and 2: bodies that stall must hold nothing shared ---------------------


class Entered(ReviewApp):
    """The webhook app, telling the test once ``expected`` requests have reached it (and, on the
    code before issue 41, taken their review slot and heavy lane: both were taken in that same
    step, before the body was read)."""

    def __init__(
        self, expected: int, limits: WebhookLimits | None = None, metrics: Metrics | None = None
    ) -> None:
        rbac = LocalRbac(RbacEvaluator.from_objects([]))
        super().__init__(Decider(StaticPolicies([]), rbac, NODEGATE), limits=limits, metrics=metrics)
        self.expected = expected
        self.entered = 0
        self.all_in = asyncio.Event()

    async def answer(self, head: RequestHead, read: ReadBody) -> Answer:
        self.entered += 1
        if self.entered == self.expected:
            self.all_in.set()
        return await super().answer(head, read)


async def stall(port: int, length: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A review's head announcing ``length`` bytes and the first 40 of them, then nothing."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /admission/validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % length + b'{"apiVersion": "admission.k8s.io/v1", "k'
    )
    await writer.drain()
    return reader, writer


async def verdict(port: int, body: bytes) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"http://127.0.0.1:{port}/admission/validate",
            data=body,
            headers={"Content-Type": "application/json"},
        ) as resp,
    ):
        return resp.status, await resp.json(content_type=None)


async def test_stalled_bodies_hold_no_review_slot() -> None:
    """Finding 1: as many connections as /admission/validate has slots each send a review's head
    (``Content-Length: 100000``) and 40 body bytes, then nothing. The slots were taken before the
    body was read, so every genuine review waited its 2 s in line and got 503, for as long as the
    attacker renewed them. A slot is now taken once the body is in: the review gets its verdict."""
    slots = WebhookLimits().max_inflight
    app = Entered(slots)
    async with listening(app) as site:
        stalled = [await stall(site.port, 100_000) for _ in range(slots)]
        await asyncio.wait_for(app.all_in.wait(), WAIT)  # every stalled review reached the app
        status, out = await asyncio.wait_for(verdict(site.port, review("genuine-1")), WAIT)
        for _reader, writer in stalled:
            writer.close()
    assert status == 200, out
    assert out["response"]["uid"] == "genuine-1"
    assert out["response"]["allowed"] is False  # the verdict (no PackagePolicy here: denied)


async def test_a_stalled_large_body_does_not_hold_the_heavy_lane() -> None:
    """Finding 2: one connection sends the head of a 400 KiB review and 40 body bytes, then
    stalls. It held the one heavy lane, so every genuine review over ``heavy_bytes`` (a 300 KiB
    CR) got 503 after 2 s. The lane is now taken once the body is in."""
    app = Entered(1)
    big = review("genuine-heavy", pad=300 * 1024)
    assert len(big) > app.limits.heavy_bytes
    async with listening(app) as site:
        _reader, writer = await stall(site.port, 400 * 1024)
        await asyncio.wait_for(app.all_in.wait(), WAIT)
        status, out = await asyncio.wait_for(verdict(site.port, big), WAIT)
        writer.close()
    assert status == 200, out
    assert out["response"]["uid"] == "genuine-heavy"


async def test_a_stalled_body_is_answered_408_and_closed_at_its_deadline() -> None:
    """A body has its own deadline (``WebhookLimits.body_seconds``, 5 s by default; small here):
    then 408 and the connection is closed, counted as a client error, and the bytes it held are
    freed. Before, only the 35 s request deadline cut it, without an answer."""
    metrics = Metrics()
    app = Entered(1, WebhookLimits(body_seconds=0.2), metrics)
    async with listening(app, metrics=metrics) as site:
        reader, writer = await stall(site.port, 100_000)
        got = await asyncio.wait_for(reader.read(), WAIT)  # to the end: the listener closed it
        writer.close()
        assert site._protocols.bodies.held == 0  # its 40 bytes are freed
    assert got.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), got
    assert b"Connection: close\r\n" in got
    assert json.loads(got.split(b"\r\n\r\n", 1)[1])["code"] == "malformed_request"
    labels = {"endpoint": "admission", "reason": "body_timeout"}
    assert metrics.registry.get_sample_value("nodegate_client_errors_total", labels) == 1


async def test_the_bodies_held_across_connections_are_capped() -> None:
    """Bodies are read before they have a slot, so the bytes they hold are capped for the whole
    listener (``BodyBytes``; 64 MiB, small here): 512 connections each sending most of a 4 MiB
    review would otherwise hold 2 GiB. Past the cap a large body still being read gets 503 at
    once, its bytes freed (none is paused: bodies waiting for each other's room would all wait
    until their deadlines); the others go on, and a small body is never refused."""
    mib = 1024 * 1024
    app = Entered(0, WebhookLimits(heavy_bytes=4 * mib))  # no heavy lane: no rest to wait for
    opens = OpenSet(body_cap=3 * mib)
    first, second = review("held-1", pad=2 * mib), review("held-2", pad=2 * mib)
    wires = []
    for body in (first, second):
        proto = ReviewProtocol(app, Clock(), opens)
        wire = Wire()
        proto.connection_made(wire)
        wires.append((proto, wire))
        proto.data_received(request(body=body)[: -len(body)])  # the head: the app asks for the body
        await settle()
        for at in range(0, 3 * mib // 2, 256 * 1024):  # 1.5 MiB of it, as a socket reads it
            proto.data_received(body[at : at + 256 * 1024])
    await settle()
    (refused,) = answers(wires[1][1])  # the second went over the cap: refused, the first goes on
    assert refused.startswith(b"HTTP/1.1 503 ")
    assert json.loads(refused.split(b"\r\n\r\n", 1)[1])["code"] == "unavailable"
    assert wires[1][1].closed
    small = ReviewProtocol(app, Clock(), opens)
    small_wire = Wire()
    small.connection_made(small_wire)
    small.data_received(request(body=review("small")))  # at the cap still: small bodies go on
    wires[0][0].data_received(first[3 * mib // 2 :])
    for wire in (small_wire, wires[0][1]):
        for _ in range(100):
            if answers(wire):
                break
            await asyncio.sleep(0)
    for wire, uid in ((small_wire, "small"), (wires[0][1], "held-1")):
        (got,) = answers(wire)
        assert got.startswith(b"HTTP/1.1 200 "), got
        assert json.loads(got.split(b"\r\n\r\n", 1)[1])["response"]["uid"] == uid
    assert opens.bodies.held == 0  # every byte is freed once its answer is out
