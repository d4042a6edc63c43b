"""Benchmark of the admission webhook over TLS against a bare aiohttp handler, under load.

What is measured, all in one run: two server processes on 127.0.0.1, each one asyncio process
with TLS and keep-alive, access logs off:
  webhook   ``nodegate serve`` itself (``python -m bootstrap.cli serve``, since issue 35): its
            admission listener as deployed (``compose.admission_app`` on ``ReviewSite``:
            TLS, in-flight limit, heavy lane, the decision cache, metrics), the JSON log at the
            default level (info: a line per review) written to a file, the join listener idle,
            with 3 PackagePolicies and 22 RBAC objects as files (``tests.bench.admission_data``):
            the real decision for every review. ``--webhook app`` runs the admission app alone in
            ``tests.bench.admission_server`` instead (no log handler: the earlier method)
  bare      (``tests.bench.admission_server``) a handler that reads the body, ``json.loads`` it
            and answers allowed with its uid: what any AdmissionReview server on aiohttp spends
            at least (the floor);
            ``--bare-parser pydantic-core`` parses with ``pydantic_core.from_json`` instead, the
            parser the webhook reads reviews with (faster than the json module): the floor for
            a server that parses as the webhook does

The load generator is this process: one asyncio event loop and C worker coroutines per server,
each sending the next body of a pre-serialised list and waiting for the answer (closed loop, C
reviews in flight). By default (``--client raw``) each worker has its own keep-alive TLS
connection driven by a small asyncio protocol (the request pre-framed, the answer framed by its
Content-Length): its cost per review is a fraction of the bare server's, so the servers are what
is measured. ``--client aiohttp`` uses one ``aiohttp.ClientSession`` with ``TCPConnector(limit=C)``
instead (the earlier method: that client costs about as much per review as the bare server, so on
few CPUs it limits the bare side and flatters the webhook). With two or more CPUs the servers are
pinned to the first and the client to the others (``--no-pin`` turns that off), so the client
never takes CPU time from the server it measures; both servers share their CPU, but only one is
under load at a time. The mix is 70 %
reviews the webhook must allow (four kinds: plain CREATE, CREATE with a reboot by a group that may
reboot, another pool, an UPDATE that bumps a version) and 30 % it must deny (no RBAC, a foreign
registry, a reboot without the verb); every body has its own uid. Each answer is checked (HTTP 200,
the uid echoed, ``allowed`` as expected: the bare handler always allows); a failed check or a
failed request is an error, reported, and makes the run's numbers suspect (exit code 1).

Method: for each concurrency (8, 64) both clients are opened and warmed up (every connection
made, TLS handshakes done), then R rounds; in each round both servers get the same list of N
reviews, one after the other, the order alternating per round.

How to read the table:
  reviews/s      median over rounds of N / wall time of the round
  p50, p99       latency of one review (send to answer read), over all timed reviews of all
                 rounds (pooled)
  srv CPU        the server process's CPU time per review (user + system, from /proc, in clock
                 ticks of usually 10 ms: coarse for the short rounds of --quick), median over
                 rounds; srv % is its CPU time / wall time (100 % = the server is saturated)
  cli CPU        the same for this process, the client; a cli % near 100 means the client, not
                 the server, limits the throughput
  ratios         webhook/bare throughput, p50, p99 and server CPU per review, medians of per-round
                 ratios: the servers of one round run seconds apart, so machine drift cancels
                 out; trust them over the absolute numbers. 1 / the server-CPU ratio is the
                 throughput ratio two saturated servers would show with the client out of the way
                 (printed): on a busy machine the throughput ratio also depends on how much CPU
                 each server got (srv %; the scheduler shares time per thread)
The targets at the end are reported, never asserted. Unpinned on few CPUs the client and the
servers share them and the client's own cost bounds what the bare handler can show (see cli %).

The mix: NodeWright and Skyhook CRs (both API groups), from five requesters (users, groups, a
service account), 70 % allowed, 30 % denied (no RBAC, a foreign registry, a reboot without the
verb, a reboot the pool's policy does not allow). By default the reviews of one kind are the same
but for their uid (the decision cache answers all but the first); ``--unique`` gives every object
a label value of its own, so no review repeats another and every one is parsed and judged.

``--profile`` samples both servers with py-spy during the load and prints where the time goes per
stage (``tests.bench.admission_profile``), next to the ratios. The machine's load averages are
printed for the run and each concurrency.

``--route validate|mutate|both`` (default both): the webhook route under load; the targets are
issue 28's, for the validating route. ``--bare-server listener`` runs the bare handler on
nodegate's own admission listener instead of aiohttp: the floor of that listener, so the ratio is
what nodegate's own work per review costs (docs/benchmarks.md).

``NODEGATE_BENCH_PROFILE=DIR`` runs both servers under cProfile (stats in DIR/admission-<mode>.prof,
the webhook's top functions printed to stderr); the numbers of such a run are slowed by it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import pstats
import random
import ssl
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import yaml

from tests.bench import admission_data, admission_profile, common
from tests.bench.admission_data import Request
from tests.bench.admission_server import BARE_PARSERS, BARE_SERVERS
from tests.support import certs

CONCURRENCY = (8, 64)
REQUESTS = {8: 1000, 64: 2000}  # per server and round
QUICK_REQUESTS = {8: 150, 64: 300}
ROUNDS = 7
QUICK_ROUNDS = 3
SERVERS = ("webhook", "bare")
WEBHOOK, BARE = SERVERS
START_SECONDS = 30.0  # deadline for a server to write its port file
HEADERS = {"Content-Type": "application/json"}
CLIENTS = ("raw", "aiohttp")
ROUTES = ("validate", "mutate")
WEBHOOKS = ("serve", "app")
BATCH_SECONDS = 300.0  # a batch that takes longer means a server stopped answering
PROFILE_ENV = "NODEGATE_BENCH_PROFILE"
ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------
# TLS and server processes


def make_tls(workdir: Path) -> tuple[Path, Path, ssl.SSLContext]:
    """A self-signed P-256 certificate for 127.0.0.1; its files and a client context trusting it."""
    cert_file, key_file, _ = certs.loopback_tls(workdir, "nodegate-bench.nodegate.svc", dns=("localhost",))
    client = ssl.create_default_context(cafile=str(cert_file))
    client.minimum_version = ssl.TLSVersion.TLSv1_2
    return cert_file, key_file, client


@dataclass
class Server:
    mode: str
    proc: subprocess.Popen[bytes]
    log: Path
    port_file: Path
    profile: Path | None
    port: int = 0
    path: str = admission_data.PATH  # the route under load
    admission_port_file: Path | None = None  # nodegate serve: the webhooks' own listener

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}{self.path}"

    def cpu_seconds(self) -> float | None:
        """User + system CPU time of the server process so far (Linux /proc), None elsewhere."""
        try:
            stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        except OSError:
            return None
        fields = stat[stat.rindex(")") + 2 :].split()  # fields 3.. of proc(5); utime, stime: 14, 15
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-2000:]
        except OSError:
            return ""


def serve_config(workdir: Path, cert: Path, key: Path) -> dict[str, Any]:
    """``nodegate serve`` as the chart runs it, with the benchmark's policies and RBAC as files
    (offline RBAC: no cluster) and the bench certificate on both listeners."""
    policy_file, rbac_file = workdir / "policies.yaml", workdir / "rbac.yaml"
    policy_file.write_text(yaml.safe_dump_all(admission_data.POLICY_DOCS))
    rbac_file.write_text(yaml.safe_dump_all(admission_data.RBAC))
    return {
        "trust_domain": "bench.nodegate.test",
        "listen": "127.0.0.1:0",
        "state_dir": str(workdir / "state"),
        "store": "sqlite",
        "server_names": ["localhost", "127.0.0.1"],
        "tls": {"cert_file": str(cert), "key_file": str(key)},
        "admission": {
            "listen": "127.0.0.1:0",
            "policy_files": [str(policy_file)],
            "rbac_files": [str(rbac_file)],
            "owner": admission_data.OWNER,
        },
    }


def start_server(
    mode: str,
    cert: Path,
    key: Path,
    workdir: Path,
    profile_dir: Path | None,
    cpus: set[int],
    bare_parser: str = BARE_PARSERS[0],
    webhook: str = "serve",
    log_level: str = "info",
    bare_server: str = BARE_SERVERS[0],
) -> Server:
    port_file, log = workdir / f"{mode}.port", workdir / f"{mode}.log"
    if mode == WEBHOOK and webhook == "serve":
        return _start_serve(cert, key, workdir, profile_dir, cpus, log_level)
    profile = profile_dir / f"admission-{mode}.prof" if profile_dir else None
    cmd = [sys.executable, "-m", "tests.bench.admission_server", "--mode", mode]
    cmd += [
        "--cert",
        str(cert),
        "--key",
        str(key),
        "--port-file",
        str(port_file),
        "--bare-parser",
        bare_parser,
        "--bare-server",
        bare_server,
    ]
    if profile is not None:
        cmd += ["--profile", str(profile)]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(proc.pid, cpus)  # before it starts threads: they inherit it
    return Server(mode, proc, log, port_file, profile)


def _start_serve(
    cert: Path, key: Path, workdir: Path, profile_dir: Path | None, cpus: set[int], log_level: str = "info"
) -> Server:
    """``python -m bootstrap.cli serve`` (``nodegate serve``), its JSON log (level info, the
    default) written to a file as a container runtime would collect it."""
    home = workdir / "serve"
    home.mkdir()
    config = home / "config.yaml"
    config.write_text(yaml.safe_dump(serve_config(home, cert, key), sort_keys=False))
    port_file, admission_port_file, log = home / "port", home / "admission-port", workdir / "webhook.log"
    profile = profile_dir / "admission-webhook.prof" if profile_dir else None
    cmd = [sys.executable]
    if profile is not None:
        cmd += ["-m", "cProfile", "-o", str(profile)]
    cmd += ["-m", "bootstrap.cli", "serve", "--config", str(config), "--port-file", str(port_file)]
    cmd += ["--admission-port-file", str(admission_port_file), "--log-level", log_level]
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "NODEGATE_LOG_LEVEL")}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env
        )
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(proc.pid, cpus)  # before it starts threads: they inherit it
    return Server(WEBHOOK, proc, log, port_file, profile, admission_port_file=admission_port_file)


def wait_listening(servers: list[Server]) -> None:
    deadline = time.monotonic() + START_SECONDS
    for server in servers:
        while not server.port_file.exists():
            if server.proc.poll() is not None:
                raise RuntimeError(
                    f"{server.mode} server exited with {server.proc.returncode}:\n{server.tail()}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"{server.mode} server did not listen within {START_SECONDS:.0f} s")
            time.sleep(0.02)
        ports = server.admission_port_file or server.port_file  # serve writes this one first
        server.port = int(ports.read_text())


def stop_servers(servers: list[Server]) -> None:
    for server in servers:
        if server.proc.poll() is None:
            server.proc.terminate()
    for server in servers:
        try:
            server.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()


# ------------------------------------------------------------------------------------------
# Load


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
    level.load_before = _loadavg()
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
    level.load_after = _loadavg()
    return level


def _loadavg() -> list[float] | None:
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


def check_expectations() -> None:
    """Every template is decided as the mix claims, before any load is sent."""
    from admission import webhook

    decider = admission_data.decider()
    for template in admission_data.REVIEWS:
        head, mid, tail = template.split()
        request = webhook.parse_review(head + b"check" + mid + b"0" + tail).request
        decision = asyncio.run(decider.decide(request))
        if decision.allowed is not template.allowed:
            raise RuntimeError(
                f"review {template.name!r}: the webhook answers allowed={decision.allowed} "
                f"({decision.message}), the benchmark expects {template.allowed}"
            )


# ------------------------------------------------------------------------------------------
# Results


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _median_ratio(top: list[float], bottom: list[float]) -> float:
    return statistics.median(t / b for t, b in zip(top, bottom, strict=True))


def summarise(levels: list[Level], config: dict[str, Any]) -> dict[str, Any]:
    """The table and ratios; the issue-28 targets for the validating route (the mutating route's
    figures are reported without targets)."""
    rows: list[dict[str, Any]] = []
    ratios: dict[int, dict[str, float]] = {}
    errors: list[dict[str, Any]] = []
    for level in levels:
        for mode in SERVERS:
            batches = level.batches[mode]
            pooled = [ns for b in batches for ns in b.latencies_ns]
            errs = [e for b in batches for e in b.errors]
            srv = [None if b.server_cpu_s is None else b.server_cpu_s / b.requests for b in batches]
            srv_share = [None if b.server_cpu_s is None else b.server_cpu_s / b.wall_s for b in batches]
            srv_us, srv_pct = _median(srv), _median(srv_share)
            rows.append(
                {
                    "server": mode,
                    "concurrency": level.concurrency,
                    "requests_per_round": level.requests,
                    "rounds": len(batches),
                    "reviews_per_s": statistics.median(b.throughput for b in batches),
                    "reviews_per_s_rounds": [round(b.throughput, 1) for b in batches],
                    "p50_ms": common.percentile(pooled, 0.50) / 1e6 if pooled else None,
                    "p99_ms": common.percentile(pooled, 0.99) / 1e6 if pooled else None,
                    "p99_ms_rounds": [round(b.percentile_ms(0.99), 3) for b in batches if b.latencies_ns],
                    "server_cpu_us_per_review": None if srv_us is None else srv_us * 1e6,
                    "server_cpu_share": srv_pct,
                    "client_cpu_us_per_review": statistics.median(
                        b.client_cpu_s / b.requests for b in batches
                    )
                    * 1e6,
                    "client_cpu_share": statistics.median(b.client_cpu_s / b.wall_s for b in batches),
                    "errors": len(errs),
                    "warmup_errors": len(level.warmup_errors[mode]),
                }
            )
            for where, found in (("timed", errs), ("warm-up", level.warmup_errors[mode])):
                if found:
                    errors.append(
                        {
                            "server": mode,
                            "concurrency": level.concurrency,
                            "phase": where,
                            "count": len(found),
                            "first": sorted(set(found))[:5],
                        }
                    )
        hook, bare = level.batches[WEBHOOK], level.batches[BARE]
        if all(b.latencies_ns for b in hook + bare):
            ratios[level.concurrency] = {
                "throughput": _median_ratio([b.throughput for b in hook], [b.throughput for b in bare]),
                "p99": _median_ratio(
                    [b.percentile_ms(0.99) for b in hook], [b.percentile_ms(0.99) for b in bare]
                ),
                "p50": _median_ratio(
                    [b.percentile_ms(0.50) for b in hook], [b.percentile_ms(0.50) for b in bare]
                ),
            }
            if all(b.server_cpu_s for b in hook + bare):
                ratios[level.concurrency]["server_cpu"] = _median_ratio(
                    [(b.server_cpu_s or 0) / b.requests for b in hook],
                    [(b.server_cpu_s or 0) / b.requests for b in bare],
                )
    targets = [
        _target(64, "throughput", ">=", 0.70, ratios),
        _target(8, "p99", "<=", 1.30, ratios),
    ]
    if config.get("route") == "mutate":
        targets = []
    return {
        "benchmark": "admission",
        "route": config.get("route", "validate"),
        "environment": _environment(),
        "config": config,
        "rows": rows,
        "ratios": {str(c): r for c, r in ratios.items()},
        "targets": targets,
        "errors": errors,
        "load_average": {
            str(level.concurrency): {"before": level.load_before, "after": level.load_after}
            for level in levels
        },
    }


def _target(
    concurrency: int, metric: str, op: str, threshold: float, ratios: dict[int, dict[str, float]]
) -> dict[str, Any]:
    value = ratios.get(concurrency, {}).get(metric)
    met = None if value is None else (value >= threshold if op == ">=" else value <= threshold)
    return {
        "concurrency": concurrency,
        "metric": f"webhook/bare {metric}",
        "value": value,
        "op": op,
        "threshold": threshold,
        "met": met,
    }


def _environment() -> dict[str, Any]:
    versions = common.versions(("aiohttp", "pydantic", "pydantic-core", "nodegate"))
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "usable_cpus": usable,
        "openssl": ssl.OPENSSL_VERSION,
        "versions": versions,
    }


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def _bare_text(config: dict[str, Any]) -> str:
    where = (
        "on aiohttp"
        if config.get("bare_server", "aiohttp") == "aiohttp"
        else "on nodegate's admission listener"
    )
    if config.get("bare_parser", "json") == "json":
        return f"bare {where}, parses with json.loads"
    return f"bare {where}, parses with pydantic_core.from_json (the webhook's parser)"


def _client_text(config: dict[str, Any]) -> str:
    kind = "lean asyncio TLS client" if config["client"] == "raw" else "aiohttp ClientSession"
    if not config["server_cpus"]:
        return f"{kind}; not pinned (it shares the CPUs with the servers: see cli %)"
    cpus = ",".join(map(str, config["client_cpus"]))
    return f"{kind}; servers pinned to CPU {config['server_cpus'][0]}, the client to CPU {cpus}"


def _load_text(load: list[float] | None) -> str:
    return "-" if not load else " / ".join(f"{x:.2f}" for x in load)


def _server_text(config: dict[str, Any]) -> str:
    if config.get("webhook", "serve") == "serve":
        level = config.get("log_level", "info")
        return f"webhook: nodegate serve (admission listener, JSON log at {level} to a file, metrics)"
    return "webhook: the admission app alone (tests.bench.admission_server, no log handler)"


def render_profile(profile: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"where the server time goes (py-spy, {admission_profile.RATE} Hz, nonblocking, whole load part; "
        "µs a review = share x server CPU per review at 64)",
    ]
    names: list[str] = []
    for data in profile.values():
        names += [n for n in data["stages"] if n not in names]
    modes = list(profile)
    head = f"  {'stage':<44}" + "".join(f" {m + ' %':>10} {m + ' µs':>10}" for m in modes)
    lines.append(head)
    for name in names:
        cells = ""
        for mode in modes:
            stage = profile[mode]["stages"].get(name)
            share = "-" if stage is None else f"{stage['share'] * 100:.1f}"
            us = "-" if stage is None or stage["us_per_review"] is None else f"{stage['us_per_review']:.0f}"
            cells += f" {share:>10} {us:>10}"
        lines.append(f"  {name:<44}{cells}")
    lines.append("  samples" + " " * 37 + "".join(f" {profile[m]['samples']:>10} {'':>10}" for m in modes))
    for mode in modes:
        if profile[mode]["problem"]:
            lines.append(f"  {mode}: no profile: {profile[mode]['problem']}")
    return lines


def render(results: dict[str, Any]) -> str:
    env, config = results["environment"], results["config"]
    mix = [f"{'allowed' if t['allowed'] else 'denied'} {t['weight']}% {t['name']}" for t in config["mix"]]
    low, high = config["body_bytes"]
    mix_lines = textwrap.wrap(
        f"mix ({low}-{high} B bodies, {config['policies']} PackagePolicies, "
        f"{config['rbac_objects']} RBAC objects): " + "; ".join(mix),
        width=104,
        initial_indent="  ",
        subsequent_indent="    ",
    )
    lines = [
        f"admission benchmark ({results.get('route', 'validate')} route): the admission listener as "
        "deployed vs a bare aiohttp handler, AdmissionReview v1 over TLS, keep-alive",
        f"  Python {env['python']} ({env['implementation']}, {env['machine']}), {env['cpus']} CPUs "
        f"({env['usable_cpus']} usable), {env['openssl']}",
        "  " + ", ".join(f"{k} {v}" for k, v in env["versions"].items()),
        f"  servers: one process each, asyncio, TLS, access log off; {_bare_text(config)}",
        f"  {_server_text(config)}",
        "  objects: "
        + (
            "each with a label value of its own (--unique: no review repeats another)"
            if config.get("unique")
            else "a few kinds of review repeated with fresh uids (as a retrying or re-applying client sends)"
        ),
        "  load average (1/5/15 min) before / after the run: "
        f"{_load_text(config['load_average']['before'])}  ->  {_load_text(config['load_average']['after'])}",
        f"  client: this process, one event loop, {_client_text(config)}",
        *mix_lines,
        f"  {config['rounds']} rounds per concurrency, servers alternating; reviews per round in brackets;"
        f" load part {config['timed_seconds']} s",
        "  reviews/s: median over rounds; p50/p99: over all timed reviews of all rounds (pooled);",
        "  srv/cli CPU: CPU µs per review and CPU/wall of the server process and of the client;",
        "  ratios: webhook/bare, medians of per-round ratios",
    ]
    if config["profile_dir"]:
        lines.append(
            f"  PROFILING ON (cProfile in the servers, stats in {config['profile_dir']}): slowed numbers"
        )
    header = (
        f"  {'server':<8} {'reviews/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'srv µs':>8} {'srv %':>6} "
        f"{'cli µs':>8} {'cli %':>6} {'errors':>7}"
    )
    for concurrency in CONCURRENCY:
        rows = [r for r in results["rows"] if r["concurrency"] == concurrency]
        if not rows:
            continue
        load = results.get("load_average", {}).get(str(concurrency), {})
        lines += [
            "",
            f"{concurrency} concurrent clients [{rows[0]['requests_per_round']}], load average "
            f"{_load_text(load.get('before'))} -> {_load_text(load.get('after'))}",
            header,
        ]
        for row in rows:
            errs = row["errors"] + row["warmup_errors"]
            lines.append(
                f"  {row['server']:<8} {row['reviews_per_s']:>10,.0f} {_num(row['p50_ms'], '.2f'):>8} "
                f"{_num(row['p99_ms'], '.2f'):>8} {_num(row['server_cpu_us_per_review'], ',.0f'):>8} "
                f"{_pct(row['server_cpu_share']):>6} {row['client_cpu_us_per_review']:>8,.0f} "
                f"{_pct(row['client_cpu_share']):>6} {errs:>7}"
            )
        ratio = results["ratios"].get(str(concurrency))
        if ratio:
            cpu = (
                f", server CPU per review {ratio['server_cpu']:.2f}x "
                f"(two saturated servers: {1 / ratio['server_cpu']:.2f}x the throughput)"
                if ratio.get("server_cpu")
                else ""
            )
            lines.append(
                f"  webhook/bare: throughput {ratio['throughput']:.2f}x, p50 {ratio['p50']:.2f}x, "
                f"p99 {ratio['p99']:.2f}x{cpu}"
            )
    if results.get("profile"):
        lines += render_profile(results["profile"])
    if results["errors"]:
        lines += ["", "ERRORS (the numbers of this run are suspect)"]
        for e in results["errors"]:
            lines.append(
                f"  {e['server']} at {e['concurrency']} concurrent, {e['phase']}: {e['count']} errors"
            )
            lines += [f"    {msg}" for msg in e["first"]]
    lines += ["", "targets (reported, not asserted)"]
    for t in results["targets"]:
        head = f"{t['concurrency']:>2} concurrent: {t['metric']:<24}"
        goal = f"{t['op']} {t['threshold']:.2f}x"
        if t["met"] is None:
            lines.append(f"  n/a   {head} {'-':>6}   {goal}")
        else:
            lines.append(f"  {'met ' if t['met'] else 'MISS'}  {head} {t['value']:>5.2f}x  {goal}")
    judged = [t for t in results["targets"] if t["met"] is not None]
    if results["targets"]:
        lines.append(f"  {sum(1 for t in judged if t['met'])} of {len(judged)} targets met")
    else:
        lines.append("  none for this route: its ratios are reported only")
    return "\n".join(lines)


def print_profile(server: Server, top: int = 25) -> None:
    if server.profile is None or not server.profile.exists():
        return
    print(f"\n{server.mode} server profile ({server.profile}), top {top} by own time:", file=sys.stderr)
    stats = pstats.Stats(str(server.profile), stream=sys.stderr)
    stats.sort_stats(pstats.SortKey.TIME).print_stats(top)
    print(f"{server.mode} server profile, top {top} by cumulative time:", file=sys.stderr)
    stats.sort_stats(pstats.SortKey.CUMULATIVE).print_stats(top)


# ------------------------------------------------------------------------------------------
# Entry point


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.bench", description=(__doc__ or "").split("\n")[0])
    p.add_argument("--json", action="store_true", help="print the results as one JSON object on one line")
    p.add_argument("--rounds", type=common.positive, default=ROUNDS, help=f"timed rounds (default {ROUNDS})")
    p.add_argument("--quick", action="store_true", help="a smoke run: 3 rounds of far fewer reviews")
    p.add_argument(
        "--client",
        choices=CLIENTS,
        default=CLIENTS[0],
        help="load generator: raw (lean asyncio TLS client, default) or aiohttp (ClientSession)",
    )
    p.add_argument(
        "--route",
        choices=(*ROUTES, "both"),
        default="both",
        help="the webhook route under load: validate, mutate (CR toleration injection) or both (default)",
    )
    p.add_argument(
        "--no-pin", action="store_true", help="do not pin the servers and the client to separate CPUs"
    )
    p.add_argument(
        "--webhook",
        choices=WEBHOOKS,
        default=WEBHOOKS[0],
        help="the webhook server: serve (nodegate serve, default: logs, metrics, as deployed) or app "
        "(the admission app alone in tests.bench.admission_server, no logging configured)",
    )
    p.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default="info",
        help="nodegate serve's --log-level (default info, the default: a line per review)",
    )
    p.add_argument(
        "--unique",
        action="store_true",
        help="every object with a label value of its own (no review repeats another but for its uid)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="sample both servers with py-spy during the load and print where the time goes per stage",
    )
    p.add_argument(
        "--bare-server",
        choices=BARE_SERVERS,
        default=BARE_SERVERS[0],
        help="where the bare handler runs: aiohttp (default, the issue's floor) or the admission listener",
    )
    p.add_argument(
        "--bare-parser",
        choices=BARE_PARSERS,
        default=BARE_PARSERS[0],
        help="the bare handler's JSON parser: json (default) or pydantic-core (the webhook's)",
    )
    return p


def _cpus(pin: bool) -> tuple[set[int], set[int]]:
    """(server, client) CPUs: both servers get the first usable CPU (only one is under load at a
    time), the client the others; empty sets (no pinning) with fewer than two CPUs or ``pin`` off."""
    if not pin or len(common.usable_cpus()) < 2:
        return set(), set()
    return common.split_cpus()


def run(
    rounds: int = ROUNDS,
    quick: bool = False,
    client: str = CLIENTS[0],
    pin: bool = True,
    bare_parser: str = BARE_PARSERS[0],
    route: str = ROUTES[0],
    webhook: str = WEBHOOKS[0],
    unique: bool = False,
    spy: bool = False,
    log_level: str = "info",
    bare_server: str = BARE_SERVERS[0],
) -> dict[str, Any]:
    if rounds < 1:
        raise ValueError("rounds must be at least 1")
    if client not in CLIENTS or bare_parser not in BARE_PARSERS:
        raise ValueError(
            f"client must be one of {', '.join(CLIENTS)}, bare_parser of {', '.join(BARE_PARSERS)}"
        )
    rounds = min(rounds, QUICK_ROUNDS) if quick else rounds
    requests = QUICK_REQUESTS if quick else REQUESTS
    check_expectations()
    profile_env = os.environ.get(PROFILE_ENV)
    profile_dir = Path(profile_env).resolve() if profile_env else None
    if profile_dir is not None:
        profile_dir.mkdir(parents=True, exist_ok=True)
    server_cpus, client_cpus = _cpus(pin)
    recordings: list[admission_profile.Recording] = []
    with tempfile.TemporaryDirectory(prefix="nodegate-bench-") as tmp, common.pinned(client_cpus):
        workdir = Path(tmp)
        cert, key, client_ctx = make_tls(workdir)
        servers: list[Server] = []
        try:
            for mode in SERVERS:
                servers.append(
                    start_server(
                        mode,
                        cert,
                        key,
                        workdir,
                        profile_dir,
                        server_cpus,
                        bare_parser,
                        webhook,
                        log_level,
                        bare_server,
                    )
                )
            wait_listening(servers)
            for server in servers:
                server.path = admission_data.MUTATE_PATH if route == "mutate" else admission_data.PATH
            if spy:
                spy_dir = Path(os.environ.get(admission_profile.KEEP_ENV) or workdir)
                spy_dir.mkdir(parents=True, exist_ok=True)
                recordings = [
                    admission_profile.record(s.mode, s.proc.pid, spy_dir, client_cpus) for s in servers
                ]
            load_before = _loadavg()
            started = time.perf_counter()
            try:
                levels = asyncio.run(
                    measure({s.mode: s for s in servers}, client_ctx, requests, rounds, client, unique)
                )
            finally:
                for recording in recordings:
                    recording.stop()
            timed = time.perf_counter() - started
            load_after = _loadavg()
        finally:
            stop_servers(servers)
        profile = {r.mode: r.result() for r in recordings}
        for server in servers:
            if server.proc.returncode not in (0, None):
                print(
                    f"{server.mode} server exited with {server.proc.returncode}:\n{server.tail()}",
                    file=sys.stderr,
                )
        if profile_dir is not None:
            print_profile(next(s for s in servers if s.mode == WEBHOOK))
    sizes = [sum(map(len, t.split())) + 37 for t in admission_data.REVIEWS]
    config = {
        "rounds": rounds,
        "concurrency": list(CONCURRENCY),
        "requests_per_round": {str(c): requests[c] for c in CONCURRENCY},
        "warmup": {str(level.concurrency): level.warmup for level in levels},
        "mix": [{"name": t.name, "weight": t.weight, "allowed": t.allowed} for t in admission_data.REVIEWS],
        "body_bytes": [min(sizes), max(sizes)],
        "policies": len(admission_data.POLICY_DOCS),
        "rbac_objects": len(admission_data.RBAC),
        "client": client,
        "bare_parser": bare_parser,
        "bare_server": bare_server,
        "server_cpus": sorted(server_cpus),
        "client_cpus": sorted(client_cpus),
        "timed_seconds": round(timed, 1),
        "profile_dir": str(profile_dir) if profile_dir else None,
        "route": route,
        "webhook": webhook,
        "unique": unique,
        "load_average": {"before": load_before, "after": load_after},
        "py_spy": spy,
        "log_level": log_level,
    }
    results = summarise(levels, config)
    if spy:
        results["profile"] = _profile_rows(profile, results["rows"])
    return results


def _profile_rows(profile: dict[str, tuple[Counter[str], str]], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per server: each stage's share of the samples and, with the server CPU per review at 64
    clients (the saturated level), its µs per review."""
    out: dict[str, Any] = {}
    for mode, (samples, problem) in profile.items():
        total = sum(samples.values())
        cpu = next(
            (r["server_cpu_us_per_review"] for r in rows if r["server"] == mode and r["concurrency"] == 64),
            None,
        )
        out[mode] = {
            "samples": total,
            "problem": problem,
            "cpu_us_per_review_64": cpu,
            "stages": {
                name: {
                    "share": count / total,
                    "us_per_review": None if cpu is None else cpu * count / total,
                }
                for name, count in samples.most_common()
            },
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    rc = 0
    for route in ROUTES if args.route == "both" else (args.route,):
        results = run(
            rounds=args.rounds,
            quick=args.quick,
            client=args.client,
            pin=not args.no_pin,
            bare_parser=args.bare_parser,
            bare_server=args.bare_server,
            route=route,
            webhook=args.webhook,
            unique=args.unique,
            spy=args.profile,
            log_level=args.log_level,
        )
        print(json.dumps(results, separators=(",", ":")) if args.json else render(results), flush=True)
        rc = max(rc, 1 if results["errors"] else 0)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
