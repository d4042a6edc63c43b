"""``kubectl nodegate boots`` (issue 43): nodes grouped by attested boot with counts, ``--where``
with digest prefixes, ``-o wide|json|yaml``, one node in full, stale records (rebooted, not
attested since) shown as such, the Node's own words marked as not vouched for; usage errors in
one line. The records are written by the kubernetes store itself, on the emulated API."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from attest.bootrecord.model import BootRecord
from bootstrap.gate import kubectlboots
from bootstrap.kube import Kube
from bootstrap.store.kube import KubeStore
from tests.gate.test_kubectl import a_node, kubeconfig, one_line, run_main, serve
from tests.store.common import T0, Ticker, commit, make_att
from tests.support import bootrecords
from tests.support.kshim import ShimEmulator
from tests.support.shared_data import shared

pytestmark = pytest.mark.kmock(cls=ShimEmulator)
DATA = shared("eventlogs")
UBUNTU, GDC = "gce-ubuntu-2404-amd-sev-snp.bin", "gdc-host.bin"


@pytest.fixture
async def kube(kmock: Any) -> AsyncIterator[Kube]:
    serve(kmock)
    kmock.resources["coordination.k8s.io/v1/leases"] = {"kind": "Lease", "namespaced": True}
    k = Kube.for_host(str(kmock.url), timeout=2.0)
    yield k
    await k.close()


def _boot(i: int) -> str:
    return f"{i:08x}-0000-4000-8000-000000000000"


def _built(name: str, boot: str) -> bootrecords.Built:
    raw = DATA.read(name)
    return bootrecords.built_from(raw, bootrecords.quoted_of(raw), boot_id=boot, pcr_class="gpu")


@pytest.fixture
async def fleet(kube: Kube) -> dict[str, BootRecord]:
    """gpu-0..2 booted Ubuntu, cpu-0..1 the GDC host; cpu-1 rebooted since (its Node reports
    another boot); legacy has an attestation from before boot records."""
    DATA.require()
    store = KubeStore(kube, clock=Ticker(), backoff=0.0)
    out = {}
    plan = [("gpu-0", UBUNTU), ("gpu-1", UBUNTU), ("gpu-2", UBUNTU), ("cpu-0", GDC), ("cpu-1", GDC)]
    for i, (name, log) in enumerate(plan):
        built = _built(log, _boot(i))
        att = replace(
            make_att(name, f"{i + 1:x}" * 64, at=T0 + timedelta(minutes=i)),
            boot_id=_boot(i),
            boot_record=built.record,
            dbx=tuple(built.dbx.items()),
        )
        await commit(store, att, f"s-{name}")
        node = a_node(name)
        node["status"] = {
            "nodeInfo": {"bootID": _boot(99 if name == "cpu-1" else i), "kernelVersion": "6.8.0-1"}
        }
        await kube.create_node(node)
        out[name] = built.record
    await commit(store, make_att("legacy", "f" * 64), "s-legacy")
    await kube.create_node(a_node("legacy"))
    return out


async def test_groups_with_counts_and_stale_records(
    kmock: Any, fleet: dict[str, BootRecord], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = str(kubeconfig(tmp_path, str(kmock.url).rstrip("/")))
    rc, out, err = await run_main(["boots", "--kubeconfig", cfg], capsys)
    assert (rc, err) == (0, "")
    lines = out.splitlines()
    assert tuple(lines[0].split()) == kubectlboots.GROUP_COLUMNS
    ubuntu, gdc = lines[1].split(), lines[2].split()
    assert ubuntu[:2] == ["3", "0"]
    assert gdc[:2] == ["2", "1"]  # cpu-1 rebooted since its record
    assert ubuntu[3] == fleet["gpu-0"].measured_boot.chain_id  # type: ignore[union-attr]
    assert lines[-1] == "1 node(s) without a boot record: legacy"


async def test_where_selects_by_digest_prefix_and_field(
    kmock: Any, fleet: dict[str, BootRecord], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = str(kubeconfig(tmp_path, str(kmock.url).rstrip("/")))
    shim = fleet["cpu-0"].measured_boot.boot_applications[0].digest  # type: ignore[union-attr]
    rc, out, _ = await run_main(
        ["boots", "--kubeconfig", cfg, "--where", f"app=sha256:{shim[:10]}", "-o", "json"], capsys
    )
    assert rc == 0
    doc = json.loads(out)
    assert [n["node"] for n in doc["nodes"]] == ["cpu-0", "cpu-1"]
    assert doc["groups"][0]["count"] == 2
    rc, out, _ = await run_main(
        ["boots", "--kubeconfig", cfg, "--where", f"app={shim[:10]}", "--where", "stale=true", "-o", "json"],
        capsys,
    )
    assert [n["node"] for n in json.loads(out)["nodes"]] == ["cpu-1"]
    dbx = fleet["gpu-0"].measured_boot.dbx.sha256  # type: ignore[union-attr]
    rc, out, _ = await run_main(
        ["boots", "--kubeconfig", cfg, "--where", f"dbx={dbx[:8]}", "-o", "yaml"], capsys
    )
    doc = yaml.safe_load(out)
    assert [n["node"] for n in doc["nodes"]] == ["gpu-0", "gpu-1", "gpu-2"]
    assert set(doc["dbx"]) == {dbx}  # the digests travel with an export (what-if --records reads them)
    rc, out, _ = await run_main(
        ["boots", "--kubeconfig", cfg, "--where", "tpm-vendor=IFX", "--where", "node=gpu-*"], capsys
    )
    assert out.splitlines()[1].split()[0] == "3"


async def test_wide_and_one_node(
    kmock: Any, fleet: dict[str, BootRecord], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = str(kubeconfig(tmp_path, str(kmock.url).rstrip("/")))
    rc, out, _ = await run_main(["boots", "--kubeconfig", cfg, "-o", "wide"], capsys)
    assert rc == 0
    assert "cpu-0, cpu-1 (stale)" in out
    assert fleet["gpu-0"].pcrs["sha256"][0] in out  # whole digests
    rc, out, _ = await run_main(["boots", "cpu-1", "--kubeconfig", cfg], capsys)
    assert rc == 0
    assert "stale: the Node reports another boot" in out
    assert "Node kernelVersion: 6.8.0-1 (reported by the node, not vouched for)" in out
    assert "TPM (EK cert):   IFX SLB 9670 TPM2.0 id:0728" in out
    rc, out, _ = await run_main(["boots", "legacy", "--kubeconfig", cfg], capsys)
    assert "no boot record yet" in out


async def test_usage_errors_are_one_line(
    kmock: Any, fleet: dict[str, BootRecord], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = str(kubeconfig(tmp_path, str(kmock.url).rstrip("/")))
    rc, _, err = await run_main(["boots", "--kubeconfig", cfg, "--where", "colour=blue"], capsys)
    assert rc == 2
    assert "unknown field 'colour'" in one_line(err)
    rc, _, err = await run_main(["boots", "--kubeconfig", cfg, "--where", "app=ab"], capsys)
    assert (rc, "at least 4 hex digits" in one_line(err)) == (2, True)
    rc, _, err = await run_main(["boots", "nowhere", "--kubeconfig", cfg], capsys)
    assert rc == 1
    assert "not found" in one_line(err)
