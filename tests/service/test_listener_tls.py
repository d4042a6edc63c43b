"""The listeners' own TLS (``bootstrap.service.http.tls``, issue 41 finding 4): what a connection
holds, the handshake's failures and deadline, close_notify, and backpressure, on real sockets
with Python's TLS client and ``openssl``-free raw bytes."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bootstrap.service.http.limits import ConnectionLimits
from bootstrap.service.http.tls import READ_BYTES, TlsFailed, TlsSession, TlsTransport
from bootstrap.service.serve import default_admission_limits
from tests.service.test_review_crowding import (
    Verdicts,
    attackers,
    crowd,
    genuine,
    let_go,
    site_with,
    tls_pair,
    until,
)

READYZ = b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n"


async def test_a_connection_is_served_through_the_listeners_own_tls(tmp_path: Path) -> None:
    """Not asyncio's TLS transport (its 256 KiB read buffer per connection): the handler's
    transport is a TlsTransport that tells what a TLS transport tells."""
    server, client = tls_pair(tmp_path)
    async with site_with(default_admission_limits(), tls=server) as (site, _):
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", site.port, ssl=client, server_hostname="127.0.0.1"
        )
        writer.write(READYZ)
        assert (await reader.readline()).startswith(b"HTTP/1.1 200 ")
        (proto,) = site.protocols
        transport = proto.transport
        assert isinstance(transport, TlsTransport)
        assert isinstance(transport.get_extra_info("ssl_object"), ssl.SSLObject)
        assert transport.get_extra_info("sslcontext") is server
        assert transport.get_extra_info("cipher") is not None
        assert transport.get_extra_info("peername")[0] == "127.0.0.1"
        assert not transport.can_write_eof()
        writer.close()


async def test_close_notify_ends_the_connection(tmp_path: Path) -> None:
    """The client's close_notify is its end of stream: the listener answers with its own and
    closes (Python reads close_notify as b"", asyncio's TLS does the same)."""
    server, client = tls_pair(tmp_path)
    async with site_with(default_admission_limits(), tls=server) as (site, _):
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", site.port, ssl=client, server_hostname="127.0.0.1"
        )
        writer.write(READYZ)
        await reader.readline()
        assert site.connections is not None
        writer.close()
        await writer.wait_closed()  # raises if the server's answer to close_notify was not TLS
        await until(lambda: site.connections is not None and site.connections.count() == 0, "closed")


async def test_a_handshake_that_fails_is_counted_and_closed(tmp_path: Path) -> None:
    server, _ = tls_pair(tmp_path)
    async with site_with(default_admission_limits(), tls=server) as (site, metrics):
        reader, writer = await asyncio.open_connection("127.0.0.1", site.port)
        writer.write(b"\x16\x03\x01\x00\x05hello")  # a handshake record with junk in it
        await asyncio.wait_for(reader.read(), 10)  # an alert, or nothing; then the close
        await until(
            lambda: (
                (
                    metrics.registry.get_sample_value(
                        "nodegate_client_errors_total",
                        {"endpoint": "connection", "reason": "handshake_failed"},
                    )
                    or 0
                )
                == 1
            ),
            "the failed handshake counted",
        )
        writer.close()


async def test_a_handshake_that_never_ends_is_cut_at_its_deadline(tmp_path: Path) -> None:
    server, _ = tls_pair(tmp_path)
    limits = ConnectionLimits(handshake_timeout=0.3, max_age=None, max_requests=None)
    async with site_with(limits, tls=server) as (site, metrics):
        reader, writer = await asyncio.open_connection("127.0.0.1", site.port)  # no ClientHello
        assert await asyncio.wait_for(reader.read(), 10) == b""
        assert (
            metrics.registry.get_sample_value(
                "nodegate_client_errors_total", {"endpoint": "connection", "reason": "handshake_failed"}
            )
            == 1
        )
        writer.close()


