"""Benchmark of the join service end to end (HTTPS, ``nodegate serve``) against its crypto floor.

What is measured, all in one run:

Server   ``python -m bootstrap.cli serve --config FILE --port-file F`` (what ``nodegate serve``
         runs) as a subprocess pinned to CPU 0: TLS with its self-issued certificate, the sqlite
         store in a temporary state_dir (WAL, synchronous=FULL: one fsync per join), enrollment
         tofu, PCR policy empty (quote checked, values recorded), no cluster, access log off.
         ``limits.join_rate`` / ``join_burst`` are raised to 1e6 so the per-address rate limiter
         (every request comes from 127.0.0.1) never answers 429; ``max_inflight`` is the default.
Variants two servers, one after the other, each trusting its nodes one way:
  chain      every node sends an EK certificate issued by a software manufacturer CA
             (``tests.support.service.EkCa``, ECDSA P-384 root) listed in ``ek_roots``: what a fleet uses
  allowlist  no EK certificate; ``ek_allowlist`` holds the SHA-256 of every soft EK of the run
Nodes    ``tests.support.softnode.SoftNode`` on ``tests.support.softtpm`` TPMs: an ECC P-256 EK
         (``--ek rsa`` for RSA-2048) and an ECC P-256 AK whose private keys this process holds, producing
         the TPM
         structures swtpm produces (pinned byte for byte by tests/attest/test_softtpm.py), and a P-256
         node key with its CSR. All are built before anything is timed; every join uses a node
         the server has never seen (a new EK, AK and name).
Client   this process, pinned to the other CPU(s): one asyncio loop, per concurrency C one
         ``aiohttp.ClientSession`` with ``TCPConnector(limit=C)`` and C workers, so C keep-alive
         TLS connections, one per simulated node in flight (closed loop). One join is POST
         /v1/join/start, ActivateCredential and Quote on the soft TPM, POST /v1/join/finish; its
         latency runs from sending start to reading finish (the client's TPM work included).
         Every answer is checked (HTTP 200, the expected SPIFFE ID, a PEM SVID; the first SVID
         of each batch is parsed and its key compared with the node key); anything else is an
         error, counted and shown (the run's numbers are then suspect, exit code 1).
Floor    per variant and round, in this process pinned to the server's CPU while the server idles:
         the public-key work one join needs, back to back, for nodes new to attest's key caches
         (``tpm.clear_caches()`` before each join; within a join the caches work as in the
         server, which parses the EK once for verify_ek and MakeCredential and the AK once at
         start for the quote at finish):
           ``tpm.verify_ek`` (chain: certificate parsed, chain to the same roots as the server;
           allowlist: the allowlisted path with a one-entry allowlist, i.e. an O(1) lookup),
           ``tpm.verify_ak``, ``parse_node_csr`` (CSR signature), ``tpm.make_credential``
           (ECDH or RSA-OAEP to the EK), ``tpm.verify_quote`` (ECDSA), ``svid.issue_svid``
           (ECDSA with the service's own CA key, loaded from its state_dir).
         Floor joins/s = 1 / (sum of those per join). Not in the floor: TLS, HTTP, JSON,
         pydantic, the sealed session (AES-GCM), the proof HMAC, sqlite, the response.
Memory   on the chain server after the load: its VmRSS before and after S calls of
         /v1/join/start (distinct new nodes, 32 in flight) that are never finished; S = 10,000
         (2,000 with --quick). Sessions are sealed tokens the client holds, so the server should
         keep nothing per session beyond attest's bounded key caches (4,096 entries each).
swtpm    one real ``nodegate join`` (``bootstrap.node.join.join`` through ``bootstrap.node.tpm``)
         from a swtpm with its RSA EK certificate, against the chain server (the swtpm local CA
         is in its ek_roots too): the soft TPMs' output is accepted by the server the same way.

Method: per variant and concurrency (1, 8, 32) a warm-up batch (every connection made, TLS
handshakes done), then R rounds; each round is one batch of N joins followed by one floor batch.

How to read the table:
  joins/s        median over rounds of N / wall time of the batch
  p50, p99       latency of one join, over all timed joins of all rounds (pooled)
  srv CPU        the server process's CPU time per join (user + system of all its threads, from
                 /proc, clock ticks of 10 ms: coarse in --quick), median over rounds; srv % is
                 its CPU time / wall time (100 % = the server's core is saturated)
  cli %          this process's CPU time / wall time (near 100 % = the client limits)
  vs floor       joins/s / floor joins/s, median of per-round ratios (target >= 0.50x)
  floor/srv      floor time / server CPU per join: the share of the server's CPU that is the
                 unavoidable public-key work (what the ratio would be with the server saturated)
The target is reported, never asserted.

``NODEGATE_BENCH_PROFILE=DIR`` runs the servers under cProfile (DIR/join-<variant>.prof, top
functions printed to stderr); such a run's numbers are slowed by it.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import gc
import json
import os
import platform
import pstats
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("TSS2_LOG", "all+none")  # before anything loads libtss2

import aiohttp
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from attest import ca, svid, tpm
from attest.csr import parse_node_csr
from bootstrap.config import Settings, settings_from_obj
from bootstrap.service.join.flow import EkTrust, load_ek_trust
from bootstrap.service.pki.authority import CaStore
from tests.bench import common
from tests.support.service import EkCa
from tests.support.softnode import SoftNode
from tests.support.softtpm import EkKind, soft_pool

CONCURRENCY = (1, 8, 32)
JOINS = {1: 100, 8: 300, 32: 400}  # per round
QUICK_JOINS = {1: 20, 8: 60, 32: 100}
ROUNDS = 5
QUICK_ROUNDS = 2
FLOOR_JOINS = 100  # per floor batch
QUICK_FLOOR_JOINS = 30
FLOOR_NODES = 50  # distinct nodes the floor cycles through (caches are cleared per join anyway)
SESSIONS = 10_000
QUICK_SESSIONS = 2_000
SESSION_CONCURRENCY = 32
VARIANTS = ("chain", "allowlist")
CHAIN, ALLOWLIST = VARIANTS
TARGET = 0.50
TRUST_DOMAIN = "bench.nodegate.test"
SELECTION = "sha256:0,1,2,3,4,5,6,7"  # the service's default pcr_policy selection (checked below)
START_SECONDS = 60.0
HEADERS = {"Content-Type": "application/json"}
PROFILE_ENV = "NODEGATE_BENCH_PROFILE"
ROOT = Path(__file__).resolve().parents[2]
OPS = ("verify_ek", "verify_ak", "parse_node_csr", "make_credential", "verify_quote", "issue_svid")


# ------------------------------------------------------------------------------------------
# CPUs


def _cpus() -> tuple[set[int], set[int], set[int]]:
    """(all usable, server, client) CPUs: the server gets the first, the client the rest."""
    return (common.usable_cpus(), *common.split_cpus())


# ------------------------------------------------------------------------------------------
# Nodes


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


# ------------------------------------------------------------------------------------------
# Server process


@dataclass
class Server:
    variant: str
    workdir: Path
    settings: Settings
    proc: subprocess.Popen[bytes]
    log: Path
    port_file: Path
    profile: Path | None
    port: int = 0
    admission_port: int = 0  # the webhooks' own listener (admission.listen)

    @property
    def base(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def admission_base(self) -> str:
        return f"https://127.0.0.1:{self.admission_port}"

    def cpu_seconds(self) -> float | None:
        """User + system CPU time of the server process (all threads) so far; None off Linux."""
        try:
            stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        except OSError:
            return None
        fields = stat[stat.rindex(")") + 2 :].split()  # fields 3.. of proc(5); utime, stime: 14, 15
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_kib(self) -> int | None:
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        except OSError:
            return None
        return None

    def tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-2000:]
        except OSError:
            return ""


def server_config(workdir: Path, variant: str, ek_roots: list[Path], allowlist: list[str]) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "trust_domain": TRUST_DOMAIN,
        "listen": "127.0.0.1:0",
        "admission": {"listen": "127.0.0.1:0"},
        "state_dir": str(workdir / "state"),
        "store": "sqlite",
        "server_names": ["localhost", "127.0.0.1"],
        # Every request comes from 127.0.0.1: the per-address limiter would otherwise be measured.
        "limits": {"join_rate": 1e6, "join_burst": 1_000_000},
    }
    if variant == CHAIN:
        doc["ek_roots"] = [str(p) for p in ek_roots]
    else:
        doc["ek_allowlist"] = allowlist
    return doc


def start_server(
    variant: str, workdir: Path, doc: dict[str, Any], cpus: set[int], profile_dir: Path | None
) -> Server:
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "config.yaml"
    config.write_text(yaml.safe_dump(doc, sort_keys=False))
    settings = settings_from_obj(doc)
    if settings.pcr_policy.selection != SELECTION:
        raise RuntimeError(f"the service quotes {settings.pcr_policy.selection}, the floor {SELECTION}")
    port_file, log = workdir / "port", workdir / "server.log"
    profile = profile_dir / f"join-{variant}.prof" if profile_dir else None
    cmd = [sys.executable]
    if profile is not None:
        cmd += ["-m", "cProfile", "-o", str(profile)]
    admission_port_file = workdir / "admission-port"  # written before the port file
    cmd += ["-m", "bootstrap.cli", "serve", "--config", str(config), "--port-file", str(port_file)]
    cmd += ["--admission-port-file", str(admission_port_file)]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(proc.pid, cpus)  # before it starts threads: they inherit it
    server = Server(variant, workdir, settings, proc, log, port_file, profile)
    deadline = time.monotonic() + START_SECONDS
    while not port_file.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"{variant} server exited with {proc.returncode}:\n{server.tail()}")
        if time.monotonic() > deadline:
            stop_server(server)
            raise RuntimeError(f"{variant} server did not listen within {START_SECONDS:.0f} s")
        time.sleep(0.02)
    server.port = int(port_file.read_text())
    server.admission_port = int(admission_port_file.read_text())
    return server


def stop_server(server: Server) -> None:
    if server.proc.poll() is None:
        server.proc.terminate()
    try:
        server.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()


def service_ca(server: Server) -> ca.CaSet:
    """The CA the server created in its state_dir: its roots for TLS, its signer for the floor."""
    return CaStore(server.settings.state_dir / "ca", TRUST_DOMAIN).load()


def client_tls(cas: ca.CaSet) -> ssl.SSLContext:
    roots = svid.bundle_pem(cas.roots(dt.datetime.now(dt.UTC))).decode()
    ctx = ssl.create_default_context(cadata=roots)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


# ------------------------------------------------------------------------------------------
# Load


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


def _session(concurrency: int, tls: ssl.SSLContext) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=concurrency, ssl=tls),
        timeout=aiohttp.ClientTimeout(total=120),
        cookie_jar=aiohttp.DummyCookieJar(),
    )


# ------------------------------------------------------------------------------------------
# Floor


@dataclass(frozen=True)
class FloorInput:
    ek_public: bytes
    ek_certificate: bytes | None
    allowlist: frozenset[str]
    ak_public: bytes
    csr_pem: str
    node_name: str
    quote: bytes
    signature: bytes
    pcrs: dict[str, dict[int, bytes]]
    qualifying_data: bytes
    spiffe_id: svid.SpiffeId


def floor_inputs(nodes: list[Prepared], variant: str) -> list[FloorInput]:
    out: list[FloorInput] = []
    for p in nodes:
        soft = p.node.tpm
        qualifying = os.urandom(32)
        quote, signature, pcrs = soft.quote(SELECTION, qualifying)
        out.append(
            FloorInput(
                ek_public=soft.ek_public,
                ek_certificate=p.node.ek_certificate if variant == CHAIN else None,
                allowlist=frozenset({soft.ek_sha256}) if variant == ALLOWLIST else frozenset(),
                ak_public=soft.ak_public,
                csr_pem=p.node.csr_pem.decode(),
                node_name=p.node.name,
                quote=quote,
                signature=signature,
                pcrs=pcrs,
                qualifying_data=qualifying,
                spiffe_id=svid.parse_spiffe_id(p.spiffe_id),
            )
        )
    return out


def floor_batch(inputs: list[FloorInput], joins: int, trust: EkTrust, signer: ca.Authority) -> list[float]:
    """Mean ns per join of each public-key step (in OPS order) over ``joins`` back-to-back joins."""
    totals = [0] * len(OPS)
    clock = time.perf_counter_ns
    now = dt.datetime.now(dt.UTC)
    ttl = dt.timedelta(hours=1)
    roots, intermediates = trust.roots, trust.intermediates
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for i in range(joins):
            f = inputs[i % len(inputs)]
            tpm.clear_caches()  # a node the service has never seen
            t0 = clock()
            tpm.verify_ek(
                f.ek_public,
                f.ek_certificate,
                roots=roots,
                intermediates=intermediates,
                allowlist=f.allowlist,
                now=now,
            )
            t1 = clock()
            ak = tpm.verify_ak(f.ak_public)
            t2 = clock()
            csr = parse_node_csr(f.csr_pem, f.node_name)
            t3 = clock()
            tpm.make_credential(f.ek_public, ak.name, os.urandom(32))
            t4 = clock()
            tpm.verify_quote(
                f.ak_public,
                f.quote,
                f.signature,
                selection=SELECTION,
                pcrs=f.pcrs,
                qualifying_data=f.qualifying_data,
            )
            t5 = clock()
            svid.issue_svid(signer, spiffe_id=f.spiffe_id, public_key=csr.public_key, now=now, ttl=ttl)
            t6 = clock()
            for k, (a, b) in enumerate(((t0, t1), (t1, t2), (t2, t3), (t3, t4), (t4, t5), (t5, t6))):
                totals[k] += b - a
    finally:
        if gc_was_enabled:
            gc.enable()
    return [t / joins for t in totals]


def allowlist_cost(f: FloorInput, allowlist: frozenset[str], calls: int = 50) -> dict[str, float]:
    """verify_ek (allowlisted, EK cached) with the server's allowlist vs a one-entry one, µs."""
    out: dict[str, float] = {}
    allowlist = allowlist | f.allowlist  # the floor's node is not one the server admits
    for label, entries in (("server_allowlist_us", allowlist), ("one_entry_us", f.allowlist)):
        tpm.verify_ek(f.ek_public, None, roots=(), allowlist=entries)
        started = time.perf_counter_ns()
        for _ in range(calls):
            tpm.verify_ek(f.ek_public, None, roots=(), allowlist=entries)
        out[label] = (time.perf_counter_ns() - started) / calls / 1000
    out["entries"] = len(allowlist)
    return out


