"""Serving under abuse (issue 16): slow and stalled clients, connection floods, aborted bodies and
bad encodings, against the real listener (``bootstrap.service.serve.start``: connection limits,
deadlines, TLS) on loopback. Genuine clients come from 127.0.0.2, abusers from 127.0.0.1.

No test sleeps for timing: each waits for an event (a closed connection, an answer) with a
generous bound, and the deadlines under test are made short through ``ConnectionLimits``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import logging
import sqlite3
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import given, settings
from hypothesis import strategies as st

from attest import svid
from bootstrap.config import Settings
from bootstrap.service.http import bodies
from bootstrap.service.http.limits import ConnectionLimits
from bootstrap.service.http.listener import Connections
from bootstrap.service.metrics import Metrics
from bootstrap.service.serve import Serving, start
from tests.support.service import EkCa, settings_for
from tests.support.softnode import SoftNode, join, post

GENUINE = "127.0.0.2"
ABUSER = "127.0.0.1"
WAIT = 30.0  # bound for events that take well under a second; only a failing test waits this long


@pytest.fixture(scope="module")
def ek_ca() -> EkCa:
    return EkCa.create()


@contextlib.asynccontextmanager
async def serving(settings: Settings, limits: ConnectionLimits | None = None) -> AsyncIterator[Serving]:
    running = await start(settings, kube=False, limits=limits or ConnectionLimits())
    try:
        yield running
    finally:
        await running.close()


def client_tls(s: Serving, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    roots = svid.bundle_pem(s.service.cas.roots(dt.datetime.now(dt.UTC))).decode()
    ctx = ssl.create_default_context(cadata=roots)
    if cert is not None:
        ctx.load_cert_chain(*cert)
    return ctx


def http(s: Serving, cert: tuple[Path, Path] | None = None, source: str = GENUINE) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(ssl=client_tls(s, cert), local_addr=(source, 0))
    return aiohttp.ClientSession(connector=connector)


def base(s: Serving) -> str:
    return f"https://127.0.0.1:{s.port}"


def write_creds(tmp: Path, name: str, key: ec.EllipticCurvePrivateKey, pem: bytes) -> tuple[Path, Path]:
    key_file, cert_file = tmp / f"{name}.key", tmp / f"{name}.pem"
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    cert_file.write_bytes(pem)
    return cert_file, key_file


async def joined(s: Serving, tmp: Path, ca: EkCa, name: str) -> tuple[SoftNode, tuple[Path, Path]]:
    node = ca.node(name)
    async with http(s) as h:
        status, out = await join(h, base(s), node)
    assert status == 200, out
    return node, write_creds(tmp, name, node.key, out["svid"].encode())


async def renew(
    s: Serving, tmp: Path, node: SoftNode, creds: tuple[Path, Path]
) -> tuple[int, dict[str, Any], tuple[Path, Path] | None]:
    """Both renewal steps; the new credentials on success."""
    fresh = SoftNode(node.tpm, node.name, node.ek_certificate)
    url = f"{base(s)}/v1/nodes/self/renew"
    async with http(s, creds) as h:
        status, out = await post(h, url, {"csr": fresh.csr_pem.decode()})
        if status != 200:
            return status, out, None
        body = fresh.evidence(out["session"], base64.b64decode(out["nonce"]), out["pcr_selection"])
        status, out = await post(h, url, body)
    if status != 200:
        return status, out, None
    serial = x509.load_pem_x509_certificate(out["svid"].encode()).serial_number
    return status, out, write_creds(tmp, f"{node.name}-{serial:x}", fresh.key, out["svid"].encode())


async def open_tls(
    s: Serving, source: str = ABUSER, port: int | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(
        "127.0.0.1", port or s.port, ssl=client_tls(s), server_hostname="127.0.0.1", local_addr=(source, 0)
    )


async def closed_by_server(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection."""
    out = b""
    with contextlib.suppress(ConnectionError, ssl.SSLError):
        while chunk := await asyncio.wait_for(reader.read(65536), WAIT):
            out += chunk
    return out


def counter(s: Serving, name: str, **labels: str) -> float:
    value = s.service.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


