"""The admission listener's connections (``bootstrap.service.webhook.protocol``): requests read
in order however the bytes arrive, one answer each, the connection closed whenever its framing
can no longer be trusted; the listener stops without losing an answer in flight."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bootstrap.service.http.framing import RequestHead
from bootstrap.service.webhook.app import Answer, ReadBody
from bootstrap.service.webhook.protocol import Clock, OpenSet, ReviewProtocol
from tests.support.reviewserver import listening


class Wire(asyncio.Transport):
    """An in-memory transport: what the protocol writes, and whether it closed or paused."""

    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()
        self.closed = False
        self.paused = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.out += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def get_protocol(self) -> Any:
        return None


class Echo:
    """Answers each request with its method, path and body length; ``gate`` makes it wait."""

    def __init__(self) -> None:
        self.gate: asyncio.Event | None = None
        self.entered = asyncio.Event()
        self.seen: list[str] = []

    async def answer(self, head: RequestHead, read: ReadBody) -> Answer:
        self.entered.set()
        if head.path == "/nobody":
            return Answer(404, b"{}")  # answered without reading the body
        if self.gate is not None:
            await self.gate.wait()
        try:
            body = await read(30.0) if head.content_length else b""
        except ConnectionError:
            self.seen.append("gone")
            return Answer(400, b"{}", close=True)
        self.seen.append(f"{head.method} {head.path} {len(body)}")
        return Answer(200, json.dumps({"path": head.path, "length": len(body)}).encode())


def request(path: str = "/admission/validate", body: bytes = b"{}", extra: bytes = b"") -> bytes:
    return (
        b"POST %b HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%b\r\n%b"
        % (
            path.encode(),
            len(body),
            extra,
            body,
        )
    )


async def settle(steps: int = 10) -> None:
    """Let the loop run what the last bytes started (a task's steps, its done callback)."""
    for _ in range(steps):
        await asyncio.sleep(0)


def connect(app: Any) -> tuple[ReviewProtocol, Wire]:
    proto = ReviewProtocol(app, Clock(), OpenSet())
    wire = Wire()
    proto.connection_made(wire)
    return proto, wire


_DATE = re.compile(rb"Date: [^\r]*\r\n")


def answers(wire: Wire) -> list[bytes]:
    """The answers written, without their Date field."""
    text = _DATE.sub(b"", bytes(wire.out))
    return [b"HTTP/1.1" + part for part in text.split(b"HTTP/1.1")[1:]]


async def test_pipelined_requests_are_answered_in_order() -> None:
    proto, wire = connect(Echo())
    proto.data_received(request(body=b"a" * 10) + request("/admission/mutate", b"b" * 20) + request(body=b""))
    await settle()
    got = answers(wire)
    assert len(got) == 3
    assert [json.loads(a.split(b"\r\n\r\n", 1)[1])["length"] for a in got] == [10, 20, 0]
    assert not wire.closed


STREAM = request(body=b"x" * 300) + request("/admission/mutate", b"y" * 5) + request(body=b'{"k": 1}')


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(1, len(STREAM) - 1), unique=True, max_size=30).map(sorted))
def test_any_split_of_the_bytes_gives_the_same_answers(cuts: list[int]) -> None:
    async def run() -> list[bytes]:
        proto, wire = connect(Echo())
        for start, end in zip([0, *cuts], [*cuts, len(STREAM)], strict=True):
            proto.data_received(STREAM[start:end])
            await settle()  # a body awaited across chunks is delivered by the loop
        return answers(wire)

    async def whole() -> list[bytes]:
        proto, wire = connect(Echo())
        proto.data_received(STREAM)
        await settle()
        return answers(wire)

    assert asyncio.run(run()) == asyncio.run(whole())