# ------------------------------------------------------------------------------------------
# One variant


@dataclass
class Level:
    concurrency: int
    joins: int
    warmup: int
    batches: list[Batch] = field(default_factory=list)
    floors: list[list[float]] = field(default_factory=list)  # per round: ns per join per op
    warmup_errors: list[str] = field(default_factory=list)


@dataclass
class VariantResult:
    variant: str
    levels: list[Level]
    floor_nodes: int
    allowlist: dict[str, float] | None = None
    memory: dict[str, Any] | None = None
    swtpm: dict[str, Any] | None = None
    rss_start_kib: int | None = None
    rss_end_kib: int | None = None


async def measure_variant(
    server: Server,
    nodes: dict[int, list[Prepared]],
    floor: list[FloorInput],
    joins: dict[int, int],
    rounds: int,
    floor_joins: int,
    server_cpus: set[int],
) -> VariantResult:
    cas = service_ca(server)
    tls = client_tls(cas)
    trust = load_ek_trust(server.settings)
    result = VariantResult(server.variant, [], len(floor))
    for concurrency in CONCURRENCY:
        pool = nodes[concurrency]
        level = Level(concurrency, joins[concurrency], warmup=len(pool) - rounds * joins[concurrency])
        async with _session(concurrency, tls) as http:
            warm = await run_batch(http, server, pool[: level.warmup], concurrency)
            level.warmup_errors = warm.errors
            if result.rss_start_kib is None:
                result.rss_start_kib = server.rss_kib()
            for r in range(rounds):
                lo = level.warmup + r * level.joins
                level.batches.append(await run_batch(http, server, pool[lo : lo + level.joins], concurrency))
                with common.pinned(server_cpus):  # on the server's core, while the server idles
                    level.floors.append(floor_batch(floor, floor_joins, trust, cas.signer))
        result.levels.append(level)
    result.rss_end_kib = server.rss_kib()
    return result


