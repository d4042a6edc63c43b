"""The gate under random interleavings (hypothesis): world changes (joins, revocations, package
progress, CR bumps, pauses and deletions, other controllers' taints), watch events delivered late
and in any order per source, 409s from concurrent writers, re-lists and reconciles.

Invariants, checked after every step:
- a node that never had a valid attestation is never released by the gate;
- taints with other keys are exactly what the other writers left (the gate never touches them);
and at quiescence (every event delivered, every node reconciled, the stability window passed):
- a node is untainted exactly when its attestation is valid and every CR that selects it is
  complete at its current version on it, and otherwise carries the right reason.

The API double here is in memory (kmock per example would be too slow for hypothesis); it keeps
resourceVersions and answers 409 on a stale one, as the API server does.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bootstrap.config import GateSettings
from bootstrap.gate import Gate
from bootstrap.kube import Conflict, Kube, NotFound, WatchEvent

KEY = "nodegate.io/hold"
T0 = datetime(2026, 6, 1, tzinfo=UTC)
NODES = ("n0", "n1", "n2")
CRS = {"sky-a": "skyhook.nvidia.com", "nw-b": "nodewright.nvidia.com", "sky-c": "skyhook.nvidia.com"}
POOLS = ("gpu", "cpu")
WINDOW = timedelta(seconds=30)
PLURALS = {"skyhook.nvidia.com": "skyhooks", "nodewright.nvidia.com": "nodewrights"}


@dataclass
class World:
    """The API double and what the other writers did."""

    now: datetime = T0
    rv: int = 0
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    attestations: dict[str, dict[str, Any]] = field(default_factory=dict)
    crs: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> object
    pending: list[tuple[str, WatchEvent]] = field(default_factory=list)  # (source, event)
    other_taints: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    ever_attested: set[str] = field(default_factory=set)
    interfere: set[str] = field(default_factory=set)  # next gate patch of these nodes meets a 409
    released_unattested: list[str] = field(default_factory=list)

    def bump(self, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)

    def emit(self, source: str, kind: str, obj: dict[str, Any]) -> None:
        self.pending.append((source, WatchEvent(kind, copy.deepcopy(obj))))

    def put_node(self, name: str, obj: dict[str, Any], kind: str = "MODIFIED") -> None:
        self.bump(obj)
        self.nodes[name] = obj
        self.emit("nodes", kind, obj)

    # -- the Kube calls the gate makes (duck-typed) --------------------------------------------

    async def list_nodes(self) -> tuple[list[dict[str, Any]], str]:
        return [copy.deepcopy(n) for n in self.nodes.values()], str(self.rv)

    async def list_cluster_objects(
        self, group: str, _version: str, plural: str
    ) -> tuple[list[dict[str, Any]], str]:
        if plural == "nodeattestations":
            return [copy.deepcopy(a) for a in self.attestations.values()], str(self.rv)
        items = [copy.deepcopy(c) for n, c in self.crs.items() if CRS[n] == group]
        return items, str(self.rv)

    async def get_node(self, name: str) -> dict[str, Any] | None:
        node = self.nodes.get(name)
        return copy.deepcopy(node) if node is not None else None

    def _guard(self, stored: dict[str, Any], patch: dict[str, Any]) -> None:
        want = patch.get("metadata", {}).get("resourceVersion")
        if want is not None and want != stored["metadata"]["resourceVersion"]:
            raise Conflict("the object has been modified")

    async def patch_node(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        if name not in self.nodes:
            raise NotFound(name)
        if name in self.interfere:  # another controller wrote between the gate's read and write
            self.interfere.discard(name)
            self.toggle_other_taint(name)
        node = copy.deepcopy(self.nodes[name])
        self._guard(node, patch)
        before = any(t.get("key") == KEY for t in node["spec"].get("taints", []))
        node["spec"]["taints"] = copy.deepcopy(patch["spec"]["taints"])
        after = any(t.get("key") == KEY for t in node["spec"]["taints"])
        if before and not after and name not in self.ever_attested:
            self.released_unattested.append(name)
        self.put_node(name, node)
        return copy.deepcopy(node)

    async def patch_node_status(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        if name not in self.nodes:
            raise NotFound(name)
        node = copy.deepcopy(self.nodes[name])
        self._guard(node, patch)
        node.setdefault("status", {}).update(copy.deepcopy(patch["status"]))
        self.put_node(name, node)
        return copy.deepcopy(node)

    async def patch_cluster_object(
        self, _group: str, _version: str, plural: str, name: str, patch: dict[str, Any], *, status: bool
    ) -> dict[str, Any]:
        assert plural == "nodeattestations"
        assert status
        obj = self.attestations.get(name)
        if obj is None:
            raise NotFound(name)
        obj = copy.deepcopy(obj)
        obj.setdefault("status", {}).update(copy.deepcopy(patch["status"]))
        self.bump(obj)
        self.attestations[name] = obj
        self.emit("nodeattestations", "MODIFIED", obj)
        return copy.deepcopy(obj)

    async def create_event(self, **_kw: Any) -> dict[str, Any]:
        return {}

    # -- what the other writers do -------------------------------------------------------------

    def join(self, name: str, pool: str) -> None:
        if name not in self.nodes:
            taints = [{"key": KEY, "value": "packages-pending", "effect": "NoSchedule"}]
            body = {
                "metadata": {"name": name, "labels": {"pool": pool}, "annotations": {}},
                "spec": {"taints": taints + copy.deepcopy(self.other_taints.get(name, []))},
                "status": {"conditions": []},
            }
            self.put_node(name, body, "ADDED")
        att = {
            "metadata": {"name": name},
            "spec": {"ekSha256": "ab" * 32, "spiffeId": f"spiffe://td/node/{name}", "revoked": False},
            "status": {
                "attestedAt": self.now.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "expiresAt": (self.now + timedelta(days=30)).isoformat(),
            },
        }
        kind = "MODIFIED" if name in self.attestations else "ADDED"
        self.bump(att)
        self.attestations[name] = att
        self.ever_attested.add(name)
        self.emit("nodeattestations", kind, att)

    def register_unjoined(self, name: str, pool: str) -> None:
        """A kubelet registering on its own (no nodegate join, no hold taint)."""
        if name in self.nodes:
            return
        body = {
            "metadata": {"name": name, "labels": {"pool": pool}, "annotations": {}},
            "spec": {"taints": copy.deepcopy(self.other_taints.get(name, []))},
            "status": {},
        }
        self.put_node(name, body, "ADDED")

    def revoke(self, name: str) -> None:
        att = self.attestations.get(name)
        if att is None:
            return
        att = copy.deepcopy(att)
        att["spec"]["revoked"] = True
        self.bump(att)
        self.attestations[name] = att
        self.emit("nodeattestations", "MODIFIED", att)

    def toggle_other_taint(self, name: str) -> None:
        node = self.nodes.get(name)
        mine = self.other_taints.setdefault(name, [])
        if mine:
            mine.clear()
        else:
            mine.append({"key": "example.com/maintenance", "value": "x", "effect": "NoSchedule"})
        if node is None:
            return
        node = copy.deepcopy(node)
        node["spec"]["taints"] = [
            t for t in node["spec"].get("taints", []) if t.get("key") == KEY
        ] + copy.deepcopy(mine)
        self.put_node(name, node)

    def put_cr(self, name: str, version: str, pool: str, *, paused: bool = False) -> None:
        group = CRS[name]
        annotations = {f"{group}/pause": "true"} if paused else {}
        kind = "MODIFIED" if name in self.crs else "ADDED"
        body = {
            "apiVersion": f"{group}/v1alpha1",
            "kind": "Skyhook" if group == "skyhook.nvidia.com" else "NodeWright",
            "metadata": {"name": name, "annotations": annotations},
            "spec": {
                "nodeSelectors": {"matchLabels": {"pool": pool}},
                "packages": {"pkg": {"version": version, "image": "ghcr.io/x/pkg"}},
            },
        }
        self.bump(body)
        self.crs[name] = body
        self.emit(group, kind, body)

    def delete_cr(self, name: str) -> None:
        body = self.crs.pop(name, None)
        if body is not None:
            self.emit(CRS[name], "DELETED", body)

    def progress(self, node: str, cr: str, version: str, state: str) -> None:
        """What the package operator writes on the Node for one CR."""
        obj = self.nodes.get(node)
        if obj is None:
            return
        obj = copy.deepcopy(obj)
        entry = {
            "name": "pkg",
            "version": version,
            "image": "ghcr.io/x/pkg",
            "stage": "config",
            "state": state,
        }
        obj["metadata"]["annotations"][f"{CRS[cr]}/nodeState_{cr}"] = json.dumps({f"pkg|{version}": entry})
        self.put_node(node, obj)

    # -- the oracle ----------------------------------------------------------------------------

    def expected(self, name: str) -> str | None:
        """The hold reason an exact reading of docs/gate.md gives, from the world as it is."""
        att = self.attestations.get(name)
        if att is not None and att["spec"].get("revoked"):
            return "quarantined"
        if att is None:
            return "unattested"
        node = self.nodes[name]
        failed = pending = False
        for cr, body in self.crs.items():
            if body["spec"]["nodeSelectors"]["matchLabels"]["pool"] != node["metadata"]["labels"]["pool"]:
                continue
            version = body["spec"]["packages"]["pkg"]["version"]
            raw = node["metadata"]["annotations"].get(f"{CRS[cr]}/nodeState_{cr}")
            entry = json.loads(raw).get(f"pkg|{version}") if raw else None
            if entry is None or entry["state"] != "complete":
                pending = True
            if entry is not None and entry["state"] == "erroring":
                failed = True
        if failed:
            return "validation-failed"
        return "packages-pending" if pending else None


node_names = st.sampled_from(NODES)
cr_names = st.sampled_from(sorted(CRS))
pools = st.sampled_from(POOLS)
versions = st.sampled_from(["1.0.0", "2.0.0"])
ops = st.one_of(
    st.tuples(st.just("join"), node_names, pools),
    st.tuples(st.just("register_unjoined"), node_names, pools),
    st.tuples(st.just("revoke"), node_names),
    st.tuples(st.just("toggle_other_taint"), node_names),
    st.tuples(st.just("interfere"), node_names),
    st.tuples(st.just("put_cr"), cr_names, versions, pools, st.booleans()),
    st.tuples(st.just("delete_cr"), cr_names),
    st.tuples(
        st.just("progress"),
        node_names,
        cr_names,
        versions,
        st.sampled_from(["complete", "in_progress", "erroring"]),
    ),
    st.tuples(st.just("deliver"), st.integers(0, 20)),
    st.tuples(st.just("reconcile"), node_names, st.booleans()),  # fresh read, or the watched copy
    st.tuples(st.just("relist")),
    st.tuples(st.just("advance")),
)


def other(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for t in node["spec"].get("taints", []) if t.get("key") != KEY]


def hold(node: dict[str, Any]) -> str | None:
    return next((t["value"] for t in node["spec"].get("taints", []) if t.get("key") == KEY), None)


async def scenario(steps: list[tuple[Any, ...]]) -> None:
    world = World()
    clock: Callable[[], datetime] = lambda: world.now  # noqa: E731
    gate = Gate(
        cast(Kube, world),
        GateSettings(stability_window=WINDOW),
        events_namespace="nodegate",
        now=clock,
        identity="gate",
    )
    world.pending.clear()
    assert await gate.load() == []

    def check() -> None:
        assert world.released_unattested == []
        for name, node in world.nodes.items():
            assert other(node) == world.other_taints.get(name, [])

    async def deliver_all() -> None:
        while world.pending:
            source, event = world.pending.pop(0)
            gate._apply_event(gate._sources[source], event)

    async def reconcile(name: str, cached: bool = False) -> None:
        with contextlib.suppress(Conflict):  # six 409s in a row: the gate retries later
            await gate.reconcile(name, cached=cached)

    for step in steps:
        op, *args = step
        if op == "deliver":
            if world.pending:
                # Events of one source arrive in order; across sources in any order.
                sources = sorted({s for s, _ in world.pending})
                source = sources[args[0] % len(sources)]
                i = next(i for i, (s, _) in enumerate(world.pending) if s == source)
                _, event = world.pending.pop(i)
                gate._apply_event(gate._sources[source], event)
        elif op == "reconcile":
            await reconcile(*args)
        elif op == "relist":
            world.pending.clear()  # a re-list supersedes whatever was in flight
            assert await gate.load() == []
        elif op == "advance":
            world.now += timedelta(seconds=20)
        elif op == "interfere":
            world.interfere.add(args[0])
        elif op == "put_cr":
            world.put_cr(args[0], args[1], args[2], paused=args[3])
        else:
            getattr(world, op)(*args)
        check()

    # Quiescence: everything delivered, every node decided, the window passed, decided again.
    world.interfere.clear()
    await deliver_all()
    for name in sorted(world.nodes):
        await reconcile(name)
    world.now += WINDOW + timedelta(seconds=1)
    await deliver_all()
    for name in sorted(world.nodes):
        await reconcile(name, cached=True)  # the watched copy is current after delivery
    await deliver_all()
    check()
    for name, node in world.nodes.items():
        assert hold(node) == world.expected(name), (name, node, world.attestations.get(name))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(ops, max_size=40))
def test_random_interleavings_keep_the_invariants(steps: list[tuple[Any, ...]]) -> None:
    asyncio.run(scenario(steps))


def test_a_scripted_interleaving_with_stale_caches_converges() -> None:
    """One fixed story: a release decided, a CR bump not delivered yet, a 409 on the next write."""
    steps: list[tuple[Any, ...]] = [
        ("join", "n0", "gpu"),
        ("put_cr", "sky-a", "1.0.0", "gpu", False),
        ("deliver", 0),
        ("deliver", 1),
        ("deliver", 2),
        ("progress", "n0", "sky-a", "1.0.0", "complete"),
        ("reconcile", "n0", True),
        ("advance",),
        ("advance",),
        ("reconcile", "n0", True),
        ("put_cr", "sky-a", "2.0.0", "gpu", False),  # not delivered before the next reconcile
        ("interfere", "n0"),
        ("reconcile", "n0", True),
    ]
    asyncio.run(scenario(steps))
