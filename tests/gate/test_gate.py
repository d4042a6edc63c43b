"""bootstrap/gate/ (and the Kube calls it added) against kmock through tests/support/kshim.py. Time is
a fake clock the tests advance; reconcile()/reconcile_all() are driven directly, except for the
run() tests (election, informers, timers), which wait for outcomes with bounded polling."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import json
import logging
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest
from kmock._internal import enums

from bootstrap.config import GateSettings
from bootstrap.gate import Gate, camel
from bootstrap.kube import Conflict, Kube, KubeUnavailable, NotFound, NotServed, WatchExpired
from tests.support.kshim import ShimEmulator

pytestmark = pytest.mark.kmock(cls=ShimEmulator)

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
KEY = "nodegate.io/hold"
NODES = "v1/nodes"
ATT = "nodegate.io/v1alpha1/nodeattestations"
SKYHOOKS = "skyhook.nvidia.com/v1alpha1/skyhooks"
NODEWRIGHTS = "nodewright.nvidia.com/v1alpha1/nodewrights"
LEASES = "coordination.k8s.io/v1/leases"
OTHER = {"key": "example.com/keep", "value": "x", "effect": "NoExecute"}


class Clock:
    def __init__(self, start: datetime = T0) -> None:
        self.t = start

    def __call__(self) -> datetime:
        return self.t

    def advance(self, **kw: float) -> None:
        self.t += timedelta(**kw)


def register(kmock: Any, *, nodewright: bool = True, skyhook: bool = True, pods: bool = True) -> None:
    kmock.resources[NODES] = {"kind": "Node", "namespaced": False}
    kmock.resources[ATT] = {"kind": "NodeAttestation", "namespaced": False}
    kmock.resources[LEASES] = {"kind": "Lease", "namespaced": True}
    kmock.resources["v1/events"] = {"kind": "Event", "namespaced": True}
    if pods:
        kmock.resources["v1/pods"] = {"kind": "Pod", "namespaced": True}
    if skyhook:
        kmock.resources[SKYHOOKS] = {"kind": "Skyhook", "namespaced": False}
    if nodewright:
        kmock.resources[NODEWRIGHTS] = {"kind": "NodeWright", "namespaced": False}


@pytest.fixture
async def kube(kmock: Any) -> AsyncIterator[Kube]:
    register(kmock)
    k = Kube.for_host(str(kmock.url), timeout=2.0)
    yield k
    await k.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@functools.cache
def base_settings() -> GateSettings:
    """Validated when a test first asks (functools.cache), not at import: a refusal by the installed
    pydantic or the settings model fails those tests, not the collection."""
    return GateSettings(stability_window=timedelta(seconds=30))


def make_gate(kube: Kube, clock: Callable[[], datetime], identity: str = "gate-a", **settings: Any) -> Gate:
    cfg = base_settings().model_copy(update=settings) if settings else base_settings()
    return Gate(kube, cfg, events_namespace="nodegate", now=clock, identity=identity)


@pytest.fixture
def gate(kube: Kube, clock: Clock) -> Gate:
    return make_gate(kube, clock)


def node_body(name: str, *taints: dict[str, Any], **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
        "spec": {"taints": list(taints)},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "x": [1]}]},
    }


def hold(reason: str, effect: str = "NoSchedule") -> dict[str, str]:
    return {"key": KEY, "value": reason, "effect": effect}


def attestation(name: str, *, at: datetime = T0, lifetime: timedelta = timedelta(days=1)) -> dict[str, Any]:
    return {
        "apiVersion": "nodegate.io/v1alpha1",
        "kind": "NodeAttestation",
        "metadata": {"name": name},
        "spec": {"ekSha256": "ab" * 32, "spiffeId": f"spiffe://example.org/node/{name}", "revoked": False},
        "status": {"attestedAt": at.strftime("%Y-%m-%dT%H:%M:%SZ"), "expiresAt": (at + lifetime).isoformat()},
    }


# What a CR needs so that NodeWright schedules its package pods on a held node (docs/gate.md).
HOLD_TOLERATIONS = [
    {"key": KEY, "operator": "Equal", "value": v, "effect": "NoSchedule"}
    for v in ("packages-pending", "validation-failed")
]


def package_cr(
    group: str,
    name: str,
    packages: dict[str, str],
    *,
    selector: dict[str, Any] | None = None,
    tolerations: list[dict[str, Any]] | None = None,
    **annotations: str,
) -> dict[str, Any]:
    return {
        "apiVersion": f"{group}/v1alpha1",
        "kind": "Skyhook" if group == "skyhook.nvidia.com" else "NodeWright",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "runtimeRequired": True,
            "nodeSelectors": selector if selector is not None else {"matchLabels": {"pool": "gpu"}},
            "additionalTolerations": HOLD_TOLERATIONS if tolerations is None else tolerations,
            "packages": {p: {"version": v, "image": f"ghcr.io/x/{p}"} for p, v in packages.items()},
        },
    }


def plural(group: str) -> str:
    return "skyhooks" if group == "skyhook.nvidia.com" else "nodewrights"


async def joined(kube: Kube, name: str = "w1", *taints: dict[str, Any], at: datetime = T0) -> None:
    """A node as nodegate's join service leaves it: pre-created with the hold, plus its attestation."""
    await kube.create_node(node_body(name, *(taints or (hold("packages-pending"), OTHER)), pool="gpu"))
    await kube.create_cluster_object("nodegate.io", "v1alpha1", "nodeattestations", attestation(name, at=at))


