"""The gate's informers on the real API server (issue 45): each source loaded once by a streaming
list (sendInitialEvents; the API server serves it for Nodes and for CRDs), then only watched, and
``gate.resync`` decides every node again without a request. What the gate asked is read from the
API server's audit log, which records the lists and watches of one user (tests/cluster/plane.py
AUDITED_USER): the gate runs here as that user, alone (``nodegate gate``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bootstrap.gate import crindex
from bootstrap.kube import INITIAL_EVENTS_END, Kube, ends_initial_events
from tests.cluster import churn as ch
from tests.cluster import nodegate as ng
from tests.cluster.plane import AUDITED_USER, ControlPlane, Proc, free_port, spawn

NODES = ["watch-0", "watch-1"]
SOURCES = {"nodes", "nodeattestations", "skyhooks", "nodewrights"}
RESYNC_S = 2
KEY = "nodegate.io/hold"


def wait_for(what: str, check: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not in {timeout:.0f} s: {what}"
        time.sleep(0.2)


def held(plane: ControlPlane, name: str) -> bool:
    status, out = plane.request("GET", f"/api/v1/nodes/{name}")
    return status == 200 and any(t.get("key") == KEY for t in (out.get("spec") or {}).get("taints") or ())


def create_node(plane: ControlPlane, name: str) -> None:
    status, out = plane.request(
        "POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
    )
    assert status == 201, out


def audited_bindings(inst: ng.Installed) -> list[dict[str, Any]]:
    """The chart's bindings of nodegate's service account, for AUDITED_USER."""
    out = []
    for doc in inst.rendered:
        if doc["kind"] in ("ClusterRoleBinding", "RoleBinding"):
            meta = {k: v for k, v in doc["metadata"].items() if k in ("name", "namespace")}
            meta["name"] += "-audited"
            user = {"kind": "User", "name": AUDITED_USER, "apiGroup": "rbac.authorization.k8s.io"}
            out.append({**doc, "metadata": meta, "subjects": [user]})
    return out


def resyncs(log: Path) -> int:
    return sum(1 for line in log.read_text(errors="replace").splitlines() if "resync: " in line)


@pytest.fixture(scope="module")
def gate(plane: ControlPlane, installed: ng.Installed) -> Iterator[Proc]:
    """``nodegate gate`` as AUDITED_USER (the chart's RBAC), resync every 2 s, its own Lease; two
    Nodes without attestations, which it holds."""
    plane.apply(audited_bindings(installed))
    create_node(plane, NODES[0])
    config = ng.write_config(
        installed,
        "watch",
        free_port(),
        free_port(),
        kubernetes={"kubeconfig": str(plane.cert_kubeconfig(AUDITED_USER))},
        gate={
            "enabled": True,
            "stability_window": "0s",
            "lease_duration": "6s",
            "lease_name": "nodegate-gate-watch",
            "resync": f"{RESYNC_S}s",
        },
    )
    proc = spawn(
        "nodegate-watch", [str(ng.nodegate_bin()), "gate", "--config", str(config)], installed.folder
    )
    try:
        wait_for(f"the gate holds {NODES[0]}", lambda: held(plane, NODES[0]) or not proc.alive())
        assert proc.alive(), proc.tail()
        yield proc
    finally:
        proc.stop()
        plane.kubectl("delete", "nodes", *NODES, "--wait=false", check=False)


def test_the_gate_loads_by_streaming_lists_and_resyncs_without_a_list(
    plane: ControlPlane, gate: Proc
) -> None:
    first = resyncs(gate.log)
    wait_for("three resyncs", lambda: resyncs(gate.log) >= first + 3, timeout=6 * RESYNC_S + 10)
    create_node(plane, NODES[1])  # the watch still follows: the new node is decided
    wait_for(f"the gate holds {NODES[1]}", lambda: held(plane, NODES[1]))
    gate.stop()  # its watches end: each one's ResponseComplete is logged too
    events = plane.audit()
    lists = [e for e in events if e["verb"] == "list" and e["stage"] == "ResponseComplete"]
    watches = {e["auditID"]: e for e in events if e["verb"] == "watch"}
    opened = [e for e in watches.values() if e["responseStatus"]["code"] == 200]
    # A new CRD's watch cache may still be initializing (429): the informer tries again.
    refused = [e for e in watches.values() if e["responseStatus"]["code"] != 200]
    print(
        f"\nnodegate gate, {resyncs(gate.log)} resyncs: {len(lists)} LIST, {len(opened)} watches "
        f"({sum('sendInitialEvents=' in e['requestURI'] for e in opened)} streaming lists), "
        f"{len(refused)} watch requests answered {sorted({e['responseStatus']['code'] for e in refused})}"
    )
    assert lists == [], [e["requestURI"] for e in lists]
    assert all("sendInitialEvents=True" in e["requestURI"] for e in watches.values())
    # One watch per source, each a streaming list, still open: the resyncs asked nothing (the
    # server ends a watch after 5 min; then it is resumed, with no sendInitialEvents).
    assert sorted(e["objectRef"]["resource"] for e in opened) == sorted(SOURCES)
    assert all(e["responseStatus"]["code"] == 429 for e in refused)


def test_a_streaming_list_and_a_watch_resumed_from_its_end_bookmark(
    plane: ControlPlane, installed: ng.Installed
) -> None:
    """What the informers rely on, asked directly: the API server streams the objects then the end
    bookmark, for Nodes and for a CRD; a watch from that bookmark's resourceVersion brings what
    changed after it, not the objects again."""
    del installed  # the CRDs
    create_node(plane, "watch-list-0")
    status, out = plane.request("POST", ch.CRS, ch.churn_cr("watch-list-cr"))
    assert status == 201, out

    async def run() -> None:
        kube = await Kube.from_config(str(plane.admin_kubeconfig))
        assert kube is not None
        try:
            names: list[str] = []
            end = ""
            async for event in kube.watch_nodes("", initial_events=True):
                if ends_initial_events(event, event.object):
                    end = event.object["metadata"]["resourceVersion"]
                    assert event.object["metadata"]["annotations"][INITIAL_EVENTS_END] == "true"
                    break
                assert event.type == "ADDED"
                names.append(event.object["metadata"]["name"])
            assert "watch-list-0" in names
            assert end
            create_node(plane, "watch-list-1")
            async for event in kube.watch_nodes(end):
                if event.type != "BOOKMARK":
                    assert (event.type, event.object["metadata"]["name"]) == ("ADDED", "watch-list-1")
                    break
            crs: list[str] = []
            async for cr in kube.watch_cluster_objects_as(
                "skyhook.nvidia.com", "v1alpha1", "skyhooks", "", crindex.DECODER, initial_events=True
            ):
                if ends_initial_events(cr, cr.object.obj):
                    break
                crs.append(cr.object.obj["metadata"]["name"])
            assert "watch-list-cr" in crs
        finally:
            await kube.close()

    try:
        asyncio.run(asyncio.wait_for(run(), 60))
    finally:
        plane.kubectl("delete", "nodes", "watch-list-0", "watch-list-1", "--wait=false", check=False)
        plane.kubectl("delete", "skyhooks.skyhook.nvidia.com", "watch-list-cr", "--wait=false", check=False)
