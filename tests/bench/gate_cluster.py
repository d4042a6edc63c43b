"""The hold gate against the real control plane (issue 36 point 6): ``python -m tests.bench
gate_cluster [--nodes N] [--samples S] [--json]``.

Cluster  tests/cluster/plane.py: etcd, kube-apiserver, kube-controller-manager and kwok (its own
         heartbeat stage, every 20-45 s per node) on 127.0.0.1; the chart's CRDs, our permissive
         Skyhook CRD; one ``nodegate serve`` (store kubernetes, gate on, stability window 0,
         leader Lease) as the chart's service account. N kwok nodes (default 1,000) held
         ``packages-pending``, each with a valid NodeAttestation, selected by one Skyhook CR with
         one package in progress on every node.
Operator NodeWright's operator is not served by the module proxy here (issue 36 point 4 is
         blocked), so the load process plays its node-state writes as the gate reads them: the
         node's ``skyhook.nvidia.com/nodeState_<cr>`` annotation (a Node merge patch), then the
         CR's ``status.nodeState[node]`` / ``nodeStatus[node]`` (a merge patch through /status).
Load     in its own process (multiprocessing): the operator's writes, the baseline round trips and
         a watch on the nodes that sees each release (times are its CLOCK_MONOTONIC).
Baseline the API server's own round trip in the same run, between the samples: a merge patch of a
         ConfigMap nobody watches plus a GET of a Node.
Reaction S times (default 100) one node's package completes: the annotation patch, then the
         status patch; reaction = from sending the status patch to the watch seeing the node
         without the hold. Median and p99 (nearest rank), and / the baseline's median.
Burst    then every other node completes at once: all annotations (16 in flight), then one status
         patch carrying every node; lag = from sending it to each release. p99 is the figure
         issue 36 asks for (target <= 1 s).
Churn    with ``--churn R``: during the samples, the real operator's waiting/blocked loop
         (docs/gate.md) at R flips/s on the last 50 held nodes (tests/cluster/churn.py).
RSS      of every process (etcd, kube-apiserver, kube-controller-manager, kwok, nodegate, load),
         after the burst.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.bench import procstat
from tests.bench.common import percentile
from tests.bench.gate_cluster_load import load_main
from tests.bench.gate_cluster_objects import PER_CR, cr_of

# ---- the run ---------------------------------------------------------------------------------


def _heartbeat(nodes: int) -> tuple[tuple[int, int] | None, int | None]:
    """kwok's heartbeat (delay, jitter ms) and the node grace period for ``nodes``: kwok's own
    20-45 s up to 1,000 nodes (~30 Node status writes/s); beyond, stretched so the rate stays the
    same, which is what 10,000 kubelets at their 5-minute status report frequency write. The grace
    period follows, or the node lifecycle controller would find the nodes unreachable."""
    if nodes <= PER_CR:
        return None, None
    f = nodes / PER_CR
    return (int(20_000 * f), int(25_000 * f)), int(45 * f * 1.5)


def _stats(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 1),
        "p99": round(percentile(values, 0.99), 1),
        "max": round(max(values), 1),
    }


def _requests(audited: list[dict[str, Any]], since: datetime, until: datetime) -> dict[str, int]:
    """nodegate's requests received between ``since`` and ``until``, by verb and resource."""
    out: dict[str, int] = {}
    for e in audited:
        when = datetime.fromisoformat(str(e["received"]).replace("Z", "+00:00"))
        if since <= when < until:
            what = f"{e['verb']} {e['resource']}" + (f"/{e['subresource']}" if e["subresource"] else "")
            out[what] = out.get(what, 0) + 1
    return dict(sorted(out.items()))