async def test_bad_framing_gets_its_code_and_the_connection_closes() -> None:
    proto, wire = connect(Echo())
    proto.data_received(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
    await settle()
    (got,) = answers(wire)
    assert got.startswith(b"HTTP/1.1 411 Length Required\r\n")
    assert b"Connection: close\r\n" in got
    assert b"Content-Type: application/problem+json" in got
    assert json.loads(got.split(b"\r\n\r\n", 1)[1])["code"] == "malformed_request"
    assert wire.closed
    proto.data_received(request())  # nothing more is read from a closed connection
    await settle()
    assert len(answers(wire)) == 1


async def test_a_head_over_the_limit_is_refused_before_it_ends() -> None:
    proto, wire = connect(Echo())
    proto.data_received(b"POST / HTTP/1.1\r\nX-Pad: " + b"a" * (17 * 1024))
    await settle()
    (got,) = answers(wire)
    assert got.startswith(b"HTTP/1.1 431 ")
    assert wire.closed


async def test_an_answer_before_the_body_closes_the_connection() -> None:
    """A refusal that leaves the body unread cannot keep the connection: its bytes would be
    read as the next request."""
    proto, wire = connect(Echo())
    proto.data_received(request("/nobody", body=b"POST /admission/validate HTTP/1.1\r\n\r\n"))
    await settle()
    (got,) = answers(wire)
    assert got.startswith(b"HTTP/1.1 404 ")
    assert wire.closed


async def test_expect_continue_is_answered_when_the_body_is_wanted() -> None:
    proto, wire = connect(Echo())
    expect = b"Expect: 100-continue\r\n"
    proto.data_received(request(body=b"", extra=expect).replace(b"Length: 0", b"Length: 4"))
    assert bytes(wire.out) == b""  # nothing before the app asks for the body
    await settle()
    assert bytes(wire.out) == b"HTTP/1.1 100 Continue\r\n\r\n"
    proto.data_received(b"abcd")
    await settle()
    got = answers(wire)
    assert got[-1].startswith(b"HTTP/1.1 200 OK\r\n")
    # A request refused before its body is read gets no 100 Continue: the refusal, then a close.
    proto, wire = connect(Echo())
    proto.data_received(request("/nobody", body=b"", extra=expect).replace(b"Length: 0", b"Length: 4"))
    await settle()
    (refused,) = answers(wire)
    assert refused.startswith(b"HTTP/1.1 404 ")
    assert wire.closed


@pytest.mark.parametrize(
    ("stream", "closed"),
    [
        (request(extra=b"Connection: close\r\n"), True),
        (request().replace(b"HTTP/1.1\r\n", b"HTTP/1.0\r\n", 1), True),
        (
            request()
            .replace(b"HTTP/1.1\r\n", b"HTTP/1.0\r\n", 1)
            .replace(b"Host", b"Connection: keep-alive\r\nHost"),
            False,
        ),
        (request(), False),
    ],
)
async def test_keep_alive_as_the_client_asks(stream: bytes, closed: bool) -> None:
    proto, wire = connect(Echo())
    proto.data_received(stream)
    await settle()
    (got,) = answers(wire)
    assert got.startswith(b"HTTP/1.1 200 OK\r\n")
    assert (b"Connection: close\r\n" in got, wire.closed) == (closed, closed)


async def test_readyz_with_a_body_is_answered_and_the_body_never_read() -> None:
    """A GET with a (huge) body: answered at once, the connection closed, nothing buffered."""
    from bootstrap.service.webhook.app import make_app
    from tests.admission.test_webhook import decider

    proto, wire = connect(make_app(decider()))
    proto.data_received(b"GET /readyz HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000000\r\n\r\nxxxx")
    await settle()
    (got,) = answers(wire)
    assert got.startswith(b"HTTP/1.1 200 OK\r\n")
    assert wire.closed


async def test_head_gets_no_body() -> None:
    proto, wire = connect(Echo())
    proto.data_received(b"HEAD /x HTTP/1.1\r\nHost: x\r\n\r\n")
    await settle()
    (got,) = answers(wire)
    assert got.endswith(b"\r\n\r\n")
    assert b"Content-Length: " in got


async def test_a_waiting_answer_holds_later_bytes_and_bounds_them() -> None:
    """While a request waits, later requests stay in the buffer; past the bound, reading pauses
    (a client cannot make the listener buffer without end)."""
    app = Echo()
    app.gate = asyncio.Event()
    proto, wire = connect(app)
    proto.data_received(request())
    await settle()
    assert answers(wire) == []
    for _ in range(40):
        proto.data_received(request(body=b"z" * 16 * 1024))
    assert wire.paused
    app.gate.set()
    await settle(41 * 5)  # a task per request, one after the other
    assert len(answers(wire)) == 41
    assert not wire.paused


async def test_the_client_leaving_mid_body_ends_the_request() -> None:
    app = Echo()
    proto, wire = connect(app)
    proto.data_received(request(body=b"q" * 1000)[:-500])
    await settle()
    proto.connection_lost(None)
    await settle()
    assert app.seen == ["gone"]
    assert answers(wire) == []


async def test_requests_are_judged_in_tasks_and_answered_in_order() -> None:
    app = Echo()
    proto, wire = connect(app)
    proto.data_received(request(body=b"abc") + request(body=b"de"))
    assert answers(wire) == []  # nothing is judged in the read callback
    await settle()
    assert [json.loads(a.split(b"\r\n\r\n", 1)[1])["length"] for a in answers(wire)] == [3, 2]


async def test_a_bug_is_a_500_with_its_traceback_logged(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        async def answer(self, head: RequestHead, read: ReadBody) -> Answer:
            raise KeyError("bug")

    proto, wire = connect(Broken())
    proto.data_received(request())
    await settle()
    (got,) = answers(wire)
    assert got.startswith(b"HTTP/1.1 500 ")
    assert json.loads(got.split(b"\r\n\r\n", 1)[1])["code"] == "internal"
    assert wire.closed
    assert any(r.exc_info for r in caplog.records if r.name == "nodegate.admission")


async def test_stopping_lets_an_answer_in_flight_finish() -> None:
    app = Echo()
    app.gate = asyncio.Event()
    async with listening(app) as site:
        reader, writer = await asyncio.open_connection("127.0.0.1", site.port)
        writer.write(request(body=b"12345"))
        await writer.drain()
        await app.entered.wait()  # the review is being answered
        stopping = asyncio.create_task(site.stop())
        await asyncio.sleep(0)  # the stop has begun: the connection closes after this answer
        app.gate.set()
        await stopping
        answer = await reader.read()
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Connection: close\r\n" in answer


async def test_a_request_whose_client_left_while_it_waited_reads_no_body() -> None:
    """Gone while waiting for a slot: its body is never awaited (the slot comes back at once)."""
    app = Echo()
    app.gate = asyncio.Event()
    proto, wire = connect(app)
    proto.data_received(request(body=b"q" * 100)[:-50])
    await settle()
    proto.connection_lost(None)
    app.gate.set()
    await settle()
    assert app.seen == ["gone"]  # read() failed at once instead of waiting for ever
    assert answers(wire) == []
