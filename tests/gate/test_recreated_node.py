"""A Node deleted by someone else and re-created by its kubelet is not the Node nodegate attested
(issue 33, finding 4 follow-up).

An administrator or a cloud's node lifecycle controller deletes a Node (a kubelet cannot delete its
own); the kubelet registers it again with labels of its own choosing and without the
``node-restriction.kubernetes.io/`` labels nodegate wrote at join. Only ``node-hold-value`` judged
that CREATE, and the gate released the Node on the strength of the name's still-valid attestation,
out of the package CRs that had selected it. The join service now records the uid of the Node it
labelled (status.nodeUID); the gate holds any other Node of that name ``unattested`` until the node
attests again, which relabels it and records the new uid.

The whole path runs: the join service (kubernetes store) and the gate on one emulated API server.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography.hazmat.primitives import serialization

from bootstrap.gate import Gate
from bootstrap.kube import Conflict, Kube
from tests.gate.test_gate import (
    ATT,
    NODES,
    add_cr,
    hold,
    hold_taints,
    make_gate,
    operator_writes,
    real_now,
    register,
    stored,
)
from tests.gate.test_reboot import boot
from tests.support.kshim import ShimEmulator, cluster_signer
from tests.support.service import EkCa, Running, running, settings_for
from tests.support.softnode import SoftNode, post

pytestmark = pytest.mark.kmock(cls=ShimEmulator)

NAME = "gpu-r1"
BOOT = "3e1f0c2a-5b6d-4e7f-8a9b-0c1d2e3f4a5b"
SKY = "skyhook.nvidia.com"
ATTESTED = "node-restriction.kubernetes.io/nodegate.io-attested"  # docs/operations.md


@pytest.fixture(scope="module")
def ek_ca() -> EkCa:
    return EkCa.create()


@pytest.fixture
async def api(kmock: Any) -> AsyncIterator[Kube]:
    register(kmock)
    kmock.signer = cluster_signer()
    k = Kube.for_host(str(kmock.url), timeout=2.0)
    yield k
    await k.close()


@pytest.fixture
async def served(kmock: Any, api: Kube, tmp_path: Path, ek_ca: EkCa) -> AsyncIterator[Running]:
    # The service's own gate is off: the test's gate (stability window 0) decides alone.
    settings = settings_for(
        tmp_path, ek_ca, store="kubernetes", admission={"policy_files": []}, gate={"enabled": False}
    )
    async with running(settings, kube=Kube.for_host(str(kmock.url))) as r:
        yield r


@pytest.fixture
def gate(api: Kube) -> Gate:
    return make_gate(api, real_now, stability_window=timedelta(0))  # the join service's clock


def _key_and_cert(node: SoftNode, svid_pem: str, tmp: Path) -> tuple[Path, Path]:
    key, cert = tmp / f"{node.name}.key", tmp / f"{node.name}.pem"
    key.write_bytes(
        node.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    cert.write_bytes(svid_pem.encode())
    return cert, key


async def _join(r: Running, node: SoftNode, tmp: Path) -> tuple[Path, Path]:
    async with r.http() as http:
        status, start = await post(http, f"{r.base}/v1/join/start", node.start_body())
        assert status == 200, start
        status, out = await post(http, f"{r.base}/v1/join/finish", node.finish_body(start, boot_id=BOOT))
    assert status == 200, out
    return _key_and_cert(node, out["svid"], tmp)


async def _renew(r: Running, node: SoftNode, creds: tuple[Path, Path], boot_id: str = BOOT) -> None:
    """``nodegate attest`` (or the agent's renewal) from the boot ``boot_id``."""
    fresh = SoftNode(node.tpm, node.name, node.ek_certificate)
    async with r.http(creds) as http:
        status, start = await post(http, f"{r.base}/v1/nodes/self/renew", {"csr": fresh.csr_pem.decode()})
        assert status == 200, start
        body = fresh.evidence(
            start["session"], base64.b64decode(start["nonce"]), start["pcr_selection"], boot_id=boot_id
        )
        status, out = await post(http, f"{r.base}/v1/nodes/self/renew", body)
    assert status == 200, out


async def _delete_node(kmock: Any) -> None:
    """``kubectl delete node`` by an administrator or the cloud's node lifecycle controller."""
    url = f"{str(kmock.url).rstrip('/')}/api/v1/nodes/{NAME}"  # kube.py has no call for it
    async with aiohttp.ClientSession() as http, http.delete(url) as resp:
        assert resp.status == 200


async def _kubelet_registers(kube: Kube, boot_id: str = BOOT, **labels: str) -> str:
    """The kubelet registers its Node again: labels of its choosing (none under
    node-restriction.kubernetes.io/, which NodeRestriction refuses it), the hold as
    ``node-hold-value`` requires, and the boot it runs. A Node that exists already is kept as it
    is (the kubelet's --node-labels apply only to a Node it creates). Returns the Node's uid."""
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NAME, "labels": {"kubernetes.io/hostname": NAME, **labels}},
        "spec": {"taints": [hold("unattested")]},
    }
    try:
        created = await kube.create_node(body)
    except Conflict:  # AlreadyExists: nodegate pre-created it
        created = await kube.get_node(NAME)
        assert created is not None
    await boot(kube, NAME, boot_id)
    return str(created["metadata"]["uid"])


async def _decide(gate: Gate) -> str | None:
    report = await gate.reconcile_all()
    assert report.errors == []
    reasons = [r for r, n in report.held.items() for _ in range(n)]
    return reasons[0] if reasons else None


def _status(kmock: Any) -> dict[str, Any]:
    status: dict[str, Any] = stored(kmock, ATT, NAME)["status"]
    return status


