"""A bring-up burst (part of ``tests/bench/gate.py``): many held nodes walk the operator's state
sequence at once while the gate runs.

Each node walks every package of its pending CR as a node coming up does: apply, config and, for a
package with an interrupt, interrupt and post-interrupt, each ``in_progress`` then ``complete``
(NodeWright's stages and states). The nodes start in waves (one tenth per tick). Each tick the
operator, as upstream does per reconcile, writes every moving node's ``nodeState_<cr>``
annotation (a Node merge patch each, 16 in flight), then each CR's status once with the reports of
all its moving nodes (a merge patch through /status: the gate's watch event is the whole CR).
Lag = from sending the status write that carries a node's last state to the node watch seeing its
hold taint gone. At the end: every node released, and every CR's index in the gate's cache equal
to a full index of the CR as stored (no event lost, nothing stale).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from bootstrap.gate import Gate, holds
from bootstrap.gate.nodewright import index_reports

BURST_NODES = 1_000
WAVES = 10
IN_FLIGHT = 16
WAIT = 300.0
STEPS = (
    ("apply", "in_progress"),
    ("apply", "complete"),
    ("config", "in_progress"),
    ("config", "complete"),
    ("interrupt", "in_progress"),
    ("interrupt", "complete"),
    ("post-interrupt", "in_progress"),
    ("post-interrupt", "complete"),
)
LAST_WITHOUT_INTERRUPT = 3  # config complete


def released(hold: str | None) -> bool:
    return hold is None


@dataclass
class Walker:
    node: str
    annotation: str  # the annotation key
    cr: tuple[str, str, str, str]
    packages: dict[str, dict[str, Any]]  # name|version -> the complete entry (name, version, image, ...)
    interrupts: set[str]  # the keys of packages with an interrupt
    step: int = -1
    sent_last_ns: int = 0

    @property
    def last(self) -> int:
        return len(STEPS) - 1 if self.interrupts else LAST_WITHOUT_INTERRUPT

    def state(self) -> dict[str, Any]:
        out = {}
        for key, entry in self.packages.items():
            stage, state = STEPS[
                min(self.step, len(STEPS) - 1 if key in self.interrupts else LAST_WITHOUT_INTERRUPT)
            ]
            out[key] = {**entry, "stage": stage, "state": state}
        return out


@dataclass
class BurstResult:
    nodes: int = 0
    seconds: float = 0.0
    ticks: int = 0
    operator_writes: int = 0
    lag_ns: list[int] = field(default_factory=list)
    released: int = 0
    checks: list[str] = field(default_factory=list)
    cpu_s: float = 0.0


def walkers(pending: list[Any], crs: dict[str, holds.PackageCr]) -> list[Walker]:
    out = []
    for p in pending:
        complete = json.loads(p.complete)
        cr = crs[p.cr[3]]
        interrupts = {f"{pkg.name}|{pkg.version}" for pkg in cr.packages.values() if pkg.interrupt}
        out.append(Walker(p.node, p.annotation, p.cr, complete, interrupts))
    return out


async def run(gate: Gate, agent: Any, watch: Any, todo: list[Walker]) -> BurstResult:
    """``agent``: tests/bench/gate_load.Load (the operator's writes are sent from its process)."""
    result = BurstResult(nodes=len(todo))
    seen = {w.node: watch.arm(w.node, released) for w in todo}
    wave = max(1, len(todo) // WAVES)
    started, cpu = time.perf_counter(), time.process_time()
    active: list[Walker] = []
    waiting = list(todo)
    while waiting or any(w.step < w.last for w in active):
        active += waiting[:wave]
        del waiting[:wave]
        moving = [w for w in active if w.step < w.last]
        for w in moving:
            w.step += 1
        result.ticks += 1
        await agent.patch_nodes(
            [(w.node, {"metadata": {"annotations": {w.annotation: json.dumps(w.state())}}}) for w in moving],
            IN_FLIGHT,
        )
        by_cr: dict[tuple[str, str, str, str], list[Walker]] = defaultdict(list)
        for w in moving:
            by_cr[w.cr].append(w)

        async def status(where: tuple[str, str, str, str], ws: list[Walker]) -> None:
            body = {
                "nodeState": {w.node: w.state() for w in ws},
                "nodeStatus": {w.node: "complete" if w.step == w.last else "in_progress" for w in ws},
            }
            sent = await agent.patch_cluster_object_sent(*where, {"status": body}, status=True)
            for w in ws:
                if w.step == w.last:
                    w.sent_last_ns = sent

        await asyncio.gather(*(status(k, v) for k, v in by_cr.items()))
        result.operator_writes += len(moving) + len(by_cr)
    if seen:  # none pending (a fleet too small for the burst's share): nothing to wait for
        await asyncio.wait(seen.values(), timeout=WAIT)
    for w in todo:
        future = seen[w.node]
        if future.done() and future.exception() is None:
            result.lag_ns.append(future.result() - w.sent_last_ns)
            result.released += 1
        else:
            future.cancel()
    if result.released < len(todo):
        late = [w.node for w in todo if not seen[w.node].done() or seen[w.node].cancelled()]
        result.checks.append(
            f"burst: {len(todo) - result.released} nodes not released within {WAIT:.0f} s after the "
            f"last write (e.g. {late[:3]})"
        )
    result.seconds = time.perf_counter() - started
    result.cpu_s = time.process_time() - cpu
    # No event lost: the gate's index of every CR the burst wrote equals a full index of it as stored.
    for where in sorted({w.cr for w in todo}):
        stored = await agent.get_cluster_object(*where)
        cached = next((c for c in gate._cache.package_crs() if c.name == where[3]), None)
        if stored is None or cached is None:
            result.checks.append(
                f"burst: {where[3]} missing (stored {stored is not None}, cached {cached is not None})"
            )
            continue
        full = index_reports(stored.get("status") or {}, list(holds.parse_cr(stored).packages.values()))
        if dict(cached.reports) != full:
            wrong = sorted(
                n for n in full.keys() | cached.reports.keys() if full.get(n) != cached.reports.get(n)
            )
            result.checks.append(
                f"burst: {where[3]}: the gate's index differs from the stored CR for {wrong[:5]}"
            )
    return result
