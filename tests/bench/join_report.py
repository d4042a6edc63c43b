"""The join benchmark's results (``tests.bench.join``): per variant the table against the floor,
the session memory and swtpm rows, the targets, and their text."""

from __future__ import annotations

import os
import platform
import pstats
import ssl
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.bench import common
from tests.bench.common import num, pct
from tests.bench.join_floor import OPS
from tests.bench.join_measure import SESSION_CONCURRENCY, VariantResult
from tests.bench.join_servers import ALLOWLIST, CHAIN, bench_cpus

TARGET = 0.50


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
    usable, server, client = bench_cpus()
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
                f"  {row['concurrency']:>4} {row['joins_per_s']:>8,.0f} {num(row['p50_ms'], '.1f'):>8} "
                f"{num(row['p99_ms'], '.1f'):>8} {num(row['server_cpu_us_per_join'], ',.0f'):>8} "
                f"{pct(row['server_cpu_share']):>6} {pct(row['client_cpu_share']):>6} "
                f"{row['floor_joins_per_s']:>8,.0f} {row['vs_floor']:>8.2f}x "
                f"{num(row['floor_over_server_cpu'], '.2f'):>9}x {errs:>7}" + f"   [{row['joins_per_round']}]"
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
