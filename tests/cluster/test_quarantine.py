"""Quarantine by selector against the real API server (issue 43): nodes join a ``nodegate serve``
with the kubernetes store and the gate; ``nodegate nodes quarantine --where ... --dry-run`` writes
nothing; without it the matching nodes are held ``quarantined`` by the gate and the others stay
released; and ``kubectl nodegate boots`` reads the records the store wrote."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from bootstrap.cli.main import main as cli_main
from bootstrap.gate import kubectl
from tests.cluster import nodegate as ng
from tests.cluster.plane import ControlPlane
from tests.cluster.test_store import wait_for
from tests.support.softnode import join

HOLD = "nodegate.io/hold"
ADMIN = "spiffe://fleet.test/admin/ops"
NODES = ("quar-gpu-1", "quar-gpu-2", "quar-cpu-1")


@pytest.fixture(scope="module")
def server(
    plane: ControlPlane, installed: ng.Installed, webhook_server: ng.Nodegate
) -> Iterator[ng.Nodegate]:
    started = ng.start_nodegate(
        plane,
        installed,
        "quarantine",
        store="kubernetes",
        gate={"enabled": True, "stability_window": "1s", "lease_duration": "6s", "resync": "30s"},
        kubernetes={"csr_timeout": "30s"},
        admin={"spiffe_ids": {ADMIN: ["list", "revoke"]}},
    )
    try:
        yield started
    finally:
        started.stop()
        # The session's other tests share this API server: attestations left here would be nodes
        # of another CA in the kubernetes store of test_store.py's replicas (they refuse to start).
        plane.kubectl("delete", "nodeattestations", *NODES, "--wait=false", check=False)
        plane.kubectl("delete", "nodes", *NODES, "--wait=false", check=False)


def _hold(plane: ControlPlane, name: str) -> str | None:
    node = json.loads(plane.kubectl("get", "node", name, "-o", "json").stdout)
    for t in node.get("spec", {}).get("taints") or []:
        if t.get("key") == HOLD:
            return str(t.get("value"))
    return None


def _attestation(plane: ControlPlane, name: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(plane.kubectl("get", "nodeattestation", name, "-o", "json").stdout)
    return out


def test_quarantine_by_selector_holds_the_matching_nodes_only(
    plane: ControlPlane,
    installed: ng.Installed,
    server: ng.Nodegate,
    tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    async def joins() -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=plane.ssl_context())) as http:
            for name in NODES:
                status, body = await join(
                    http, f"https://127.0.0.1:{server.port}", installed.ek_ca.node(name)
                )
                assert status == 200, body

    asyncio.run(joins())
    wait_for("every node released", lambda: all(_hold(plane, n) is None for n in NODES), 60)
    for name in NODES:  # the store wrote each boot record, published as status.boot
        assert _attestation(plane, name)["status"]["boot"]["ek"]["model"] == "swtpm"

    admin = tmp_path / "admin"
    issue = ["ca", "issue-admin", "--config", str(server.config), "--spiffe-id", ADMIN, "--out", str(admin)]
    assert cli_main(issue) == 0
    flags = [
        "--server",
        f"https://127.0.0.1:{server.port}",
        "--ca-bundle",
        str(plane.ca.cert_file),
        "--admin",
        str(admin),
    ]
    where = ["--where", "node=quar-gpu-*", "--where", "tpm-model=swtpm"]
    before = {n: _attestation(plane, n) for n in NODES}
    capsys.readouterr()
    assert cli_main(["nodes", "quarantine", *flags, *where, "--reason", "shim CVE", "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == ["  quar-gpu-1", "  quar-gpu-2"]
    for name in NODES:  # --dry-run wrote nothing: no spec change, no audit entry
        after = _attestation(plane, name)
        assert after["spec"] == before[name]["spec"]
        assert (
            after["metadata"]["annotations"]["nodegate.io/audit"]
            == before[name]["metadata"]["annotations"]["nodegate.io/audit"]
        )
        assert _hold(plane, name) is None

    assert cli_main(["nodes", "quarantine", *flags, *where, "--reason", "shim CVE"]) == 0
    assert capsys.readouterr().out.splitlines() == ["quarantined 2 node(s):", "  quar-gpu-1", "  quar-gpu-2"]
    wait_for(
        "the gate holds the quarantined nodes",
        lambda: all(_hold(plane, n) == "quarantined" for n in NODES[:2]),
        60,
    )
    for name in NODES[:2]:
        att = _attestation(plane, name)
        assert att["spec"]["quarantine"]["reason"] == "shim CVE (--where node=quar-gpu-* tpm-model=swtpm)"
        assert att["status"]["reason"] == "quarantined"
        assert "quarantined by an admin" in att["status"]["message"]
    assert _hold(plane, "quar-cpu-1") is None  # untouched
    assert "quarantine" not in _attestation(plane, "quar-cpu-1")["spec"]

    # the fleet view reads the same records
    capsys.readouterr()
    kubeconfig = str(plane.admin_kubeconfig)
    assert kubectl.main(["boots", "--kubeconfig", kubeconfig, "--where", "node=quar-*", "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert sorted(n["node"] for n in doc["nodes"]) == sorted(NODES)