async def add_cr(kube: Kube, group: str, name: str, packages: dict[str, str], **kw: Any) -> None:
    await kube.create_cluster_object(
        group, "v1alpha1", plural(group), package_cr(group, name, packages, **kw)
    )


def node_state_value(states: dict[str, tuple[str, str, str]]) -> dict[str, Any]:
    """NodeWright's nodeState map: package -> (version, stage, state) becomes name|version -> entry."""
    return {
        f"{p}|{v}": {"name": p, "version": v, "image": f"ghcr.io/x/{p}", "stage": stage, "state": state}
        for p, (v, stage, state) in states.items()
    }


async def operator_writes(
    kube: Kube,
    node: str,
    cr: str,
    states: dict[str, tuple[str, str, str]],
    prefix: str = "skyhook.nvidia.com",
    *,
    group: str | None = None,
    annotation: bool = True,
    status: bool = True,
    node_status: str | None = None,
) -> None:
    """What the NodeWright/Skyhook operator writes for one node (wrapper/node.go SetState, then
    SetStatus): the Node's nodeState annotation, then the CR's status.nodeState and nodeStatus
    (through the status subresource, as its own service account)."""
    value = node_state_value(states)
    if annotation:
        await kube.patch_node(
            node, {"metadata": {"annotations": {f"{prefix}/nodeState_{cr}": json.dumps(value)}}}
        )
    if status:
        group = group or prefix
        if node_status is None:
            found = {state for _v, _stage, state in states.values()}
            node_status = (
                "erroring" if "erroring" in found else "complete" if found <= {"complete"} else "in_progress"
            )
        current = await kube.get_cluster_object(group, "v1alpha1", plural(group), cr)
        assert current is not None
        old = (current.get("status") or {}).get("nodeState", {}).get(node, {})
        entries: dict[str, Any] = {k: None for k in old}  # merge patch: the map is replaced whole
        entries.update(value)
        patch = {"status": {"nodeState": {node: entries}, "nodeStatus": {node: node_status}}}
        await kube.patch_cluster_object(group, "v1alpha1", plural(group), cr, patch, status=True)


def stored(kmock: Any, resource: str, name: str) -> dict[str, Any]:
    return copy.deepcopy(kmock.objects[resource, None, name].raw)


def hold_taints(kmock: Any, name: str = "w1") -> list[dict[str, Any]]:
    return [t for t in stored(kmock, NODES, name)["spec"].get("taints") or [] if t.get("key") == KEY]


def ready_condition(kmock: Any, name: str = "w1") -> dict[str, Any]:
    (cond,) = [c for c in stored(kmock, NODES, name)["status"]["conditions"] if c["type"] == "NodegateReady"]
    return cond


def events(kmock: Any) -> list[dict[str, Any]]:
    out = [v.raw for k, v in kmock.objects.items() if k[0] == "v1/events"]
    return sorted(out, key=lambda e: e["metadata"]["resourceVersion"])


EXPIRED = {
    "type": "ERROR",
    "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"},
}


def writes(kmock: Any) -> int:
    return len(list(kmock[enums.method.PATCH])) + len(list(kmock[enums.method.PUT]))


# -- Kube additions ---------------------------------------------------------------------------


async def test_list_nodes_and_status_patch(kmock: Any, kube: Kube) -> None:
    assert await kube.list_nodes() == ([], "...")
    await kube.create_node(node_body("a", pool="gpu"))
    await kube.create_node(node_body("b", pool="cpu"))
    items, _ = await kube.list_nodes()
    assert sorted(i["metadata"]["name"] for i in items) == ["a", "b"]
    gpu, _ = await kube.list_nodes(label_selector="pool=gpu")
    assert [i["metadata"]["name"] for i in gpu] == ["a"]

    node = await kube.get_node("a")
    assert node is not None
    rv = node["metadata"]["resourceVersion"]
    conditions = [*node["status"]["conditions"], {"type": "NodegateReady", "status": "False"}]
    out = await kube.patch_node_status(
        "a", {"metadata": {"resourceVersion": rv}, "status": {"conditions": conditions}}
    )
    assert out["status"]["conditions"] == conditions
    assert out["spec"] == node["spec"]
    assert kmock[enums.method.PATCH][-1].url.path == "/api/v1/nodes/a/status"
    assert kmock[enums.method.PATCH][-1].headers["Content-Type"] == "application/merge-patch+json"
    with pytest.raises(Conflict):
        await kube.patch_node_status("a", {"metadata": {"resourceVersion": rv}, "status": {"conditions": []}})
    with pytest.raises(NotFound):
        await kube.patch_node_status("zz", {"status": {}})


async def test_watch_nodes_follows_and_reports_410(kmock: Any, kube: Kube) -> None:
    await kube.create_node(node_body("a"))
    seen: list[tuple[str, str]] = []
    async for event in kube.watch_nodes("..."):
        seen.append((event.type, event.object["metadata"]["name"]))
        break
    assert seen == [("ADDED", "a")]
    assert kmock[enums.action.WATCH][-1].params["resourceVersion"] == "..."
    kmock.script("watch", NODES, [EXPIRED])
    kmock.script("watch", NODES, 500)
    async with asyncio.timeout(10):
        with pytest.raises(WatchExpired):
            async for _ in kube.watch_nodes("5"):
                pass
        with pytest.raises(KubeUnavailable, match="500"):
            async for _ in kube.watch_nodes("5"):
                pass


