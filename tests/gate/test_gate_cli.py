"""`nodegate gate --once` and `Gate.once()`: the pass takes the leader Lease, gives it back, refuses
when another gate holds it; and the gate runs inside `nodegate serve` when a cluster is configured."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from bootstrap import cli
from bootstrap.config import Settings
from bootstrap.gate import Gate, LeaseHeld, identity
from bootstrap.kube import Kube
from bootstrap.service.app import build_service
from tests.gate.test_gate import KEY, OTHER, add_cr, hold, joined, make_gate, register
from tests.support.kshim import ShimEmulator
from tests.support.kshim import kubeconfig as emulated_kubeconfig

pytestmark = pytest.mark.kmock(cls=ShimEmulator)

NOW = datetime.now(UTC)


def kubeconfig(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(emulated_kubeconfig(url)))
    return path


def config(tmp_path: Path, url: str, **gate: Any) -> Path:
    path = tmp_path / "nodegate.yaml"
    body = {
        "state_dir": str(tmp_path / "state"),
        "kubernetes": {"kubeconfig": str(kubeconfig(tmp_path, url)), "events_namespace": "nodegate"},
        "gate": {"stability_window": "0s", **gate},
    }
    path.write_text(yaml.safe_dump(body))
    return path


def lease_holder(kmock: Any) -> str:
    return str(
        kmock.objects["coordination.k8s.io/v1/leases", "nodegate", "nodegate-gate"].raw["spec"][
            "holderIdentity"
        ]
    )


async def taint_value(kube: Kube, name: str) -> str | None:
    node = await kube.get_node(name)
    assert node is not None
    return next((t["value"] for t in node["spec"]["taints"] if t["key"] == KEY), None)


async def test_once_cli_releases_holds_and_reports(
    kmock: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    register(kmock)
    kube = Kube.for_host(str(kmock.url))
    try:
        # The real clock: attestations valid from now for a day; no CRs select w2's pool.
        await joined(kube, "w1", at=NOW)
        await joined(kube, "w2", at=NOW)
        await add_cr(kube, "skyhook.nvidia.com", "drivers", {"gpu-driver": "1.0.0"})
        cfg = config(tmp_path, str(kmock.url))
        rc = await asyncio.to_thread(cli.main, ["gate", "--once", "--config", str(cfg)])
        out = capsys.readouterr()
        assert rc == 0, out.err
        assert out.out.startswith("2 nodes: 0 released; held: packages-pending 2; ")
        assert await taint_value(kube, "w1") == "packages-pending"
        # The Lease was taken for the pass and given back, so a running gate need not wait.
        lease = await kube.get_lease("nodegate", "nodegate-gate")
        assert lease is not None
        assert lease["spec"]["holderIdentity"] == ""
        # The CR goes away: a second pass releases both, and the other taint stays.
        await kube.delete_cluster_object("skyhook.nvidia.com", "v1alpha1", "skyhooks", "drivers")
        rc = await asyncio.to_thread(cli.main, ["gate", "--once", "--config", str(cfg)])
        out = capsys.readouterr()
        assert rc == 0, out.err
        assert out.out.startswith("2 nodes: 2 released; held: none;")
        node = await kube.get_node("w1")
        assert node is not None
        assert node["spec"]["taints"] == [OTHER]
    finally:
        await kube.close()


async def test_once_refuses_while_another_gate_holds_the_lease(
    kmock: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    register(kmock)
    kube = Kube.for_host(str(kmock.url))
    try:
        await joined(kube, "w1", hold("unattested"), at=NOW)
        running = Gate(
            kube,
            Settings().gate,
            events_namespace="nodegate",
            now=lambda: datetime.now(UTC),
            identity="in-cluster-replica",
        )
        assert await running.elect()
        cfg = config(tmp_path, str(kmock.url))
        rc = await asyncio.to_thread(cli.main, ["gate", "--once", "--config", str(cfg)])
        err = capsys.readouterr().err
        assert rc == 3
        assert "in-cluster-replica" in err
        assert "nothing was done" in err
        assert await taint_value(kube, "w1") == "unattested"  # not written
        # --no-lease is the explicit way around it.
        rc = await asyncio.to_thread(cli.main, ["gate", "--once", "--no-lease", "--config", str(cfg)])
        assert rc == 0, capsys.readouterr().err
        assert await taint_value(kube, "w1") is None
    finally:
        await kube.close()


async def test_once_api_down_exits_1_and_writes_nothing(
    kmock: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    register(kmock)
    kube = Kube.for_host(str(kmock.url))
    try:
        await joined(kube, "w1", at=NOW)
        kmock.script("list", "v1/nodes", 503)
        cfg = config(tmp_path, str(kmock.url))
        rc = await asyncio.to_thread(cli.main, ["gate", "--once", "--no-lease", "--config", str(cfg)])
        err = capsys.readouterr().err
        assert rc == 1
        assert "no node was decided" in err
        assert await taint_value(kube, "w1") == "packages-pending"
    finally:
        await kube.close()


def test_gate_without_a_cluster_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "nodegate.yaml"
    path.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "s")}))
    assert cli.main(["gate", "--once", "--config", str(path)]) == 2
    assert "no cluster" in capsys.readouterr().err


def test_gate_with_a_bad_kubeconfig_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "kubeconfig"
    bad.write_text("clusters: [")
    path = tmp_path / "nodegate.yaml"
    path.write_text(yaml.safe_dump({"kubernetes": {"kubeconfig": str(bad)}}))
    assert cli.main(["gate", "--once", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("nodegate gate: kubeconfig")
    assert "Traceback" not in err


async def test_a_lease_that_lapses_mid_pass_is_reported(kmock: Any) -> None:
    """If the write window of the lease ends during the pass (renewals failing), the nodes after
    that are not written and the report says so instead of claiming success."""
    register(kmock)
    kube = Kube.for_host(str(kmock.url))
    try:
        for i in range(4):
            await joined(kube, f"w{i}", hold("unattested"), at=NOW)
        t = [NOW]

        def clock() -> datetime:
            t[0] += timedelta(seconds=1)  # every read of the clock moves it: the pass "takes" long
            return t[0]

        g = make_gate(kube, clock, identity="script", lease_duration=timedelta(seconds=6))
        report = await g.once()
        assert report.nodes == 4
        assert any("lapsed" in e for e in report.errors)
        values = [await taint_value(kube, f"w{i}") for i in range(4)]
        assert "unattested" in values  # some node was left as it was, not half-written
    finally:
        await kube.close()


async def test_once_with_a_held_lease_raises(kmock: Any) -> None:
    register(kmock)
    kube = Kube.for_host(str(kmock.url))
    try:
        other = make_gate(kube, lambda: datetime.now(UTC), identity="other")
        assert await other.elect()
        me = make_gate(kube, lambda: datetime.now(UTC), identity="me")
        with pytest.raises(LeaseHeld) as info:
            await me.once()
        assert info.value.holder == "other"
    finally:
        await kube.close()


def test_identity_is_unique_per_call() -> None:
    a, b = identity(), identity()
    assert a != b
    assert len(a) < 260


async def test_serve_runs_the_gate_when_a_cluster_is_configured(kmock: Any, tmp_path: Path) -> None:
    register(kmock)
    kube = Kube.for_host(str(kmock.url))
    settings = Settings(state_dir=tmp_path / "s", store="kubernetes")
    service = await build_service(settings, kube=kube)
    try:
        assert service.gate is not None
    finally:
        await service.close()
    off = Settings.model_validate({"state_dir": str(tmp_path / "t"), "gate": {"enabled": False}})
    kube2 = Kube.for_host(str(kmock.url))
    service = await build_service(off, kube=kube2)
    try:
        assert service.gate is None
    finally:
        await service.close()
    service = await build_service(Settings(state_dir=tmp_path / "u"), kube=None)
    try:
        assert service.gate is None
    finally:
        await service.close()


async def test_gate_process_follows_the_cluster_and_gives_the_lease_back_on_sigterm(
    kmock: Any, tmp_path: Path
) -> None:
    """`nodegate gate` as its own process: it releases a node whose packages are done and hands
    the Lease back when stopped (so a replacement need not wait out the lease)."""
    import signal
    import sys

    from tests.gate.test_gate import eventually, stored

    register(kmock)
    kube = Kube.for_host(str(kmock.url))
    await joined(kube, "w1", hold("unattested"), at=NOW)
    cfg = config(tmp_path, str(kmock.url))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bootstrap.cli", "gate", "--config", str(cfg), stderr=asyncio.subprocess.PIPE
    )
    try:
        await eventually(
            lambda: all(t["key"] != KEY for t in stored(kmock, "v1/nodes", "w1")["spec"]["taints"]),
            "the release",
            limit=30.0,
        )
        assert lease_holder(kmock)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
        await kube.close()
    assert proc.returncode == 0, err.decode()[-2000:]
    assert lease_holder(kmock) == ""
    assert b"Traceback" not in err
