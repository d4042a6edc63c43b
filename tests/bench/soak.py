"""Soak of ``nodegate serve``: joins, renewals and webhook reviews for minutes, quiet and next to
misbehaving clients, in one invocation.

Server   ``python -m bootstrap.cli serve`` as in the join benchmark (``tests.bench.join``: sqlite
         store, self-issued TLS, soft-TPM EK roots), pinned to CPU 0, with the admission
         benchmark's PackagePolicies and RBAC as files (``tests.bench.admission_data``), the
         default limits (``max_inflight`` 256, 64 connections per address) and the rate limiter
         raised out of the way. A fresh server per phase.
Genuine  this process, pinned to the other CPU(s), from 127.0.0.2, closed loops for the phase:
         JOINERS workers re-joining a pool of soft-TPM nodes (start, ActivateCredential, quote,
         finish), RENEWERS workers each renewing its own node over mTLS (both steps, a new key
         each time, a new TLS connection with the current SVID), REVIEWERS workers posting
         AdmissionReviews (the admission benchmark's mix) on keep-alive connections.
Abusers  in the abused phase only, from 127.0.0.1, as the adversarial run of issue 16 did:
         SLOW_BODIES connections sending ``POST /v1/join/start`` headers with Content-Length 1000
         and 10 bytes, then nothing, reconnecting once cut; SLOWLORIS connections sending half
         the headers; ABORTERS closing mid-body over and over; BAD_ENCODINGS posting gzip
         headers over bodies that are not gzip (expecting 415). Bounded: at most 62 connections
         at once, nothing after the phase ends, loopback only.
Report   per phase and operation: completed operations, throughput (per second of the phase),
         p50 and p99 latency, errors (anything but the expected answer); the abused phase's
         throughput and p99 as ratios of the quiet phase's; what the abusers got. Exit 1 when a
         genuine operation failed. Targets are reported, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime as dt
import json
import random
import ssl
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from cryptography.hazmat.primitives import serialization

from attest import svid
from tests.bench import admission_data, common
from tests.bench.join_load import HEADERS, Prepared, build_nodes
from tests.bench.join_servers import (
    CHAIN,
    Server,
    client_tls,
    server_config,
    service_ca,
    start_server,
    stop_server,
)
from tests.support.service import EkCa
from tests.support.softnode import SoftNode

PHASE_SECONDS = 120.0
QUICK_PHASE_SECONDS = 15.0
JOINERS, RENEWERS, REVIEWERS = 4, 4, 4
JOIN_POOL = 64  # nodes the joiners re-join in turn (same TPM, a new session each time)
SLOW_BODIES, SLOWLORIS, ABORTERS, BAD_ENCODINGS = 48, 8, 4, 2
GENUINE, ABUSER = "127.0.0.2", "127.0.0.1"
OPS = ("join", "renew", "review")


@dataclass
class Ops:
    latencies_ns: dict[str, list[int]] = field(default_factory=lambda: {op: [] for op in OPS})
    errors: dict[str, list[str]] = field(default_factory=lambda: {op: [] for op in OPS})
    abuse: dict[str, int] = field(default_factory=dict)

    def bump(self, what: str) -> None:
        self.abuse[what] = self.abuse.get(what, 0) + 1


# ------------------------------------------------------------------------------------------
# Genuine clients


def _session(tls: ssl.SSLContext, limit: int = 1) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=tls, limit=limit, local_addr=(GENUINE, 0)),
        timeout=aiohttp.ClientTimeout(total=60),
        cookie_jar=aiohttp.DummyCookieJar(),
    )


async def _post(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body, separators=(",", ":")).encode()
    async with http.post(url, data=data, headers=HEADERS) as resp:
        raw = await resp.read()
        return resp.status, json.loads(raw) if raw else None


async def _join(http: aiohttp.ClientSession, base: str, p: Prepared) -> str | None:
    status, start = await _post(http, f"{base}/v1/join/start", p.start)
    if status != 200:
        return f"start {status}: {str(start)[:160]}"
    status, out = await _post(http, f"{base}/v1/join/finish", p.node.finish_body(start))
    return (
        None
        if status == 200 and out.get("spiffe_id") == p.spiffe_id
        else f"finish {status}: {str(out)[:160]}"
    )


@dataclass
class Renewer:
    node: SoftNode
    folder: Path
    cert_pem: bytes

    def tls(self, cas_pem: str) -> ssl.SSLContext:
        """The current SVID as the TLS client certificate (the ssl module loads it from files)."""
        cert, key = self.folder / "svid.pem", self.folder / "node.key"
        key.write_bytes(
            self.node.key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        cert.write_bytes(self.cert_pem)
        ctx = ssl.create_default_context(cadata=cas_pem)
        ctx.load_cert_chain(cert, key)
        return ctx

    async def renew(self, base: str, cas_pem: str) -> str | None:
        fresh = SoftNode(self.node.tpm, self.node.name, self.node.ek_certificate)
        url = f"{base}/v1/nodes/self/renew"
        async with _session(self.tls(cas_pem)) as http:
            status, start = await _post(http, url, {"csr": fresh.csr_pem.decode()})
            if status != 200:
                return f"renew start {status}: {str(start)[:160]}"
            body = fresh.evidence(start["session"], base64.b64decode(start["nonce"]), start["pcr_selection"])
            status, out = await _post(http, url, body)
        if status != 200:
            return f"renew finish {status}: {str(out)[:160]}"
        self.node, self.cert_pem = fresh, out["svid"].encode()
        return None


async def _timed(ops: Ops, op: str, stop: asyncio.Event, step: Callable[[], Awaitable[str | None]]) -> None:
    clock = time.perf_counter_ns
    while not stop.is_set():
        started = clock()
        try:
            problem = await step()
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, OSError) as exc:
            problem = f"{type(exc).__name__}: {exc}"[:200]
        if stop.is_set():
            return  # finished after the phase: neither counted nor an error
        if problem is None:
            ops.latencies_ns[op].append(clock() - started)
        else:
            ops.errors[op].append(problem)


# ------------------------------------------------------------------------------------------
# Abusers (bounded: a fixed number of loops, each ending with the phase)


async def _until_closed(reader: asyncio.StreamReader, stop: asyncio.Event) -> bool:
    """True when the server closed the connection, False when the phase ended first."""
    waiter = asyncio.ensure_future(stop.wait())
    try:
        while True:
            read = asyncio.ensure_future(reader.read(4096))
            done, _ = await asyncio.wait({read, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if read not in done:
                read.cancel()
                return False
            with contextlib.suppress(ConnectionError, ssl.SSLError):
                if not read.result():
                    return True
    except (ConnectionError, ssl.SSLError):
        return True
    finally:
        waiter.cancel()


async def _abuse_stalling(
    ops: Ops, port: int, tls: ssl.SSLContext, stop: asyncio.Event, payload: bytes, what: str
) -> None:
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=tls, server_hostname="127.0.0.1", local_addr=(ABUSER, 0)
            )
        except (ConnectionError, ssl.SSLError, OSError):
            ops.bump(f"{what} refused")
            await asyncio.sleep(0.05)  # pacing the reconnect of a refused abuser
            continue
        try:
            writer.write(payload)
            await writer.drain()
            if await _until_closed(reader, stop):
                ops.bump(f"{what} cut by the server")
        except (ConnectionError, ssl.SSLError):
            ops.bump(f"{what} cut by the server")
        finally:
            writer.close()


async def _abuse_aborting(ops: Ops, port: int, tls: ssl.SSLContext, stop: asyncio.Event) -> None:
    payload = (
        b"POST /v1/join/finish HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 900\r\n\r\n{"se'
    )
    while not stop.is_set():
        try:
            _reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=tls, server_hostname="127.0.0.1", local_addr=(ABUSER, 0)
            )
            writer.write(payload)
            await writer.drain()
            writer.close()
            ops.bump("aborted bodies sent")
        except (ConnectionError, ssl.SSLError, OSError):
            ops.bump("aborted bodies refused")
        await asyncio.sleep(0.01)  # pacing: about 100 aborts per second per aborter


async def _abuse_encoding(ops: Ops, base: str, tls: ssl.SSLContext, stop: asyncio.Event) -> None:
    connector = aiohttp.TCPConnector(ssl=tls, limit=1, local_addr=(ABUSER, 0))
    headers = {**HEADERS, "Content-Encoding": "gzip"}
    async with aiohttp.ClientSession(connector=connector) as http:
        while not stop.is_set():
            path = random.choice(("/v1/join/start", "/v1/join/finish", "/v1/nodes/self/renew"))
            try:
                async with http.post(f"{base}{path}", data=b'{"not": "gzip"}', headers=headers) as resp:
                    await resp.read()
                    ops.bump(f"bad encodings answered {resp.status}")
            except (aiohttp.ClientError, OSError):
                ops.bump("bad encodings refused")


def _abusers(ops: Ops, server: Server, tls: ssl.SSLContext, stop: asyncio.Event) -> list[Awaitable[None]]:
    slow = (
        b"POST /v1/join/start HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 1000\r\n\r\n{"node_nam'
    )
    loris = b"POST /v1/join/start HTTP/1.1\r\nHost: x\r\nContent-Ty"
    out: list[Awaitable[None]] = []
    out += [_abuse_stalling(ops, server.port, tls, stop, slow, "slow bodies") for _ in range(SLOW_BODIES)]
    out += [_abuse_stalling(ops, server.port, tls, stop, loris, "slowloris") for _ in range(SLOWLORIS)]
    out += [_abuse_aborting(ops, server.port, tls, stop) for _ in range(ABORTERS)]
    out += [_abuse_encoding(ops, server.base, tls, stop) for _ in range(BAD_ENCODINGS)]
    return out


# ------------------------------------------------------------------------------------------
# Phases


async def _phase(
    server: Server, pool: list[Prepared], owned: list[Prepared], folder: Path, seconds: float, abuse: bool
) -> tuple[Ops, float]:
    cas = service_ca(server)
    tls = client_tls(cas)
    cas_pem = svid.bundle_pem(cas.roots(dt.datetime.now(dt.UTC))).decode()
    renewers: list[Renewer] = []
    async with _session(tls) as http:
        for i, p in enumerate(owned):  # setup, not timed
            status, start = await _post(http, f"{server.base}/v1/join/start", p.start)
            status, out = await _post(http, f"{server.base}/v1/join/finish", p.node.finish_body(start))
            if status != 200:
                raise RuntimeError(f"setup join failed: {status} {out}")
            (folder / f"r{i}").mkdir(parents=True, exist_ok=True)
            renewers.append(Renewer(p.node, folder / f"r{i}", out["svid"].encode()))
    reviews = admission_data.requests(2000, random.Random(16))
    ops, stop = Ops(), asyncio.Event()
    todo = iter(range(10**9))

    async def joiner(http: aiohttp.ClientSession) -> None:
        await _timed(ops, "join", stop, lambda: _join(http, server.base, pool[next(todo) % len(pool)]))

    async def reviewer(http: aiohttp.ClientSession) -> None:
        async def one() -> str | None:
            r = reviews[next(todo) % len(reviews)]
            status, out = await _post(http, f"{server.admission_base}/admission/validate", r.body)
            got = out.get("response", {}).get("allowed") if isinstance(out, dict) else None
            return None if status == 200 and got is r.allowed else f"review {status}: {str(out)[:160]}"

        await _timed(ops, "review", stop, one)

    async with _session(tls, JOINERS) as join_http, _session(tls, REVIEWERS) as review_http:
        work: list[Awaitable[None]] = [joiner(join_http) for _ in range(JOINERS)]
        work += [_timed(ops, "renew", stop, lambda r=r: r.renew(server.base, cas_pem)) for r in renewers]  # type: ignore[misc]
        work += [reviewer(review_http) for _ in range(REVIEWERS)]
        if abuse:
            work += _abusers(ops, server, tls, stop)
        asyncio.get_running_loop().call_later(seconds, stop.set)
        started = time.perf_counter()
        await asyncio.gather(*work)
        elapsed = time.perf_counter() - started
    return ops, min(elapsed, seconds)


def _summary(ops: Ops, seconds: float) -> dict[str, Any]:
    out: dict[str, Any] = {"seconds": round(seconds, 1), "abusers": dict(sorted(ops.abuse.items()))}
    for op in OPS:
        lat = ops.latencies_ns[op]
        out[op] = {
            "completed": len(lat),
            "per_second": round(len(lat) / seconds, 2) if seconds else None,
            "p50_ms": round(common.percentile(lat, 0.50) / 1e6, 1) if lat else None,
            "p99_ms": round(common.percentile(lat, 0.99) / 1e6, 1) if lat else None,
            "errors": len(ops.errors[op]),
            "first_errors": ops.errors[op][:3],
        }
    return out


def run(quick: bool = False, seconds: float | None = None) -> dict[str, Any]:
    seconds = seconds or (QUICK_PHASE_SECONDS if quick else PHASE_SECONDS)
    _usable, server_cpus, client_cpus = (common.usable_cpus(), *common.split_cpus())
    ek_ca = EkCa.create()
    phases: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="nodegate-bench-soak-") as tmp:
        work = Path(tmp)
        roots = [ek_ca.write(work / "ek-root.pem")]
        policy_file, rbac_file = work / "policies.yaml", work / "rbac.yaml"
        policy_file.write_text(yaml.safe_dump_all(admission_data.POLICY_DOCS))
        rbac_file.write_text(yaml.safe_dump_all(admission_data.RBAC))
        for name, abuse in (("quiet", False), ("abused", True)):
            pool = build_nodes(JOIN_POOL, f"{name}-pool", "ecc", ek_ca)
            owned = build_nodes(RENEWERS, f"{name}-renew", "ecc", ek_ca)
            doc = server_config(work / name, CHAIN, roots, [])
            doc["admission"] = {
                **doc["admission"],
                "policy_files": [str(policy_file)],
                "rbac_files": [str(rbac_file)],
                "owner": admission_data.OWNER,
            }
            server = start_server(CHAIN, work / name, doc, server_cpus, None)
            try:
                with common.pinned(client_cpus):
                    ops, spent = asyncio.run(
                        _phase(server, pool, owned, work / name / "renewers", seconds, abuse)
                    )
            finally:
                stop_server(server)
            phases[name] = _summary(ops, spent)
    ratios = {
        op: {
            "throughput": _ratio(phases["abused"][op]["per_second"], phases["quiet"][op]["per_second"]),
            "p99": _ratio(phases["abused"][op]["p99_ms"], phases["quiet"][op]["p99_ms"]),
        }
        for op in OPS
    }
    errors = sum(phases[p][op]["errors"] for p in phases for op in OPS)
    return {
        "benchmark": "soak",
        "config": {
            "phase_seconds": seconds,
            "joiners": JOINERS,
            "renewers": RENEWERS,
            "reviewers": REVIEWERS,
            "abusers": {
                "slow_bodies": SLOW_BODIES,
                "slowloris": SLOWLORIS,
                "aborters": ABORTERS,
                "bad_encodings": BAD_ENCODINGS,
            },
            "server_cpus": sorted(server_cpus),
            "client_cpus": sorted(client_cpus),
        },
        "phases": phases,
        "abused_vs_quiet": ratios,
        "errors": errors,
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def render(results: dict[str, Any]) -> str:
    seconds = results["config"]["phase_seconds"]
    lines = [
        f"soak: {seconds:.0f} s quiet, then {seconds:.0f} s next to misbehaving clients (fresh server each)",
        f"{'phase':8} {'op':7} {'done':>7} {'per s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}",
    ]
    for name, phase in results["phases"].items():
        for op in OPS:
            row = phase[op]
            lines.append(
                f"{name:8} {op:7} {row['completed']:>7} {row['per_second'] or 0:>8.1f} "
                f"{row['p50_ms'] or 0:>8.1f} {row['p99_ms'] or 0:>8.1f} {row['errors']:>7}"
            )
    lines.append(
        "abused / quiet: "
        + ", ".join(
            f"{op} throughput {r['throughput']}x p99 {r['p99']}x"
            for op, r in results["abused_vs_quiet"].items()
        )
    )
    lines.append(
        "abusers got: " + ", ".join(f"{k} {v}" for k, v in results["phases"]["abused"]["abusers"].items())
    )
    for name, phase in results["phases"].items():
        for op in OPS:
            for e in phase[op]["first_errors"]:
                lines.append(f"  {name} {op} error: {e}")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.bench soak", description=(__doc__ or "").split("\n")[0])
    p.add_argument("--json", action="store_true", help="print the results as one JSON object on one line")
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_PHASE_SECONDS:.0f} s phases instead of {PHASE_SECONDS:.0f} s",
    )
    p.add_argument(
        "--rounds",
        type=common.positive,
        default=1,
        help="accepted for the runner; one quiet and one abused phase",
    )
    p.add_argument("--seconds", type=float, default=None, help="length of each phase")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args, _unknown = _parser().parse_known_args(argv)
    results = run(quick=args.quick, seconds=args.seconds)
    print(json.dumps(results, separators=(",", ":")) if args.json else render(results), flush=True)
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