async def test_leases(kmock: Any, kube: Kube) -> None:
    assert await kube.get_lease("ng", "gate") is None
    body = {"metadata": {"name": "gate", "namespace": "ng"}, "spec": {"holderIdentity": "a"}}
    created = await kube.create_lease("ng", body)
    with pytest.raises(Conflict):
        await kube.create_lease("ng", body)
    got = await kube.get_lease("ng", "gate")
    assert got == created
    with pytest.raises(ValueError, match="resourceVersion"):
        await kube.replace_lease("ng", "gate", {"metadata": {"name": "gate"}, "spec": {}})
    replaced = await kube.replace_lease("ng", "gate", {**created, "spec": {"holderIdentity": "b"}})
    assert replaced["spec"] == {"holderIdentity": "b"}
    assert kmock[enums.method.PUT][-1].url.path == "/apis/coordination.k8s.io/v1/namespaces/ng/leases/gate"
    with pytest.raises(Conflict):  # the resourceVersion that was read is stale now
        await kube.replace_lease("ng", "gate", {**created, "spec": {"holderIdentity": "c"}})
    with pytest.raises(NotFound):
        await kube.replace_lease(
            "ng", "nope", {**created, "metadata": {"name": "nope", "resourceVersion": "1"}}
        )


async def test_unserved_lists_are_not_served(kube: Kube) -> None:
    with pytest.raises(NotServed):
        await kube.list_cluster_objects("example.com", "v1", "unknowns")


# -- the gate: decisions written ---------------------------------------------------------------


async def test_joined_node_is_held_packages_pending(kmock: Any, kube: Kube, gate: Gate) -> None:
    await joined(kube)
    await add_cr(kube, "skyhook.nvidia.com", "drivers", {"gpu-driver": "550.1"})
    report = await gate.reconcile_all()
    assert (report.nodes, report.held, report.released, report.errors) == (1, {"packages-pending": 1}, 0, [])
    assert hold_taints(kmock) == [hold("packages-pending")]  # unchanged: no taint write
    assert stored(kmock, NODES, "w1")["spec"]["taints"][1] == OTHER
    cond = ready_condition(kmock)
    assert (cond["status"], cond["reason"]) == ("False", "PackagesPending")
    assert "gpu-driver 550.1" in cond["message"]
    status = stored(kmock, ATT, "w1")["status"]
    assert status["attestedAt"] == "2026-03-01T12:00:00Z"  # the join service's keys are kept
    assert (status["phase"], status["reason"]) == ("Held", "packages-pending")
    assert status["packages"] == [
        {
            "cr": "skyhook.nvidia.com/drivers",
            "package": "gpu-driver",
            "version": "550.1",
            "stage": None,
            "state": None,
            "complete": False,
        }
    ]
    assert status.get("completeSince") is None  # null in a merge patch: the key is removed
    assert status["observedAt"] == "2026-03-01T12:00:00Z"
    (held,) = status["conditions"]
    assert (held["type"], held["status"], held["reason"]) == ("Held", "True", "PackagesPending")
    assert report.writes == 2  # the condition and the status; no event (the reason did not change)
    assert events(kmock) == []

    before = writes(kmock)
    again = await gate.reconcile_all()
    assert (again.writes, writes(kmock)) == (0, before)  # nothing changed: nothing written


async def test_packages_progress_then_release_after_the_window(
    kmock: Any, kube: Kube, gate: Gate, clock: Clock
) -> None:
    await joined(kube)
    await add_cr(kube, "skyhook.nvidia.com", "drivers", {"gpu-driver": "550.1", "tuning": "2"})
    await gate.reconcile_all()
    stages = [("apply", "in_progress"), ("apply", "complete"), ("config", "in_progress")]
    for stage, state in stages:
        await operator_writes(
            kube,
            "w1",
            "drivers",
            {"gpu-driver": ("550.1", stage, state), "tuning": ("2", "config", "complete")},
        )
        assert await gate.load() == []  # what the CR watch would bring
        clock.advance(seconds=10)  # a stage alone changed: written at most once per 10 s
        decision = await gate.reconcile("w1")
        assert decision is not None
        assert decision.reason == "packages-pending"
        assert hold_taints(kmock) == [hold("packages-pending")]
        assert f"stage {stage} state {state}" in stored(kmock, ATT, "w1")["status"]["message"]

    await operator_writes(
        kube,
        "w1",
        "drivers",
        {"gpu-driver": ("550.1", "config", "complete"), "tuning": ("2", "config", "complete")},
    )
    assert await gate.load() == []
    clock.advance(seconds=5)
    done_at = clock()
    decision = await gate.reconcile("w1")
    assert decision is not None
    assert (decision.reason, decision.complete_since) == ("packages-pending", done_at)
    assert decision.requeue_at == done_at + timedelta(seconds=30)  # the end of the stability window
    assert stored(kmock, ATT, "w1")["status"]["completeSince"] == done_at.strftime("%Y-%m-%dT%H:%M:%SZ")

    clock.advance(seconds=29)
    assert (await gate.reconcile("w1") or decision).reason == "packages-pending"
    assert hold_taints(kmock) == [hold("packages-pending")]
    clock.advance(seconds=1)
    released = await gate.reconcile("w1")
    assert released is not None
    assert released.reason is None
    node = stored(kmock, NODES, "w1")
    assert node["spec"]["taints"] == [OTHER]  # only the hold went
    assert node["status"]["conditions"][0] == {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "x": [1],
    }
    cond = ready_condition(kmock)
    assert (cond["status"], cond["reason"]) == ("True", "Released")
    assert cond["lastTransitionTime"] == clock().strftime("%Y-%m-%dT%H:%M:%SZ")
    status = stored(kmock, ATT, "w1")["status"]
    assert (status["phase"], status["reason"]) == ("Ready", "")
    assert [(c["status"], c["reason"]) for c in status["conditions"]] == [("False", "Released")]
    assert [(e["reason"], e["type"]) for e in events(kmock)] == [("NodegateReleased", "Normal")]
    (event,) = events(kmock)
    # A Node's Event lives in default: the real API server refuses it anywhere else
    # (tests/cluster/test_store.py showed the 422 for events_namespace: nodegate).
    assert event["metadata"]["namespace"] == "default"
    assert event["involvedObject"]["name"] == "w1"
    assert event["involvedObject"]["uid"] == node["metadata"]["uid"]

    before = writes(kmock)
    clock.advance(seconds=60)
    assert (await gate.reconcile("w1") or decision).reason is None
    assert writes(kmock) == before  # released and nothing new: no write


