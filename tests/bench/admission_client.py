"""The admission benchmark's load generator (``tests.bench.admission``): the lean asyncio TLS
client and the aiohttp one, a batch of reviews with each answer checked, and the rounds at each
concurrency with the servers alternating."""

from __future__ import annotations

import asyncio
import json
import os
import random
import ssl
import time
from dataclasses import dataclass, field
from typing import Protocol

import aiohttp

from tests.bench import admission_data, common
from tests.bench.admission_data import Request
from tests.bench.admission_servers import BARE, SERVERS, Server

CONCURRENCY = (8, 64)
CLIENTS = ("raw", "aiohttp")
HEADERS = {"Content-Type": "application/json"}
BATCH_SECONDS = 300.0  # a batch that takes longer means a server stopped answering


@dataclass
class Batch:
    """One server's share of one round."""

    requests: int
    wall_s: float
    latencies_ns: list[int]  # of the requests that succeeded
    errors: list[str]
    client_cpu_s: float
    server_cpu_s: float | None

    @property
    def throughput(self) -> float:
        return self.requests / self.wall_s

    def percentile_ms(self, q: float) -> float:
        return common.percentile(self.latencies_ns, q) / 1e6


def _check(status: int, raw: bytes, req: Request, expect_allowed: bool) -> str | None:
    if status != 200:
        return f"HTTP {status}: {raw[:200]!r}"
    try:
        out = json.loads(raw)
        response = out["response"]
        uid, allowed = response["uid"], response["allowed"]
    except (ValueError, KeyError, TypeError) as exc:
        return f"malformed answer ({type(exc).__name__}: {exc}): {raw[:200]!r}"
    if out.get("apiVersion") != "admission.k8s.io/v1" or out.get("kind") != "AdmissionReview":
        return f"not an AdmissionReview v1: {raw[:200]!r}"
    if uid != req.uid:
        return f"uid {uid!r} answered for {req.uid!r}"
    if allowed is not expect_allowed:
        return f"allowed={allowed!r}, expected {expect_allowed} for uid {req.uid}"
    return None


async def run_batch(client: Client, server: Server, reqs: list[Request], concurrency: int) -> Batch:
    """Send ``reqs`` with ``concurrency`` reviews in flight; time each and check each answer."""
    bare = server.mode == BARE or server.path == admission_data.MUTATE_PATH  # mutate always allows
    latencies: list[int] = []
    errors: list[str] = []
    todo = iter(reqs)
    clock = time.perf_counter_ns

    async def worker(slot: int) -> None:
        for req in todo:  # one iterator shared by the workers: each takes the next review
            started = clock()
            try:
                status, raw = await client.post(slot, req.body)
            except (aiohttp.ClientError, OSError, TimeoutError, BenchProtocolError) as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                continue
            latencies.append(clock() - started)
            problem = _check(status, raw, req, True if bare else req.allowed)
            if problem is not None:
                errors.append(problem)

    server_cpu = server.cpu_seconds()
    client_cpu = time.process_time()
    started = time.perf_counter()
    try:
        await asyncio.wait_for(asyncio.gather(*(worker(i) for i in range(concurrency))), BATCH_SECONDS)
    except TimeoutError:
        raise RuntimeError(
            f"{server.mode} server did not answer {len(reqs)} reviews in {BATCH_SECONDS:.0f} s"
        ) from None
    wall = time.perf_counter() - started
    client_cpu = time.process_time() - client_cpu
    server_after = server.cpu_seconds()
    spent = None if server_cpu is None or server_after is None else server_after - server_cpu
    return Batch(len(reqs), wall, latencies, errors, client_cpu, spent)


class BenchProtocolError(Exception):
    """An answer the raw client cannot read as one HTTP/1.1 response with a Content-Length."""


class Client(Protocol):
    """Posts a review on the connection of worker ``slot`` (one review in flight per slot)."""

    async def post(self, slot: int, body: bytes) -> tuple[int, bytes]: ...

    async def close(self) -> None: ...


class AiohttpClient:
    """``aiohttp.ClientSession`` with ``TCPConnector(limit=C)``: what a Python caller would use, but
    its own cost per request is about that of the bare server, so it can bound what that shows."""

    def __init__(self, url: str, concurrency: int, ctx: ssl.SSLContext) -> None:
        self._url = url
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=concurrency, ssl=ctx),
            timeout=aiohttp.ClientTimeout(total=60),
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def post(self, slot: int, body: bytes) -> tuple[int, bytes]:
        async with self._session.post(self._url, data=body, headers=HEADERS) as resp:
            return resp.status, await resp.read()

    async def close(self) -> None:
        await self._session.close()


