"""The gate benchmark's results (``tests.bench.gate``): the resync table and scaling, memory, the
reaction, reboot, burst and re-list figures with their ratios and targets, and their text."""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Sequence
from typing import Any

from tests.bench import common, gate_event, gate_phases
from tests.bench.common import num
from tests.bench.gate_reaction import ReactionResult
from tests.bench.gate_resync import Pass, SizeResult

TARGET_SCALING = 1.25  # ms/node at the largest N over the smallest: "linear" within 25 %


def _ms(values: Sequence[int]) -> dict[str, float | None]:
    if not values:
        return {"median_ms": None, "p99_ms": None, "max_ms": None}
    return {
        "median_ms": statistics.median(values) / 1e6,
        "p99_ms": common.percentile(values, 0.99) / 1e6,
        "max_ms": max(values) / 1e6,
    }


def _median_pass(passes: list[Pass], n: int) -> dict[str, Any]:
    summaries = [p.summary(n) for p in passes]
    order = sorted(range(len(passes)), key=lambda i: passes[i].wall_s)
    out = dict(summaries[order[len(order) // 2]])  # the median pass, whole (calls included)
    out["ms_per_node_rounds"] = [round(s["ms_per_node"], 4) for s in summaries]
    out["ms_per_node"] = statistics.median(s["ms_per_node"] for s in summaries)
    out["gate_cpu_ms_per_node"] = statistics.median(s["gate_cpu_ms_per_node"] for s in summaries)
    return out


def summarise(
    sizes: list[SizeResult], memory: dict[str, Any], reaction: ReactionResult, config: dict[str, Any]
) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for s in sizes:
        rows.append(
            {
                "nodes": s.nodes,
                "pending": s.pending,
                "first": s.first.summary(s.nodes),
                "steady": _median_pass(s.steady, s.nodes),
                "rss_before_kib": s.rss_before_kib,
                "rss_after_kib": s.rss_after_kib,
                "hwm_kib": s.hwm_kib,
                "cr_bytes_total": sum(s.cr_bytes),
                "cr_bytes_max": max(s.cr_bytes, default=0),
            }
        )
    small, large = rows[0], rows[-1]
    scaling = {
        "from_nodes": small["nodes"],
        "to_nodes": large["nodes"],
        "first": large["first"]["ms_per_node"] / small["first"]["ms_per_node"],
        "steady": large["steady"]["ms_per_node"] / small["steady"]["ms_per_node"],
        "first_gate_cpu": large["first"]["gate_cpu_ms_per_node"] / small["first"]["gate_cpu_ms_per_node"],
        "steady_gate_cpu": large["steady"]["gate_cpu_ms_per_node"] / small["steady"]["gate_cpu_ms_per_node"],
    }
    base = _ms(reaction.baseline_ns)
    react = _ms(reaction.samples_ns)
    status_base = _ms(reaction.status_baseline_ns)
    counted = max(reaction.reactions, 1)
    reaction_out: dict[str, Any] = {
        "nodes": reaction.nodes,
        "samples": len(reaction.samples_ns),
        "warmup": reaction.reactions - len(reaction.samples_ns),
        **react,
        "from_ack": _ms(reaction.from_ack_ns),
        "from_ack_vs_roundtrip_median": None
        if not reaction.from_ack_ns or not base["median_ms"]
        else statistics.median(reaction.from_ack_ns) / 1e6 / base["median_ms"],
        "baseline": base,
        "status_baseline": status_base,
        "vs_status_write_median": None
        if react["median_ms"] is None or not status_base["median_ms"]
        else react["median_ms"] / status_base["median_ms"],
        "vs_status_write_p99": None
        if react["p99_ms"] is None or not status_base["median_ms"]
        else react["p99_ms"] / status_base["median_ms"],
        "vs_roundtrip_median": None
        if react["median_ms"] is None or not base["median_ms"]
        else react["median_ms"] / base["median_ms"],
        "vs_roundtrip_p99": None
        if react["p99_ms"] is None or not base["median_ms"]
        else react["p99_ms"] / base["median_ms"],
        "converge_s": round(reaction.converge_s, 2),
        "converge_calls": reaction.converge_calls,
        "seconds": round(reaction.seconds, 2),
        "others_cpu_s": reaction.others_cpu_s,
        # this process's CPU per reaction (the gate alone), both writes of it (annotation, CR status)
        "cpu_ms_per_reaction": reaction.cpu_s * 1000 / counted,
        "load_cpu_ms_per_reaction": reaction.load_cpu_s * 1000 / counted,
        "calls": reaction.calls,
        "calls_per_reaction": sum(reaction.calls.values()) / counted,
    }
    reboot_base = _ms(reaction.reboot_baseline_ns)

    def vs(values: dict[str, float | None], key: str) -> float | None:
        value, trip = values[key], reboot_base["median_ms"]
        return None if value is None or not trip else value / trip

    to_hold, to_release = _ms(reaction.reboot_ns), _ms(reaction.attest_ns)
    reboot_out = {
        "nodes": reaction.nodes,
        "samples": len(reaction.reboot_ns),
        "warmup": reaction.reboots - len(reaction.reboot_ns),
        "boot_to_hold": {**to_hold, "vs_roundtrip_median": vs(to_hold, "median_ms"),
                         "vs_roundtrip_p99": vs(to_hold, "p99_ms")},
        "attestation_to_release": {**to_release, "vs_roundtrip_median": vs(to_release, "median_ms"),
                                   "vs_roundtrip_p99": vs(to_release, "p99_ms")},
        "baseline": reboot_base,
        "seconds": round(reaction.reboot_seconds, 2),
        "calls": reaction.reboot_calls,
        "calls_per_reboot": sum(reaction.reboot_calls.values()) / max(reaction.reboots, 1),
        "cpu_ms_per_reboot": reaction.reboot_cpu_s * 1000 / max(reaction.reboots, 1),
    }  # fmt: skip
    errors = [c for s in sizes for c in s.checks] + reaction.checks
    if memory.get("load_errors"):
        errors.append(f"memory load: {memory['load_errors']}")
    targets = [
        {
            "metric": f"{name} pass ms/node at {large['nodes']:,} vs {small['nodes']:,}",
            "value": scaling[name],
            "op": "<=",
            "threshold": TARGET_SCALING,
            "met": scaling[name] <= TARGET_SCALING,
        }
        for name in ("first", "steady")
    ]
    event = config.get("event") or {}
    burst = reaction.burst
    burst_out: dict[str, Any] = {}
    if burst is not None:
        lag = _ms(burst.lag_ns)
        released = max(burst.released, 1)
        writes = sum(
            v
            for k, v in reaction.burst_calls.items()
            if k.split()[0] in ("create", "patch", "update", "delete")
        )
        burst_out = {
            "nodes": burst.nodes,
            "released": burst.released,
            "seconds": round(burst.seconds, 2),
            "ticks": burst.ticks,
            "operator_writes": burst.operator_writes,
            "lag": lag,
            "gate_calls": reaction.burst_calls,
            "gate_writes_per_release": writes / released,
            "cpu_ms_per_node": burst.cpu_s * 1000 / max(burst.nodes, 1),
        }
        errors += burst.checks

    def target(metric: str, value: float | None, op: str, threshold: float, unit: str) -> dict[str, Any]:
        met = value is not None and (value <= threshold if op == "<=" else value >= threshold)
        return {"metric": metric, "value": value, "op": op, "threshold": threshold, "unit": unit, "met": met}

    if event:
        targets.append(target("CPU per MiB of package CR watch event, decode included",
                              event.get("ms_per_mib"),
                              "<=", gate_event.TARGET_MS_PER_MIB, " ms"))  # fmt: skip
    targets.append(target(f"package completion -> release at {reaction.nodes:,}, median vs round trip",
                          reaction_out["vs_roundtrip_median"], "<=", 5.0, "x"))  # fmt: skip
    targets.append(target(f"package completion -> release at {reaction.nodes:,}, p99 vs round-trip median",
                          reaction_out["vs_roundtrip_p99"], "<=", 15.0, "x"))  # fmt: skip
    targets.append(target(f"package completion -> release at {reaction.nodes:,}, median vs the status "
                          "write's own round trip", reaction_out["vs_status_write_median"],
                          "<=", 5.0, "x"))  # fmt: skip
    targets.append(target(f"package completion -> release at {reaction.nodes:,}, p99 vs the status "
                          "write's own round-trip median", reaction_out["vs_status_write_p99"],
                          "<=", 15.0, "x"))  # fmt: skip
    if burst_out:
        targets.append(target(f"burst of {burst_out['nodes']:,} nodes: released",
                              float(burst_out["released"]),
                              ">=", float(burst_out["nodes"]), ""))  # fmt: skip
        targets.append(
            target("burst: seconds for all to walk and be released", burst_out["seconds"], "<=", 60.0, " s")
        )
        targets.append(target("burst: lag (last status write -> release) p99", burst_out["lag"]["p99_ms"],
                              "<=", 1000.0, " ms"))  # fmt: skip
    return {
        "benchmark": "gate",
        "event": event,
        "burst": burst_out,
        "relist": reaction.relist,
        "phases": reaction.phases,
        "environment": _environment(config),
        "config": config,
        "resync": rows,
        "scaling": scaling,
        "memory": memory,
        "reaction": reaction_out,
        "reboot": reboot_out,
        "targets": targets,
        "errors": errors,
    }


def _environment(config: dict[str, Any]) -> dict[str, Any]:
    versions = common.versions(("aiohttp", "kubernetes_asyncio", "kmock", "nodegate"))
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "double_cpus": config["double_cpus"],
        "gate_cpus": config["gate_cpus"],
        "versions": versions,
    }


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value / (1 << 20):.1f} MiB"


def _kib(value: float | None) -> str:
    return _mib(None if value is None else value * 1024)


def _calls(calls: dict[str, int]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in sorted(calls.items(), key=lambda kv: -kv[1]))


def _timing(label: str, t: dict[str, Any]) -> str:
    return (
        f"  {label} median {num(t['median_ms'], '.2f')} ms  p99 {num(t['p99_ms'], '.2f')} ms  "
        f"max {num(t['max_ms'], '.2f')} ms  ({num(t['vs_roundtrip_median'], '.2f')}x / "
        f"{num(t['vs_roundtrip_p99'], '.2f')}x the round trip median)"
    )


def render(results: dict[str, Any]) -> str:
    env, config = results["environment"], results["config"]
    lines = [
        "gate benchmark: bootstrap/gate.py against kmock (tests/support/kshim.py) in a child process",
        f"  Python {env['python']} ({env['implementation']}, {env['machine']}), {env['cpus']} CPUs; "
        f"double on CPU {env['double_cpus']}, gate on {env['gate_cpus']}",
        "  " + ", ".join(f"{k} {v}" for k, v in env["versions"].items()),
        f"  {config['crs']} package CRs, {config['pending_share']:.0%} of nodes pending, stability window 0; "
        f"{config['rounds']} steady pass(es) per size; run {config['seconds']} s, load average "
        f"{config['loadavg_before']} -> {config['loadavg_after']}",
    ]
    if config["profile_dir"]:
        lines.append(
            f"  PROFILING ON (cProfile in both processes, stats in {config['profile_dir']}): slowed numbers"
        )
    lines += [
        "",
        "resync (reconcile_all; first = writes everything once, steady = writes nothing)",
        f"  {'nodes':>6} {'pass':<6} {'wall s':>7} {'ms/node':>8} {'gate CPU':>9} {'double':>7} "
        f"{'others':>7} {'calls':>7} {'/node':>6} {'writes':>7}",
    ]
    for row in results["resync"]:
        for label in ("first", "steady"):
            p = row[label]
            lines.append(
                f"  {row['nodes']:>6,} {label:<6} {p['wall_s']:>7.2f} {p['ms_per_node']:>8.3f} "
                f"{p['gate_cpu_ms_per_node']:>7.3f}ms {num(p['double_cpu_s'], '.1f'):>6}s "
                f"{num(p['others_cpu_s'], '.1f'):>6}s {p['calls_total']:>7,} {p['calls_per_node']:>6.2f} "
                f"{p['writes']:>7,}"
            )
    large = results["resync"][-1]
    lines.append(
        f"  package CRs at {large['nodes']:,} nodes: {_mib(large['cr_bytes_total'])} of JSON in all, the "
        f"largest {_mib(large['cr_bytes_max'])} (mostly status.nodeState; etcd's request limit: 1.5 MiB)"
    )
    lines.append(f"  calls at {large['nodes']:,}, first: {_calls(large['first']['calls'])}")
    lines.append(f"  calls at {large['nodes']:,}, steady: {_calls(large['steady']['calls'])}")
    sc = results["scaling"]
    lines.append(
        f"  scaling {sc['from_nodes']:,} -> {sc['to_nodes']:,} nodes (ms/node ratio, 1.0 = linear): "
        f"first {sc['first']:.2f}x, steady {sc['steady']:.2f}x; gate CPU/node: first "
        f"{sc['first_gate_cpu']:.2f}x, steady {sc['steady_gate_cpu']:.2f}x"
    )
    mem = results["memory"]
    lines += [
        "",
        f"memory at {mem['nodes']:,} nodes (a fresh gate's load(), tracemalloc)",
        f"  still allocated from bootstrap/ frames (the gate's caches): {_mib(mem['gate_retained_bytes'])} "
        f"({mem['gate_bytes_per_node']:,.0f} B/node); all still allocated {_mib(mem['retained_bytes'])}; "
        f"traced peak {_mib(mem['peak_bytes'])}",
        f"  this process (gate, client, benchmark): RSS {_kib(large['rss_before_kib'])} before the "
        f"{large['nodes']:,}-node gate, {_kib(large['rss_after_kib'])} after its passes (gate alive), "
        f"peak {_kib(large['hwm_kib'])}",
    ]
    r = results["reaction"]
    lines += [
        "",
        f"reaction at {r['nodes']:,} nodes (Gate.run(): package complete -> hold taint gone, "
        f"{r['samples']} samples in {r['seconds']} s, others used {num(r['others_cpu_s'], '.1f')} s CPU)",
        f"  run() start-up: every node decided and the gate idle after {r['converge_s']} s "
        f"({r['converge_calls'].get('get nodes', 0):,} node GETs: {_calls(r['converge_calls'])})",
        f"  reaction      median {num(r['median_ms'], '.2f')} ms  p99 {num(r['p99_ms'], '.2f')} ms  "
        f"max {num(r['max_ms'], '.2f')} ms  (from the patch's answer: median "
        f"{num(r['from_ack']['median_ms'], '.2f')} ms, p99 {num(r['from_ack']['p99_ms'], '.2f')} ms)",
        f"  baseline      median {num(r['baseline']['median_ms'], '.2f')} ms  p99 "
        f"{num(r['baseline']['p99_ms'], '.2f')} ms  (the agent's patch + GET of a node-sized object)",
        f"  status write  median {num(r['status_baseline']['median_ms'], '.2f')} ms  p99 "
        f"{num(r['status_baseline']['p99_ms'], '.2f')} ms  (the operator's same merge patch through /status "
        f"to an unwatched copy of the same CR: that request's bare round trip); reaction / it: median "
        f"{num(r['vs_status_write_median'], '.2f')}x, p99 {num(r['vs_status_write_p99'], '.2f')}x",
        f"  reaction / round trip: median {num(r['vs_roundtrip_median'], '.2f')}x, p99 "
        f"{num(r['vs_roundtrip_p99'], '.2f')}x the baseline median; from the status write's answer "
        f"(the API's work before its answer left out) median "
        f"{num(r['from_ack_vs_roundtrip_median'], '.2f')}x",
        f"  the gate's calls: {r['calls_per_reaction']:.2f} per reaction ({_calls(r['calls'])}); this "
        f"process's CPU (the gate's alone) {r['cpu_ms_per_reaction']:.1f} ms per reaction (two events, one a "
        f"whole CR); the load's process {r['load_cpu_ms_per_reaction']:.1f} ms",
    ]
    b = results["reboot"]
    hold, free = b["boot_to_hold"], b["attestation_to_release"]
    lines += [
        "",
        f"reboot at {b['nodes']:,} nodes (Gate.run(): a released node's boot id changes -> held unattested; "
        f"the attestation of the new boot -> released; {b['samples']} samples in {b['seconds']} s)",
        _timing("boot id -> hold    ", hold),
        _timing("attested -> release", free),
        f"  baseline            median {num(b['baseline']['median_ms'], '.2f')} ms  p99 "
        f"{num(b['baseline']['p99_ms'], '.2f')} ms  (the agent's patch + GET of a node-sized object)",
        f"  the gate's calls: {b['calls_per_reboot']:.2f} per reboot and attestation ({_calls(b['calls'])}); "
        f"this process's CPU {b['cpu_ms_per_reboot']:.1f} ms per reboot and attestation",
    ]
    if results["errors"]:
        lines += ["", "ERRORS (the numbers of this run are suspect)"]
        lines += [f"  {e}" for e in results["errors"]]
    lines += _render_new(results)
    lines += ["", "targets (reported, not asserted)"]
    for t in results["targets"]:
        verdict = "PASS" if t["met"] else "MISS"
        unit = t.get("unit", "x")
        lines.append(
            f"  {verdict}  {t['metric']}: {num(t['value'], '.2f')}{unit} {t['op']} {t['threshold']:.2f}{unit}"
        )
    return "\n".join(lines)


def _render_new(results: dict[str, Any]) -> list[str]:
    """The event cost, the per-phase split, the burst and the re-lists."""
    lines: list[str] = []
    if results.get("event"):
        lines += ["", *gate_event.render(results["event"])]
    phases = results.get("phases") or {}
    r, b = results["reaction"], results["reboot"]
    per = {"reaction": r["samples"] + r["warmup"], "reboot": b["samples"] + b["warmup"]}
    burst = results.get("burst") or {}
    if burst:
        per["burst"] = burst["nodes"]
    if phases:
        lines += ["", "where the gate's time goes (gate_phases: its own steps, no profiler)"]
        for label, what in (
            ("reaction", "reaction"),
            ("reboot", "reboot and attestation"),
            ("burst", "node walked"),
        ):
            if label in phases and label in per:
                lines.append(gate_phases.render(label, phases[label], per[label], what))
    if burst:
        lag = burst["lag"]
        lines += [
            "",
            f"burst: {burst['nodes']:,} held nodes walk apply, config (, interrupt, post-interrupt), each "
            f"in_progress then complete, in waves; {burst['operator_writes']:,} operator writes in "
            f"{burst['ticks']} ticks",
            f"  {burst['released']:,} released in {burst['seconds']} s; lag (last status write -> release) "
            f"median {num(lag['median_ms'], '.1f')} ms, p99 {num(lag['p99_ms'], '.1f')} ms, "
            f"max {num(lag['max_ms'], '.1f')} ms",
            f"  the gate's writes per release {burst['gate_writes_per_release']:.2f} (a held node's status "
            f"follows each step); its calls: {_calls(burst['gate_calls'])}; this process's CPU "
            f"{burst['cpu_ms_per_node']:.1f} ms per node (the operator's writes included)",
        ]
    for row in results.get("relist") or []:
        if not lines or not lines[-1].startswith("  relist"):
            lines += ["", "re-list after 410 Gone (Cache.relist, then every node decided again until idle)"]
        lines.append(
            f"  relist {row['source']:<22} {row['objects']:>6,} objects: listed in {row['list_s']:.2f} s, "
            f"idle after {row['idle_s']:.2f} s, this process's CPU {row['cpu_s']:.2f} s, "
            f"writes {row['writes']}"
        )
    return lines