# -- item 1: stalled bodies must not starve joins and renewals ----------------------------------


async def test_stalled_bodies_do_not_starve_joins_or_renewals(
    tmp_path: Path, ek_ca: EkCa, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The adversarial run: one address opens 200 TLS connections, sends ``POST /v1/join/start``
    headers with ``Content-Length: 1000``, 10 bytes, and stalls. Before: each held an in-flight
    slot with no deadline, so genuine starts and renewals got 503 ``unavailable`` while they
    stayed. Now slots are taken after the body, the address gets at most ``per_address``
    connections, and stalled bodies are cut after their deadline; genuine clients are served
    throughout (here with only 16 slots, fewer than the stalled connections admitted)."""
    monkeypatch.setattr(bodies, "BASE_SECONDS", 8.0)  # long enough to outlast the genuine work
    settings = settings_for(tmp_path, ek_ca, limits={"max_inflight": 16})
    limits = ConnectionLimits(per_address=64, header_timeout=5.0)
    async with serving(settings, limits) as s:
        node, creds = await joined(s, tmp_path, ek_ca, "steady-0")
        stalled: list[asyncio.StreamWriter] = []
        head = (
            b"POST /v1/join/start HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n" + b'{"node_nam'
        )

        async def stall() -> None:
            try:
                reader, writer = await open_tls(s)
            except (ConnectionError, ssl.SSLError, OSError):
                return  # refused at accept: beyond the per-address cap
            writer.write(head)
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            stalled.append(writer)
            await closed_by_server(reader)

        attack = [asyncio.create_task(stall()) for _ in range(200)]
        while (
            len(stalled) + int(counter(s, "nodegate_connections_refused_total", reason="address_limit")) < 200
        ):
            await asyncio.sleep(0.01)  # the attack is in place (an event, polled)
        assert s.site.connections is not None
        assert s.site.connections.count(ABUSER) <= 64
        # Genuine work while the stalled connections are open: joins and renewals all succeed.
        outcomes = []
        for i in range(6):
            async with http(s) as h:
                outcomes.append((await join(h, base(s), ek_ca.node(f"steady-{i + 1}")))[0])
            status, out, fresh = await renew(s, tmp_path, node, creds)
            outcomes.append(status)
            assert fresh is not None, out
            creds = fresh
        assert outcomes == [200] * 12
        # ... all of it while every admitted stalled connection was still held open
        assert counter(s, "nodegate_client_errors_total", endpoint="join_start", reason="body_timeout") == 0
        assert s.site.connections.count(ABUSER) == len(stalled)
        assert counter(s, "nodegate_requests_total", endpoint="join_start", code="unavailable") == 0
        await asyncio.wait_for(asyncio.gather(*attack), WAIT)  # every stalled body was cut
        assert counter(s, "nodegate_client_errors_total", endpoint="join_start", reason="body_timeout") > 0
        assert counter(s, "nodegate_connections_refused_total", reason="address_limit") >= 200 - 64
        for w in stalled:
            w.close()


async def test_per_address_connection_cap(tmp_path: Path, ek_ca: EkCa) -> None:
    async with serving(settings_for(tmp_path, ek_ca), ConnectionLimits(per_address=5, total=8)) as s:
        assert s.site.connections is not None
        held = []

        async def busy(source: str) -> None:  # in the middle of its headers: not idle, not evictable
            reader, writer = await open_tls(s, source)
            writer.write(b"GET /healthz HTTP/1.1\r\n")
            await writer.drain()
            held.append((reader, writer))

        for _ in range(5):
            await busy(ABUSER)
        with pytest.raises((ConnectionError, ssl.SSLError, OSError)):  # closed at accept
            await open_tls(s)
        assert counter(s, "nodegate_connections_refused_total", reason="address_limit") == 1
        async with http(s) as h, h.get(f"{base(s)}/healthz") as resp:  # another address is served
            assert resp.status == 200
        for _ in range(3):
            await busy(GENUINE)
        while s.site.connections.idle_count() or s.site.connections.count() > 8:
            await asyncio.sleep(0.01)  # every held connection has sent its first bytes (an event, polled)
        with pytest.raises((ConnectionError, ssl.SSLError, OSError)):
            await open_tls(s, GENUINE)
        assert counter(s, "nodegate_connections_refused_total", reason="total_limit") == 1
        for _, w in held:
            w.close()


async def test_slow_headers_are_cut(tmp_path: Path, ek_ca: EkCa) -> None:
    """A slowloris: part of the headers, then nothing. Closed after header_timeout."""
    async with serving(settings_for(tmp_path, ek_ca), ConnectionLimits(header_timeout=0.5)) as s:
        reader, writer = await open_tls(s)
        writer.write(b"POST /v1/join/start HTTP/1.1\r\nHost: x\r\n")
        assert await closed_by_server(reader) == b""
        assert counter(s, "nodegate_client_errors_total", endpoint="connection", reason="header_timeout") == 1
        writer.close()


async def test_a_silent_connection_and_a_stalled_handshake_are_cut(tmp_path: Path, ek_ca: EkCa) -> None:
    limits = ConnectionLimits(header_timeout=0.5, handshake_timeout=0.5)
    async with serving(settings_for(tmp_path, ek_ca), limits) as s:
        reader, writer = await open_tls(s)  # TLS up, no request
        assert await closed_by_server(reader) == b""
        raw_reader, raw_writer = await asyncio.open_connection("127.0.0.1", s.port)  # no ClientHello
        assert await closed_by_server(raw_reader) == b""
        assert (
            counter(s, "nodegate_client_errors_total", endpoint="connection", reason="handshake_failed") == 1
        )
        assert s.site.connections is not None
        assert s.site.connections.count() == 0
        writer.close()
        raw_writer.close()


async def test_idle_keep_alive_connections_are_closed(tmp_path: Path, ek_ca: EkCa) -> None:
    async with serving(settings_for(tmp_path, ek_ca), ConnectionLimits(idle_timeout=0.5)) as s:
        reader, writer = await open_tls(s)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = await closed_by_server(reader)
        assert answer.startswith(b"HTTP/1.1 200")
        assert counter(s, "nodegate_client_errors_total", endpoint="connection", reason="idle_timeout") == 0
        writer.close()


# -- item 4: client aborts are not server errors --------------------------------------------------


async def test_aborted_bodies_are_counted_apart_and_not_logged_as_errors(
    tmp_path: Path, ek_ca: EkCa, caplog: pytest.LogCaptureFixture
) -> None:
    async with serving(settings_for(tmp_path, ek_ca)) as s:
        caplog.clear()  # what start-up said (no PackagePolicy source here) is not this test's
        with caplog.at_level(logging.DEBUG, logger="nodegate"):
            for path in ("/v1/join/start", "/v1/join/finish", "/admission/validate"):
                port = s.admission_port if path.startswith("/admission") else s.port
                _reader, writer = await open_tls(s, port=port)
                writer.write(
                    f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    'Content-Length: 1000\r\n\r\n{"session'.encode()
                )
                await writer.drain()
                writer.close()  # mid-body
                with contextlib.suppress(ConnectionError, ssl.SSLError):
                    await writer.wait_closed()
            while counter(s, "nodegate_client_errors_total", endpoint="admission", reason="aborted") < 1:
                await asyncio.sleep(0.01)  # the service noticed (an event, polled)
        for endpoint in ("join_start", "join_finish"):
            assert counter(s, "nodegate_client_errors_total", endpoint=endpoint, reason="aborted") == 1
            assert counter(s, "nodegate_requests_total", endpoint=endpoint, code="unavailable") == 0
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
        assert "unexpected error" not in caplog.text
        assert "Traceback" not in caplog.text


# -- item 5: encodings ------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["gzip", "br", "deflate", "zstd", "x-anything"])
@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("/v1/join/start", "unsupported_media_type"),
        ("/v1/join/finish", "unsupported_media_type"),
        ("/v1/nodes/self/renew", "unsupported_media_type"),
        ("/admission/validate", "malformed_request"),  # the webhook's code for bodies it does not take
    ],
)
async def test_encoded_bodies_get_415(
    tmp_path: Path, ek_ca: EkCa, encoding: str, path: str, code: str
) -> None:
    """Before: a gzip header over a non-gzip body was a 503 with a traceback, ``br`` an aiohttp
    'Please install Brotli'. No client of these endpoints compresses: any encoding is a 415."""
    async with serving(settings_for(tmp_path, ek_ca)) as s, http(s) as h:
        headers = {"Content-Type": "application/json", "Content-Encoding": encoding}
        url = f"https://127.0.0.1:{s.admission_port if path.startswith('/admission') else s.port}{path}"
        async with h.post(url, data=b'{"not": "compressed"}', headers=headers) as resp:
            out = await resp.json(content_type=None)
            assert resp.content_type == "application/problem+json"
    assert (resp.status, out["code"]) == (415, code), out


# -- item 6: one damaged record ------------------------------------------------------------------


async def test_a_damaged_record_is_listed_and_its_node_gets_a_clear_code(tmp_path: Path, ek_ca: EkCa) -> None:
    """Before: a node with unreadable counters made GET /v1/admin/nodes and that node's join a
    503 with a traceback."""
    admin = "spiffe://fleet.test/admin/alice"
    settings = settings_for(tmp_path, ek_ca, admin={"spiffe_ids": {admin: ["list"]}})
    async with serving(settings) as s:
        broken = ek_ca.node("broken-1")
        async with http(s) as h:
            assert (await join(h, base(s), broken))[0] == 200
            assert (await join(h, base(s), ek_ca.node("fine-1")))[0] == 200
        db = sqlite3.connect(settings.state_dir / "nodegate.db")
        db.execute("UPDATE nodes SET counters = 'garbage', svid_serials = '{' WHERE node_name = 'broken-1'")
        db.commit()
        db.close()
        key = ec.generate_private_key(ec.SECP256R1())
        leaf = svid.issue_svid(
            s.service.cas.signer,
            spiffe_id=svid.parse_spiffe_id(admin),
            public_key=key.public_key(),
            now=dt.datetime.now(dt.UTC),
            ttl=dt.timedelta(minutes=10),
        )
        creds = write_creds(tmp_path, "alice", key, leaf.public_bytes(serialization.Encoding.PEM))
        async with http(s, creds) as h, h.get(f"{base(s)}/v1/admin/nodes") as resp:
            listing = await resp.json()
        assert resp.status == 200, listing
        assert [n["node_name"] for n in listing["nodes"]] == ["fine-1"]
        assert [d["node_name"] for d in listing["damaged"]] == ["broken-1"]
        again = ek_ca.node("broken-1", broken.tpm)
        async with http(s) as h:
            status, out = await join(h, base(s), again)
        assert (status, out["code"]) == (409, "node_record_damaged"), out
        assert "forget" in out["detail"]


# -- the connection accounting, as a property -------------------------------------------------


class _Peer:
    def __init__(self, address: str) -> None:
        self.address = address


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("open"), st.sampled_from(["a", "b", "c"])),
            st.tuples(st.just("close"), st.integers(0, 40)),
        ),
        max_size=80,
    )
)
def test_connection_caps_hold_under_any_sequence(steps: list[tuple[str, object]]) -> None:
    """Admissions and releases in any order: no address over its cap, never more than the total,
    the gauge equals what is open, and a release of something not admitted changes nothing."""
    metrics = Metrics()
    conns = Connections(ConnectionLimits(per_address=3, total=5), metrics, asyncio.Protocol, None)
    admitted: list[_Peer] = []
    tried: list[_Peer] = []
    for step in steps:
        if step[0] == "open":
            peer = _Peer(str(step[1]))
            tried.append(peer)
            if conns.admit(peer):  # type: ignore[arg-type]
                admitted.append(peer)
        elif tried:
            peer = tried[int(step[1]) % len(tried)]  # type: ignore[call-overload]
            conns.release(peer)  # type: ignore[arg-type]
            if peer in admitted:
                admitted.remove(peer)
        assert conns.count() == len(admitted) <= 5
        for address in "abc":
            assert conns.count(address) == sum(p.address == address for p in admitted) <= 3
        assert metrics.registry.get_sample_value("nodegate_connections") == len(admitted)
