"""Crowding the admission listener (issue 41, findings 3, 4 and 4b): many connections, from one
address or several, that hold what they are given (a pipelined byte, a bare TCP connect before
TLS, requests answered as fast as the server can) or pipeline without reading their answers. Each
test shows the listener's answer: an address holds at most its share, a newcomer from an address
with fewer connections gets in by closing a busy connection of the address with the most, the
API server's sources keep their room, and what a connection holds stays bounded."""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from ipaddress import ip_network
from pathlib import Path

import pytest

from bootstrap.service.http.framing import RequestHead
from bootstrap.service.http.limits import ConnectionLimits
from bootstrap.service.metrics import Metrics
from bootstrap.service.serve import (
    ADMISSION_CONNECTIONS,
    ADMISSION_PER_ADDRESS,
    ADMISSION_SOCKET_BUFFER,
    ADMISSION_TLS_BUFFER,
    default_admission_limits,
)
from bootstrap.service.webhook.app import Answer, ReadBody
from bootstrap.service.webhook.protocol import _HOLD_BYTES
from bootstrap.service.webhook.site import ReviewSite
from tests.service.test_admission_listener import review
from tests.service.test_review_protocol import request
from tests.support import certs

WAIT = 30.0
GENUINE = "127.0.0.1"  # the API server's address in these tests
PIPELINED_BYTE = b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\nG"  # one request answered, one begun


class Verdicts:
    """Answers a review with its uid (allowed); ``hold`` makes /readyz wait (requests that are
    being answered: a connection that is busy, not stalled)."""

    def __init__(self) -> None:
        self.hold: asyncio.Event | None = None

    async def answer(self, head: RequestHead, read: ReadBody) -> Answer:
        if head.path == "/readyz":
            if self.hold is not None:
                await self.hold.wait()
            return Answer(200, b"{}")
        body = json.loads(await read(5.0))
        uid = body["request"]["uid"]
        out = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}
        out["response"] = {"uid": uid, "allowed": True}
        return Answer(200, json.dumps(out).encode())