def run(
    nodes: int, samples: int, churn: float = 0.0, churn_nodes: int = 50, steady_s: float = 60.0
) -> dict[str, Any]:
    from tests.cluster import nodegate as ng
    from tests.cluster import plane as cp

    missing = cp.missing_binaries()
    if missing:
        raise SystemExit(f"gate_cluster: {', '.join(missing)} missing: run `make cluster`")
    load_before = os.getloadavg()
    folder = Path(tempfile.mkdtemp(prefix="nodegate-bench-cluster-"))
    heartbeat, grace = _heartbeat(nodes)
    plane = cp.ControlPlane.start(
        folder / "plane", heartbeat_ms=heartbeat, node_grace_s=grace, audit_users=(ng.USERNAME,)
    )
    started = plane.timings["total"]
    server = None
    parent, child = mp.Pipe()
    admin = (str(plane.folder / "pki" / "admin.crt"), str(plane.folder / "pki" / "admin.key"))
    proc = mp.get_context("spawn").Process(
        target=load_main, args=(child, plane.url, str(plane.ca.cert_file), admin), daemon=True
    )
    proc.start()

    def ask(cmd: str, arg: Any = None) -> Any:
        parent.send((cmd, arg))
        while not parent.poll(1.0):
            if not proc.is_alive():
                raise SystemExit(f"gate_cluster: the load process ended during {cmd!r} (its error above)")
        return parent.recv()

    def cpu() -> dict[str, float]:
        pids = {k: p.popen.pid for k, p in plane.procs.items()}
        if server is not None:
            pids["nodegate"] = server.proc.popen.pid
        pids["load"] = proc.pid or 0
        return {k: procstat.pid_cpu_seconds(pid) or 0.0 for k, pid in pids.items()}

    try:
        inst = ng.install(plane, folder / "nodegate")
        t = time.monotonic()
        names: list[str] = ask("setup", nodes)
        setup_s = time.monotonic() - t
        ask("watch")
        t = time.monotonic()
        # --new-ca: the bench's NodeAttestations are synthetic, no CA issued them.
        server = ng.start_nodegate(
            plane,
            inst,
            "gate",
            args=("--new-ca",),
            store="kubernetes",
            gate={"enabled": True, "stability_window": "0s", "lease_duration": "15s"},
        )
        # The first pass: every node decided and reported (its NodegateReady condition on the
        # Node, its NodeAttestation's phase), as the load's watches see them.
        reported, conditioned, phased = ask("reported", 60 + nodes * 0.1)
        if len(reported) < 2:
            raise SystemExit(
                f"gate_cluster: the first pass did not end: {conditioned} conditions, {phased} phases"
            )
        first_pass = {k: round(v - t, 1) for k, v in reported.items()}
        # A restart: every cache listed again and every node decided again (nothing to write).
        server.stop()
        t = time.monotonic()
        server.restart()
        ready = time.monotonic()
        while not all(server.metric(m) == 1 for m in ("nodegate_gate_leader", "nodegate_gate_synced")) or (
            server.metric("nodegate_gate_backlog") > 0
        ):
            time.sleep(0.1)
        restart_pass = {
            "from_start": round(time.monotonic() - t, 1),
            "from_ready": round(time.monotonic() - ready, 1),
        }
        reactions: list[float] = []
        after_ack: list[float] = []
        base: list[float] = []
        if churn > 0:  # on the last held nodes: the burst releases them, the samples do not
            ask("churn", (names[-churn_nodes:], churn))
        for i in range(samples):
            base += ask("baseline", (3, names[-1]))
            sent, acked = ask("sample", names[i])
            reactions.append(sent)
            after_ack.append(acked)
        churned = ask("churn_stop") if churn > 0 else None
        cpu_before, t = cpu(), time.monotonic()
        lags, status_write_ms = ask("burst", names[samples:])
        burst_s = time.monotonic() - t
        cpu_burst = {k: round(v - cpu_before.get(k, 0.0), 1) for k, v in cpu().items()}
        # The release is the taint; the reports (condition, NodeAttestation, Event) follow it.
        reports_done_s = ask("settled", (names[samples:], 600.0)) - t
        floors = {w: ask("floor", (names[samples:], w)) for w in (queue_workers(), 4 * queue_workers())}
        # Steady state: nothing completes, kwok's heartbeats go on; nodegate's requests counted
        # from the API server's audit log (its service account's only).
        quiet_from = datetime.now(UTC)
        time.sleep(steady_s)
        quiet_to = datetime.now(UTC)
        time.sleep(1)  # the requests in flight at the window's end are logged
        audited = plane.audited()
        steady = _requests(audited, quiet_from, quiet_to)
        whole = _requests(audited, datetime.min.replace(tzinfo=UTC), quiet_to)
        rss = {k: v for k, v in plane.rss_kib().items()}
        rss["nodegate"] = server.proc.rss_kib()
        rss["load"] = ask("rss")
        base_med = statistics.median(base)
        return {
            "bench": "gate_cluster",
            "nodes": nodes,
            "crs": len({cr_of(n) for n in names}),
            "samples": samples,
            "kwok_heartbeat_ms": heartbeat or "kwok's 20000-45000",
            "control_plane_start_s": round(started, 1),
            "control_plane_start_parts_s": {k: round(v, 1) for k, v in plane.timings.items()},
            "setup_s": round(setup_s, 1),
            "first_pass_s": first_pass,
            "restart_pass_s": restart_pass,
            "baseline_ms": {"median": round(base_med, 2), "p99": round(percentile(base, 0.99), 2)},
            "reaction_ms": _stats(reactions),
            "reaction_x_round_trip": round(statistics.median(reactions) / base_med, 1),
            "reaction_p99_x_round_trip": round(percentile(reactions, 0.99) / base_med, 1),
            "reaction_after_ack_ms": _stats(after_ack),
            "burst_nodes": len(lags),
            "burst_status_writes_ms": round(status_write_ms, 1),
            "burst_lag_ms": _stats(lags),
            "burst_reports_done_s": round(reports_done_s, 1),
            "burst_cpu_s": {"wall": round(burst_s, 1), **cpu_burst},
            "floor_ms": {str(w): _stats(v) for w, v in floors.items()},
            "steady_s": steady_s,
            "steady_requests": steady,
            "steady_requests_per_s_per_1000_nodes": round(
                sum(steady.values()) / steady_s / (nodes / 1000), 3
            ),
            "run_requests": whole,
            "churn": {"flips_per_s": churn, "nodes": churn_nodes, **churned} if churned else None,
            "rss_mib": {k: round(v / 1024, 1) for k, v in rss.items()},
            "loadavg_before": round(load_before[0], 2),
            "loadavg_after": round(os.getloadavg()[0], 2),
            "cpus": os.cpu_count(),
        }
    finally:
        if proc.is_alive():
            parent.send(("stop", None))
            proc.join(10)
            if proc.is_alive():
                proc.kill()
        if server is not None:
            server.stop()
        plane.stop()
        print(f"gate_cluster: logs in {folder}", file=sys.stderr)