async def measure_sessions(server: Server, nodes: list[Prepared]) -> dict[str, Any]:
    """RSS of the server before and after join starts for ``nodes`` (but the first
    SESSION_CONCURRENCY, which open the connections) that are never finished."""
    tls = client_tls(service_ca(server))
    tokens: list[int] = []  # token sizes of the held sessions
    answers: list[int] = []  # sizes of the start answers
    errors: list[str] = []

    async def start(http: aiohttp.ClientSession, p: Prepared) -> None:
        try:
            async with http.post(f"{server.base}/v1/join/start", data=p.start, headers=HEADERS) as resp:
                raw, status = await resp.read(), resp.status
            if status != 200:
                errors.append(f"start HTTP {status}: {raw[:200]!r}")
                return
            tokens.append(len(json.loads(raw)["session"]))
            answers.append(len(raw))
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as exc:
            errors.append(f"{type(exc).__name__}: {exc}"[:300])

    warm, held = nodes[:SESSION_CONCURRENCY], nodes[SESSION_CONCURRENCY:]
    async with _session(SESSION_CONCURRENCY, tls) as http:
        await asyncio.gather(*(start(http, p) for p in warm))  # every connection up first
        tokens.clear()
        answers.clear()
        todo = iter(held)

        async def worker() -> None:
            for p in todo:
                await start(http, p)

        before = server.rss_kib()
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(SESSION_CONCURRENCY)))
        wall = time.perf_counter() - started
        after = server.rss_kib()
    return {
        "sessions": len(held),
        "ok": len(tokens),
        "errors": errors,
        "rss_before_kib": before,
        "rss_after_kib": after,
        "rss_growth_kib": None if before is None or after is None else after - before,
        "token_bytes_median": statistics.median(tokens) if tokens else None,
        "token_bytes_max": max(tokens) if tokens else None,
        "start_response_bytes_median": statistics.median(answers) if answers else None,
        "starts_per_s": len(tokens) / wall if wall > 0 else None,
    }


