"""The gate's write discipline under the real operator's churn (issue 45, docs/gate.md "How it
writes"): the operator flips a held node's ``status_<cr>`` label and annotation and the CR's
``status.nodeStatus[<node>]`` between ``waiting`` and ``blocked`` on every reconcile. The gate's
decision does not change, so it writes nothing to the Node, and the NodeAttestation at most once
per 10 s per node when only its words change. On the in-memory API double of the interleaving
tests (hypothesis: kmock per example would be too slow)."""

from __future__ import annotations

import asyncio
import copy
import math
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bootstrap.gate import Gate
from bootstrap.gate.writes import PACE
from tests.gate.test_gate_interleavings import CRS, KEY, WINDOW, World, gate_of


class Counting(World):
    """The API double, counting the gate's writes by kind."""

    node_writes: int = 0
    attestation_writes: int = 0
    events: int = 0

    async def create_event(self, **kw: Any) -> dict[str, Any]:
        self.events += 1
        return await super().create_event(**kw)

    async def patch_node(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.node_writes += 1
        return await super().patch_node(name, patch)

    async def patch_node_status(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.node_writes += 1
        return await super().patch_node_status(name, patch)

    async def patch_cluster_object(
        self, group: str, version: str, plural: str, name: str, patch: dict[str, Any], *, status: bool
    ) -> dict[str, Any]:
        self.attestation_writes += 1
        return await super().patch_cluster_object(group, version, plural, name, patch, status=status)

    # -- what the real operator writes in its hot loop ------------------------------------------

    def operator_flip(self, node: str, cr: str, value: str, said: str) -> None:
        """status_<cr> on the Node (label and annotation) and in the CR's status.nodeStatus, with
        the CR's TaintNotTolerable condition saying ``said``."""
        group = CRS[cr]
        obj = copy.deepcopy(self.nodes[node])
        obj["metadata"]["annotations"][f"{group}/status_{cr}"] = value
        obj["metadata"]["labels"][f"{group}/status_{cr}"] = value
        self.put_node(node, obj)
        body = copy.deepcopy(self.crs[cr])
        status = body.setdefault("status", {})
        status.setdefault("nodeStatus", {})[node] = value
        status["conditions"] = [
            {"type": f"{group}/TaintNotTolerable", "status": "True", "message": said[:200]}
        ]
        self.bump(body)
        self.crs[cr] = body
        self.emit(group, "MODIFIED", body)

    def tolerate_everything(self, cr: str) -> None:
        """A CR whose pods tolerate every taint: NodeWright's report is then the only word on why
        it is blocked (the gate computes no cause), so the words follow the operator's text."""
        body = copy.deepcopy(self.crs[cr])
        body["spec"]["additionalTolerations"] = [{"operator": "Exists"}]
        self.bump(body)
        self.crs[cr] = body
        self.emit(CRS[cr], "MODIFIED", body)


async def held_world(*, quarantined: bool, tolerant: bool) -> tuple[Counting, Gate]:
    """n0 held by the gate, selected by two CRs (one with work elsewhere: the operator's priority
    check keeps it ``waiting``), the gate's first writes done."""
    world = Counting()
    gate = gate_of(world)
    world.join("n0", "gpu")
    world.put_cr("sky-a", "1.0.0", "gpu")
    world.put_cr("sky-c", "1.0.0", "gpu")
    if tolerant:
        world.tolerate_everything("sky-a")
        world.tolerate_everything("sky-c")
    world.progress("n0", "sky-a", "1.0.0", "in_progress")
    if quarantined:
        world.revoke("n0")
    assert await gate.load() == []
    world.pending.clear()
    await gate.reconcile("n0", cached=True)
    await settle(world, gate)
    world.node_writes = world.attestation_writes = 0
    return world, gate


async def settle(world: Counting, gate: Gate) -> None:
    while world.pending:
        source, event = world.pending.pop(0)
        gate._apply_event(gate._sources[source], event)


flips = st.lists(
    st.tuples(
        st.integers(0, 3000),  # ms since the last flip (the real operator: ~35 ms)
        st.sampled_from(["sky-a", "sky-c"]),
        st.sampled_from(["waiting", "blocked"]),
        st.text(min_size=0, max_size=40),  # what the CR's condition says this time
    ),
    max_size=60,
)


async def churn(world: Counting, gate: Gate, steps: list[tuple[int, str, str, str]]) -> float:
    """Each flip delivered and the node decided again, as the watch would; the seconds it took."""
    start = world.now
    for ms, cr, value, said in steps:
        world.now += timedelta(milliseconds=ms)
        world.operator_flip("n0", cr, value, said)
        await settle(world, gate)
        await gate.reconcile("n0", cached=True)
        await settle(world, gate)
    return (world.now - start).total_seconds()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=flips, quarantined=st.booleans())
def test_the_operators_waiting_blocked_flips_write_nothing(
    steps: list[tuple[int, str, str, str]], quarantined: bool
) -> None:
    """Held unattested-by-revocation or packages-pending behind CRs that do not tolerate the hold:
    the gate computes why NodeWright cannot schedule there, which does not flip."""

    async def run() -> Counting:
        world, gate = await held_world(quarantined=quarantined, tolerant=False)
        await churn(world, gate, steps)
        return world

    world = asyncio.run(run())
    assert (world.node_writes, world.attestation_writes) == (0, 0)
    hold = [t["value"] for t in world.nodes["n0"]["spec"]["taints"] if t["key"] == KEY]
    assert hold == ["quarantined" if quarantined else "packages-pending"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=flips)
def test_words_that_follow_the_operator_are_written_at_most_once_per_pace(
    steps: list[tuple[int, str, str, str]],
) -> None:
    """CRs that tolerate everything: the words say what NodeWright reports (blocked, and its
    condition's message), which changes with every flip. The NodeAttestation is written at most
    once per PACE; the Node not at all (the condition follows decisions, not words)."""

    async def run() -> tuple[Counting, float, Gate]:
        world, gate = await held_world(quarantined=False, tolerant=True)
        return world, await churn(world, gate, steps), gate

    world, elapsed, _gate = asyncio.run(run())
    assert world.node_writes == 0
    assert world.attestation_writes <= math.floor(elapsed / PACE.total_seconds()) + 1


def test_held_back_words_are_written_when_the_pace_allows() -> None:
    """Coalesced, not lost: the newest words are written once the pace allows, and the decision
    asks to be taken again then (requeue_at)."""

    async def run() -> None:
        world, gate = await held_world(quarantined=False, tolerant=True)
        await churn(world, gate, [(10_000, "sky-a", "blocked", "first")])
        assert world.attestation_writes == 1  # the first change of words since the last write
        world.now += timedelta(seconds=1)
        world.operator_flip("n0", "sky-a", "blocked", "second")
        await settle(world, gate)
        decision = await gate.reconcile("n0", cached=True)
        assert decision is not None
        assert decision.requeue_at == world.now - timedelta(seconds=1) + PACE
        assert world.attestation_writes == 1
        assert "first" in world.attestations["n0"]["status"]["message"]
        world.now = decision.requeue_at
        await settle(world, gate)
        await gate.reconcile("n0", cached=True)
        assert world.attestation_writes == 2
        assert "second" in world.attestations["n0"]["status"]["message"]

    asyncio.run(run())


def test_a_decision_change_is_written_at_once() -> None:
    """The pace never delays a change of the decision: the package the node waits for completes
    (the set changes) one second after a paced write, and both the NodeAttestation and the
    condition say so at once."""

    async def run() -> None:
        world, gate = await held_world(quarantined=False, tolerant=True)
        await churn(world, gate, [(10_000, "sky-a", "blocked", "first")])
        world.now += timedelta(seconds=1)
        world.progress("n0", "sky-a", "1.0.0", "complete")
        await settle(world, gate)
        await gate.reconcile("n0", cached=True)
        packages = world.attestations["n0"]["status"]["packages"]
        assert [p["complete"] for p in packages if p["cr"].endswith("sky-a")] == [True]
        assert world.attestation_writes == 2
        assert world.node_writes == 1  # the condition's words changed with the decision

    asyncio.run(run())


def test_a_release_is_one_write_and_the_reports_follow_on_the_next_turn() -> None:
    """While the controller runs, the release is the taint write alone; the node is queued again
    and its next turn writes the Event, the condition and the NodeAttestation (nothing more)."""

    async def run() -> None:
        world, gate = await held_world(quarantined=False, tolerant=True)
        world.progress("n0", "sky-a", "1.0.0", "complete")
        world.progress("n0", "sky-c", "1.0.0", "complete")
        await settle(world, gate)
        await gate.reconcile("n0", cached=True)  # the stability window starts
        await settle(world, gate)
        world.now += WINDOW
        world.node_writes = world.attestation_writes = world.events = 0
        gate._queue.running = True  # as in run(): follow-ups go through the queue
        try:
            released = await gate.reconcile("n0", cached=True)
            assert released is not None
            assert released.reason is None
            assert (world.node_writes, world.attestation_writes, world.events) == (1, 0, 0)
            assert not [t for t in world.nodes["n0"]["spec"]["taints"] if t["key"] == KEY]
            assert not gate._queue.empty()  # its reports, behind whatever was queued before
            await gate.reconcile("n0", cached=True)  # before the watch brought the taint write
            assert (world.node_writes, world.attestation_writes, world.events) == (2, 1, 1)
            assert world.attestations["n0"]["status"]["phase"] == "Ready"
            await settle(world, gate)
            await gate.reconcile("n0", cached=True)
            assert (world.node_writes, world.attestation_writes, world.events) == (2, 1, 1)
        finally:
            gate._queue.running = False

    asyncio.run(run())