async def test_erroring_package_is_validation_failed(kmock: Any, kube: Kube, gate: Gate) -> None:
    await joined(kube)
    await add_cr(kube, "skyhook.nvidia.com", "drivers", {"gpu-driver": "550.1"})
    await operator_writes(kube, "w1", "drivers", {"gpu-driver": ("550.1", "apply", "erroring")})
    report = await gate.reconcile_all()
    assert report.held == {"validation-failed": 1}
    assert hold_taints(kmock) == [hold("validation-failed")]
    assert ready_condition(kmock)["reason"] == "ValidationFailed"
    assert [(e["reason"], e["type"]) for e in events(kmock)] == [("NodegateHeld", "Warning")]
    assert stored(kmock, ATT, "w1")["status"]["reason"] == "validation-failed"


async def test_paused_cr_holds_and_says_so(kmock: Any, kube: Kube, gate: Gate) -> None:
    await joined(kube)
    await add_cr(
        kube, "skyhook.nvidia.com", "drivers", {"gpu-driver": "550.1"}, **{"skyhook.nvidia.com/pause": "true"}
    )
    await operator_writes(kube, "w1", "drivers", {"gpu-driver": ("550.1", "apply", "in_progress")})
    report = await gate.reconcile_all()
    assert report.held == {"packages-pending": 1}
    assert "skyhook.nvidia.com/drivers is paused" in stored(kmock, ATT, "w1")["status"]["message"]
    assert "is paused" in ready_condition(kmock)["message"]


async def released_node(kmock: Any, kube: Kube, gate: Gate, clock: Clock) -> None:
    await joined(kube)
    await add_cr(kube, "skyhook.nvidia.com", "drivers", {"gpu-driver": "550.1"})
    await operator_writes(kube, "w1", "drivers", {"gpu-driver": ("550.1", "config", "complete")})
    await gate.reconcile_all()
    clock.advance(seconds=30)
    await gate.reconcile_all()
    assert hold_taints(kmock) == []


async def test_version_bump_holds_again(kmock: Any, kube: Kube, gate: Gate, clock: Clock) -> None:
    await released_node(kmock, kube, gate, clock)
    await kube.patch_cluster_object(
        "skyhook.nvidia.com",
        "v1alpha1",
        "skyhooks",
        "drivers",
        {"spec": {"packages": {"gpu-driver": {"version": "560.2"}}}},
    )
    clock.advance(seconds=1)
    report = await gate.reconcile_all()
    assert report.held == {"packages-pending": 1}
    assert hold_taints(kmock) == [hold("packages-pending")]
    assert stored(kmock, NODES, "w1")["spec"]["taints"] == [OTHER, hold("packages-pending")]
    assert [e["reason"] for e in events(kmock)] == ["NodegateReleased", "NodegateHeld"]
    status = stored(kmock, ATT, "w1")["status"]
    assert status.get("completeSince") is None  # null in a merge patch: the key is removed
    assert status["packages"][0]["version"] == "560.2"

    await operator_writes(kube, "w1", "drivers", {"gpu-driver": ("560.2", "config", "complete")})
    assert await gate.load() == []
    await gate.reconcile("w1")
    clock.advance(seconds=29)
    await gate.reconcile("w1")
    assert hold_taints(kmock) == [hold("packages-pending")]  # the window starts again
    clock.advance(seconds=1)
    await gate.reconcile("w1")
    assert hold_taints(kmock) == []


async def test_cr_deletion_releases(kmock: Any, kube: Kube, gate: Gate, clock: Clock) -> None:
    await joined(kube)
    await add_cr(kube, "skyhook.nvidia.com", "drivers", {"gpu-driver": "550.1"})
    assert (await gate.reconcile_all()).held == {"packages-pending": 1}
    await kube.delete_cluster_object("skyhook.nvidia.com", "v1alpha1", "skyhooks", "drivers")
    assert (await gate.reconcile_all()).held == {"packages-pending": 1}  # stable for the window first
    clock.advance(seconds=30)
    report = await gate.reconcile_all()
    assert (report.released, report.held) == (1, {})
    assert hold_taints(kmock) == []
    assert stored(kmock, ATT, "w1")["status"]["message"] == "attested; no package CR selects it"


