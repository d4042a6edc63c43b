"""The gate under random interleavings (hypothesis): world changes (joins, revocations, package
progress written by the operator, annotations forged by the node, reboots and fresh attestations,
CR bumps, pauses and deletions, other controllers' taints), watch events delivered late and in any
order per source, 409s from concurrent writers, re-lists and reconciles.

Invariants, checked at every release and after every step:
- a node that never had a valid attestation is never released by the gate;
- a node is never released while its Node's boot id differs from its attested boot id;
- a node whose operator-written state is not complete is never released, whatever its annotations
  say: every package the gate judged complete was reported complete by the operator (in the CR's
  status) at some time (a cache may lag the world, but never invents an operator's report);
- taints with other keys are exactly what the other writers left (the gate never touches them);
and at quiescence (every event delivered, every node reconciled, the stability window passed):
- a node is untainted exactly when its attestation is valid for its current boot and every CR
  that selects it is complete at its current version by the operator's report, with the node's
  annotation agreeing, and otherwise carries the right reason.

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
from bootstrap.gate import Gate, crindex
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
    pending: list[tuple[str, WatchEvent[Any]]] = field(default_factory=list)  # (source, event)
    other_taints: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    ever_attested: set[str] = field(default_factory=set)
    interfere: set[str] = field(default_factory=set)  # next gate patch of these nodes meets a 409
    released_unattested: list[str] = field(default_factory=list)
    boots: int = 0  # boot ids are never reused
    reported_complete: set[tuple[str, str, str]] = field(default_factory=set)  # (node, cr, version)
    gate: Gate | None = None  # to check, at each release, what the gate believed
    bad_releases: list[str] = field(default_factory=list)

    def bump(self, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)

    def emit(self, source: str, kind: str, obj: dict[str, Any]) -> None:
        # A package CR as the real watch hands it: its JSON through the gate's decoder.
        decoded = (
            crindex.DECODER.from_json(json.dumps(obj).encode()) if source in PLURALS else copy.deepcopy(obj)
        )
        self.pending.append((source, WatchEvent(kind, decoded)))

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

    async def list_cluster_objects_as(
        self, group: str, version: str, plural: str, decoder: Any
    ) -> tuple[list[Any], str]:
        items, rv = await self.list_cluster_objects(group, version, plural)
        return [decoder.from_json(json.dumps(i).encode()) for i in items], rv

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
        if before and not after:
            if name not in self.ever_attested:
                self.released_unattested.append(name)
            self.check_release(name, node)
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

    async def list_node_pods(self, _node: str) -> list[dict[str, Any]]:
        return []  # NodeWright's package pods are gone (the gate says so)

    def check_release(self, name: str, node: dict[str, Any]) -> None:
        """At the moment the gate removes the hold: the boot is attested, and every package the
        gate judged complete was reported complete by the operator at some time."""
        att = self.attestations.get(name)
        boot = node.get("status", {}).get("nodeInfo", {}).get("bootID")
        attested_boot = (att or {}).get("status", {}).get("bootID")
        if attested_boot is not None and attested_boot != boot:
            self.bad_releases.append(f"{name}: released on boot {boot}, attested {attested_boot}")
        assert self.gate is not None
        for cr in self.gate._cache.package_crs():
            if cr.selector["matchLabels"]["pool"] != node["metadata"]["labels"]["pool"]:
                continue
            for pkg in cr.packages.values():
                if (name, cr.name, pkg.version) not in self.reported_complete:
                    self.bad_releases.append(f"{name}: released on {cr.name} {pkg.version}, never reported")

    # -- what the other writers do -------------------------------------------------------------

    def new_boot(self) -> str:
        self.boots += 1
        return f"boot-{self.boots}"

    def join(self, name: str, pool: str, with_boot: bool = True) -> None:
        """Join (or renew) through nodegate: the attestation records the boot the node runs now
        (an old agent sends none)."""
        if name not in self.nodes:
            taints = [{"key": KEY, "value": "packages-pending", "effect": "NoSchedule"}]
            body = {
                "metadata": {"name": name, "labels": {"pool": pool}, "annotations": {}},
                "spec": {"taints": taints + copy.deepcopy(self.other_taints.get(name, []))},
                "status": {"conditions": [], "nodeInfo": {"bootID": self.new_boot()}},
            }
            self.put_node(name, body, "ADDED")
        status: dict[str, Any] = {
            "attestedAt": self.now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "expiresAt": (self.now + timedelta(days=30)).isoformat(),
        }
        if with_boot:
            status["bootID"] = self.nodes[name]["status"]["nodeInfo"]["bootID"]
            status["resetCount"] = self.boots
        att = {
            "metadata": {"name": name},
            "spec": {"ekSha256": "ab" * 32, "spiffeId": f"spiffe://td/node/{name}", "revoked": False},
            "status": status,
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
            "status": {"nodeInfo": {"bootID": self.new_boot()}},
        }
        self.put_node(name, body, "ADDED")

    def reboot(self, name: str) -> None:
        """The machine reboots (a NodeWright reboot interrupt, a crash): the kubelet reports a new
        boot id."""
        node = self.nodes.get(name)
        if node is None:
            return
        node = copy.deepcopy(node)
        node.setdefault("status", {})["nodeInfo"] = {"bootID": self.new_boot()}
        self.put_node(name, node)

    def attest(self, name: str) -> None:
        """`nodegate attest` from the boot the node runs now (a renewal with a fresh quote)."""
        if name in self.attestations and name in self.nodes:
            self.join(name, self.nodes[name]["metadata"]["labels"]["pool"])

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
        if name in self.crs and "status" in self.crs[name]:
            body["status"] = copy.deepcopy(self.crs[name]["status"])  # a spec write keeps the status
        self.bump(body)
        self.crs[name] = body
        self.emit(group, kind, body)

    def delete_cr(self, name: str) -> None:
        body = self.crs.pop(name, None)
        if body is not None:
            self.emit(CRS[name], "DELETED", body)

    def annotate(self, node: str, cr: str, value: dict[str, Any]) -> None:
        obj = copy.deepcopy(self.nodes[node])
        obj["metadata"]["annotations"][f"{CRS[cr]}/nodeState_{cr}"] = json.dumps(value)
        self.put_node(node, obj)

    def progress(self, node: str, cr: str, version: str, state: str) -> None:
        """What the package operator writes for one node: the Node's annotation, then (when the
        CR exists) the CR's status.nodeState and nodeStatus."""
        if node not in self.nodes:
            return
        entry = {
            "name": "pkg",
            "version": version,
            "image": "ghcr.io/x/pkg",
            "stage": "config",
            "state": state,
        }
        value = {f"pkg|{version}": entry}
        self.annotate(node, cr, value)
        body = self.crs.get(cr)
        if body is None:
            return
        body = copy.deepcopy(body)
        status = body.setdefault("status", {})
        status.setdefault("nodeState", {})[node] = value
        status.setdefault("nodeStatus", {})[node] = "complete" if state == "complete" else state
        self.bump(body)
        self.crs[cr] = body
        self.emit(CRS[cr], "MODIFIED", body)
        if state == "complete":
            self.reported_complete.add((node, cr, version))

    def forge(self, node: str) -> None:
        """The node's own credentials rewrite its annotations: every CR complete at its current
        version (what a compromised node would claim); the operator knows better."""
        if node not in self.nodes:
            return
        obj = copy.deepcopy(self.nodes[node])
        for cr, body in self.crs.items():
            version = body["spec"]["packages"]["pkg"]["version"]
            entry = {"name": "pkg", "version": version, "image": "x", "stage": "config", "state": "complete"}
            obj["metadata"]["annotations"][f"{CRS[cr]}/nodeState_{cr}"] = json.dumps(
                {f"pkg|{version}": entry}
            )
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
        attested_boot = att["status"].get("bootID")
        if attested_boot is not None and attested_boot != node["status"]["nodeInfo"]["bootID"]:
            return "unattested"
        failed = pending = False
        for cr, body in self.crs.items():
            if body["spec"]["nodeSelectors"]["matchLabels"]["pool"] != node["metadata"]["labels"]["pool"]:
                continue
            version = body["spec"]["packages"]["pkg"]["version"]
            reported = body.get("status", {}).get("nodeState", {}).get(name, {}).get(f"pkg|{version}")
            raw = node["metadata"]["annotations"].get(f"{CRS[cr]}/nodeState_{cr}")
            annotated = json.loads(raw).get(f"pkg|{version}") if raw else None

            if reported is None or reported["state"] != "complete":
                pending = True
            if stage_state(annotated) != stage_state(reported):
                pending = True
            if reported is not None and reported["state"] == "erroring":
                failed = True
        if failed:
            return "validation-failed"
        return "packages-pending" if pending else None


