"""``kubectl get nodeattestations`` against the emulated API: lists name their kind, and a Table
(what kubectl asks for) has the CRD's printer columns, date columns as kubectl-style ages."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from bootstrap.demo import tables
from bootstrap.demo.cluster import register_resources
from tests.support.kshim import ShimEmulator

pytestmark = pytest.mark.kmock(cls=ShimEmulator)
CRD = Path(__file__).resolve().parents[2] / "charts" / "nodegate" / "crds"
KUBECTL_ACCEPT = (  # what kubectl get sends
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,"
    "application/json"
)


def crd_columns() -> list[dict[str, str]]:
    for path in CRD.glob("*.yaml"):
        doc = yaml.safe_load(path.read_text())
        if doc["spec"]["names"]["plural"] == "nodeattestations":
            (version,) = doc["spec"]["versions"]
            return [
                {k: c[k] for k in ("name", "type", "jsonPath")} for c in version["additionalPrinterColumns"]
            ]
    raise AssertionError("no NodeAttestation CRD")


def test_the_columns_are_the_crds() -> None:
    assert list(tables.NODEATTESTATION_COLUMNS) == crd_columns()


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0, "0s"),
        (45, "45s"),
        (119, "119s"),
        (150, "2m30s"),
        (600, "10m"),
        (3 * 3600, "3h"),
        (3 * 3600 + 60 * 5, "3h5m"),
        (30 * 3600, "30h"),
        (3 * 86400 + 3600, "3d1h"),
        (40 * 86400, "40d"),
        (800 * 86400, "2y70d"),
    ],
)
def test_ages_read_like_kubectls(seconds: int, shown: str) -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    at = (now - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert tables.age(at, now) == shown
    assert tables.age(None, now) == "<unknown>"


async def test_kubectl_get_gets_a_table_and_lists_name_their_kind(kmock: Any) -> None:
    register_resources(kmock)
    base = str(kmock.url).rstrip("/") + "/apis/nodegate.io/v1alpha1/nodeattestations"
    att = {
        "apiVersion": "nodegate.io/v1alpha1",
        "kind": "NodeAttestation",
        "metadata": {"name": "gpu-1"},
        "spec": {"spiffeId": "spiffe://fleet.test/node/gpu-1", "ekSha256": "a" * 64},
        "status": {"phase": "Held", "reason": "packages-pending", "attestedAt": "2026-01-01T00:00:00Z"},
    }
    async with aiohttp.ClientSession() as http:
        async with http.post(base, json=att) as resp:
            assert resp.status == 201
        async with http.get(base, headers={"Accept": KUBECTL_ACCEPT}) as resp:
            table = await resp.json()
        async with http.get(base) as resp:
            listing = await resp.json()
    assert (table["kind"], table["apiVersion"]) == ("Table", "meta.k8s.io/v1")
    assert [c["name"] for c in table["columnDefinitions"]] == [
        "Name",
        "Phase",
        "Reason",
        "SPIFFE-ID",
        "Attested",
        "Age",
    ]
    (row,) = table["rows"]
    assert row["cells"][:4] == ["gpu-1", "Held", "packages-pending", "spiffe://fleet.test/node/gpu-1"]
    assert row["cells"][4].endswith(("d", "h", "y")) or "d" in row["cells"][4]
    assert row["object"]["kind"] == "PartialObjectMetadata"
    assert (listing["kind"], listing["apiVersion"]) == ("NodeAttestationList", "nodegate.io/v1alpha1")
    assert listing["items"][0]["metadata"]["name"] == "gpu-1"