# ------------------------------------------------------------------------------------------
# swtpm


@dataclass
class SwtpmSetup:
    roots_file: Path | None
    stop: Any  # callable stopping the swtpm, or None
    tcti: str
    note: str


def setup_swtpm(workdir: Path) -> SwtpmSetup:
    """A manufactured swtpm and a PEM file with its local CA (root + intermediate)."""
    from bootstrap.demo import swtpm

    try:
        local = swtpm.make_ca(workdir / "xdg")
        swtpm.manufacture(local, workdir / "tpm")
        running = swtpm.start(local, workdir / "tpm")
    except (swtpm.SwtpmMissing, subprocess.CalledProcessError, RuntimeError, OSError) as exc:
        return SwtpmSetup(None, None, "", f"swtpm unavailable: {str(exc)[:200]}")
    pem = workdir / "swtpm-localca.pem"
    pem.write_bytes(
        local.root.public_bytes(serialization.Encoding.PEM)
        + local.intermediate.public_bytes(serialization.Encoding.PEM)
    )
    return SwtpmSetup(pem, running.stop, running.tcti, "")


async def swtpm_join(server: Server, setup: SwtpmSetup) -> dict[str, Any]:
    """One real ``nodegate join`` from the swtpm against the benchmark's chain server."""
    if setup.roots_file is None:
        return {"ok": None, "note": setup.note}
    from bootstrap.node import join as joinclient

    bundle = server.workdir / "service-bundle.pem"
    bundle.write_bytes(svid.bundle_pem(service_ca(server).roots(dt.datetime.now(dt.UTC))))
    opts = joinclient.JoinOptions(
        server=server.base,
        ca_bundle=bundle,
        node_name="swtpm-node",
        tcti=setup.tcti,
        out=server.workdir / "swtpm-node",
        ek_kind="rsa",
        attempts=1,
    )
    started = time.perf_counter()
    try:
        joined = await joinclient.join(opts)
    except joinclient.JoinFailed as exc:
        return {"ok": False, "note": f"refused: {exc.code}: {exc.detail}"}
    took = time.perf_counter() - started
    return {"ok": True, "spiffe_id": joined.spiffe_id, "seconds": round(took, 2), "note": "RSA-2048 EK"}