async def test_ciphertext_waiting_for_a_paused_handler_is_bounded(tmp_path: Path) -> None:
    """While the handler does not read (a request being answered, answers not read), the socket
    is not read either once a read's worth waits: what a client sends without end stays in the
    kernel's buffers, bounded by the listener's, not in the process."""
    server, client = tls_pair(tmp_path)
    app = Verdicts()
    app.hold = asyncio.Event()  # the first /readyz is answered only when the test says
    async with site_with(default_admission_limits(), tls=server, app=app) as (site, _):
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", site.port, ssl=client, server_hostname="127.0.0.1"
        )
        writer.write(READYZ * 30_000)  # 1 MB of requests behind one being answered
        try:
            await until(lambda: any(not p.reading for p in site.protocols), "the handler paused")
            (proto,) = site.protocols
            transport = proto.transport
            assert isinstance(transport, TlsTransport)
            await until(lambda: not transport.socket_reading(), "the socket no longer read")
            assert transport.ciphertext_pending() <= 16 * 1024 + READ_BYTES + 16 * 1024
            assert proto.buffered() <= 2 * 64 * 1024
            app.hold.set()
            assert allowed_readyz(await reader.readline())
        finally:
            app.hold.set()
            writer.transport.abort()


def allowed_readyz(line: bytes) -> bool:
    return line.startswith(b"HTTP/1.1 200 ")


async def test_a_review_over_the_listeners_tls_is_answered_while_others_hold_handshakes(
    tmp_path: Path,
) -> None:
    """A genuine review on a new connection gets its verdict next to 64 handshakes left open."""
    server, client = tls_pair(tmp_path)
    async with site_with(default_admission_limits(), tls=server) as (site, _):
        held = await crowd(site.port, attackers(1), 64, tls=client)  # bare connects, no ClientHello
        try:
            answer = await genuine(site.port, tls=client)
            assert answer["response"]["allowed"] is True  # type: ignore[index]
        finally:
            let_go(held)


def _session_pair(tmp_path: Path) -> tuple[TlsSession, ssl.SSLObject, ssl.MemoryBIO, ssl.MemoryBIO]:
    server, client = tls_pair(tmp_path)
    session = TlsSession(server)
    c_in, c_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    peer = client.wrap_bio(c_in, c_out, server_hostname="127.0.0.1")
    for _ in range(10):  # the handshake, bytes passed by hand
        with contextlib.suppress(ssl.SSLWantReadError):
            peer.do_handshake()
        session.feed(c_out.read())
        session.handshake()
        c_in.write(session.take())
        if session.handshaken:
            break
    peer.do_handshake()
    return session, peer, c_in, c_out


@pytest.fixture(scope="module")
def tls_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tls")


@settings(max_examples=60, deadline=None)
@given(data=st.binary(min_size=1, max_size=200_000), cuts=st.lists(st.integers(1, 70_000), max_size=8))
def test_what_is_sent_is_read_whole_in_order_in_pieces_of_at_most_a_read(
    tls_dir: Path, data: bytes, cuts: list[int]
) -> None:
    """Any plaintext, cut into any records, fed in any pieces: the session hands back exactly it,
    never more than READ_BYTES at once."""
    session, peer, _, c_out = _session_pair(tls_dir)
    pos = 0
    for cut in [*cuts, len(data)]:
        peer.write(data[pos : pos + cut])
        pos += cut
        if pos >= len(data):
            break
    wire = c_out.read()
    got = []
    step = max(1, len(wire) // 7)
    for i in range(0, len(wire), step):
        session.feed(wire[i : i + step])
        while chunk := session.read():
            assert len(chunk) <= READ_BYTES
            got.append(chunk)
    assert b"".join(got) == data


def test_a_broken_record_is_a_tls_failure(tls_dir: Path) -> None:
    session, peer, _, c_out = _session_pair(tls_dir)
    peer.write(b"x" * 100)
    wire = bytearray(c_out.read())
    wire[-1] ^= 0xFF  # the record's tag no longer matches
    session.feed(bytes(wire))
    with pytest.raises(TlsFailed):
        session.read()