async def test_both_api_groups_and_both_prefixes(kmock: Any, kube: Kube, gate: Gate, clock: Clock) -> None:
    await joined(kube)
    await joined(kube, "w2", hold("packages-pending"))
    await add_cr(kube, "nodewright.nvidia.com", "net", {"ofed": "24.1"})
    await add_cr(kube, "skyhook.nvidia.com", "drivers", {"gpu-driver": "550.1"})
    # A Skyhook superseded by its NodeWright mirror is not judged (its state may never be written
    # again): the mirror has its name, its spec and upstream's two stamps (gate/mirror.py).
    await add_cr(kube, "skyhook.nvidia.com", "old", {"legacy": "1"})
    await add_cr(
        kube,
        "nodewright.nvidia.com",
        "old",
        {"legacy": "1"},
        **{"nodewright.nvidia.com/mirrored-from": "old", "nodewright.nvidia.com/mirrored-generation": "1"},
    )
    for node in ("w1", "w2"):
        await operator_writes(
            kube, node, "net", {"ofed": ("24.1", "config", "complete")}, "nodewright.nvidia.com"
        )
        await operator_writes(
            kube, node, "old", {"legacy": ("1", "config", "complete")}, "nodewright.nvidia.com"
        )
    await operator_writes(kube, "w1", "drivers", {"gpu-driver": ("550.1", "config", "complete")})
    await gate.reconcile_all()
    clock.advance(seconds=30)
    report = await gate.reconcile_all()
    assert (report.released, report.held) == (1, {"packages-pending": 1})
    assert hold_taints(kmock, "w1") == []
    assert hold_taints(kmock, "w2") == [hold("packages-pending")]
    rows = stored(kmock, ATT, "w1")["status"]["packages"]
    assert sorted(r["cr"] for r in rows) == [
        "nodewright.nvidia.com/net",
        "nodewright.nvidia.com/old",
        "skyhook.nvidia.com/drivers",
    ]
    assert "skyhook.nvidia.com/drivers: gpu-driver" in stored(kmock, ATT, "w2")["status"]["message"]


@pytest.mark.parametrize("served", ["nodewright.nvidia.com", "skyhook.nvidia.com"])
async def test_a_group_that_is_not_served_counts_as_empty(kmock: Any, clock: Clock, served: str) -> None:
    register(kmock, nodewright=served == "nodewright.nvidia.com", skyhook=served == "skyhook.nvidia.com")
    kube = Kube.for_host(str(kmock.url), timeout=2.0)
    try:
        gate = make_gate(kube, clock)
        await joined(kube)
        await add_cr(kube, served, "drivers", {"gpu-driver": "550.1"})
        prefix = served
        await operator_writes(kube, "w1", "drivers", {"gpu-driver": ("550.1", "config", "complete")}, prefix)
        records: list[logging.LogRecord] = []
        handler = logging.Handler()
        handler.emit = records.append  # type: ignore[method-assign]
        logger = logging.getLogger("nodegate.gate")
        level = logger.level
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        try:
            first = await gate.reconcile_all()
            assert first.errors == []
            (missing,) = gate.not_served
            assert missing != served
            clock.advance(seconds=30)
            assert (await gate.reconcile_all()).released == 1
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
        assert sum("is not served" in r.getMessage() for r in records) == 1  # logged once, not per pass
    finally:
        await kube.close()


async def test_invalid_cr_holds_the_nodes_it_may_select(
    kmock: Any, kube: Kube, gate: Gate, clock: Clock
) -> None:
    await joined(kube)
    bad = package_cr("skyhook.nvidia.com", "bad", {"x": "1"})
    bad["spec"]["packages"]["x"] = {"image": "no-version"}
    await kube.create_cluster_object("skyhook.nvidia.com", "v1alpha1", "skyhooks", bad)
    await gate.reconcile_all()
    clock.advance(seconds=60)
    report = await gate.reconcile_all()
    assert report.held == {"packages-pending": 1}
    assert "invalid CR" in stored(kmock, ATT, "w1")["status"]["message"]


@pytest.mark.parametrize(
    ("case", "effect"),
    [("revoked", "NoExecute"), ("expired", "NoExecute"), ("lifetime", "NoSchedule")],
)
async def test_revoked_or_expired_is_quarantined(
    kmock: Any, kube: Kube, clock: Clock, case: str, effect: str
) -> None:
    gate = make_gate(kube, clock, quarantine_effect=effect, attestation_lifetime=timedelta(hours=12))
    await released_node(kmock, kube, gate, clock)
    if case == "revoked":
        await kube.patch_cluster_object(
            "nodegate.io", "v1alpha1", "nodeattestations", "w1", {"spec": {"revoked": True}}
        )
    elif case == "expired":
        clock.advance(days=1)
    else:
        clock.advance(hours=12)
    report = await gate.reconcile_all()
    assert report.held == {"quarantined": 1}
    assert hold_taints(kmock) == [hold("quarantined", effect)]
    assert stored(kmock, NODES, "w1")["spec"]["taints"][0] == OTHER
    assert [e["reason"] for e in events(kmock)][-1] == "NodegateQuarantined"
    assert stored(kmock, ATT, "w1")["status"]["phase"] == "Quarantined"
    assert ready_condition(kmock)["reason"] == "Quarantined"


async def test_node_without_attestation_is_unattested_and_not_created(
    kmock: Any, kube: Kube, gate: Gate
) -> None:
    await kube.create_node(node_body("w9", OTHER))  # never joined through nodegate, not held yet
    report = await gate.reconcile_all()
    assert report.held == {"unattested": 1}
    assert stored(kmock, NODES, "w9")["spec"]["taints"] == [OTHER, hold("unattested")]
    assert (ATT, None, "w9") not in kmock.objects
    assert [e["reason"] for e in events(kmock)] == ["NodegateHeld"]


