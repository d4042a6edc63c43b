"""The attest benchmark's results (``tests.bench.attest``): per case the medians and the per-round
ratios against keylime and the floors, the targets, the environment, and their text."""

from __future__ import annotations

import os
import platform
import statistics
from typing import Any

from tests.bench import common
from tests.bench.attest_cases import Group
from tests.bench.attest_evidence import FLOOR, FLOOR_COLD, KEYLIME, OURS


def _p90(values: list[float]) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


def _median_ratio(top: list[float], bottom: list[float]) -> float:
    """Median over rounds of top/bottom: the machine's speed in a round cancels out."""
    return statistics.median(t / b for t, b in zip(top, bottom, strict=True))


def summarise(groups: list[Group], config: dict[str, Any]) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    targets: list[dict[str, Any]] = []
    for group in groups:
        keylime, floor, floor_cold = group.find(KEYLIME), group.find(FLOOR), group.find(FLOOR_COLD)
        for case in group.cases:
            median = statistics.median(case.samples)
            vs_keylime = _median_ratio(keylime.samples, case.samples) if keylime else None
            # A cold case (key never seen) is held against the cold floor: building the key
            # object and its first use cost OpenSSL the same whoever calls it.
            base = floor_cold if ("cold" in case.label and case.impl == OURS and floor_cold) else floor
            vs_floor = _median_ratio(case.samples, base.samples) if base else None
            rows.append(
                {
                    "group": group.name,
                    "case": case.label,
                    "impl": case.impl,
                    "calls_per_round": group.calls,
                    "rounds": len(case.samples),
                    "median_us": median / 1000,
                    "p90_us": _p90(case.samples) / 1000,
                    "min_us": min(case.samples) / 1000,
                    "ops_per_s": 1e9 / median,
                    "vs_keylime": vs_keylime,
                    "vs_floor": vs_floor,
                    "samples_us": [round(x / 1000, 3) for x in case.samples],
                }
            )
            if case.impl != OURS:
                continue
            need = 1.5 if group.name.startswith("quote") else 1.0
            if vs_keylime is not None:
                targets.append(
                    _target(group.name, case.short, "vs keylime throughput", vs_keylime, ">=", need)
                )
            else:
                note = "; ".join(why for label, why in group.skipped if label.startswith("keylime"))
                targets.append(
                    _target(group.name, case.short, "vs keylime throughput", None, ">=", need, note)
                )
            if vs_floor is not None:
                metric = "time vs cold floor" if base is floor_cold else "time vs floor"
                targets.append(_target(group.name, case.short, metric, vs_floor, "<=", 1.3))
    return {
        "benchmark": "attest",
        "environment": _environment(),
        "config": config,
        "cases": rows,
        "skipped": [
            {"group": g.name, "case": label, "note": why} for g in groups for label, why in g.skipped
        ],
        "targets": targets,
    }


def _target(
    group: str, case: str, metric: str, value: float | None, op: str, threshold: float, note: str = ""
) -> dict[str, Any]:
    met = None if value is None else (value >= threshold if op == ">=" else value <= threshold)
    out = {"group": group, "case": case, "metric": metric, "value": value, "op": op, "threshold": threshold}
    return {**out, "met": met, **({"note": note} if note else {})}


def _environment() -> dict[str, Any]:
    from cryptography.hazmat.backends.openssl.backend import backend

    versions = common.versions(("cryptography", "keylime", "tpm2-pytss", "nodegate"))
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "openssl": backend.openssl_version_text(),
        "versions": versions,
    }


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def render(results: dict[str, Any]) -> str:
    env, config = results["environment"], results["config"]
    lines = [
        "attest benchmark: TPM quote verification and MakeCredential",
        f"  Python {env['python']} ({env['implementation']}, {env['machine']}, {env['cpus']} CPUs), "
        f"{env['openssl']}",
        "  " + ", ".join(f"{k} {v}" for k, v in env["versions"].items()),
        f"  {config['rounds']} rounds, cases interleaved within each group (calls per batch in brackets)",
        f"  µs/op and p90: median and 90th percentile over rounds; timed part {config['timed_seconds']} s",
        "  vs keylime: throughput case/keylime (higher is better); vs floor: time case/floor;",
        "  both ratios are medians of per-round ratios",
        "",
    ]
    header = f"  {'case':<40} {'µs/op':>9} {'p90':>9} {'ops/s':>9} {'vs keylime':>11} {'vs floor':>9}"
    groups = dict.fromkeys(row["group"] for row in results["cases"])
    for group in groups:
        lines += [f"{group} [{results['config']['calls'][group]}]", header]
        for row in results["cases"]:
            if row["group"] == group:
                lines.append(
                    f"  {row['case']:<40} {row['median_us']:>9.1f} {row['p90_us']:>9.1f} "
                    f"{row['ops_per_s']:>9,.0f} {_ratio(row['vs_keylime']):>11} {_ratio(row['vs_floor']):>9}"
                )
        for skip in results["skipped"]:
            if skip["group"] == group:
                lines.append(f"  {skip['case']:<40} skipped: {skip['note']}")
        lines.append("")
    lines.append("targets (reported, not asserted)")
    for t in results["targets"]:
        goal = f"{t['op']} {t['threshold']:.2f}x"
        head = f"{t['group']:<36} {t['case']:<10} {t['metric']:<22}"
        if t["met"] is None:
            lines.append(f"  n/a   {head} {'-':>7}  {goal}  ({t.get('note', '')})")
        else:
            lines.append(f"  {'met ' if t['met'] else 'MISS'}  {head} {t['value']:>6.2f}x  {goal}")
    judged = [t for t in results["targets"] if t["met"] is not None]
    lines.append(f"  {sum(1 for t in judged if t['met'])} of {len(judged)} targets met")
    return "\n".join(lines)
