"""The join benchmark's load generator (``tests.bench.join``): soft-TPM nodes with their start
bodies serialised ahead, whole joins over HTTPS with each SVID checked, and a timed batch of
them with a given number in flight."""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from dataclasses import dataclass

import aiohttp
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from tests.bench.join_servers import TRUST_DOMAIN, Server
from tests.support.service import EkCa
from tests.support.softnode import SoftNode
from tests.support.softtpm import EkKind, soft_pool

HEADERS = {"Content-Type": "application/json"}


@dataclass
class Prepared:
    """A node and its /v1/join/start body, serialised before the timing."""

    node: SoftNode
    start: bytes
    spiffe_id: str


def build_nodes(n: int, prefix: str, ek_kind: EkKind, ek_ca: EkCa | None) -> list[Prepared]:
    out: list[Prepared] = []
    for i, soft in enumerate(soft_pool(n, ek_kind=ek_kind)):
        name = f"{prefix}-{i:05d}"
        cert = soft.ek_certificate(ek_ca.key, ek_ca.cert) if ek_ca is not None else None
        node = SoftNode(soft, name, cert)
        body = json.dumps(node.start_body(), separators=(",", ":")).encode()
        out.append(Prepared(node, body, f"spiffe://{TRUST_DOMAIN}/node/{name}"))
    return out


@dataclass
class Batch:
    joins: int
    wall_s: float
    latencies_ns: list[int]  # of the joins that succeeded
    errors: list[str]
    client_cpu_s: float
    server_cpu_s: float | None

    @property
    def throughput(self) -> float:
        return (self.joins - len(self.errors)) / self.wall_s


def _check_finish(status: int, raw: bytes, p: Prepared, deep: bool) -> str | None:
    if status != 200:
        return f"finish HTTP {status}: {raw[:200]!r}"
    try:
        fin = json.loads(raw)
        sid, pem = fin["spiffe_id"], fin["svid"]
    except (ValueError, KeyError, TypeError) as exc:
        return f"finish answer malformed ({type(exc).__name__}): {raw[:200]!r}"
    if sid != p.spiffe_id or fin.get("node_name") != p.node.name:
        return f"finish answered {sid!r} for {p.spiffe_id!r}"
    if not isinstance(pem, str) or not pem.startswith("-----BEGIN CERTIFICATE-----"):
        return f"finish answer has no PEM SVID: {str(pem)[:80]!r}"
    if deep:
        leaf = x509.load_pem_x509_certificates(pem.encode())[0]
        spki = serialization.PublicFormat.SubjectPublicKeyInfo
        if leaf.public_key().public_bytes(
            serialization.Encoding.DER, spki
        ) != p.node.key.public_key().public_bytes(serialization.Encoding.DER, spki):
            return "the SVID certifies another key than the node's CSR key"
        uris = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        if uris.get_values_for_type(x509.UniformResourceIdentifier) != [p.spiffe_id]:
            return "the SVID carries another SPIFFE ID"
    return None


async def one_join(http: aiohttp.ClientSession, base: str, p: Prepared, deep: bool) -> str | None:
    """One whole join; None when it succeeded, else what went wrong."""
    try:
        async with http.post(f"{base}/v1/join/start", data=p.start, headers=HEADERS) as resp:
            raw, status = await resp.read(), resp.status
        if status != 200:
            return f"start HTTP {status}: {raw[:200]!r}"
        body = p.node.finish_body(json.loads(raw))
        data = json.dumps(body, separators=(",", ":")).encode()
        async with http.post(f"{base}/v1/join/finish", data=data, headers=HEADERS) as resp:
            raw, status = await resp.read(), resp.status
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as exc:
        return f"{type(exc).__name__}: {exc}"[:300]
    return _check_finish(status, raw, p, deep)


async def run_batch(
    http: aiohttp.ClientSession, server: Server, nodes: list[Prepared], concurrency: int
) -> Batch:
    """Join ``nodes`` with ``concurrency`` joins in flight; time and check each."""
    latencies: list[int] = []
    errors: list[str] = []
    todo = iter(enumerate(nodes))
    clock = time.perf_counter_ns
    base = server.base

    async def worker() -> None:
        for i, p in todo:  # one iterator shared by the workers: each takes the next node
            started = clock()
            problem = await one_join(http, base, p, deep=i == 0)
            if problem is None:
                latencies.append(clock() - started)
            else:
                errors.append(problem)

    server_cpu = server.cpu_seconds()
    client_cpu = time.process_time()
    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - started
    client_cpu = time.process_time() - client_cpu
    after = server.cpu_seconds()
    spent = None if server_cpu is None or after is None else after - server_cpu
    return Batch(len(nodes), wall, latencies, errors, client_cpu, spent)


def client_session(concurrency: int, tls: ssl.SSLContext) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=concurrency, ssl=tls),
        timeout=aiohttp.ClientTimeout(total=120),
        cookie_jar=aiohttp.DummyCookieJar(),
    )