async def test_attestation_without_a_node_is_attested_then_follows_the_node(
    kmock: Any, kube: Kube, gate: Gate, clock: Clock
) -> None:
    await kube.create_cluster_object("nodegate.io", "v1alpha1", "nodeattestations", attestation("w5"))
    await gate.reconcile_all()
    status = stored(kmock, ATT, "w5")["status"]
    assert (status["phase"], status["reason"]) == ("Attested", "")
    assert status["attestedAt"] == "2026-03-01T12:00:00Z"  # the join service's keys are kept
    # The kubelet registers (no CR selects it): Ready after the window; then the Node is deleted.
    await kube.create_node(node_body("w5", hold("unattested")))
    await gate.reconcile_all()
    clock.advance(seconds=31)
    await gate.reconcile_all()
    assert stored(kmock, ATT, "w5")["status"]["phase"] == "Ready"
    url = f"{str(kmock.url).rstrip('/')}/api/v1/nodes/w5"  # the Node is deleted (kube.py has no call)
    async with aiohttp.ClientSession() as http, http.delete(url) as resp:
        assert resp.status == 200
    await gate.reconcile_all()
    assert stored(kmock, ATT, "w5")["status"]["phase"] == "Attested"  # not a stale "Ready"


def test_camel() -> None:
    assert [camel(r) for r in ("packages-pending", "unattested", "validation-failed", None)] == [
        "PackagesPending",
        "Unattested",
        "ValidationFailed",
        "Released",
    ]


# -- conflicts, failures ---------------------------------------------------------------------


def stale_reads(kmock: Any, name: str, times: int) -> Callable[[], Any]:
    """Answer the next ``times`` reads of the node with the object as it was while another writer
    adds its own taint behind the gate's back; later reads fall through to the emulator."""
    left = [times]
    key = (NODES, None, name)

    def read() -> Any:
        if left[0] <= 0:
            return None  # no content: kmock moves on to the emulator
        left[0] -= 1
        before = copy.deepcopy(kmock.objects[key].raw)
        raw = kmock.objects[key].raw
        extra = {"key": f"example.com/racer-{left[0]}", "effect": "NoSchedule"}
        kmock.objects[key].patch(
            {
                "metadata": {"resourceVersion": f"other-{left[0]}"},
                "spec": {"taints": [*raw["spec"]["taints"], extra]},
            }
        )
        return before

    return read


def taint_patches(kmock: Any, name: str = "w1") -> list[Any]:
    return [r for r in kmock[enums.method.PATCH] if r.url.path == f"/api/v1/nodes/{name}"]


async def test_a_409_on_the_taint_patch_is_retried_on_a_fresh_read(
    kmock: Any, kube: Kube, gate: Gate, clock: Clock
) -> None:
    await joined(kube)
    await add_cr(kube, "skyhook.nvidia.com", "drivers", {"gpu-driver": "550.1"})
    await operator_writes(kube, "w1", "drivers", {"gpu-driver": ("550.1", "config", "complete")})
    await gate.reconcile_all()
    clock.advance(seconds=30)
    kmock["get /api/v1/nodes/w1"] << stale_reads(kmock, "w1", times=2)
    before = len(taint_patches(kmock))
    decision = await gate.reconcile("w1")
    assert decision is not None
    assert decision.reason is None
    assert len(taint_patches(kmock)) == before + 3  # two stale writes answered 409, the third converged
    assert stored(kmock, NODES, "w1")["spec"]["taints"] == [
        OTHER,
        {"key": "example.com/racer-1", "effect": "NoSchedule"},
        {"key": "example.com/racer-0", "effect": "NoSchedule"},
    ]
    assert [e["reason"] for e in events(kmock)] == ["NodegateReleased"]


async def test_a_409_on_the_condition_write_is_retried(kmock: Any, kube: Kube, gate: Gate) -> None:
    await joined(kube)
    await add_cr(kube, "skyhook.nvidia.com", "drivers", {"gpu-driver": "550.1"})
    kmock.script("patch", NODES, 409)  # the taint is right already: the first node write is the condition
    report = await gate.reconcile_all()
    assert report.errors == []
    status_patches = [r for r in kmock[enums.method.PATCH] if r.url.path == "/api/v1/nodes/w1/status"]
    assert len(status_patches) == 2
    assert ready_condition(kmock)["reason"] == "PackagesPending"
    assert stored(kmock, NODES, "w1")["status"]["conditions"][0]["type"] == "Ready"


async def test_conflicts_that_never_end_give_up_without_release(
    kmock: Any, kube: Kube, gate: Gate, clock: Clock
) -> None:
    await joined(kube)
    await gate.reconcile_all()
    await kube.patch_cluster_object(
        "nodegate.io", "v1alpha1", "nodeattestations", "w1", {"spec": {"revoked": True}}
    )
    await gate.load()
    kmock["get /api/v1/nodes/w1"] << stale_reads(kmock, "w1", times=100)
    with pytest.raises(Conflict):
        await gate.reconcile("w1")
    assert hold_taints(kmock) == [hold("packages-pending")]  # nothing half-written
    gets = [r for r in kmock[enums.method.GET] if r.url.path == "/api/v1/nodes/w1"]
    assert len(gets) == 6  # one fresh read per attempt, then it gives up


async def test_a_failed_list_decides_nothing(kmock: Any, kube: Kube, gate: Gate, clock: Clock) -> None:
    await joined(kube)
    await operator_writes(kube, "w1", "drivers", {}, status=False)  # no CR: nothing selects w1
    await gate.reconcile_all()
    clock.advance(seconds=30)
    before = writes(kmock)
    for resource in (ATT, SKYHOOKS, NODES):
        kmock.script("list", resource, 500)
        report = await gate.reconcile_all()
        assert report.errors, resource
        assert (report.nodes, report.released, report.writes) == (0, 0, 0)
        assert writes(kmock) == before
        assert hold_taints(kmock) == [hold("packages-pending")]
    assert (await gate.reconcile_all()).released == 1  # the API is back