# ------------------------------------------------------------------------------------------
# Results


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def summarise_variant(v: VariantResult) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    rows: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    all_floors = [f for level in v.levels for f in level.floors]
    op_us = {op: statistics.median(f[k] for f in all_floors) / 1000 for k, op in enumerate(OPS)}
    floor_us = statistics.median(sum(f) for f in all_floors) / 1000
    for level in v.levels:
        batches = level.batches
        pooled = [ns for b in batches for ns in b.latencies_ns]
        errs = [e for b in batches for e in b.errors]
        floor_per_s = [1e9 / sum(f) for f in level.floors]
        ratios = [b.throughput / f for b, f in zip(batches, floor_per_s, strict=True)]
        srv = [None if b.server_cpu_s is None else b.server_cpu_s / b.joins for b in batches]
        floor_share = [
            None if s is None or s == 0 else (sum(f) / 1e9) / s
            for s, f in zip(srv, level.floors, strict=True)
        ]
        srv_us = _median(srv)
        rows.append(
            {
                "concurrency": level.concurrency,
                "joins_per_round": level.joins,
                "warmup": level.warmup,
                "rounds": len(batches),
                "joins_per_s": statistics.median(b.throughput for b in batches),
                "joins_per_s_rounds": [round(b.throughput, 1) for b in batches],
                "p50_ms": common.percentile(pooled, 0.50) / 1e6 if pooled else None,
                "p99_ms": common.percentile(pooled, 0.99) / 1e6 if pooled else None,
                "server_cpu_us_per_join": None if srv_us is None else srv_us * 1e6,
                "server_cpu_share": _median(
                    [None if b.server_cpu_s is None else b.server_cpu_s / b.wall_s for b in batches]
                ),
                "client_cpu_share": statistics.median(b.client_cpu_s / b.wall_s for b in batches),
                "floor_joins_per_s": statistics.median(floor_per_s),
                "vs_floor": statistics.median(ratios),
                "vs_floor_rounds": [round(r, 3) for r in ratios],
                "floor_over_server_cpu": _median(floor_share),
                "errors": len(errs),
                "warmup_errors": len(level.warmup_errors),
            }
        )
        for phase, found in (("timed", errs), ("warm-up", level.warmup_errors)):
            if found:
                errors.append(
                    {
                        "variant": v.variant,
                        "concurrency": level.concurrency,
                        "phase": phase,
                        "count": len(found),
                        "first": sorted(set(found))[:5],
                    }
                )
    if v.memory and v.memory["errors"]:
        errors.append(
            {
                "variant": v.variant,
                "concurrency": SESSION_CONCURRENCY,
                "phase": "sessions",
                "count": len(v.memory["errors"]),
                "first": sorted(set(v.memory["errors"]))[:5],
            }
        )
    memory = None if v.memory is None else {k: x for k, x in v.memory.items() if k != "errors"}
    out = {
        "variant": v.variant,
        "floor_us_per_join": floor_us,
        "floor_joins_per_s": 1e6 / floor_us,
        "floor_op_us": op_us,
        "floor_nodes": v.floor_nodes,
        "rows": rows,
        "allowlist_cost": v.allowlist,
        "memory": memory,
        "swtpm": v.swtpm,
        "rss_start_kib": v.rss_start_kib,
        "rss_end_kib": v.rss_end_kib,
    }
    return out, errors