def stage_state(entry: dict[str, Any] | None) -> tuple[str, str] | None:
    return None if entry is None else (entry["stage"], entry["state"])


node_names = st.sampled_from(NODES)
cr_names = st.sampled_from(sorted(CRS))
pools = st.sampled_from(POOLS)
versions = st.sampled_from(["1.0.0", "2.0.0"])
ops = st.one_of(
    st.tuples(st.just("join"), node_names, pools, st.booleans()),
    st.tuples(st.just("reboot"), node_names),
    st.tuples(st.just("attest"), node_names),
    st.tuples(st.just("forge"), node_names),
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


def gate_of(world: World) -> Gate:
    """A gate on the double, its clock the world's."""
    clock: Callable[[], datetime] = lambda: world.now  # noqa: E731
    gate = Gate(
        cast(Kube, world),
        GateSettings(stability_window=WINDOW),
        events_namespace="nodegate",
        now=clock,
        identity="gate",
    )
    world.gate = gate
    return gate


async def scenario(steps: list[tuple[Any, ...]]) -> World:
    world = World()
    gate = gate_of(world)
    world.pending.clear()
    assert await gate.load() == []

    def check() -> None:
        assert world.released_unattested == []
        assert world.bad_releases == []
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
    return world


# Examples start from a small fleet (hypothesis draws short lists: without it, few examples would
# get a joined node, a CR selecting it and then the step under test); n2 starts unknown.
PROLOGUE: list[tuple[Any, ...]] = [
    ("join", "n0", "gpu", True),
    ("join", "n1", "cpu", False),  # an agent that sends no boot id
    ("put_cr", "sky-a", "1.0.0", "gpu", False),
    ("put_cr", "nw-b", "1.0.0", "cpu", False),
    ("relist",),
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(ops, max_size=40), fleet=st.booleans())
def test_random_interleavings_keep_the_invariants(steps: list[tuple[Any, ...]], fleet: bool) -> None:
    asyncio.run(scenario([*PROLOGUE, *steps] if fleet else steps))


def test_a_scripted_interleaving_with_stale_caches_converges() -> None:
    """One fixed story: a release decided, a CR bump not delivered yet, a 409 on the next write."""
    steps: list[tuple[Any, ...]] = [
        ("join", "n0", "gpu", True),
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


def test_a_scripted_reboot_is_held_until_the_new_boot_attests() -> None:
    """Released; the node reboots (held unattested at once, whatever its packages); the fresh
    attestation of the new boot arrives (released again)."""
    released: list[tuple[Any, ...]] = [
        ("join", "n0", "gpu", True),
        ("put_cr", "nw-b", "1.0.0", "gpu", False),
        ("progress", "n0", "nw-b", "1.0.0", "complete"),
        ("relist",),
        ("reconcile", "n0", False),
        ("advance",),
        ("advance",),
        ("reconcile", "n0", False),
    ]
    world = asyncio.run(scenario(released))
    assert hold(world.nodes["n0"]) is None
    rebooted = asyncio.run(scenario([*released, ("reboot", "n0"), ("reconcile", "n0", False)]))
    assert hold(rebooted.nodes["n0"]) == "unattested"
    attested = asyncio.run(scenario([*released, ("reboot", "n0"), ("attest", "n0"), ("relist",)]))
    assert hold(attested.nodes["n0"]) is None


def test_a_scripted_forgery_is_held() -> None:
    """The node writes its own annotation complete; the operator reports it in progress."""
    steps: list[tuple[Any, ...]] = [
        ("join", "n0", "gpu", True),
        ("put_cr", "sky-a", "1.0.0", "gpu", False),
        ("progress", "n0", "sky-a", "1.0.0", "in_progress"),
        ("forge", "n0"),
        ("relist",),
        ("advance",),
        ("advance",),
        ("reconcile", "n0", False),
    ]
    world = asyncio.run(scenario(steps))
    assert hold(world.nodes["n0"]) == "packages-pending"