async def test_timeouts_and_errors_release_nothing(kmock: Any, clock: Clock) -> None:
    register(kmock)
    kube = Kube.for_host(str(kmock.url), timeout=0.2)
    release = asyncio.Event()
    try:
        gate = make_gate(kube, clock)
        await joined(kube)
        await gate.reconcile_all()
        clock.advance(seconds=30)

        async def hang() -> Any:
            await release.wait()
            return None

        kmock["list skyhook.nvidia.com/v1alpha1/skyhooks"] << hang
        report = await gate.reconcile_all()
        assert any("no answer within" in e for e in report.errors)
        assert hold_taints(kmock) == [hold("packages-pending")]
        release.set()

        kmock.script("patch", NODES, 503)
        report = await gate.reconcile_all()
        assert (report.released, len(report.errors)) == (0, 1)
        assert "503" in report.errors[0]
        assert hold_taints(kmock) == [hold("packages-pending")]
        assert (await gate.reconcile_all()).released == 1
    finally:
        release.set()
        await kube.close()


async def test_reconcile_before_any_list_decides_nothing(kmock: Any, kube: Kube, gate: Gate) -> None:
    await joined(kube)
    assert await gate.reconcile("w1") is None
    assert writes(kmock) == 0


async def test_reconcile_all_report(kmock: Any, kube: Kube, gate: Gate, clock: Clock) -> None:
    await joined(kube, "a")
    await joined(kube, "b")
    await kube.create_node(node_body("c", hold("packages-pending")))
    await add_cr(
        kube,
        "nodewright.nvidia.com",
        "net",
        {"ofed": "1"},
        selector={"matchLabels": {"kubernetes.io/hostname": "b"}},
    )
    await gate.reconcile_all()
    clock.advance(seconds=30)
    report = await gate.reconcile_all()
    assert report.nodes == 3
    assert report.held == {"packages-pending": 1, "unattested": 1}
    assert report.released == 1
    assert report.errors == []
    assert report.writes > 0
    assert hold_taints(kmock, "a") == []
    assert hold_taints(kmock, "c") == [hold("unattested")]


# -- leader election --------------------------------------------------------------------------


def lease(kmock: Any) -> dict[str, Any]:
    return copy.deepcopy(kmock.objects[LEASES, "nodegate", "nodegate-gate"].raw)


async def test_only_the_leader_writes(kmock: Any, kube: Kube, clock: Clock) -> None:
    other = Kube.for_host(str(kmock.url), timeout=2.0)
    try:
        a, b = make_gate(kube, clock, "gate-a"), make_gate(other, clock, "gate-b")
        assert [await a.elect(), await b.elect()] == [True, False]
        spec = lease(kmock)["spec"]
        assert (spec["holderIdentity"], spec["leaseDurationSeconds"], spec["leaseTransitions"]) == (
            "gate-a",
            15,
            0,
        )
        assert spec["renewTime"] == "2026-03-01T12:00:00.000000Z"

        await joined(kube)
        await kube.create_node(node_body("w2"))
        assert (await b.reconcile_all()).writes == 0
        assert writes(kmock) == 0
        assert (await a.reconcile_all()).writes > 0
        assert hold_taints(kmock, "w2") == [hold("unattested")]

        clock.advance(seconds=5)
        assert await a.elect()  # renewal keeps the acquire time
        renewed = lease(kmock)["spec"]
        assert renewed["acquireTime"] == spec["acquireTime"]
        assert renewed["renewTime"] == "2026-03-01T12:00:05.000000Z"

        clock.advance(seconds=10)  # a stops writing at 2/3 of the duration without a renewal
        assert not a.is_leader()
        await kube.patch_cluster_object(
            "nodegate.io", "v1alpha1", "nodeattestations", "w1", {"spec": {"revoked": True}}
        )
        before = writes(kmock)
        assert (await a.reconcile_all()).writes == 0
        assert not await b.elect()  # the lease is still a's for 5 more seconds
        clock.advance(seconds=5)
        assert await b.elect()
        taken = lease(kmock)["spec"]
        assert (taken["holderIdentity"], taken["leaseTransitions"]) == ("gate-b", 1)
        assert not await a.elect()
        assert writes(kmock) == before + 1  # b's takeover of the lease only
        assert (await b.reconcile_all()).held["quarantined"] == 1
    finally:
        await other.close()


async def test_racing_candidates_elect_one(kmock: Any, kube: Kube, clock: Clock) -> None:
    other = Kube.for_host(str(kmock.url), timeout=2.0)
    try:
        a, b = make_gate(kube, clock, "gate-a"), make_gate(other, clock, "gate-b")
        assert sorted(await asyncio.gather(a.elect(), b.elect())) == [False, True]
        clock.advance(seconds=20)  # expired: both try to take it over with the same resourceVersion
        assert sorted(await asyncio.gather(a.elect(), b.elect())) == [False, True]
        assert a.is_leader() != b.is_leader()
    finally:
        await other.close()


async def test_unavailable_lease_api_keeps_writing_only_until_the_deadline(
    kmock: Any, kube: Kube, clock: Clock
) -> None:
    gate = make_gate(kube, clock)
    assert await gate.elect()
    kmock.script("fetch", LEASES, 503)
    clock.advance(seconds=5)
    assert await gate.elect()  # not renewed, but still within the deadline
    clock.advance(seconds=5)
    assert not gate.is_leader()


# -- run(): election, informers, work queue, timers (real clock; outcomes awaited, bounded) ----


