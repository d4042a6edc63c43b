"""The gate benchmark's reaction part (``tests.bench.gate``): ``Gate.run()`` on the largest
cluster, timed from the agent's or operator's write to the node watch seeing the hold as wanted
(package complete -> released, reboot -> held -> attested -> released), then the burst and the
re-lists after a 410 Gone."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from bootstrap.gate import Gate, crindex
from bootstrap.gate.cache import ATTESTATIONS
from bootstrap.kube import Kube
from tests.bench import gate_burst, gate_load, gate_phases
from tests.bench.gate_double import CR_COPY, GATE_AGENT, Double
from tests.bench.gate_fleet import KEY, PING, Pending, boot_id, stamp
from tests.bench.gate_kube import TIMEOUT, TrackedKube, api_client, make_gate
from tests.bench.gate_procstat import Others

WARMUP_REACTIONS = 10
WAIT = 120.0  # for one reaction, or for the gate to go idle
WAIT_PER_NODE = 0.05  # for run() to decide every node (plus WAIT): a bound for failure, not a pace
BENCH_AGENT = "nodegate-bench-agent"


Want = Callable[[str | None], bool]  # on the hold taint's value (None: no hold taint)


def released(hold: str | None) -> bool:
    return hold is None


def held_unattested(hold: str | None) -> bool:
    return hold == "unattested"


class NodeWatch:
    """One watch on every node (the agent's view): resolves a future when the armed node shows up
    with its hold taint as wanted."""

    def __init__(self, kube: Kube, nodes: int) -> None:
        self._kube = kube
        self._armed: dict[str, tuple[Want, asyncio.Future[int]]] = {}
        self._nodes = nodes
        self.events = 0
        self.replayed = asyncio.Event()  # kmock starts a watch with every stored object as ADDED
        self.task = asyncio.create_task(self._run(), name="bench-node-watch")

    def arm(self, node: str, want: Want = released) -> asyncio.Future[int]:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._armed[node] = (want, future)
        return future

    async def _run(self) -> None:
        while True:
            async for event in self._kube.watch_nodes(""):
                self.events += 1
                if self.events >= self._nodes:
                    self.replayed.set()
                obj = event.object
                armed = self._armed.get((obj.get("metadata") or {}).get("name", ""))
                if armed is None or armed[1].done():
                    continue
                taints = (obj.get("spec") or {}).get("taints") or []
                hold = next(
                    (t.get("value") for t in taints if isinstance(t, dict) and t.get("key") == KEY), None
                )
                if armed[0](hold):
                    armed[1].set_result(time.perf_counter_ns())

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


def _idle(gate: Gate, kube: TrackedKube) -> bool:
    # Private peek (bench only): nothing queued and no call in flight means the worker waits.
    return kube.inflight == 0 and gate._queue.idle()


async def _until(check: Callable[[], bool], kube: TrackedKube, what: str, limit: float = WAIT) -> None:
    """Wait (woken by every completed API call of the gate, no polling) until ``check()``."""
    try:
        async with asyncio.timeout(limit):
            while not check():
                kube.done.clear()
                await kube.done.wait()
    except TimeoutError:
        raise RuntimeError(f"the gate never {what} within {limit:.0f} s") from None


async def _settle(gate: Gate, kube: TrackedKube, agent: Any, probe: str, writes: int) -> None:
    """Until the gate has written ``writes`` in all and is idle; a round trip to the double lets a
    watch event that was already sent reach the gate, after which it must still be idle."""
    await _until(lambda: gate.writes >= writes and _idle(gate, kube), kube, "went idle")
    while True:
        await agent.get_node(probe)
        if _idle(gate, kube):
            return
        await _until(lambda: _idle(gate, kube), kube, "went idle")


@dataclass
class ReactionResult:
    nodes: int
    samples_ns: list[int] = field(default_factory=list)
    from_ack_ns: list[int] = field(default_factory=list)
    baseline_ns: list[int] = field(default_factory=list)
    # The operator's same status write to the CR's unwatched copy: that request's bare round trip.
    status_baseline_ns: list[int] = field(default_factory=list)
    reactions: int = 0  # done, warm-up included
    # The reboot loop: a Node's boot id changes -> the hold taint; the fresh attestation -> release.
    reboot_ns: list[int] = field(default_factory=list)
    attest_ns: list[int] = field(default_factory=list)
    reboot_baseline_ns: list[int] = field(default_factory=list)
    reboots: int = 0
    reboot_seconds: float = 0.0
    reboot_calls: dict[str, int] = field(default_factory=dict)
    converge_s: float = 0.0
    converge_calls: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0  # the reactions' part
    others_cpu_s: float | None = None
    cpu_s: float = 0.0  # this process: the gate and its client (the load runs in its own process)
    reboot_cpu_s: float = 0.0
    calls: dict[str, int] = field(default_factory=dict)
    checks: list[str] = field(default_factory=list)
    phases: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)  # per part of the run
    burst: gate_burst.BurstResult | None = None
    burst_calls: dict[str, int] = field(default_factory=dict)
    relist: list[dict[str, Any]] = field(default_factory=list)
    load_cpu_s: float = 0.0  # the load's process in the reaction phase (the agent, operator, node watch)


async def round_trip(agent: Any, i: int) -> int:
    """The baseline: a merge patch and a GET of a node-sized object that nobody watches, ns."""
    if isinstance(agent, gate_load.Load):
        return await agent.round_trip(i)  # measured in the load's process
    started = time.perf_counter_ns()
    patch = {"metadata": {"annotations": {"nodegate.bench/ping": str(i)}}}
    await agent.patch_cluster_object(*PING, patch)
    await agent.get_cluster_object(*PING)
    return time.perf_counter_ns() - started


async def _status_round_trip(agent: Any, name: str, status: dict[str, Any]) -> int:
    """The status write's own bare round trip: the same merge patch through /status, to the copy
    of the same CR (same size, same answer) that nobody watches, ns."""
    if isinstance(agent, gate_load.Load):
        ns: int = await agent.ask("status_round_trip", *CR_COPY, name, {"status": status})
        return ns
    started = time.perf_counter_ns()
    await agent.patch_cluster_object(*CR_COPY, name, {"status": status}, status=True)
    return time.perf_counter_ns() - started


async def _timed(watch: Any, node: str, want: Want, write: Coroutine[Any, Any, Any]) -> tuple[int, int]:
    """Send ``write`` and wait for the node's hold to become as wanted: (sent, seen) in ns. With
    the load in its own process, the send time is the child's, just before its request."""
    seen = watch.arm(node, want)
    sent = time.perf_counter_ns()
    await write
    if isinstance(watch, gate_load.Watch):
        sent = watch.load.last_sent_ns
    async with asyncio.timeout(WAIT):
        at = await seen
    return sent, at


async def _react(
    gate: Gate,
    kube: TrackedKube,
    agent: Any,
    watch: Any,
    todo: list[Pending],
    warmup: int,
    result: ReactionResult,
    others: Others,
) -> None:
    """Package complete -> released. As upstream writes it: the agent-side annotation on the Node
    first (the gate decides on it and stays held: the operator's report is not there yet), then,
    timed, the operator's status.nodeState[node] in the CR, a merge patch through /status (the
    watch event the gate gets is the whole CR)."""
    started, cpu = time.perf_counter(), time.process_time()
    for i, p in enumerate(todo):
        await agent.patch_node(p.node, {"metadata": {"annotations": {p.annotation: p.complete}}})
        await _settle(gate, kube, agent, p.node, gate.writes)
        writes = gate.writes
        status = {"nodeState": {p.node: json.loads(p.complete)}, "nodeStatus": {p.node: "complete"}}
        acked = 0

        async def operator(p: Pending = p, status: dict[str, Any] = status) -> None:
            nonlocal acked
            await agent.patch_cluster_object(*p.cr, {"status": status}, status=True)
            acked = time.perf_counter_ns()

        try:
            sent, at = await _timed(watch, p.node, released, operator())
        except TimeoutError:
            result.checks.append(f"{p.node}: the hold taint was not removed within {WAIT:.0f} s")
            return
        result.reactions += 1
        # The release writes the taint, an Event, the condition and the status.
        await _settle(gate, kube, agent, p.node, writes + 4)
        # The baseline between the reactions (the gate idle), so that drift hits both alike.
        trip = await round_trip(agent, i)
        status_trip = await _status_round_trip(agent, p.cr[3], status)
        if i >= warmup:
            result.samples_ns.append(at - sent)
            result.from_ack_ns.append(at - acked)
            result.baseline_ns.append(trip)
            result.status_baseline_ns.append(status_trip)
    result.seconds, result.others_cpu_s = time.perf_counter() - started, others.seconds()
    result.cpu_s = time.process_time() - cpu


async def _reboots(
    gate: Gate,
    kube: TrackedKube,
    agent: Any,
    watch: Any,
    nodes: list[str],
    warmup: int,
    result: ReactionResult,
) -> None:
    """Released node -> its kubelet reports a new boot id (a Node status patch) -> held
    ``unattested``; then the join service records the attestation of that boot (NodeAttestation
    status bootID, resetCount, attestedAt) -> released. Each timed from the write's send to the
    node watch showing the hold as wanted; the gate idle before each write."""
    started, cpu = time.perf_counter(), time.process_time()
    for i, name in enumerate(nodes):
        new_boot = boot_id(name, 1)
        writes = gate.writes
        reboot = agent.patch_node_status(name, {"status": {"nodeInfo": {"bootID": new_boot}}})
        try:
            sent, held = await _timed(watch, name, held_unattested, reboot)
        except TimeoutError:
            result.checks.append(f"{name}: not held within {WAIT:.0f} s of its new boot id")
            return
        await _settle(gate, kube, agent, name, writes + 4)  # taint, Event, condition, status
        writes = gate.writes
        fresh = {"bootID": new_boot, "resetCount": 2, "attestedAt": stamp(datetime.now(UTC))}
        attested = agent.patch_cluster_object(*ATTESTATIONS, name, {"status": fresh}, status=True)
        try:
            sent2, free = await _timed(watch, name, released, attested)
        except TimeoutError:
            result.checks.append(f"{name}: not released within {WAIT:.0f} s of its fresh attestation")
            return
        result.reboots += 1
        await _settle(gate, kube, agent, name, writes + 4)
        trip = await round_trip(agent, 10_000 + i)
        if i >= warmup:
            result.reboot_ns.append(held - sent)
            result.attest_ns.append(free - sent2)
            result.reboot_baseline_ns.append(trip)
    result.reboot_seconds = time.perf_counter() - started
    result.reboot_cpu_s = time.process_time() - cpu


async def _relists(
    gate: Gate, kube: TrackedKube, agent: Any, probe: str, double: Double
) -> list[dict[str, Any]]:
    """What a 410 Gone costs: each source listed again as Cache.inform does after one (the caches
    replaced, every node queued and decided again on its watched copy), until the gate is idle.
    Nothing is to be written: the cluster did not change."""
    out = []
    for key, src in gate._cache.sources.items():
        writes = gate.writes
        double.calls()
        cpu, started = time.process_time(), time.perf_counter()
        await gate._cache.relist(src)
        listed = time.perf_counter() - started
        await _settle(gate, kube, agent, probe, writes)
        out.append(
            {
                "source": key,
                "objects": len(src.objects or {}),
                "list_s": listed,
                "idle_s": time.perf_counter() - started,
                "cpu_s": time.process_time() - cpu,
                "writes": gate.writes - writes,
                "calls": double.calls()["gate"],
            }
        )
    return out


async def measure_reaction(double: Double, n: int, pending: list[Pending], samples: int) -> ReactionResult:
    warmup = min(WARMUP_REACTIONS, max(1, samples // 5))
    todo = pending[: warmup + samples]
    result = ReactionResult(n)
    if len(todo) < warmup + samples:
        result.checks.append(f"only {len(todo)} pending nodes for {warmup + samples} reactions")
    # The agent, the operator and the node watch in their own process (on the double's CPU), so
    # that this process's CPU is the gate's.
    agent = gate_load.Load(double.url, n, double.cpus, BENCH_AGENT, TIMEOUT)
    agent.start()
    kube = TrackedKube(api_client(double.url, GATE_AGENT), TIMEOUT)
    watch = agent.watch
    probe = todo[0].node if todo else "gpu-00000"
    try:
        try:
            async with asyncio.timeout(WAIT):
                await watch.wait_replayed()  # before anything is timed: ~50 MB of JSON at 10,000 nodes
        except TimeoutError:
            result.checks.append(f"the agent's watch did not list {n} nodes within {WAIT:.0f} s")
            return result
        gate = make_gate(kube)
        phases = gate_phases.Phases()
        undo = phases.install(gate, (crindex.DECODER,))
        started = time.perf_counter()
        task = asyncio.create_task(gate.run(), name="bench-gate")
        try:

            def decided() -> bool:
                # Every node decided (the gate records each decision's completeSince, also for
                # nodes decided on the watched copy without a GET) and nothing in flight.
                return len(gate._complete_since) >= n and _idle(gate, kube)

            await _until(decided, kube, "decided every node", WAIT + n * WAIT_PER_NODE)
            await _settle(gate, kube, agent, probe, gate.writes)
            result.converge_s = time.perf_counter() - started
            result.converge_calls = double.calls()["gate"]
            phases.take()
            load_cpu = agent.cpu_seconds() or 0.0
            await _react(gate, kube, agent, watch, todo, warmup, result, Others(double, agent))
            result.load_cpu_s = (agent.cpu_seconds() or 0.0) - load_cpu
            result.calls = double.calls()["gate"]
            result.phases["reaction"] = phases.take()
            stuck = {p.node for p in pending}
            rebooting = [f"gpu-{i:05d}" for i in range(n) if f"gpu-{i:05d}" not in stuck][: warmup + samples]
            await _reboots(gate, kube, agent, watch, rebooting, warmup, result)
            result.reboot_calls = double.calls()["gate"]
            result.phases["reboot"] = phases.take()
            burst = pending[warmup + samples :][: gate_burst.BURST_NODES]
            crs = {c.name: c for c in gate._cache.package_crs()}
            result.burst = await gate_burst.run(gate, agent, watch, gate_burst.walkers(burst, crs))
            await _settle(gate, kube, agent, probe, gate.writes)
            result.burst_calls = double.calls()["gate"]
            result.phases["burst"] = phases.take()
            result.relist = await _relists(gate, kube, agent, probe, double)
            result.phases["relist"] = phases.take()
            if task.done():
                result.checks.append(f"Gate.run() ended: {task.exception()!r}")
        except RuntimeError as exc:  # the gate never converged or never went idle
            result.checks.append(str(exc))
        finally:
            undo()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    finally:
        await watch.close()
        await agent.close()
        await kube.close()
    return result
