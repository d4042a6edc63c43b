"""Hostile clients on the admission listener (an adversarial review of issue 35's HTTP/1.1): each
test is a way a client could hold the listener longer, make it work harder or keep a connection
it should lose, and the behaviour that stops it."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from bootstrap.service.http.framing import parse_head
from bootstrap.service.http.listener import Connection, ConnectionLimits, Connections
from bootstrap.service.metrics import Metrics
from bootstrap.service.webhook.protocol import Clock, OpenSet, ReviewProtocol
from tests.service.test_review_protocol import Echo, Wire, answers, connect, request, settle
from tests.support.reviewserver import listening


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