@pytest.fixture(autouse=True)
def _descriptors() -> None:
    """Client and server sides of 512 connections in one process (as ``serve`` raises it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


@contextlib.asynccontextmanager
async def site_with(
    limits: ConnectionLimits, tls: ssl.SSLContext | None = None, app: Verdicts | None = None
) -> AsyncIterator[tuple[ReviewSite, Metrics]]:
    metrics = Metrics()
    site = ReviewSite(app or Verdicts(), "127.0.0.1", 0, tls=tls, limits=limits, metrics=metrics)
    await site.start()
    try:
        yield site, metrics
    finally:
        await site.stop()


def tls_pair(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    cert, key, _ = certs.loopback_tls(tmp_path, "nodegate.nodegate.svc")
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    client = ssl.create_default_context(cafile=str(cert))
    return server, client


async def raw_connect(port: int, source: str) -> socket.socket:
    sock = socket.socket()
    sock.setblocking(False)
    sock.bind((source, 0))
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return sock


async def crowd(port: int, sources: list[str], each: int, tls: ssl.SSLContext | None = None) -> list[object]:
    """``each`` connections from every address: with ``tls``, bare TCP connects that never start
    the handshake; without, one request answered and the first byte of the next."""
    held: list[object] = []
    for source in sources:
        for _ in range(each):
            sock = await raw_connect(port, source)
            if tls is None:
                _, writer = await asyncio.open_connection(sock=sock)
                writer.write(PIPELINED_BYTE)
                await writer.drain()
                held.append(writer)
            else:
                held.append(sock)
    return held


async def crowd_busy(port: int, source: str, each: int) -> list[object]:
    """``each`` connections from ``source``, each with a request in whole (being answered)."""
    held: list[object] = []
    for _ in range(each):
        _, writer = await asyncio.open_connection(sock=await raw_connect(port, source))
        writer.write(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        held.append(writer)
    return held


def let_go(held: list[object]) -> None:
    for item in held:
        if isinstance(item, asyncio.StreamWriter):
            item.transport.abort()
        elif isinstance(item, socket.socket):
            item.close()


async def genuine(port: int, source: str = GENUINE, tls: ssl.SSLContext | None = None) -> dict[str, object]:
    """A review from ``source``, and its verdict."""
    sock = await raw_connect(port, source)
    reader, writer = await asyncio.open_connection(
        sock=sock, ssl=tls, server_hostname="127.0.0.1" if tls is not None else None
    )
    try:
        writer.write(request(body=review("genuine")))
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), WAIT)
        assert status.startswith(b"HTTP/1.1 200 "), status
        length = 0
        while (line := await reader.readline()) != b"\r\n":
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        answer: dict[str, object] = json.loads(await reader.readexactly(length))
        return answer
    finally:
        writer.transport.abort()


async def until(check: Callable[[], bool], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT
    while not check():
        assert asyncio.get_running_loop().time() < deadline, f"not within {WAIT:g} s: {what}"
        await asyncio.sleep(0.01)


def counter(metrics: Metrics, name: str, reason: str) -> float:
    return metrics.registry.get_sample_value(name, {"reason": reason}) or 0.0


def allowed(answer: dict[str, object]) -> bool:
    response = answer["response"]
    return isinstance(response, dict) and response["uid"] == "genuine" and response["allowed"] is True


def attackers(n: int) -> list[str]:
    return [f"127.0.0.{2 + i}" for i in range(n)]


async def test_one_address_holds_at_most_its_share_of_the_listener() -> None:
    """Finding 3, one address: 512 connections each with a pipelined byte took every connection
    the listener had (the per-address cap was the total). Now that address holds 64 of 512, the
    rest are refused at accept, and a review from another address is answered."""
    async with site_with(default_admission_limits()) as (site, metrics):
        assert site.connections is not None
        held = await crowd(site.port, attackers(1), ADMISSION_CONNECTIONS)
        try:
            await until(
                lambda: (
                    counter(metrics, "nodegate_connections_refused_total", "address_limit")
                    == ADMISSION_CONNECTIONS - ADMISSION_PER_ADDRESS
                ),
                "the connections past the address's cap refused",
            )
            assert site.connections.count(attackers(1)[0]) == ADMISSION_PER_ADDRESS
            assert allowed(await genuine(site.port))
        finally:
            let_go(held)


async def test_many_addresses_filling_the_listener_cannot_keep_a_newcomer_out() -> None:
    """Finding 3, several addresses: 8 addresses x 64 connections with a pipelined byte fill all
    512. The API server's next connection closes a stalled one of an address with the most and
    gets its verdict; the attackers' own newcomers close nothing (no address has more than
    theirs), so they cannot push it out again."""
    async with site_with(default_admission_limits()) as (site, metrics):
        assert site.connections is not None
        held = await crowd(site.port, attackers(8), ADMISSION_PER_ADDRESS)
        try:
            await until(
                lambda: site.connections is not None and site.connections.count() == 512, "the listener full"
            )
            assert allowed(await genuine(site.port))
            assert counter(metrics, "nodegate_connections_recycled_total", "evicted_busy") == 1
            connections = site.connections
            await until(lambda: connections.count() == 511, "the review's connection closed")
            (short,) = [a for a in attackers(8) if connections.count(a) == ADMISSION_PER_ADDRESS - 1]
            held += await crowd(site.port, [short], 1)  # room: admitted, nothing closed
            await until(lambda: connections.count() == 512, "the listener full again")
            held += await crowd(site.port, attackers(1), 1)  # at its cap: refused, nothing closed
            await until(
                lambda: counter(metrics, "nodegate_connections_refused_total", "address_limit") == 1,
                "an attacker's newcomer refused",
            )
            assert counter(metrics, "nodegate_connections_recycled_total", "evicted_busy") == 1
        finally:
            let_go(held)


async def test_bare_tls_connects_cannot_keep_a_newcomer_out(tmp_path: Path) -> None:
    """Finding 3 with TLS: 512 bare TCP connects (no handshake byte) from 8 addresses held the
    listener for the handshake timeout at a time. A connection still in its handshake waits on
    its client: the API server's newcomer closes one and its review is answered."""
    server, client = tls_pair(tmp_path)
    async with site_with(default_admission_limits(), tls=server) as (site, metrics):
        held = await crowd(site.port, attackers(8), ADMISSION_PER_ADDRESS, tls=client)
        try:
            await until(
                lambda: site.connections is not None and site.connections.count() == 512, "the listener full"
            )
            assert allowed(await genuine(site.port, tls=client))
            assert counter(metrics, "nodegate_connections_recycled_total", "evicted_busy") == 1
        finally:
            let_go(held)


