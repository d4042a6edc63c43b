"""The PCR class label follows every accepted attestation (issue 33, finding 9).

``node-restriction.kubernetes.io/nodegate.io-pcr-class`` was written at join only: a node whose
renewals (``nodegate attest`` at every boot) matched another class kept the old label, so pools
built on it kept sending that class's packages and workloads to a boot of another class."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization

from bootstrap.kube import Kube
from tests.support.kshim import ShimEmulator, cluster_signer
from tests.support.service import EkCa, Running, running, settings_for
from tests.support.softnode import SoftNode, join, post

pytestmark = pytest.mark.kmock(cls=ShimEmulator)

PCR_CLASS_LABEL = "node-restriction.kubernetes.io/nodegate.io-pcr-class"  # docs/operations.md
PROD = "00" * 32  # a soft TPM's PCRs start at zero
DEV = "11" * 32


@pytest.fixture(scope="module")
def ek_ca() -> EkCa:
    return EkCa.create()


def _policy(*classes: tuple[str, str, str]) -> dict[str, Any]:
    return {
        "bank": "sha256",
        "pcrs": [0, 1, 2, 3, 4, 5, 6, 7],
        "classes": [{"name": n, "mode": m, "golden": {"sha256": {0: [v]}}} for n, m, v in classes],
    }


@pytest.fixture
def served(kmock: Any, tmp_path: Path, ek_ca: EkCa) -> Any:
    kmock.resources["nodegate.io/v1alpha1/nodeattestations"] = {
        "kind": "NodeAttestation",
        "namespaced": False,
    }
    kmock.signer = cluster_signer()

    def start(policy: dict[str, Any]) -> Any:
        settings = settings_for(
            tmp_path, ek_ca, store="kubernetes", admission={"policy_files": []}, pcr_policy=policy
        )
        return running(settings, kube=Kube.for_host(str(kmock.url)))

    return start


def _node_labels(kmock: Any, name: str) -> dict[str, str]:
    obj = kmock.objects["v1/nodes", None, name]
    labels: dict[str, str] = obj["metadata"]["labels"]
    return labels


async def _joined(r: Running, ek_ca: EkCa, tmp: Path, name: str) -> tuple[SoftNode, tuple[Path, Path]]:
    node = ek_ca.node(name)
    async with r.http() as http:
        status, out = await join(http, r.base, node)
    assert status == 200, out
    key, cert = tmp / f"{name}.key", tmp / f"{name}.pem"
    key.write_bytes(
        node.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    cert.write_bytes(out["svid"].encode())
    return node, (cert, key)


async def _renew(r: Running, node: SoftNode, creds: tuple[Path, Path]) -> tuple[int, dict[str, Any]]:
    fresh = SoftNode(node.tpm, node.name, node.ek_certificate)
    async with r.http(creds) as http:
        status, start = await post(http, f"{r.base}/v1/nodes/self/renew", {"csr": fresh.csr_pem.decode()})
        assert status == 200, start
        body = fresh.evidence(start["session"], base64.b64decode(start["nonce"]), start["pcr_selection"])
        return await post(http, f"{r.base}/v1/nodes/self/renew", body)


async def test_a_renewal_of_another_class_moves_the_label(
    kmock: Any, served: Any, ek_ca: EkCa, tmp_path: Path
) -> None:
    async with served(_policy(("prod", "enforce", PROD), ("dev", "enforce", DEV))) as r:
        node, creds = await _joined(r, ek_ca, tmp_path, "gpu-c1")
        assert _node_labels(kmock, "gpu-c1")[PCR_CLASS_LABEL] == "prod"
        node.tpm.pcrs["sha256"][0] = bytes.fromhex(DEV)  # the next boot is the dev image
        status, out = await _renew(r, node, creds)
        assert status == 200, out
        labels = _node_labels(kmock, "gpu-c1")
        assert labels[PCR_CLASS_LABEL] == "dev"
        assert labels["node-restriction.kubernetes.io/nodegate.io-attested"] == "true"


async def test_a_renewal_matching_no_class_removes_the_label(
    kmock: Any, served: Any, ek_ca: EkCa, tmp_path: Path
) -> None:
    # Only a warn-mode class: a node that no longer matches it passes, but is of no class.
    async with served(_policy(("lab", "warn", PROD))) as r:
        node, creds = await _joined(r, ek_ca, tmp_path, "gpu-c2")
        assert _node_labels(kmock, "gpu-c2")[PCR_CLASS_LABEL] == "lab"
        node.tpm.pcrs["sha256"][0] = bytes.fromhex(DEV)
        status, out = await _renew(r, node, creds)
        assert status == 200, out
        assert PCR_CLASS_LABEL not in _node_labels(kmock, "gpu-c2")


async def test_a_label_that_cannot_be_written_commits_nothing(
    kmock: Any, served: Any, ek_ca: EkCa, tmp_path: Path
) -> None:
    async with served(_policy(("prod", "enforce", PROD), ("dev", "enforce", DEV))) as r:
        node, creds = await _joined(r, ek_ca, tmp_path, "gpu-c3")
        before = await r.service.store.get("gpu-c3")
        node.tpm.pcrs["sha256"][0] = bytes.fromhex(DEV)
        kmock.script("patch", "v1/nodes", 500)
        status, out = await _renew(r, node, creds)
        assert (status, out["code"]) == (503, "unavailable")
        after = await r.service.store.get("gpu-c3")
        assert before is not None
        assert after is not None
        assert after.svid_serials == before.svid_serials  # no SVID issued, no attestation recorded
        assert after.attested_at == before.attested_at
        assert _node_labels(kmock, "gpu-c3")[PCR_CLASS_LABEL] == "prod"
        status, out = await _renew(r, node, creds)  # the API is back: the renewal goes through
        assert status == 200, out
        assert _node_labels(kmock, "gpu-c3")[PCR_CLASS_LABEL] == "dev"


async def test_a_renewal_without_a_node_object_still_renews(
    kmock: Any, served: Any, ek_ca: EkCa, tmp_path: Path
) -> None:
    async with served(_policy(("prod", "enforce", PROD))) as r:
        node, creds = await _joined(r, ek_ca, tmp_path, "gpu-c4")
        del kmock.objects["v1/nodes", None, "gpu-c4"]
        status, out = await _renew(r, node, creds)
        assert status == 200, out
        assert ("v1/nodes", None, "gpu-c4") not in kmock.objects  # nothing was created


def test_the_label_patch_of_a_classless_attestation_removes_the_label() -> None:
    """A re-join (``ensure_node``) and a renewal write the labels through one merge patch: no class
    now means the label is deleted, not left from the join before."""
    from bootstrap.service.join.kubelet import attested_labels, label_patch

    assert label_patch(attested_labels("ab" * 32, None, {}))[PCR_CLASS_LABEL] is None
    assert label_patch(attested_labels("ab" * 32, "prod", {}))[PCR_CLASS_LABEL] == "prod"
