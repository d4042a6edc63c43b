"""The admission benchmark's results (``tests.bench.admission``): the table, the webhook/bare
ratios and targets from the measured levels, the py-spy stage profile, and their text."""

from __future__ import annotations

import os
import platform
import pstats
import ssl
import statistics
import sys
import textwrap
from collections import Counter
from collections.abc import Sequence
from typing import Any

from tests.bench import admission_profile, common
from tests.bench.admission_client import CONCURRENCY, Level
from tests.bench.admission_servers import BARE, SERVERS, WEBHOOK, Server
from tests.bench.common import num, pct


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
                f"  {row['server']:<8} {row['reviews_per_s']:>10,.0f} {num(row['p50_ms'], '.2f'):>8} "
                f"{num(row['p99_ms'], '.2f'):>8} {num(row['server_cpu_us_per_review'], ',.0f'):>8} "
                f"{pct(row['server_cpu_share']):>6} {row['client_cpu_us_per_review']:>8,.0f} "
                f"{pct(row['client_cpu_share']):>6} {errs:>7}"
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


def profile_rows(profile: dict[str, tuple[Counter[str], str]], rows: list[dict[str, Any]]) -> dict[str, Any]:
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