def real_now() -> datetime:
    return datetime.now(UTC)


async def eventually(check: Callable[[], bool], what: str, limit: float = 10.0) -> None:
    """Wait for ``check`` (the controller works in the background); fail after ``limit`` s."""
    try:
        async with asyncio.timeout(limit):
            while not check():
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"never happened: {what}") from None


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def loads_of(kmock: Any, path: str) -> int:
    """Streaming lists asked of ``path``."""
    return sum(1 for r in kmock[enums.action.WATCH] if r.url.path == path and "sendInitialEvents" in r.params)


async def test_run_follows_events_and_releases_on_the_timer(kmock: Any, kube: Kube) -> None:
    # The resync is 10 minutes: only the requeue timer can end the stability window here.
    gate = make_gate(kube, real_now, stability_window=timedelta(seconds=0.3))
    await joined(kube, at=real_now())
    await add_cr(kube, "skyhook.nvidia.com", "drivers", {"gpu-driver": "550.1"})
    task = asyncio.create_task(gate.run())
    try:
        await eventually(lambda: "reason" in stored(kmock, ATT, "w1").get("status", {}), "the first decision")
        assert hold_taints(kmock) == [hold("packages-pending")]
        assert lease(kmock)["spec"]["holderIdentity"] == "gate-a"

        # A node event (the operator's annotation) starts the window; the timer ends it.
        await operator_writes(kube, "w1", "drivers", {"gpu-driver": ("550.1", "config", "complete")})
        await eventually(lambda: hold_taints(kmock) == [], "the release after the window")
        assert stored(kmock, NODES, "w1")["spec"]["taints"] == [OTHER]

        # A CR event re-decides the nodes it selects.
        await kube.patch_cluster_object(
            "skyhook.nvidia.com",
            "v1alpha1",
            "skyhooks",
            "drivers",
            {"spec": {"packages": {"gpu-driver": {"version": "2"}}}},
        )
        await eventually(
            lambda: hold_taints(kmock) == [hold("packages-pending")], "the hold after a version bump"
        )

        # A NodeAttestation event re-decides its node.
        await kube.patch_cluster_object(
            "nodegate.io", "v1alpha1", "nodeattestations", "w1", {"spec": {"revoked": True}}
        )
        await eventually(
            lambda: hold_taints(kmock) == [hold("quarantined")], "the quarantine after a revocation"
        )

        # A new node is seen by the node watch.
        await kube.create_node(node_body("w2"))
        await eventually(lambda: hold_taints(kmock, "w2") == [hold("unattested")], "the new node held")
        await eventually(lambda: len(events(kmock)) == 4, "the events")
    finally:
        await stop(task)
    assert lease(kmock)["spec"]["holderIdentity"] == ""  # given up on shutdown
    assert [e["reason"] for e in events(kmock)] == [
        "NodegateReleased",
        "NodegateHeld",
        "NodegateQuarantined",
        "NodegateHeld",
    ]


async def test_run_loads_again_after_410_and_survives_api_failures(kmock: Any, kube: Kube) -> None:
    gate = make_gate(kube, real_now)
    await kube.create_node(node_body("w1"))
    kmock.script("watch", NODES, [EXPIRED])  # the nodes' streaming list: 410, loaded again
    kmock.script("watch", ATT, 500)  # the attestations' fails: nothing is decided until it works
    kmock.script("patch", NODES, 503)  # and so does the first taint write: retried after a backoff
    task = asyncio.create_task(gate.run())
    try:
        await eventually(lambda: loads_of(kmock, "/api/v1/nodes") >= 2, "a load again after 410")
        await eventually(lambda: hold_taints(kmock) == [hold("unattested")], "the hold despite the failures")
        assert loads_of(kmock, "/apis/nodegate.io/v1alpha1/nodeattestations") >= 2
        await kube.create_node(node_body("w2"))
        await eventually(lambda: hold_taints(kmock, "w2") == [hold("unattested")], "a node after the load")
        assert not task.done()
    finally:
        await stop(task)
    assert list(kmock[enums.action.LIST]) == []  # streaming lists, no LIST


async def test_run_with_two_gates_only_the_leader_writes(kmock: Any, kube: Kube) -> None:
    other = Kube.for_host(str(kmock.url), timeout=2.0)
    # Renewals every second; the leader gives the lease up on shutdown, so the takeover is quick.
    quick = {"lease_duration": timedelta(seconds=3)}
    a, b = make_gate(kube, real_now, "gate-a", **quick), make_gate(other, real_now, "gate-b", **quick)
    await kube.create_node(node_body("w1"))
    ta = asyncio.create_task(a.run())
    tb = asyncio.create_task(b.run())
    try:
        await eventually(lambda: hold_taints(kmock) == [hold("unattested")], "the hold")
        leader, standby = (a, b) if lease(kmock)["spec"]["holderIdentity"] == "gate-a" else (b, a)
        assert lease(kmock)["spec"]["leaseTransitions"] == 0  # nobody else ever held it
        assert not standby.is_leader()
        await eventually(lambda: leader.writes > 0, "the leader's count")  # the server saw it first
        assert standby.writes == 0
        await stop(ta if leader is a else tb)
        await eventually(standby.is_leader, "the takeover")
        await kube.create_node(node_body("w2"))
        await eventually(lambda: hold_taints(kmock, "w2") == [hold("unattested")], "the new leader's write")
        await eventually(lambda: standby.writes > 0, "the new leader's count")
        assert lease(kmock)["spec"]["leaseTransitions"] == 1
    finally:
        await stop(ta)
        await stop(tb)
        await other.close()