async def _released_in_pool(
    kmock: Any, api: Kube, served: Running, gate: Gate, ek_ca: EkCa, tmp: Path
) -> tuple[SoftNode, tuple[Path, Path], str]:
    """Joined, its kubelet running on the attested boot, put into the gpu pool by an
    administrator, and released with the pool's CR complete."""
    node = ek_ca.node(NAME)
    creds = await _join(served, node, tmp)
    uid = str(stored(kmock, NODES, NAME)["metadata"]["uid"])
    await boot(api, NAME, BOOT)
    await api.patch_node(NAME, {"metadata": {"labels": {"pool": "gpu"}}})  # the admin's pool label
    await add_cr(api, SKY, "drivers", {"gpu-driver": "550.1"})  # selects pool=gpu
    assert await _decide(gate) == "packages-pending"
    await operator_writes(api, NAME, "drivers", {"gpu-driver": ("550.1", "config", "complete")})
    assert await _decide(gate) is None
    assert hold_taints(kmock, NAME) == []
    return node, creds, uid


async def test_a_node_recreated_by_its_kubelet_stays_held_until_it_attests_again(
    kmock: Any, api: Kube, served: Running, gate: Gate, ek_ca: EkCa, tmp_path: Path
) -> None:
    node, creds, old_uid = await _released_in_pool(kmock, api, served, gate, ek_ca, tmp_path)
    await _delete_node(kmock)
    # The attack: the kubelet registers its Node without the pool label the CR selects it by, on
    # the boot the name's attestation proved. No CR selects it, the attestation is valid: before
    # the fix the gate released it here, without the gpu pool's packages.
    new_uid = await _kubelet_registers(api, team="mine")
    assert await _decide(gate) == "unattested"
    assert hold_taints(kmock, NAME) == [hold("unattested")]
    status = _status(kmock)
    assert (status["phase"], status["reason"]) == ("Held", "unattested")
    assert (
        f"unattested: the Node is not the object nodegate attested (uid {new_uid}, attested {old_uid}): "
        "it was deleted and re-created since; the node must attest again" in status["message"]
    )
    assert ATTESTED not in stored(kmock, NODES, NAME)["metadata"]["labels"]
    assert status["nodeUID"] == old_uid  # the Node the join service labelled

    # The recovery: the node attests again; nodegate writes its labels onto this Node and records
    # its uid, and the gate decides it as any attested Node (here: no CR selects it any more).
    await _renew(served, node, creds)
    labels = stored(kmock, NODES, NAME)["metadata"]["labels"]
    assert labels[ATTESTED] == "true"
    assert _status(kmock)["nodeUID"] == new_uid
    assert await _decide(gate) is None
    assert hold_taints(kmock, NAME) == []
    assert _status(kmock)["phase"] == "Ready"


async def test_a_renewal_while_the_node_is_gone_keeps_the_old_uid(
    kmock: Any, api: Kube, served: Running, gate: Gate, ek_ca: EkCa, tmp_path: Path
) -> None:
    """An administrator deletes the Node; a renewal on the same boot finds no Node to label and
    creates none. The record keeps the last Node's uid, so the Node the kubelet registers at its
    next start is held, and the next attestation adopts it."""
    node, creds, old_uid = await _released_in_pool(kmock, api, served, gate, ek_ca, tmp_path)
    await _delete_node(kmock)
    await _renew(served, node, creds)
    new_uid = await _kubelet_registers(api, pool="gpu")  # an honest kubelet, with --node-labels
    assert await _decide(gate) == "unattested"
    assert "re-created since" in _status(kmock)["message"]
    assert _status(kmock)["nodeUID"] == old_uid
    record = await served.service.store.get(NAME)
    assert record is not None
    assert record.node_uid == old_uid
    await _renew(served, node, creds)
    assert _status(kmock)["nodeUID"] == new_uid
    # Attested again and selected by the pool's CR again: the new Node carries no nodeState
    # annotation, so it waits for the operator as a new node does, then is released.
    assert await _decide(gate) == "packages-pending"
    await operator_writes(api, NAME, "drivers", {"gpu-driver": ("550.1", "config", "complete")})
    assert await _decide(gate) is None


async def test_a_new_boot_whose_node_is_gone_gets_it_pre_created_as_at_join(
    kmock: Any, api: Kube, served: Running, gate: Gate, ek_ca: EkCa, tmp_path: Path
) -> None:
    """The cloud deletes the Node of a stopped machine. At its next boot ``nodegate attest`` runs
    before the kubelet: a new boot, no Node, so the join service pre-creates it with the hold and
    the attested labels and records its uid; the kubelet registers onto it, and the gate decides
    it as any attested node (the pool label the administrator set went with the old Node)."""
    node, creds, _old_uid = await _released_in_pool(kmock, api, served, gate, ek_ca, tmp_path)
    await _delete_node(kmock)
    new_boot = "9c8b7a6f-5e4d-4c3b-8a29-1f0e9d8c7b6a"
    node.tpm.reset_count += 1  # the machine booted: a TPM Reset
    await _renew(served, node, creds, boot_id=new_boot)
    made = stored(kmock, NODES, NAME)
    assert made["metadata"]["labels"][ATTESTED] == "true"
    assert made["spec"]["taints"] == [hold("packages-pending")]
    assert _status(kmock)["nodeUID"] == made["metadata"]["uid"]
    uid = await _kubelet_registers(api, new_boot, team="mine")  # AlreadyExists: its labels do not apply
    assert uid == made["metadata"]["uid"]
    assert "team" not in stored(kmock, NODES, NAME)["metadata"]["labels"]
    assert await _decide(gate) is None  # no CR selects it now
    assert hold_taints(kmock, NAME) == []
