"""One admission-listener connection: HTTP/1.1 requests read off it in order, each answered by the
:class:`~bootstrap.service.webhook.app.ReviewApp`, the answers written back.

Why not aiohttp's request handler (issue 35, docs/admission.md): per review it cost more than the
decision itself (a request object, a payload stream, header multidicts, a response object and its
writer; about 55 µs of the bare handler's 100 µs on the benchmark machine). This protocol frames
the one grammar the API server speaks (``bootstrap.service.http.framing``), judges each request in
a task of its own and writes one buffer per answer. (Judging a review inside the read callback,
without a task, was tried and measured: it cost more CPU per review and doubled the p90 latency at
8 clients; docs/benchmarks.md.)

The listener (``bootstrap.service.http.listener.Connection``) stays in front: address limits,
TLS, and the deadlines of every phase. This protocol tells it when an answer is out
(``answered``), and closes the connection when it says so.

Flow control: one request at a time. While one is answered, later bytes wait in the buffer;
past ``_HOLD_BYTES`` reading pauses (so does it while the client does not read its answers). With
the listener's socket and TLS buffers (``ConnectionLimits.socket_buffer``, ``tls_buffer``), one
read brings at most about that much, so a connection that pipelines without reading its answers
holds a bounded amount (issue 41, findings 4 and 4b).

Bodies: the app reads a review's body before it takes a review slot or the heavy lane (issue 41,
findings 1 and 2), so a body has a deadline of its own (the ``seconds`` the app gives ``read``; a
timer is armed only when the body is not already in the buffer), and the bytes of the bodies the
listener holds, from their first byte until their answer, count against one cap for all its
connections (:class:`BodyBytes`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from email.utils import formatdate
from http import HTTPStatus
from typing import Final

from bootstrap.service.http.framing import FramingError, HeadReader, RequestHead, head_end, skip_blank_lines
from bootstrap.service.http.listener import Connection
from bootstrap.service.webhook.app import Answer, BodyLate, NoRoom, Reviews, problem_answer

log = logging.getLogger("nodegate.admission")

_HOLD_BYTES: Final = 64 * 1024  # buffered beyond the request being read: reading pauses
# A body at most this large is counted in BodyBytes but never refused for its cap.
_SMALL_BODY: Final = 256 * 1024
# The bytes of bodies held by the listener, from their first byte until their answer: reviews
# being read, waiting for a slot (up to 2 s) or judged. Genuine load holds a few MiB (64 slots of
# small reviews, large ones one at a time); 512 connections each holding a 4 MiB review would be
# 2 GiB, over the chart's memory limit (512Mi).
BODY_BYTES: Final = 64 * 1024 * 1024
_CONTINUE: Final = b"HTTP/1.1 100 Continue\r\n\r\n"
_REASONS: Final = {s.value: s.phrase.encode() for s in HTTPStatus}


class Clock:
    """The Date header, formatted once a second."""

    __slots__ = ("_second", "_value")

    def __init__(self) -> None:
        self._second = -1
        self._value = b""

    def date(self) -> bytes:
        second = int(time.time())
        if second != self._second:
            self._second = second
            self._value = formatdate(second, usegmt=True).encode()
        return self._value


def encode_answer(answer: Answer, date: bytes, close: bool, body: bool = True) -> bytes:
    """Status line, fields and body (none for HEAD): one buffer, one write."""
    extra = b""
    if answer.retry_after is not None:
        extra += b"Retry-After: %b\r\n" % answer.retry_after.encode()
    if close:
        extra += b"Connection: close\r\n"
    return b"HTTP/1.1 %d %b\r\nContent-Type: %b\r\nContent-Length: %d\r\nDate: %b\r\n%b\r\n%b" % (
        answer.status,
        _REASONS.get(answer.status, b"Unknown"),
        answer.content_type.encode(),
        len(answer.body),
        date,
        extra,
        answer.body if body else b"",
    )


class BodyBytes:
    """The bytes of request bodies held across a listener's connections, from their first byte
    until their answer (``held``), and their cap. At the cap, a body larger than ``_SMALL_BODY``
    that is not in whole yet is refused (``NoRoom``: 503) when it is asked for or when its next
    bytes come, and its bytes freed: never paused, for bodies that wait for each other's room
    would all wait until their deadlines. Smaller bodies are counted but never refused, so
    ``_SMALL_BODY`` per connection beyond the cap is the most it is overshot by."""

    __slots__ = ("cap", "held")

    def __init__(self, cap: int = BODY_BYTES) -> None:
        self.cap = cap
        self.held = 0

    def refuses(self, size: int) -> bool:
        """A body of ``size`` bytes, not in whole, is refused now."""
        return size > _SMALL_BODY and self.held >= self.cap


class OpenSet:
    """The listener's open connections (``empty`` is set whenever there are none) and the bytes
    of the bodies they hold (``bodies``)."""

    def __init__(self, body_cap: int = BODY_BYTES) -> None:
        self.members: set[ReviewProtocol] = set()
        self.empty = asyncio.Event()
        self.empty.set()
        self.draining = False  # the listener stops: a connection made now closes at once
        self.bodies = BodyBytes(body_cap)

    def add(self, proto: ReviewProtocol) -> None:
        self.members.add(proto)
        self.empty.clear()

    def discard(self, proto: ReviewProtocol) -> None:
        self.members.discard(proto)
        if not self.members:
            self.empty.set()


class ReviewProtocol(asyncio.Protocol):
    def __init__(
        self, app: Reviews, clock: Clock, protocols: OpenSet, heads: HeadReader | None = None
    ) -> None:
        self._app = app
        self._heads = heads or HeadReader()
        self._clock = clock
        self._protocols = protocols
        self._transport: asyncio.Transport | None = None
        self._conn: Connection | None = None
        self._buf = b""
        self._checked = 0  # the buffer's length when its next head was last found incomplete
        self._head: RequestHead | None = None  # the request being answered
        self._need = 0  # its body's length, while not yet taken
        self._taken = True  # its body was read (or it has none)
        self._waiter: asyncio.Future[bytes] | None = None  # a body awaited by the app
        self._parts: list[bytes] = []
        self._have = 0
        self._late: asyncio.TimerHandle | None = None  # the deadline of the body awaited
        self._held = 0  # bytes of the current request's body counted in protocols.bodies
        self._busy = False  # an answer is being computed in a task
        self._closing = False
        self._draining = False  # the listener stops: close after the current answer
        self._read_paused = False
        self._write_paused = False

    def buffered(self) -> int:
        """Bytes read off the connection and not yet handed to the app: the buffer, and the part
        of a body being awaited (the most a connection holds: docs/admission.md, "Connections")."""
        return len(self._buf) + self._have

    @property
    def transport(self) -> asyncio.Transport | None:
        return self._transport

    @property
    def reading(self) -> bool:
        """False while reading is paused (a request is answered, or answers are not read)."""
        return not self._read_paused

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not isinstance(transport, asyncio.Transport):
            raise TypeError("the admission listener serves stream transports only")
        self._transport = transport
        proto = transport.get_protocol()  # the listener's Connection, in front of this protocol
        self._conn = proto if isinstance(proto, Connection) else None
        self._protocols.add(self)
        if self._protocols.draining:  # accepted (or its handshake done) after the stop began
            self.drain()

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        if self._waiter is not None:
            self._parts.append(data)
            self._have += len(data)
            self._held += len(data)
            bodies = self._protocols.bodies
            bodies.held += len(data)
            if self._have >= self._need:
                self._fill()
            elif bodies.refuses(self._need):
                self._end_body(NoRoom(f"no room for a body of {self._need} bytes"))
            return
        self._buf = self._buf + data if self._buf else data
        if self._busy or self._head is not None:
            self._hold()
        else:
            self._next()

    def eof_received(self) -> bool | None:
        return False  # the transport closes; connection_lost follows

    def pause_writing(self) -> None:
        self._write_paused = True
        self._pause_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        if not self._busy and self._head is None and not self._closing:
            self._resume_reading()
            self._next()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._protocols.discard(self)
        self._disarm_body()
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionResetError("the client closed the connection mid-body"))

    # -- requests ---------------------------------------------------------------------------

    def _next(self) -> None:
        """Answer the requests complete in the buffer, one after the other."""
        while not (self._busy or self._closing or self._write_paused):
            buf = self._buf
            try:
                start = skip_blank_lines(buf, 0)
                end = head_end(buf, start, self._checked)
                if end < 0:
                    # Until a head is complete the buffer is only appended to: the next read's
                    # bytes are searched and checked, not all of it again.
                    self._checked = len(buf)
                    break  # empty lines kept: they count towards their limit across reads
                head = self._heads.parse(buf[start : end - 4])
            except FramingError as exc:
                self._write(problem_answer(exc.status, exc.code, exc.detail, close=True), True)
                return
            # The buffer is cut: here, and by _read and _fill while this request is being read.
            self._buf, self._checked = buf[end:], 0
            self._head, self._need, self._taken = head, head.content_length, head.content_length == 0
            self._start(head)
        if not (self._busy or self._closing or self._write_paused) and len(self._buf) <= _HOLD_BYTES:
            self._resume_reading()  # what was held is answered: read on

    def _start(self, head: RequestHead) -> None:
        task = asyncio.get_running_loop().create_task(self._app.answer(head, self._read))
        self._busy = True
        task.add_done_callback(self._done)
        if self._taken:  # no body: the request is in whole
            self._judging()

    def _judging(self) -> None:
        """The request is in whole: the listener no longer counts its connection as waiting on
        the client (``Connection.stalled``)."""
        if self._conn is not None:
            self._conn.judging()

    def _done(self, task: asyncio.Task[Answer]) -> None:
        self._busy = False
        if self._held:  # the body is answered: its bytes are free
            self._protocols.bodies.held -= self._held
            self._held = 0
        if task.cancelled():
            answer = problem_answer(
                503, "unavailable", "the listener is stopping; retry", close=True, retry_after=1
            )
        elif (exc := task.exception()) is not None:
            log.error("admission: the review could not be answered", exc_info=exc)
            answer = problem_answer(500, "internal", "the review could not be answered", close=True)
        else:
            answer = task.result()
        self._finish(answer)
        self._next()

    def _finish(self, answer: Answer) -> None:
        head, self._head = self._head, None
        close = (
            answer.close
            or not self._taken  # its body is still on the wire: the framing cannot go on
            or self._draining
            or (head is not None and not head.keep_alive)
        )
        conn = self._conn
        if not close and conn is not None:
            if not conn.answered():
                close = True  # the connection's last answer (the listener's limits)
            elif self._pending():
                conn.started()  # the next request is already here: the request deadline, not idle
        self._write(answer, close, head is None or head.method != "HEAD")

    def _pending(self) -> bool:
        """Part of a request (not only empty lines) is in the buffer."""
        try:
            return skip_blank_lines(self._buf, 0) < len(self._buf)
        except FramingError:
            return True

    async def _read(self, seconds: float) -> bytes:
        """The current request's body (the app calls this at most once); BodyLate when it is not
        in whole within ``seconds``."""
        need, buf = self._need, self._buf
        self._taken = True
        if self._closing:  # gone before its body was asked for
            raise ConnectionResetError("the client closed the connection before its body was read")
        bodies = self._protocols.bodies
        if len(buf) >= need:
            self._buf = buf[need:]
            self._need = 0
            self._held = need
            bodies.held += need
            if self._buf:
                self._hold()
            self._judging()
            return buf[:need]
        if bodies.refuses(need):
            self._taken = False  # never read: the connection closes after the answer
            raise NoRoom(f"no room for a body of {need} bytes")
        head = self._head
        if head is not None and head.expect_continue:
            self._send(_CONTINUE)  # only now: a request refused before its body never gets it
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bytes] = loop.create_future()
        self._waiter = waiter
        self._late = loop.call_later(seconds, self._body_late, seconds)
        self._parts, self._have, self._buf = [buf], len(buf), b""
        self._held = len(buf)
        bodies.held += len(buf)
        self._resume_reading()
        return await waiter

    def _fill(self) -> None:
        self._disarm_body()
        waiter, self._waiter = self._waiter, None
        data, need = b"".join(self._parts), self._need
        self._parts, self._have, self._need = [], 0, 0
        self._buf = data[need:]
        if self._buf:
            self._held -= len(self._buf)  # the next request's bytes: not this body's
            self._protocols.bodies.held -= len(self._buf)
            self._hold()
        self._judging()
        if waiter is not None and not waiter.done():
            waiter.set_result(data[:need])

    def _body_late(self, seconds: float) -> None:
        """The body's deadline: the app answers 408."""
        self._late = None
        self._end_body(BodyLate(f"the body did not arrive within {seconds:g} s"))

    def _end_body(self, exc: Exception) -> None:
        """The body awaited is refused with ``exc``; the rest of it is never read: the
        connection closes after the answer, and the bytes read so far are freed now."""
        self._disarm_body()
        waiter, self._waiter = self._waiter, None
        self._parts, self._have, self._need = [], 0, 0
        self._taken = False
        held, self._held = self._held, 0
        self._protocols.bodies.held -= held
        self._pause_reading()  # nothing more is read from it
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def _disarm_body(self) -> None:
        if self._late is not None:
            self._late.cancel()
            self._late = None

    def _hold(self) -> None:
        if len(self._buf) > _HOLD_BYTES:
            self._pause_reading()

    # -- writing and closing ------------------------------------------------------------------

    def _write(self, answer: Answer, close: bool, body: bool = True) -> None:
        self._send(encode_answer(answer, self._clock.date(), close, body))
        if close:
            self.close()

    def _send(self, data: bytes) -> None:
        transport = self._transport
        if transport is not None and not self._closing:
            transport.write(data)

    def close(self) -> None:
        """Close after what is written (a clean close: the client reads its last answer)."""
        self._closing = True
        if self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        """Close at once (the stop's time is up)."""
        self._closing = True
        if self._transport is not None:
            self._transport.abort()

    def drain(self) -> None:
        """The listener stops: close now when idle, else after the current answer."""
        self._draining = True
        if self._head is None and not self._busy:
            self.close()

    def _pause_reading(self) -> None:
        if not self._read_paused and self._transport is not None and not self._closing:
            self._read_paused = True
            self._transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._read_paused and self._transport is not None and not self._closing:
            self._read_paused = False
            self._transport.resume_reading()