class _RawConnection(asyncio.Protocol):
    """One keep-alive TLS connection that speaks just enough HTTP/1.1 for one request at a time:
    the answer must carry a Content-Length (aiohttp's ``web.Response`` always does)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._buf = bytearray()
        self._waiter: asyncio.Future[tuple[int, bytes]] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)  # create_connection gives one
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._buf += data
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        try:
            answer = self._take()
        except (ValueError, BenchProtocolError) as exc:
            self.closed = True
            waiter.set_exception(BenchProtocolError(f"unreadable answer: {exc}"))
            return
        if answer is not None:
            self._waiter = None
            waiter.set_result(answer)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ConnectionResetError(f"connection lost: {exc}"))

    def _take(self) -> tuple[int, bytes] | None:
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            return None
        status_line, *headers = self._buf[:end].decode("latin-1").split("\r\n")
        version, status, _reason = (status_line + " ").split(" ", 2)
        if version != "HTTP/1.1":
            raise BenchProtocolError(f"status line {status_line!r}")
        length = None
        for line in headers:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "transfer-encoding":
                raise BenchProtocolError(f"transfer-encoding {value.strip()}")
            elif name == "connection" and value.strip().lower() == "close":
                self.closed = True
        if length is None:
            raise BenchProtocolError("no content-length")
        total = end + 4 + length
        if len(self._buf) < total:
            return None
        body = bytes(self._buf[end + 4 : total])
        del self._buf[:total]
        return int(status), body

    async def request(self, data: bytes) -> tuple[int, bytes]:
        assert self.transport is not None  # connected before use
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return await self._waiter


class RawClient:
    """A lean load generator: one asyncio TLS connection per worker, the request pre-framed, the
    answer framed by Content-Length and then checked in full like the aiohttp client's. Its own
    cost per review is a fraction of the bare server's, so the servers, not the client, are measured."""

    def __init__(self, server: Server, ctx: ssl.SSLContext) -> None:
        self._port = server.port
        self._ctx = ctx
        self._head = (
            f"POST {server.path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
            "User-Agent: nodegate-bench\r\nAccept: application/json\r\n"
            "Content-Type: application/json\r\nContent-Length: "
        ).encode()
        self._conns: dict[int, _RawConnection] = {}

    async def post(self, slot: int, body: bytes) -> tuple[int, bytes]:
        conn = self._conns.get(slot)
        if conn is None or conn.closed:
            if conn is not None and conn.transport is not None:
                conn.transport.close()
            _, conn = await asyncio.get_running_loop().create_connection(
                _RawConnection, "127.0.0.1", self._port, ssl=self._ctx
            )
            self._conns[slot] = conn
        return await conn.request(b"%b%d\r\n\r\n%b" % (self._head, len(body), body))

    async def close(self) -> None:
        for conn in self._conns.values():
            if conn.transport is not None:
                conn.transport.close()
        self._conns.clear()
        await asyncio.sleep(0)  # let the transports run their close callbacks


def make_client(kind: str, server: Server, concurrency: int, ctx: ssl.SSLContext) -> Client:
    return AiohttpClient(server.url, concurrency, ctx) if kind == "aiohttp" else RawClient(server, ctx)


@dataclass
class Level:
    """All batches at one concurrency."""

    concurrency: int
    requests: int  # per server and round
    warmup: int
    batches: dict[str, list[Batch]] = field(default_factory=lambda: {s: [] for s in SERVERS})
    warmup_errors: dict[str, list[str]] = field(default_factory=lambda: {s: [] for s in SERVERS})
    load_before: list[float] | None = None
    load_after: list[float] | None = None


async def measure_level(
    servers: dict[str, Server],
    client_ctx: ssl.SSLContext,
    concurrency: int,
    requests: int,
    rounds: int,
    rng: random.Random,
    client_kind: str,
    unique: bool = False,
) -> Level:
    level = Level(concurrency, requests, warmup=max(4 * concurrency, requests // 4))
    level.load_before = loadavg()
    clients = {mode: make_client(client_kind, servers[mode], concurrency, client_ctx) for mode in SERVERS}
    try:
        for mode in SERVERS:  # opens every connection and warms both servers' code paths
            warm = await run_batch(
                clients[mode], servers[mode], admission_data.requests(level.warmup, rng, unique), concurrency
            )
            level.warmup_errors[mode] = warm.errors
        for r in range(rounds):
            reqs = admission_data.requests(requests, rng, unique)  # the same reviews for both servers
            for mode in SERVERS if r % 2 == 0 else SERVERS[::-1]:
                level.batches[mode].append(await run_batch(clients[mode], servers[mode], reqs, concurrency))
    finally:
        for client in clients.values():
            await client.close()
    level.load_after = loadavg()
    return level


def loadavg() -> list[float] | None:
    """The machine's 1, 5 and 15 minute load averages (other sessions' work shows here)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


async def measure(
    servers: dict[str, Server],
    client_ctx: ssl.SSLContext,
    requests: dict[int, int],
    rounds: int,
    client_kind: str,
    unique: bool = False,
) -> list[Level]:
    rng = random.Random(20240611)  # a reproducible mix, not a secret
    return [
        await measure_level(servers, client_ctx, c, requests[c], rounds, rng, client_kind, unique)
        for c in CONCURRENCY
    ]
