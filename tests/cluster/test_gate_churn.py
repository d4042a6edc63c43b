"""The gate beside the real operator's hot loop, on the real API server (issue 45): held nodes whose
``status_<cr>`` a scripted operator (tests/cluster/churn.py) flips between ``waiting`` and
``blocked``. nodegate writes neither Nodes nor NodeAttestations for it, so the operator's
resourceVersion-guarded patches get no more 409s with nodegate than without. A release is one
Node write on its critical path (the taint), and the condition one more after it: Node status is a
subresource, which a Node patch cannot change (shown here too)."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from bootstrap.gate.writes import PACE
from tests.cluster import churn as ch
from tests.cluster import nodegate as ng
from tests.cluster.plane import ControlPlane

NODES = [f"churn-{i:02d}" for i in range(10)]
CRS = ["churn-a", "churn-b"]
SECONDS = 15.0
PER_SECOND = 20.0  # flips in all: 2 per node per second, each four operator requests


def stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def api(plane: ControlPlane) -> ch.Api:
    admin = (plane.folder / "pki" / "admin.crt", plane.folder / "pki" / "admin.key")
    return ch.Api(plane.url, plane.ssl_context(admin))


def wait_for(what: str, check: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not in {timeout:.0f} s: {what}"
        time.sleep(0.2)


def attestations(plane: ControlPlane) -> dict[str, dict[str, Any]]:
    out = json.loads(plane.kubectl("get", "nodeattestations", "-o", "json").stdout)
    return {i["metadata"]["name"]: i for i in out["items"]}


def node(plane: ControlPlane, name: str) -> dict[str, Any]:
    status, out = plane.request("GET", f"/api/v1/nodes/{name}")
    assert status == 200, out
    return dict(out)


@pytest.fixture(scope="module")
def gate(plane: ControlPlane, installed: ng.Installed) -> Iterator[ng.Nodegate]:
    """Ten held kwok nodes (their attestations revoked: ``quarantined``), two CRs selecting them
    with work pending, and one ``nodegate serve`` with the gate on, its first pass done."""
    now = datetime.now(UTC)
    for cr in CRS:
        status, out = plane.request("POST", ch.CRS, ch.churn_cr(cr))
        assert status == 201, out
        pending = {
            "driver|1.0.0": {"name": "driver", "version": "1.0.0", "stage": "apply", "state": "in_progress"}
        }
        body = {
            "status": {"nodeState": {n: pending for n in NODES}, "nodeStatus": {n: "waiting" for n in NODES}}
        }
        status, out = plane.request("PATCH", f"{ch.CRS}/{cr}/status", body, headers=dict(ch.MERGE))
        assert status == 200, out
    for i, name in enumerate(NODES):
        body, att_status = ch.revoked_attestation(name, 900 + i, stamp(now), stamp(now + timedelta(days=1)))
        status, out = plane.request("POST", ch.ATTESTATIONS, body)
        assert status == 201, out
        status, out = plane.request(
            "PATCH", f"{ch.ATTESTATIONS}/{name}/status", att_status, headers=dict(ch.MERGE)
        )
        assert status == 200, out
    for body in ch.held_nodes(NODES, quarantined=True):
        status, out = plane.request("POST", "/api/v1/nodes", body)
        assert status == 201, out
    server = ng.start_gate(plane, installed, "churn", lease="6s")
    try:
        wait_for(
            "the gate's first pass over the churn nodes",
            lambda: all(
                (attestations(plane).get(n, {}).get("status") or {}).get("phase") == "Quarantined"
                for n in NODES
            ),
        )
        yield server
    finally:
        server.stop()
        # Other modules' nodegates share this cluster: with `store: kubernetes` these synthetic
        # NodeAttestations would be store entries no CA of theirs issued.
        plane.kubectl("delete", "nodeattestations", *NODES, "--wait=false", check=False)
        plane.kubectl("delete", "nodes", *NODES, "--wait=false", check=False)
        plane.kubectl("delete", "skyhooks.skyhook.nvidia.com", *CRS, "--wait=false", check=False)


def test_a_node_patch_cannot_change_node_status(plane: ControlPlane, gate: ng.Nodegate) -> None:
    """Why the condition cannot ride on the taint's write: the API server drops status from a
    patch of the Node itself (status is a subresource), and the patch still succeeds."""
    before = node(plane, NODES[0])
    cond = {"type": "ExampleFolded", "status": "True", "reason": "Test", "message": "through nodes"}
    status, out = plane.request(
        "PATCH",
        f"/api/v1/nodes/{NODES[0]}",
        {"status": {"conditions": [*before["status"]["conditions"], cond]}},
        headers=dict(ch.MERGE),
    )
    assert status == 200, out
    assert "ExampleFolded" not in [c["type"] for c in out["status"]["conditions"]]
    assert out["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]  # a no-op


def test_the_operators_flips_get_no_write_from_nodegate_and_no_more_409s(
    plane: ControlPlane, gate: ng.Nodegate
) -> None:
    async def run() -> ch.Counts:
        client = api(plane)
        try:
            return await ch.churn(client, NODES, CRS, per_second=PER_SECOND, seconds=SECONDS)
        finally:
            await client.close()

    with_gate = asyncio.run(run())
    gate.stop()
    try:
        without = asyncio.run(run())
    finally:
        gate.restart()
    print(f"\nchurn {len(NODES)} nodes {SECONDS} s: with nodegate {with_gate}\nwithout {without}")
    assert with_gate.flips >= PER_SECOND * SECONDS * 0.8  # the churn really ran
    assert with_gate.nodegate_node_writes == 0  # no Node write: nothing to fail the operator's patches
    bound = len(NODES) * (math.floor(with_gate.seconds / PACE.total_seconds()) + 1)
    assert with_gate.nodegate_attestation_writes <= bound
    if with_gate.other_taint_changes == 0:  # kwok kept heartbeating: nothing but the flips changed
        assert with_gate.nodegate_attestation_writes == 0
    assert (without.nodegate_node_writes, without.nodegate_attestation_writes) == (0, 0)
    # The remaining 409s come from kwok's heartbeats (every 2-3 s per node), in both runs alike:
    # Poisson noise, three standard deviations.
    assert with_gate.conflicts <= without.conflicts + 3 * math.sqrt(without.conflicts + 1) + 3
    # And no 409 followed a write by nodegate (the manager that wrote NodegateReady).
    fields = node(plane, NODES[0])["metadata"]["managedFields"]
    ours = {e["manager"] for e in fields if "NodegateReady" in json.dumps(e.get("fieldsV1"))}
    assert ours
    assert not [w for w in with_gate.conflicts_after if w.split("/")[0] in ours], with_gate.conflicts_after
    # The words still say why (one wording, whatever the operator reports right now).
    message = attestations(plane)[NODES[0]]["status"]["message"]
    assert "NodeWright cannot schedule its package pods here (TaintNotTolerable)" in message


def test_a_release_is_one_node_write_then_the_reports(plane: ControlPlane, gate: ng.Nodegate) -> None:
    """The last node's packages complete (the operator's report and the node's annotation agree),
    then its attestation is restored: the taint goes in one Node write; the condition follows in a
    second (status is a subresource), the NodeAttestation in one write, and one Event."""
    name = NODES[-1]
    done = {"driver|1.0.0": {"name": "driver", "version": "1.0.0", "stage": "config", "state": "complete"}}
    annotations = {f"{ch.GROUP}/nodeState_{cr}": json.dumps(done) for cr in CRS}
    status, out = plane.request(
        "PATCH", f"/api/v1/nodes/{name}", {"metadata": {"annotations": annotations}}, headers=dict(ch.MERGE)
    )
    assert status == 200, out
    for cr in CRS:
        body = {"status": {"nodeState": {name: done}, "nodeStatus": {name: "complete"}}}
        status, out = plane.request("PATCH", f"{ch.CRS}/{cr}/status", body, headers=dict(ch.MERGE))
        assert status == 200, out

    def reported() -> bool:
        packages = (attestations(plane)[name].get("status") or {}).get("packages") or []
        return len(packages) == 2 and all(p["complete"] for p in packages)

    wait_for("the gate's report of the completed packages", reported)

    async def restore(client: ch.Api) -> None:
        await client.ok("PATCH", f"{ch.ATTESTATIONS}/{name}", {"spec": {"revoked": False}}, ch.MERGE)

    async def run() -> ch.Counts:
        client = api(plane)
        try:
            return await ch.churn(
                client, [name], CRS, per_second=0, seconds=8.0, during=lambda: restore(client)
            )
        finally:
            await client.close()

    counts = asyncio.run(run())
    print(f"\nrelease of {name}: nodegate's writes {counts.history}")
    assert not [t for t in node(plane, name)["spec"].get("taints") or [] if t["key"] == ch.HOLD]
    assert counts.node_writes == {name: 2}
    first, second = (json.loads(mark) for kind, _, mark in counts.history if kind == "node")
    assert first[0] == []  # the taint went first: the release
    assert [c["status"] for c in first[1]] == ["False"]  # the condition had not changed yet
    assert [c["status"] for c in second[1]] == ["True"]
    assert counts.attestation_writes == {name: 2}  # the test's own restore, then nodegate's status
    assert attestations(plane)[name]["status"]["phase"] == "Ready"
    # Events about cluster-scoped objects live in default (bootstrap/kube/events.py).
    events = json.loads(plane.kubectl("get", "events", "-n", "default", "-o", "json").stdout)["items"]
    mine = [
        e
        for e in events
        if e["involvedObject"]["name"] == name and e["source"].get("component") == "nodegate"
    ]
    assert [e["reason"] for e in mine] == ["NodegateReleased"]
