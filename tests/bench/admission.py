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
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.bench import admission_data, admission_profile, common
from tests.bench.admission_client import CLIENTS, CONCURRENCY, loadavg, measure
from tests.bench.admission_report import print_profile, profile_rows, render, summarise
from tests.bench.admission_server import BARE_PARSERS, BARE_SERVERS
from tests.bench.admission_servers import (
    SERVERS,
    WEBHOOK,
    Server,
    make_tls,
    start_server,
    stop_servers,
    wait_listening,
)

REQUESTS = {8: 1000, 64: 2000}  # per server and round
QUICK_REQUESTS = {8: 150, 64: 300}
ROUNDS = 7
QUICK_ROUNDS = 3
ROUTES = ("validate", "mutate")
WEBHOOKS = ("serve", "app")
PROFILE_ENV = "NODEGATE_BENCH_PROFILE"


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
            load_before = loadavg()
            started = time.perf_counter()
            try:
                levels = asyncio.run(
                    measure({s.mode: s for s in servers}, client_ctx, requests, rounds, client, unique)
                )
            finally:
                for recording in recordings:
                    recording.stop()
            timed = time.perf_counter() - started
            load_after = loadavg()
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
        results["profile"] = profile_rows(profile, results["rows"])
    return results


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
