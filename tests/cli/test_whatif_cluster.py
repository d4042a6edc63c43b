"""``nodegate policy whatif`` against a cluster (the emulated API): boot records from a kubernetes
store's NodeAttestations (and the dbx digests in its Leases), and the package side against the
cluster's package CRs and PackagePolicies."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from bootstrap.cli.main import main
from bootstrap.kube import Kube
from bootstrap.store.kube import KubeStore
from tests.admission.test_webhook import gpu_policies
from tests.gate.test_kubectl import kubeconfig, serve
from tests.store.common import Ticker, commit, make_att
from tests.support import bootrecords
from tests.support import eventlogs as el
from tests.support.kshim import ShimEmulator
from tests.support.package_crs import SAMPLE, open_policy

pytestmark = pytest.mark.kmock(cls=ShimEmulator)
POLICIES = "nodegate.io/v1alpha1/packagepolicies"


@pytest.fixture
async def kube(kmock: Any) -> AsyncIterator[Kube]:
    serve(kmock)
    kmock.resources["coordination.k8s.io/v1/leases"] = {"kind": "Lease", "namespaced": True}
    kmock.resources[POLICIES] = {"kind": "PackagePolicy", "namespaced": False}
    k = Kube.for_host(str(kmock.url), timeout=2.0)
    yield k
    await k.close()


async def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    def run() -> tuple[int, str, str]:
        rc = main(["policy", "whatif", *argv])
        out, err = capsys.readouterr()
        return rc, out, err

    return await asyncio.to_thread(run)  # main() runs its own event loop, beside kmock's


async def test_boot_records_from_a_kubernetes_store(
    kmock: Any, kube: Kube, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The new config names the kubernetes store: the records and dbx digests come from the
    cluster, and a new dbx_required is judged with the digests the Leases keep."""
    store = KubeStore(kube, clock=Ticker(), backoff=0.0)
    fleet = {"gpu-1": el.boot(), "gpu-2": [*el.boot()[:3], el.dbx(b"\xcc" * 32), *el.boot()[4:]]}
    for i, (name, events) in enumerate(fleet.items()):
        built = bootrecords.synthetic(events)
        att = replace(
            make_att(name, f"{i + 1:x}" * 64), boot_record=built.record, dbx=tuple(built.dbx.items())
        )
        await commit(store, att, f"s-{name}")
    cfg = kubeconfig(tmp_path, str(kmock.url).rstrip("/"))
    new = tmp_path / "new.yaml"
    new.write_text(
        yaml.safe_dump(
            {
                "store": "kubernetes",
                "kubernetes": {"kubeconfig": str(cfg)},
                "measured_boot": {"classes": [{"name": "revoked-aa", "dbx_required": ["aa" * 32]}]},
            }
        )
    )
    rc, out, err = await _run(["--config", str(new)], capsys)
    assert (rc, err) == (1, "")
    assert "would be refused (1):\n  gpu-2: measured_boot_violation" in out
    assert "dbx lacks 1 required entries, e.g. " + "aa" * 32 in out
    assert (
        "would change class (1):\n  gpu-1: pcr -, measured boot - -> pcr -, measured boot revoked-aa" in out
    )


async def test_package_policies_against_the_clusters_crs(
    kmock: Any, kube: Kube, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await kube.create_cluster_object("nodegate.io", "v1alpha1", "packagepolicies", open_policy("open"))
    over = copy.deepcopy(SAMPLE)
    over["metadata"]["name"] = "over-budget"
    over["spec"]["interruptionBudget"] = {"percent": 90}
    for cr in (SAMPLE, over):
        await kube.create_cluster_object("skyhook.nvidia.com", "v1alpha1", "skyhooks", cr)
    new = tmp_path / "new.yaml"
    new.write_text(
        yaml.safe_dump_all([p.model_dump(by_alias=True, exclude_none=True) for p in gpu_policies()])
    )
    cfg = str(kubeconfig(tmp_path, str(kmock.url).rstrip("/")))
    rc, out, err = await _run(["--policy", str(new), "--kubeconfig", cfg, "-o", "json"], capsys)
    assert (rc, err) == (1, "")
    doc = json.loads(out)
    assert [(d["kind"], d["name"]) for d in doc["newlyDenied"]] == [("Skyhook", "over-budget")]
    assert any("budget" in v for v in doc["newlyDenied"][0]["violations"])
    assert doc["judged"] == 2
