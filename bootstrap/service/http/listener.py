"""The listening socket, within limits, so that no client can hold what genuine joins need.

Counted from the TCP accept, before any TLS byte: at most ``per_address`` open connections from
one client address and ``total`` in all; others are closed at once (``nodegate_connections_refused_total``).
Then every phase of a connection has a deadline, so a stalled client holds its connection for a
bounded time and never an in-flight slot (the body is read before a slot is taken: on the join
listener by ``bootstrap.service.http.bodies``, on the admission listener by
``bootstrap.service.webhook.app``, issue 41):

- the TLS handshake: ``handshake_timeout``;
- the headers of a request: ``header_timeout`` from its first byte (a new connection's first
  request is due within the same time). On the admission listener this is the deadline of the
  whole request, from its first byte to its answer (``serve.default_admission_limits``);
- the body: on the join listener, the time ``bodies`` gives it, plus ``body_grace`` as a backstop
  (``reading_body``); on the admission listener, the body's own deadline is armed by its
  connection's protocol (``WebhookLimits.body_seconds``, ``bootstrap.service.webhook.protocol``),
  not here;
- an idle keep-alive connection is closed after ``idle_timeout``;
- a connection lives at most ``max_age`` and serves at most ``max_requests`` requests (then it
  is closed after its current answer, or at once when idle), so no client keeps a slot forever by
  refreshing it now and then;
- at the ``total`` cap a new connection is still admitted when some connection is idle: the one
  idle the longest is closed for it (``nodegate_connections_recycled_total{reason="evicted"}``).
  Holding the cap then takes a busy connection per slot, not one request per idle timeout
  (issue 21, finding 7: 33 addresses x 64 connections refreshed every 40 s kept joins out);
- with ``evict_busy`` (the admission listener), when nothing is idle either, a busy connection of
  the address that holds the most is closed for the newcomer, provided that address holds at
  least two more than the newcomer's (``reason="evicted_busy"``); one that waits on its client
  (its handshake, a request's head or body, or answers it does not read) before one being
  answered. An address then keeps at most a fair share of a full listener, whatever it sends
  (issue 41, finding 3: 512 connections from one address, each with one pipelined byte, kept
  every other client out);
- ``sources`` (the admission listener: the API server's addresses, ``admission.api_server_sources``)
  have no per-address cap, ``reserved`` connections that only they may take, and their newcomers
  close other addresses' connections first; no other newcomer closes theirs.

Memory per connection is bounded too (issue 41, findings 4 and 4b): one read brings at most
``READ_BYTES``; ``socket_buffer`` sets the kernel's send and receive buffers of the accepted sockets
(no autotuning: a client that does not read its answers stops the writes there, and one that
sends without end fills that much), and a TLS connection holds at most ``tls_buffer`` of
ciphertext each way.

TLS is the connection's own (``bootstrap.service.http.tls``: ``ssl.SSLObject`` on memory BIOs),
after the address check, not ``loop.start_tls``, whose buffers made an idle TLS connection cost
about 270 KiB. Once a
connection is admitted, the listener's handler serves it: aiohttp's request handler on the join
listener, whose middleware tells the connection where its request is (``connection_of(request)``:
body, handler, answered); ``bootstrap.service.webhook.protocol.ReviewProtocol`` on the admission
listener, which tells it when an answer is out.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections import Counter
from collections.abc import Callable
from typing import Literal

from bootstrap.service.http.crowding import busy_victim, is_source
from bootstrap.service.http.limits import ConnectionLimits
from bootstrap.service.http.tls import PENDING_BYTES, TlsFailed, TlsSession, TlsTransport
from bootstrap.service.metrics import Metrics

log = logging.getLogger("nodegate.server")

Phase = Literal["accepting", "idle", "headers", "body", "working", "closed"]
READ_BYTES = 64 * 1024  # the most one read off a connection brings
# Phases in which a connection waits on its client (under pressure, closed before those answered).
_STALLED: frozenset[Phase] = frozenset({"accepting", "headers", "body"})


class Connections:
    """The open connections of one listener: admission by address, and their closing."""

    def __init__(
        self,
        limits: ConnectionLimits,
        metrics: Metrics,
        handler_factory: Callable[[], asyncio.Protocol],
        tls: ssl.SSLContext | None,
    ) -> None:
        self.limits = limits
        self.metrics = metrics
        self.tls = tls
        self._handler_factory = handler_factory
        self.read_buffer = memoryview(bytearray(READ_BYTES))  # every connection's reads (Connection)
        self._open: set[Connection] = set()
        self._by_address: Counter[str] = Counter()
        self._others = 0  # open connections not from ``limits.sources``
        # Idle connections, the one idle the longest first (dicts keep insertion order).
        self._idle: dict[Connection, None] = {}

    def protocol(self) -> Connection:
        """The protocol factory for ``loop.create_server``."""
        return Connection(self)

    def new_handler(self) -> asyncio.Protocol:
        return self._handler_factory()

    def admit(self, conn: Connection) -> bool:
        limits = self.limits
        conn.source = is_source(conn.address, limits.sources)
        if not conn.source and self._by_address[conn.address] >= limits.per_address:
            self.metrics.connections_refused.labels("address_limit").inc()
            return False
        # Another address's connection is room only when it is not a source's, if the newcomer is
        # not one either and the connections others may hold (total - reserved) are all taken.
        others_full = not conn.source and self._others >= limits.total - limits.reserved
        if (len(self._open) >= limits.total or others_full) and not self._make_room(conn):
            self.metrics.connections_refused.labels("total_limit").inc()
            return False
        self._open.add(conn)
        self._by_address[conn.address] += 1
        self._others += not conn.source
        self.metrics.connections.inc()
        return True

    def _make_room(self, newcomer: Connection) -> bool:
        """Close a connection for ``newcomer``: the one idle the longest, else (``evict_busy``)
        a busy one (``busy_victim``); False when there is none to close."""
        # Any newcomer closes another address's connection first; only a source's newcomer may
        # close a source's.
        idle = next((c for c in self._idle if not c.source), None)
        if idle is None and newcomer.source:
            idle = next(iter(self._idle), None)
        if idle is not None:
            self._close_for(idle, "evicted")
            return True
        if not self.limits.evict_busy:
            return False
        victim = busy_victim(self._open, self._by_address, newcomer)
        if victim is None:
            return False
        self._close_for(victim, "evicted_busy")
        return True

    def _close_for(self, victim: Connection, reason: str) -> None:
        self.recycled(reason)
        victim.abort()
        self.release(victim)  # now: the new connection takes its place before connection_lost runs

    def idle(self, conn: Connection) -> None:
        self._idle.pop(conn, None)
        self._idle[conn] = None  # to the end: idle the shortest

    def busy(self, conn: Connection) -> None:
        self._idle.pop(conn, None)

    def recycled(self, reason: str) -> None:
        self.metrics.connections_recycled.labels(reason).inc()

    def release(self, conn: Connection) -> None:
        self._idle.pop(conn, None)
        if conn not in self._open:
            return
        self._open.discard(conn)
        self._others -= not conn.source
        self._by_address[conn.address] -= 1
        if self._by_address[conn.address] <= 0:
            del self._by_address[conn.address]
        self.metrics.connections.dec()

    def client_error(self, reason: str, endpoint: str = "connection") -> None:
        self.metrics.client_errors.labels(endpoint, reason).inc()

    def sweep(self, now: float) -> None:
        """Enforce the recorded deadlines (``limits.sweep``)."""
        for conn in [c for c in self._open if c.deadline <= now]:
            conn.expire()

    def members(self) -> frozenset[Connection]:
        return frozenset(self._open)

    def idle_count(self) -> int:
        return len(self._idle)

    def count(self, address: str | None = None) -> int:
        return len(self._open) if address is None else self._by_address.get(address, 0)

    def abort_unserved(self) -> None:
        """At shutdown: connections aiohttp does not know yet (handshakes in flight)."""
        for conn in list(self._open):
            conn.abort_if_unserved()


class Connection(asyncio.BufferedProtocol):
    """One client connection: the raw TCP protocol until TLS is up, then the TLS transport's
    protocol in front of aiohttp's request handler, with the deadline of its current phase.

    Its reads land in the listener's one buffer of ``READ_BYTES`` and are copied out at once (the
    loop runs one read at a time), so one read brings at most that much, whatever the kernel has
    queued or TLS has decrypted (issue 41, finding 4b)."""

    def __init__(self, owner: Connections) -> None:
        self._owner = owner
        self.address = "unknown"
        self.phase: Phase = "accepting"
        self._raw: asyncio.Transport | None = None
        self._transport: asyncio.Transport | None = None
        self._handler: asyncio.Protocol | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.deadline = float("inf")  # with limits.sweep: when the current phase's time is up
        self._timer_reason = ""
        self._tls: TlsSession | None = None  # with a TLS listener: this connection's TLS
        self._tls_reading = True  # the handler takes what TLS decrypts (it has not paused reading)
        self.requests = 0
        self._old = False  # max_age or max_requests reached: closed after the current answer
        self._age_timer: asyncio.TimerHandle | None = None
        self.source = False  # from one of limits.sources
        self.since = time.monotonic()  # when its current phase began (evict_busy: the oldest first)
        self._unread = False  # the client does not read its answers (the transport paused writing)

    def stalled(self) -> bool:
        """It waits on its client: its handshake, a request's head or body, or answers unread."""
        return self._unread or self.phase in _STALLED

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """The TCP accept."""
        raw = transport if isinstance(transport, asyncio.Transport) else None
        peer = transport.get_extra_info("peername")
        self.address = str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"
        if raw is None or not self._owner.admit(self):
            self.phase = "closed"
            transport.abort()  # type: ignore[attr-defined]
            return
        self._raw = raw
        if self._owner.tls is None:
            self._serve(raw)
            return
        self._tls = TlsSession(self._owner.tls)
        size = self._owner.limits.tls_buffer
        if size is not None:  # ciphertext the kernel has not taken: the handler sees this limit
            raw.set_write_buffer_limits(high=size)
        # A handshake that fails or takes too long counts as failed (docs/troubleshooting.md).
        self._arm(self._owner.limits.handshake_timeout, "handshake_failed")

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._owner.read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(bytes(self._owner.read_buffer[:nbytes]))

    def data_received(self, data: bytes) -> None:
        tls = self._tls
        if tls is not None:
            tls.feed(data)
            if tls.handshaken or self._handshake(tls):
                self._decrypt(tls)
            return
        if self._handler is not None:
            self.started()
            self._handler.data_received(data)

    def eof_received(self) -> bool | None:
        if self._handler is None or (self._tls is not None and self._tls.peer_closed):
            return None  # before the handshake's end, or after close_notify: nothing to finish
        return self._handler.eof_received()

    def pause_writing(self) -> None:
        if not self._unread:
            self._unread, self.since = True, time.monotonic()
        if self._handler is not None:
            self._handler.pause_writing()

    def resume_writing(self) -> None:
        self._unread = False
        if self._handler is not None:
            self._handler.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.phase = "closed"
        self._disarm()
        if self._age_timer is not None:
            self._age_timer.cancel()
        self._owner.release(self)
        if self._handler is not None:
            self._handler.connection_lost(exc)

    # -- phases (the middleware moves a request along) ----------------------------------------

    def started(self) -> None:
        """A request began: its first byte came, or it was already read, behind the last answer
        (pipelined). Either way it is under the request deadline, and the connection is busy."""
        if self.phase == "idle":
            self.phase = "headers"
            self.since = time.monotonic()
            self._owner.busy(self)
            if self._timer_reason != "header_timeout":  # a fresh connection's clock keeps running
                self._arm(self._owner.limits.header_timeout, "header_timeout")

    def reading_body(self, seconds: float) -> None:
        self.phase = "body"
        self._arm(seconds + self._owner.limits.body_grace, "body_timeout")

    def judging(self) -> None:
        """The request is in whole and being answered (the admission listener): not stalled, and
        its deadline, which covers the answer too, keeps running."""
        if self.phase != "closed":
            self.phase, self.since = "working", time.monotonic()

    def working(self) -> None:
        self.phase = "working"
        self._disarm()

    def answered(self) -> bool:
        """The answer is on its way; False when it is the connection's last (max_age or
        max_requests reached): the caller closes the connection after it (``force_close``)."""
        if self.phase == "closed":
            return False
        self.requests += 1  # counted per answer: pipelined requests arrive in one read
        limit = self._owner.limits.max_requests
        if limit is not None and self.requests >= limit and not self._old:
            self._old = True
            self._owner.recycled("max_requests")
        if self._old:  # aiohttp closes it once the answer is written; the timer is a backstop
            self._arm(self._owner.limits.idle_timeout, "idle_timeout")
            return False
        self.phase = "idle"
        self._owner.idle(self)
        self._arm(self._owner.limits.idle_timeout, "idle_timeout")
        return True

    def abort(self) -> None:
        """Closed by the listener (evicted): no further byte is read or written."""
        self.phase = "closed"
        self._disarm()
        transport = self._transport or self._raw
        if transport is not None:
            transport.abort()

    def abort_if_unserved(self) -> None:
        if self._handler is None and self._raw is not None:
            self._raw.abort()  # a TLS handshake in flight

    # -- TLS (bootstrap.service.http.tls) ---------------------------------------------------------

    def _handshake(self, tls: TlsSession) -> bool:
        """Advance the handshake; True once it is done and the handler serves the connection."""
        try:
            done = tls.handshake()
        except TlsFailed:
            self._owner.client_error("handshake_failed")
            self.tls_send()  # the alert, when OpenSSL wrote one
            self.abort()
            return False
        self.tls_send()
        if done and self._raw is not None and self.phase != "closed":
            self._serve(TlsTransport(self, tls, self._raw, self))
            return True
        return False

    def _decrypt(self, tls: TlsSession) -> None:
        """Hand the handler what is decrypted while it reads; read the socket only while it does
        and little ciphertext waits."""
        while self._tls_reading and self._handler is not None and self.phase != "closed":
            try:
                data = tls.read()
            except TlsFailed:
                self.abort()
                return
            if data is None:  # the client's close_notify: its end of the stream, and ours
                self._handler.eof_received()
                if self._transport is not None:
                    self._transport.close()
                break
            if not data:
                break
            self.started()
            self._handler.data_received(data)
        self.tls_send()  # what reading made OpenSSL answer (a key update, an alert)
        raw = self._raw
        if raw is not None and not raw.is_closing():
            limit = self._owner.limits.tls_buffer or PENDING_BYTES
            if self._tls_reading and tls.pending() < limit:
                raw.resume_reading()
            else:
                raw.pause_reading()

    def tls_pause_reading(self) -> None:
        self._tls_reading = False
        if self._raw is not None and not self._raw.is_closing():
            self._raw.pause_reading()

    def tls_resume_reading(self) -> None:
        self._tls_reading = True
        tls = self._tls
        if tls is not None:  # what waits decrypted first, on the loop's next turn
            asyncio.get_running_loop().call_soon(self._decrypt, tls)

    def tls_send(self) -> None:
        tls, raw = self._tls, self._raw
        if tls is not None and raw is not None and not raw.is_closing():
            data = tls.take()
            if data:
                raw.write(data)

    def tls_close(self) -> None:
        if self._raw is not None:
            self._raw.close()  # once what was written is sent

    # -- internals ----------------------------------------------------------------------------

    def _serve(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        handler = self._owner.new_handler()
        handler.connection_made(transport)
        self._handler = handler
        self.phase = "idle"
        self._owner.idle(self)
        if self._owner.limits.max_age is not None:
            self._age_timer = asyncio.get_running_loop().call_later(self._owner.limits.max_age, self._aged)
        self._arm(self._owner.limits.header_timeout, "header_timeout")

    def _aged(self) -> None:
        self._age_timer = None
        if self.phase == "closed" or self._old:
            return
        self._old = True
        self._owner.recycled("max_age")
        if self.phase == "idle" and self._transport is not None:
            self._disarm()
            self.phase = "closed"
            self._transport.close()  # idle: nothing in flight, a clean close
        # busy: closed after its current answer (answered() says so)

    def _arm(self, seconds: float, reason: str) -> None:
        if self._owner.limits.sweep is not None:  # recorded only: the sweep enforces it
            self._timer_reason = reason
            self.deadline = time.monotonic() + seconds
            return
        self._disarm()
        self._timer_reason = reason
        self._timer = asyncio.get_running_loop().call_later(seconds, self._expired, reason)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_reason = ""
        self.deadline = float("inf")

    def expire(self) -> None:
        """The sweep found the current phase's deadline passed."""
        reason, self.deadline = self._timer_reason, float("inf")
        if reason:
            self._expired(reason)

    def _expired(self, reason: str) -> None:
        self._timer = None
        if self.phase == "closed":
            return
        if reason != "idle_timeout":  # an idle keep-alive connection ending is normal
            self._owner.client_error(reason)
        transport = self._transport or self._raw
        if transport is not None:
            transport.abort()  # not close(): a client that stopped reading never drains it
