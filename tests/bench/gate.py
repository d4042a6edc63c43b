"""Benchmark of the hold gate (bootstrap/gate/) on a large cluster: resync cost and per-event reaction.

What is measured, all in one run:

Double   the API is kmock with tests/support/kshim.py's ShimEmulator (resourceVersions, 409s, merge patches,
         watches), run in a child process pinned to CPU 0 so that the gate's own CPU time can be
         read apart; the gate and this process run on the other CPU(s). Four changes make kmock usable
         at 10,000 objects, all in the double's process and none changing an answer: requests for a
         resource go straight to the emulator's handlers instead of through kmock's reaction
         matching (~10 ms a request whatever the cluster size), a named object is found by key
         instead of by scanning every stored object (~20 ms a request at 10,000 nodes), a merge
         patch shares what it leaves alone with the stored version instead of deep-copying it, and
         JSON is rendered by msgspec (a 1 MiB CR's status write cost ~35 ms of json.dumps). It
         also counts requests as they arrive (by client, verb and resource) instead of keeping
         them, and keeps each object's latest version only.
Load     the agent's and the operator's writes, the baseline round trips and the node watch that
         sees the verdicts run in a third process (gate_load.py, on the double's CPU), so that this
         process's CPU in the reaction phases is the gate's alone; times are the load process's
         CLOCK_MONOTONIC (send before the request, seen when its watch decoded the event).
Cluster  N nodes over 8 pools and 3 zones, 20 package CRs (10 NodeWright, 10 Skyhook; selectors by
         pool, pool In (...), zone plus Exists, NotIn and In; 1-4 packages each, fewer where they
         select more nodes, some with an interrupt), so a node is selected by ~6 CRs and carries
         their nodeState annotations (~9 packages). Each CR's status holds every selected node's
         report, as the operator writes it (status.nodeState and nodeStatus; the largest is ~1 MiB
         at 10,000 nodes, under etcd's 1.5 MiB). 10 % of the nodes (drawn at random) have one
         package in progress, the rest have all complete. Every node has a valid NodeAttestation of
         its current boot and the hold taint the join service leaves (a quarter of them also a
         foreign taint, which the CRs tolerate). The gate's stability window is 0.
Resync   per N (1,000, 2,500, 5,000, 10,000; --quick 1,000 and 2,000) a fresh cluster and a fresh
         Gate; ``reconcile_all()`` once (the first pass: it releases 90 % of the nodes and writes
         every condition and status), then R more times (R = --rounds, default 1: the steady state,
         which must write nothing; with R > 1 the median pass is shown). A 200-node cluster goes
         first, unreported: a process's first requests are slow.
         Timed: wall time, this process's CPU time (the gate with its HTTP client) and the
         double's; API calls counted by the double.
Memory   at the largest N, a fresh Gate's ``load()`` (every list: the caches a pass decides from)
         under tracemalloc (8 frames): what is still allocated afterwards from a frame in
         bootstrap/ (the gate's caches), all that is still allocated, and the traced peak; and
         this process's RSS before that N's gate, after its passes (the gate alive) and at peak
         (RSS also holds what earlier sizes freed: read the tracemalloc figures first).
Reaction at the largest N, after the resync: ``Gate.run()`` (leader election on: a Lease in the
         double); once it has decided every node and gone idle, S times (200; --quick 50; after
         10 not counted) one pending node's package completes as NodeWright writes it: the
         "agent" client merge-patches the node's nodeState annotation (the gate decides and stays
         held: the operator's report is not there yet; it is let go idle), then the operator's
         report in the CR (status.nodeState[node], through /status: the gate's watch event is the
         whole CR), and a watch on every node (opened before run()) sees that node without the
         hold taint. Reaction = from sending the status patch to that watch event. After each
         sample the gate is let finish the release (taint, Event, condition, NodeAttestation
         status) and go idle (no call in flight, nothing queued), so every sample starts from an
         idle gate. The baseline is measured between the samples (the gate idle): the agent's
         merge patch plus GET of a node-sized object nobody watches; and the status write's own
         baseline: the operator's same merge patch through /status to a copy of the same CR (same
         size, same ~1 MiB answer) under a resource nobody watches. The load reads each answer of
         the operator's CR writes whole but does not decode it and sends the parent only its size
         (a real operator decodes it on its own machine, not on the API server's or the gate's CPU).
Reboot   then, S times on released nodes: the kubelet's new boot id (a Node status patch) until
         the watch sees the hold ``unattested``; the join service's attestation of that boot
         (NodeAttestation status bootID, resetCount, attestedAt) until it sees the release; each
         against the same kind of round trip measured between the samples.
Burst    then 1,000 further pending nodes walk the operator's states at once (gate_burst.py): the
         lag from the status write carrying a node's last state to its release, the writes per
         release, and every CR's index in the gate equal to a full index of the stored CR.
Relist   then each source listed again as after a 410 Gone, until the gate is idle (no writes).
Event    first, alone in this process: the CPU of one ~1 MiB CR watch event (gate_event.py).
Phases   the gate's CPU per phase (watch decode, index, decision) and its write steps, counted by
         wrappers around its own steps (gate_phases.py), per reaction, reboot and burst node.

How to read the output:
  ms/node         wall time of a pass / N; gate CPU = this process's CPU time / N, double CPU the
                  child's (clock ticks of 10 ms: coarse in --quick); others = CPU time the rest of
                  the machine used meanwhile (anything but 0 slows the pass: trust such rows less)
  calls           the gate's API calls in the pass, by verb and resource; calls/node = all / N;
                  writes = create + patch + update + delete
  scaling         ms/node at the largest N / ms/node at the smallest (1.0 = linear); also for the
                  gate's CPU time per node. Other load on the machine moves both: see the load
                  averages printed per run (and per pass in --json)
  reaction        median, p99 (nearest rank) and max over the counted samples; "from the patch's
                  answer" starts the clock when the agent's patch is answered instead
  x round trip    reaction / the baseline's median: how many bare patch + GET round trips a
                  release costs end to end; "x status write": reaction / the status write's own
                  bare round trip (the like-for-like ratio: the same request without the gate)
  calls/reaction  the gate's API calls in the reaction phase / reactions (its GET of the node,
                  the four writes of a release, the GETs the watch events of those writes cause,
                  lease renewals)
``NODEGATE_BENCH_PROFILE=DIR`` runs both processes under cProfile (DIR/gate.prof, DIR/gate-double.prof;
the gate's top functions printed to stderr); such a run's numbers are slowed by it.

The targets at the end are reported, never asserted. Checks (a first pass that decides every node
as planned, a steady pass that writes nothing, every reaction seen) are errors: exit code 1.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import os
import pstats
import sys
import time
from collections.abc import Coroutine, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.bench import common, gate_event
from tests.bench.gate_double import Double, merge_patch
from tests.bench.gate_fleet import CR_COUNT, PENDING_SHARE, POOLS, Pending, build_cluster
from tests.bench.gate_kube import bench_settings
from tests.bench.gate_reaction import ReactionResult, measure_reaction
from tests.bench.gate_report import render, summarise
from tests.bench.gate_resync import SizeResult, measure_memory, measure_size

__all__ = ["main", "merge_patch", "run"]  # merge_patch: tests/gate/test_bench_merge_patch.py

SIZES = (1_000, 2_500, 5_000, 10_000)
QUICK_SIZES = (1_000, 2_000)
ROUNDS = 1  # steady-state passes per size: each adds ~70 s to a full run
QUICK_ROUNDS = 1
REACTIONS = 200
QUICK_REACTIONS = 50
WARMUP_NODES = 200  # a first cluster, not reported: the first requests of a process are slow
PROFILE_ENV = "NODEGATE_BENCH_PROFILE"


# ------------------------------------------------------------------------------------------
# Entry point


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.bench", description=(__doc__ or "").split("\n")[0])
    p.add_argument("--json", action="store_true", help="print the results as one JSON object on one line")
    p.add_argument(
        "--rounds",
        type=common.positive,
        default=ROUNDS,
        help=f"steady-state passes per size (default {ROUNDS})",
    )
    p.add_argument("--quick", action="store_true", help="a smoke run: 1,000 and 2,000 nodes, 50 reactions")
    p.add_argument(
        "--nodes",
        type=common.positive,
        action="append",
        help="cluster sizes to run instead of the default ones (repeatable; the last is the reaction's)",
    )
    return p


async def _measure(
    double: Double, sizes: Sequence[int], rounds: int, samples: int
) -> tuple[list[SizeResult], dict[str, Any], ReactionResult]:
    results: list[SizeResult] = []
    pending: list[Pending] = []
    await measure_size(double, WARMUP_NODES, 1)  # not reported
    for n in sizes:
        result, pending = await measure_size(double, n, rounds)
        results.append(result)
    # The largest cluster is converged now (pending nodes held, the rest released): react on it.
    reaction = await measure_reaction(double, sizes[-1], pending, samples)
    # Last: tracemalloc's snapshots leave this process's RSS high for what would come after.
    memory = await measure_memory(double)
    return results, memory, reaction


def run(rounds: int = ROUNDS, quick: bool = False, nodes: Sequence[int] | None = None) -> dict[str, Any]:
    if rounds < 1:
        raise ValueError("rounds must be at least 1")
    sizes = tuple(nodes) if nodes else QUICK_SIZES if quick else SIZES
    # First, alone in this process: the CPU of one package-CR event at the largest size.
    event = gate_event.measure(
        build_cluster(sizes[-1], datetime.now(UTC)),
        bench_settings(),
        gate_event.QUICK_EVENT_SAMPLES if quick else gate_event.EVENT_SAMPLES,
    )
    gc.collect()
    rounds = min(rounds, QUICK_ROUNDS) if quick else rounds
    samples = QUICK_REACTIONS if quick else REACTIONS
    double_cpus, gate_cpus = common.split_cpus()  # the double gets the first CPU
    profile_env = os.environ.get(PROFILE_ENV)
    profile_dir = Path(profile_env).resolve() if profile_env else None
    if profile_dir is not None:
        profile_dir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    started = time.perf_counter()
    double = Double(double_cpus, profile_dir / "gate-double.prof" if profile_dir else None)
    before = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    profiler = cProfile.Profile() if profile_dir else None
    try:
        if gate_cpus and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, gate_cpus)
        coro: Coroutine[Any, Any, tuple[list[SizeResult], dict[str, Any], ReactionResult]]
        coro = _measure(double, sizes, rounds, samples)
        if profiler is None:
            sized, memory, reaction = asyncio.run(coro)
        else:
            sized, memory, reaction = profiler.runcall(asyncio.run, coro)
    finally:
        if before and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, before)
        double.stop()
    if profiler is not None and profile_dir is not None:
        path = profile_dir / "gate.prof"
        profiler.dump_stats(path)
        print(f"\ngate process profile ({path}; the double's: {double.profile}),", file=sys.stderr)
        print("top 30 by own time:", file=sys.stderr)
        pstats.Stats(str(path), stream=sys.stderr).sort_stats(pstats.SortKey.TIME).print_stats(30)
    config = {
        "sizes": list(sizes),
        "rounds": rounds,
        "reactions": samples,
        "crs": CR_COUNT,
        "pools": POOLS,
        "pending_share": PENDING_SHARE,
        "stability_window_s": bench_settings().stability_window.total_seconds(),
        "double_cpus": sorted(double_cpus),
        "gate_cpus": sorted(gate_cpus),
        "seconds": round(time.perf_counter() - started, 1),
        # Other work on the machine slows both processes: the 1-minute load average around the run.
        "loadavg_before": round(load_before[0], 2),
        "loadavg_after": round(os.getloadavg()[0], 2),
        "profile_dir": str(profile_dir) if profile_dir else None,
        "event": event,
    }
    return summarise(sized, memory, reaction, config)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    results = run(rounds=args.rounds, quick=args.quick, nodes=args.nodes)
    print(json.dumps(results, separators=(",", ":")) if args.json else render(results), flush=True)
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