def summarise(variants: list[VariantResult], config: dict[str, Any]) -> dict[str, Any]:
    out: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    targets: list[dict[str, Any]] = []
    for v in variants:
        summary, errs = summarise_variant(v)
        out.append(summary)
        errors += errs
        top = max(summary["rows"], key=lambda r: r["concurrency"])
        value = top["vs_floor"]
        targets.append(
            {
                "variant": v.variant,
                "concurrency": top["concurrency"],
                "metric": "end-to-end joins/s vs floor",
                "value": value,
                "op": ">=",
                "threshold": TARGET,
                "met": value >= TARGET,
            }
        )
    by_variant = {v["variant"]: v for v in out}
    if CHAIN in by_variant and ALLOWLIST in by_variant:
        # The issue's own definition: simulated nodes on the allowlist, against a floor that
        # lists the EK chain among the public-key operations of one join. Reported beside the
        # like-for-like ratios above, not instead of them.
        top = max(by_variant[ALLOWLIST]["rows"], key=lambda r: r["concurrency"])
        value = top["joins_per_s"] / by_variant[CHAIN]["floor_joins_per_s"]
        targets.append(
            {
                "variant": "issue",
                "concurrency": top["concurrency"],
                "metric": "allowlisted joins/s vs the floor with the EK chain (the issue's wording)",
                "value": value,
                "op": ">=",
                "threshold": TARGET,
                "met": value >= TARGET,
            }
        )
    return {
        "benchmark": "join",
        "environment": _environment(),
        "config": config,
        "variants": out,
        "targets": targets,
        "errors": errors,
    }


def _environment() -> dict[str, Any]:
    versions = common.versions(("aiohttp", "cryptography", "pydantic", "nodegate"))
    usable, server, client = _cpus()
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "usable_cpus": sorted(usable),
        "server_cpus": sorted(server),
        "client_cpus": sorted(client),
        "openssl": ssl.OPENSSL_VERSION,
        "versions": versions,
    }


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def _mib(kib: float | None) -> str:
    return "-" if kib is None else f"{kib / 1024:.1f} MiB"


