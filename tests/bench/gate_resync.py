"""The gate benchmark's resync and memory parts (``tests.bench.gate``): timed ``reconcile_all``
passes at each cluster size, checked, and the caches of a fresh gate after one load()."""

from __future__ import annotations

import gc
import os
import time
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bootstrap.gate import Gate, GateReport
from tests.bench import gate_procstat
from tests.bench.gate_double import GATE_AGENT, Double
from tests.bench.gate_fleet import Pending
from tests.bench.gate_kube import TIMEOUT, TrackedKube, api_client, make_gate
from tests.bench.gate_procstat import Others

TRACE_FRAMES = 8  # enough to reach bootstrap/ from json and aiohttp allocations
ROOT = Path(__file__).resolve().parents[2]
BOOTSTRAP = str(ROOT / "bootstrap")


@dataclass
class Pass:
    wall_s: float
    gate_cpu_s: float
    double_cpu_s: float | None
    calls: dict[str, int]
    report: GateReport
    others_cpu_s: float | None

    def summary(self, n: int) -> dict[str, Any]:
        total = sum(self.calls.values())
        writes = sum(
            v for k, v in self.calls.items() if k.split()[0] in ("create", "patch", "update", "delete")
        )
        return {
            "wall_s": round(self.wall_s, 3),
            "ms_per_node": self.wall_s * 1000 / n,
            "gate_cpu_s": round(self.gate_cpu_s, 3),
            "gate_cpu_ms_per_node": self.gate_cpu_s * 1000 / n,
            "double_cpu_s": self.double_cpu_s,
            "calls": self.calls,
            "calls_total": total,
            "calls_per_node": total / n,
            "writes": writes,
            "gate_writes": self.report.writes,
            "released": self.report.released,
            "held": dict(self.report.held),
            "errors": self.report.errors[:5],
            "others_cpu_s": self.others_cpu_s,
        }


async def timed_pass(gate: Gate, double: Double) -> Pass:
    double.calls()  # reset the count
    others = Others(double)
    cpu, dcpu, started = time.process_time(), double.cpu_seconds(), time.perf_counter()
    report = await gate.reconcile_all()
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu
    after = double.cpu_seconds()
    calls = double.calls()["gate"]
    spent = None if dcpu is None or after is None else after - dcpu
    return Pass(wall, cpu, spent, calls, report, others.seconds())


@dataclass
class SizeResult:
    nodes: int
    pending: int
    first: Pass
    steady: list[Pass]
    rss_before_kib: int | None
    rss_after_kib: int | None  # the gate still alive
    hwm_kib: int | None
    cr_bytes: list[int] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)


async def measure_size(double: Double, n: int, rounds: int) -> tuple[SizeResult, list[Pending]]:
    pending, cr_bytes = double.populate(n)
    gc.collect()
    rss_before = gate_procstat.rss_kib()
    kube = TrackedKube(api_client(double.url, GATE_AGENT), TIMEOUT)
    try:
        gate = make_gate(kube)
        first = await timed_pass(gate, double)
        steady = [await timed_pass(gate, double) for _ in range(rounds)]
        gc.collect()
        rss_after = gate_procstat.rss_kib()
    finally:
        await kube.close()
    result = SizeResult(
        n, len(pending), first, steady, rss_before, rss_after, gate_procstat.hwm_kib(), cr_bytes
    )
    want = {"nodes": n, "released": n - len(pending), "held": {"packages-pending": len(pending)}}
    got = {"nodes": first.report.nodes, "released": first.report.released, "held": first.report.held}
    if got != want or first.report.errors:
        result.checks.append(
            f"{n} nodes, first pass: {got} (wanted {want}); errors {first.report.errors[:3]}"
        )
    for i, p in enumerate(steady):
        writes = {k: v for k, v in p.calls.items() if not k.startswith(("get ", "list "))}
        if p.report.writes or writes or p.report.errors or p.report.released != n - len(pending):
            result.checks.append(
                f"{n} nodes, steady pass {i + 1}: writes {p.report.writes} {writes}, "
                f"released {p.report.released}, errors {p.report.errors[:3]}"
            )
    return result, pending


async def measure_memory(double: Double) -> dict[str, Any]:
    """The caches of a fresh gate after one load(), at the double's current cluster."""
    kube = TrackedKube(api_client(double.url, GATE_AGENT), TIMEOUT)
    gate: Gate | None = None
    try:
        gc.collect()
        tracemalloc.start(TRACE_FRAMES)
        try:
            base = tracemalloc.take_snapshot()
            base_current, _ = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            gate = make_gate(kube)
            errors = await gate.load()
            gc.collect()
            current, peak = tracemalloc.get_traced_memory()
            snap = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
        # bootstrap/emulator.py is the double's code: it runs in the other process, but say so.
        ours = [
            tracemalloc.Filter(True, f"{BOOTSTRAP}{os.sep}*", all_frames=True),
            tracemalloc.Filter(False, f"{BOOTSTRAP}{os.sep}emulator.py", all_frames=True),
        ]
        diff = snap.filter_traces(ours).compare_to(base.filter_traces(ours), "filename")
        gate_bytes = sum(d.size_diff for d in diff)
        nodes = len(gate._sources["nodes"].objects or {})
    finally:
        await kube.close()
    return {
        "nodes": nodes,
        "load_errors": errors,
        "gate_retained_bytes": gate_bytes,
        "retained_bytes": current - base_current,
        "peak_bytes": peak - base_current,
        "gate_bytes_per_node": gate_bytes / max(nodes, 1),
        "trace_frames": TRACE_FRAMES,
    }
