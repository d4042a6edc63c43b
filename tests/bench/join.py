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
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("TSS2_LOG", "all+none")  # before anything loads libtss2

from tests.bench import common
from tests.bench.join_floor import allowlist_cost, floor_inputs
from tests.bench.join_load import Prepared, build_nodes
from tests.bench.join_measure import (
    CONCURRENCY,
    SESSION_CONCURRENCY,
    VariantResult,
    measure_sessions,
    measure_variant,
)
from tests.bench.join_report import print_profile, render, summarise
from tests.bench.join_servers import (
    ALLOWLIST,
    CHAIN,
    VARIANTS,
    bench_cpus,
    server_config,
    start_server,
    stop_server,
)
from tests.bench.join_swtpm import setup_swtpm, swtpm_join
from tests.support.service import EkCa
from tests.support.softtpm import EkKind

JOINS = {1: 100, 8: 300, 32: 400}  # per round
QUICK_JOINS = {1: 20, 8: 60, 32: 100}
ROUNDS = 5
QUICK_ROUNDS = 2
FLOOR_JOINS = 100  # per floor batch
QUICK_FLOOR_JOINS = 30
FLOOR_NODES = 50  # distinct nodes the floor cycles through (caches are cleared per join anyway)
SESSIONS = 10_000
QUICK_SESSIONS = 2_000
PROFILE_ENV = "NODEGATE_BENCH_PROFILE"


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
    _usable, server_cpus, client_cpus = bench_cpus()
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