def render(results: dict[str, Any]) -> str:
    env, config = results["environment"], results["config"]
    lines = [
        "join benchmark: nodegate serve over HTTPS vs the public-key floor of one join",
        f"  Python {env['python']} ({env['implementation']}, {env['machine']}), {env['cpus']} CPUs; "
        f"server on CPU {env['server_cpus']}, client on {env['client_cpus']}; {env['openssl']}",
        "  " + ", ".join(f"{k} {v}" for k, v in env["versions"].items()),
        f"  soft TPMs: {config['ek'].upper()} EK, ECC P-256 AK, P-256 node key; sqlite store "
        "(synchronous=FULL); rate limit raised to 1e6/s; one keep-alive TLS connection per node in flight",
        f"  {config['rounds']} rounds per concurrency (joins per round in brackets), each followed by a "
        f"floor batch of {config['floor_joins']} joins; load part {config['timed_seconds']} s",
        "  joins/s: median over rounds; p50/p99: pooled over rounds; srv CPU: server CPU µs per join;",
        "  vs floor: joins/s / floor joins/s, median of per-round ratios; floor/srv: floor time / srv CPU",
    ]
    if config["profile_dir"]:
        lines.append(
            f"  PROFILING ON (cProfile in the servers, stats in {config['profile_dir']}): slowed numbers"
        )
    header = (
        f"  {'conc':>4} {'joins/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'srv µs':>8} {'srv %':>6} "
        f"{'cli %':>6} {'floor/s':>8} {'vs floor':>9} {'floor/srv':>10} {'errors':>7}"
    )
    for v in results["variants"]:
        trust = (
            "EK certificate -> EkCa P-384 root (ek_roots)"
            if v["variant"] == CHAIN
            else "EK SHA-256 in ek_allowlist, no certificate"
        )
        ops = ", ".join(f"{op} {us:.0f}" for op, us in v["floor_op_us"].items())
        lines += [
            "",
            f"{v['variant']}: {trust}",
            f"  floor {v['floor_us_per_join']:,.0f} µs/join = {v['floor_joins_per_s']:,.0f} joins/s"
            f" ({ops} µs)",
            header,
        ]
        for row in v["rows"]:
            errs = row["errors"] + row["warmup_errors"]
            lines.append(
                f"  {row['concurrency']:>4} {row['joins_per_s']:>8,.0f} {_num(row['p50_ms'], '.1f'):>8} "
                f"{_num(row['p99_ms'], '.1f'):>8} {_num(row['server_cpu_us_per_join'], ',.0f'):>8} "
                f"{_pct(row['server_cpu_share']):>6} {_pct(row['client_cpu_share']):>6} "
                f"{row['floor_joins_per_s']:>8,.0f} {row['vs_floor']:>8.2f}x "
                f"{_num(row['floor_over_server_cpu'], '.2f'):>9}x {errs:>7}"
                + f"   [{row['joins_per_round']}]"
            )
        cost = v["allowlist_cost"]
        if cost:
            lines.append(
                f"  verify_ek on the allowlisted path: {cost['server_allowlist_us']:,.0f} µs with the "
                "server's "
                f"{cost['entries']:,.0f}-entry allowlist vs {cost['one_entry_us']:,.0f} µs with one entry"
            )
        mem = v["memory"]
        if mem and mem["ok"]:
            n = mem["ok"]
            token = mem["token_bytes_median"]
            lines.append(
                f"  {n:,} sessions in flight (never finished): server RSS {_mib(mem['rss_before_kib'])} -> "
                f"{_mib(mem['rss_after_kib'])} (+{_mib(mem['rss_growth_kib'])}, "
                f"{(mem['rss_growth_kib'] or 0) * 1024 / max(n, 1):,.0f} B/session incl. attest's key "
                "caches);"
            )
            lines.append(
                f"    token {token:,.0f} B, so clients hold {n * (token or 0) / 1e6:.1f} MB "
                f"(10,000 x token = {10_000 * (token or 0) / 1e6:.1f} MB); start answer "
                f"{mem['start_response_bytes_median']:,.0f} B; {mem['starts_per_s']:,.0f} starts/s"
            )
        if v["rss_start_kib"] is not None:
            lines.append(
                f"  server RSS after the first warm-up {_mib(v['rss_start_kib'])}, "
                f"after the load {_mib(v['rss_end_kib'])}"
            )
        sw = v["swtpm"]
        if sw is not None:
            if sw["ok"]:
                lines.append(f"  swtpm join: ok ({sw['note']}, {sw['spiffe_id']}, {sw['seconds']} s)")
            elif sw["ok"] is None:
                lines.append(
                    f"  swtpm join: skipped ({sw['note']}); "
                    "the byte layouts are pinned by tests/attest/test_softtpm.py"
                )
            else:
                lines.append(f"  swtpm join: FAILED ({sw['note']})")
    if results["errors"]:
        lines += ["", "ERRORS (the numbers of this run are suspect)"]
        for e in results["errors"]:
            lines.append(
                f"  {e['variant']} at {e['concurrency']} concurrent, {e['phase']}: {e['count']} errors"
            )
            lines += [f"    {msg}" for msg in e["first"]]
    lines += ["", "targets (reported, not asserted)"]
    for t in results["targets"]:
        verdict = "PASS" if t["met"] else "MISS"
        lines.append(
            f"  {verdict}  {t['variant']:<9} {t['concurrency']:>2} concurrent: {t['metric']} "
            f"{t['value']:.2f}x {t['op']} {t['threshold']:.2f}x"
        )
    return "\n".join(lines)


def print_profile(path: Path | None, top: int = 30) -> None:
    if path is None or not path.exists():
        return
    print(f"\nserver profile ({path}), top {top} by own time:", file=sys.stderr)
    stats = pstats.Stats(str(path), stream=sys.stderr)
    stats.sort_stats(pstats.SortKey.TIME).print_stats(top)
    print(f"server profile ({path}), top {top} by cumulative time:", file=sys.stderr)
    stats.sort_stats(pstats.SortKey.CUMULATIVE).print_stats(top)