async def test_connections_being_answered_still_yield_to_a_newcomer_with_fewer() -> None:
    """A flood of requests the server is answering (none stalled) is busy too: at the cap, the
    newcomer from an address with fewer connections closes one of the address with the most.
    A newcomer from the address with the most is refused instead."""
    app = Verdicts()
    app.hold = asyncio.Event()  # every /readyz is being answered, none finished
    limits = ConnectionLimits(per_address=8, total=8, max_age=None, max_requests=None, evict_busy=True)
    async with site_with(limits, app=app) as (site, metrics):
        held: list[object] = []
        for source in attackers(2):
            held += await crowd_busy(site.port, source, 4)
        try:
            await until(
                lambda: (
                    sum(not p.reading or p.buffered() == 0 for p in site.protocols) == 8
                    and site.connections is not None
                    and site.connections.count() == 8
                ),
                "eight requests being answered",
            )
            assert allowed(await genuine(site.port))
            assert counter(metrics, "nodegate_connections_recycled_total", "evicted_busy") == 1
            connections = site.connections
            await until(lambda: connections.count() == 7, "the review's connection closed")
            fat, short = sorted(attackers(2), key=connections.count, reverse=True)
            held += await crowd_busy(site.port, fat, 1)  # room: 5 and 3
            await until(lambda: connections.count() == 8, "full again")
            held += await crowd_busy(site.port, fat, 1)  # the most already: nothing to take
            await until(
                lambda: counter(metrics, "nodegate_connections_refused_total", "total_limit") == 1,
                "the newcomer of the address with the most refused",
            )
            held += await crowd_busy(site.port, short, 1)  # fewer: takes one of the most's
            await until(
                lambda: counter(metrics, "nodegate_connections_recycled_total", "evicted_busy") == 2,
                "the newcomer of the address with fewer admitted",
            )
            assert (connections.count(fat), connections.count(short)) == (4, 4)
        finally:
            app.hold.set()
            let_go(held)


async def test_the_api_servers_sources_keep_their_room() -> None:
    """With ``admission.api_server_sources``, other addresses together hold at most total -
    reserved; the sources' connections take the reserved room without closing anything, then close
    others' connections (never the reverse), and have no per-address cap."""
    limits = ConnectionLimits(
        per_address=4,
        total=16,
        max_age=None,
        max_requests=None,
        evict_busy=True,
        sources=(ip_network("127.0.0.1/32"),),
        reserved=4,
    )
    async with site_with(limits) as (site, metrics):
        assert site.connections is not None
        held = await crowd(site.port, attackers(3), 4)  # 12 = total - reserved
        try:
            await until(lambda: site.connections is not None and site.connections.count() == 12, "12 held")
            held += await crowd(site.port, [GENUINE], 4)  # the reserved room: nothing closed
            await until(lambda: site.connections is not None and site.connections.count() == 16, "16 held")
            assert counter(metrics, "nodegate_connections_recycled_total", "evicted_busy") == 0
            held += await crowd(site.port, [GENUINE], 2)  # past per_address: others' give way
            await until(
                lambda: counter(metrics, "nodegate_connections_recycled_total", "evicted_busy") == 2,
                "two of the other addresses' connections closed",
            )
            assert site.connections.count(GENUINE) == 6
            held += await crowd(site.port, attackers(4)[3:], 1)  # a new address: takes from others only
            await until(
                lambda: counter(metrics, "nodegate_connections_recycled_total", "evicted_busy") == 3,
                "the new address's connection admitted for another address's",
            )
            assert site.connections.count(GENUINE) == 6
            assert allowed(await genuine(site.port))
        finally:
            let_go(held)


async def _pipeline_without_reading(port: int, tls: ssl.SSLContext | None) -> asyncio.StreamWriter:
    _, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=tls, server_hostname="127.0.0.1" if tls is not None else None
    )
    writer.write(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n" * 20_000)  # 700 KB of requests
    return writer


@pytest.mark.parametrize("use_tls", [False, True], ids=["tcp", "tls"])
async def test_a_client_that_does_not_read_its_answers_holds_a_bounded_amount(
    tmp_path: Path, use_tls: bool
) -> None:
    """Findings 4 and 4b: a connection that pipelines requests and never reads the answers held
    466 KiB (TCP) or about 1.1 MiB (TLS) in the process: 512 of them went over the chart's memory
    limit. Now the server stops reading it once its answers back up, its kernel buffers are
    fixed at ADMISSION_SOCKET_BUFFER (no autotuning), TLS buffers at ADMISSION_TLS_BUFFER each way,
    and what the protocol holds is at most its hold threshold plus one read."""
    server, client = tls_pair(tmp_path) if use_tls else (None, None)
    async with site_with(default_admission_limits(), tls=server) as (site, _):
        writer = await _pipeline_without_reading(site.port, client)
        try:
            await until(lambda: any(not p.reading for p in site.protocols), "reading paused")
            (proto,) = site.protocols
            # one read is at most the socket's receive buffer (the kernel doubles what is set)
            assert proto.buffered() <= _HOLD_BYTES + 2 * ADMISSION_SOCKET_BUFFER
            transport = proto.transport
            assert transport is not None
            assert transport.get_write_buffer_size() <= 2 * ADMISSION_TLS_BUFFER
            sock = transport.get_extra_info("socket")
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) <= 2 * ADMISSION_SOCKET_BUFFER
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) <= 2 * ADMISSION_SOCKET_BUFFER
            if use_tls:
                assert transport.get_write_buffer_limits()[1] == ADMISSION_TLS_BUFFER
            # the stalled connection yields when the listener is full: it waits on its client
            assert site.connections is not None
            (conn,) = site.connections.members()
            await until(conn.stalled, "the connection counted as waiting on its client")
        finally:
            writer.transport.abort()