def queue_workers() -> int:
    from bootstrap.gate.queue import WORKERS

    return WORKERS


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tests.bench gate_cluster",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--nodes", type=int, default=1_000)
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--quick", action="store_true", help="200 nodes, 30 samples")
    ap.add_argument(
        "--churn",
        type=float,
        default=0.0,
        help="flips/s of the operator's waiting/blocked loop on 50 held nodes during the samples",
    )
    ap.add_argument("--steady", type=float, default=60.0, help="seconds of steady state to count requests")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--rounds", type=int, default=1, help="accepted for the runner; unused")
    args, _ = ap.parse_known_args(list(argv) if argv is not None else None)
    nodes, samples = (200, 30) if args.quick else (args.nodes, args.samples)
    result = run(nodes, samples, args.churn, steady_s=20.0 if args.quick else args.steady)
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"gate against the real API server: {nodes} kwok nodes in {result['crs']} CRs, {samples} samples "
        f"(load {result['loadavg_before']} -> {result['loadavg_after']}, {result['cpus']} CPUs)"
    )
    parts = result["control_plane_start_parts_s"]
    print(f"  control plane warm start {result['control_plane_start_s']} s {parts}")
    fp = result["first_pass_s"]
    print(
        f"  setup {result['setup_s']} s; the gate's first pass: every node's condition "
        f"{fp.get('conditions')} s, "
        f"every NodeAttestation's phase {fp.get('phases')} s"
    )
    rp = result["restart_pass_s"]
    print(
        f"  after a restart, every node decided again: {rp['from_start']} s from the process's start, "
        f"{rp['from_ready']} s from its readiness"
    )
    rt = result["baseline_ms"]
    print(f"  API round trip (patch + GET)  median {rt['median']} ms  p99 {rt['p99']} ms")
    r, a = result["reaction_ms"], result["reaction_after_ack_ms"]
    print(
        f"  completion -> release         median {r['median']} ms  p99 {r['p99']} ms  max {r['max']} ms"
        f"  ({result['reaction_x_round_trip']} x / {result['reaction_p99_x_round_trip']} x round trip)"
    )
    print(f"    from the status write's answer: median {a['median']} ms  p99 {a['p99']} ms")
    b = result["burst_lag_ms"]
    print(
        f"  burst of {result['burst_nodes']}: lag median {b['median']} ms  p99 {b['p99']} ms"
        f"  max {b['max']} ms (the operator's status writes took {result['burst_status_writes_ms']} ms)"
    )
    print(
        "    every released node's condition and NodeAttestation said so after "
        f"{result['burst_reports_done_s']} s"
    )
    print("    CPU s during the burst: " + ", ".join(f"{k} {v}" for k, v in result["burst_cpu_s"].items()))
    for w, f in result["floor_ms"].items():
        print(
            f"    floor: {result['burst_nodes']} Node patches {w} at a time: "
            f"median {f['median']} ms  p99 {f['p99']} ms  max {f['max']} ms"
        )
    if result["churn"]:
        c = result["churn"]
        print(
            f"  during the samples: {c['flips']} waiting/blocked flips on {c['nodes']} held nodes, "
            f"409s {c['conflicts_409']}, failed (API server timeouts) {c['failed']}"
        )
    print(
        f"  steady state ({result['steady_s']:.0f} s): nodegate's requests "
        f"{result['steady_requests_per_s_per_1000_nodes']}/s per 1,000 nodes {result['steady_requests']}"
    )
    print(f"  nodegate's requests over the whole run: {result['run_requests']}")
    print("  RSS MiB: " + ", ".join(f"{k} {v}" for k, v in result["rss_mib"].items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