# ------------------------------------------------------------------------------------------
# Entry point


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.bench", description=(__doc__ or "").split("\n")[0])
    p.add_argument("--json", action="store_true", help="print the results as one JSON object on one line")
    p.add_argument("--rounds", type=common.positive, default=ROUNDS, help=f"timed rounds (default {ROUNDS})")
    p.add_argument("--quick", action="store_true", help="a smoke run: 2 rounds of far fewer joins")
    p.add_argument("--ek", choices=("ecc", "rsa"), default="ecc", help="soft EK kind (default ecc)")
    p.add_argument("--variant", choices=(*VARIANTS, "both"), default="both", help="EK trust (default both)")
    return p


def run(
    rounds: int = ROUNDS, quick: bool = False, ek: EkKind = "ecc", variants: Sequence[str] = VARIANTS
) -> dict[str, Any]:
    if rounds < 1:
        raise ValueError("rounds must be at least 1")
    rounds = min(rounds, QUICK_ROUNDS) if quick else rounds
    joins = QUICK_JOINS if quick else JOINS
    floor_joins = QUICK_FLOOR_JOINS if quick else FLOOR_JOINS
    sessions = QUICK_SESSIONS if quick else SESSIONS
    profile_env = os.environ.get(PROFILE_ENV)
    profile_dir = Path(profile_env).resolve() if profile_env else None
    if profile_dir is not None:
        profile_dir.mkdir(parents=True, exist_ok=True)
    _usable, server_cpus, client_cpus = _cpus()
    ek_ca = EkCa.create()
    results: list[VariantResult] = []
    timed = 0.0
    built = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="nodegate-bench-join-") as tmp:
        workdir = Path(tmp)
        plans: dict[str, tuple[dict[int, list[Prepared]], list[Prepared], list[Prepared]]] = {}
        for variant in variants:
            issuer = ek_ca if variant == CHAIN else None
            by_level = {
                c: build_nodes(max(2 * c, 10) + rounds * joins[c], f"{variant}-c{c}", ek, issuer)
                for c in CONCURRENCY
            }
            for_floor = build_nodes(FLOOR_NODES, f"{variant}-floor", ek, issuer)
            held = (
                build_nodes(sessions + SESSION_CONCURRENCY, f"{variant}-held", ek, issuer)
                if variant == CHAIN
                else []
            )
            plans[variant] = (by_level, for_floor, held)
        build_s = time.perf_counter() - built
        swtpm_setup = setup_swtpm(workdir / "swtpm") if CHAIN in variants else None
        try:
            for variant in variants:
                by_level, floor_built, held = plans[variant]
                roots = [ek_ca.write(workdir / "ek-root.pem")]
                if variant == CHAIN and swtpm_setup is not None and swtpm_setup.roots_file is not None:
                    roots.append(swtpm_setup.roots_file)
                allow = sorted({p.node.tpm.ek_sha256 for nodes in by_level.values() for p in nodes})
                doc = server_config(workdir / variant, variant, roots, allow)
                server = start_server(variant, workdir / variant, doc, server_cpus, profile_dir)
                try:
                    with common.pinned(client_cpus):
                        floor = floor_inputs(floor_built, variant)
                        started = time.perf_counter()
                        result = asyncio.run(
                            measure_variant(server, by_level, floor, joins, rounds, floor_joins, server_cpus)
                        )
                        if variant == ALLOWLIST:
                            with common.pinned(server_cpus):
                                result.allowlist = allowlist_cost(floor[0], frozenset(allow))
                        if held:
                            result.memory = asyncio.run(measure_sessions(server, held))
                        timed += time.perf_counter() - started
                        if variant == CHAIN and swtpm_setup is not None:
                            result.swtpm = asyncio.run(swtpm_join(server, swtpm_setup))
                    results.append(result)
                finally:
                    stop_server(server)
                if server.proc.returncode not in (0, None):
                    print(
                        f"{variant} server exited with {server.proc.returncode}:\n{server.tail()}",
                        file=sys.stderr,
                    )
                if profile_dir is not None:
                    print_profile(server.profile)
        finally:
            if swtpm_setup is not None and swtpm_setup.stop is not None:
                swtpm_setup.stop()
    config = {
        "ek": ek,
        "variants": list(variants),
        "rounds": rounds,
        "concurrency": list(CONCURRENCY),
        "joins_per_round": {str(c): joins[c] for c in CONCURRENCY},
        "floor_joins": floor_joins,
        "sessions": sessions,
        "build_seconds": round(build_s, 1),
        "timed_seconds": round(timed, 1),
        "profile_dir": str(profile_dir) if profile_dir else None,
    }
    return summarise(results, config)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    variants = VARIANTS if args.variant == "both" else (args.variant,)
    results = run(rounds=args.rounds, quick=args.quick, ek=args.ek, variants=variants)
    print(json.dumps(results, separators=(",", ":")) if args.json else render(results), flush=True)
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
