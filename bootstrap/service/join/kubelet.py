"""Kubelet credentials for an attested node: Node pre-creation with the hold taint, the kubelet
client CSR (created and approved by nodegate), and a kubeconfig without the private key.

The node's key never leaves the node: the CSR from the join carries it, the cluster signer
(kube-controller-manager) signs it, and the node puts its key into the kubeconfig itself.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
from collections.abc import Awaitable, Mapping
from typing import Any

import yaml

from bootstrap.kube import Conflict, Kube, NotFound
from bootstrap.names import ATTESTED_LABEL, EK_LABEL, NODE_RESTRICTION_PREFIX, ek_label_value
from bootstrap.store.model import check_node_uid

SIGNER = "kubernetes.io/kube-apiserver-client-kubelet"
USAGES = ("digital signature", "client auth")
LABEL_PREFIX = NODE_RESTRICTION_PREFIX
PCR_CLASS_LABEL = f"{LABEL_PREFIX}nodegate.io-pcr-class"
HOLD_VALUE = "packages-pending"
_PATCH_ATTEMPTS = 5


def attested_labels(ek_sha256: str, pcr_class: str | None, extra: Mapping[str, str]) -> dict[str, str]:
    """Labels a kubelet cannot set itself (NodeRestriction forbids this prefix to kubelets)."""
    labels = {
        ATTESTED_LABEL: "true",
        EK_LABEL: ek_label_value(ek_sha256),
    }
    if pcr_class:
        labels[PCR_CLASS_LABEL] = pcr_class[:63]
    for key, value in extra.items():
        labels[key if key.startswith(LABEL_PREFIX) else LABEL_PREFIX + key] = value
    return labels


def label_patch(labels: Mapping[str, str]) -> dict[str, str | None]:
    """The merge patch of ``metadata.labels`` that leaves the Node with ``labels``: a PCR class
    label that the latest attestation no longer names is removed (null), never kept from an
    earlier boot (issue 33, finding 9)."""
    patch: dict[str, str | None] = dict(labels)
    patch.setdefault(PCR_CLASS_LABEL, None)
    return patch


def node_uid(node: Mapping[str, Any]) -> str | None:
    """The Node's ``metadata.uid`` as the store records it (None: none, or not a uid)."""
    meta = node.get("metadata")
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    try:
        return check_node_uid(uid)
    except ValueError:
        return None


async def relabel_node(
    kube: Kube, node_name: str, labels: Mapping[str, str], *, create_held: str | None = None
) -> str | None:
    """Write the attested labels of an accepted re-attestation (renewal, ``nodegate attest``) onto
    the Node; the uid of the Node written (recorded with the attestation: the gate holds any other
    Node of this name), or None when there is no Node. Labels only, so no resourceVersion: a merge
    patch of the label map leaves every other label and the taints as they are. A Node its kubelet
    re-created after a delete is adopted here: the re-attestation is the recovery (docs/gate.md).
    With ``create_held`` (the hold taint's key) a missing Node is pre-created as at join."""
    try:
        written = await kube.patch_node(node_name, {"metadata": {"labels": label_patch(labels)}})
    except NotFound:
        if create_held is None:
            return None
        return await ensure_node(kube, node_name, labels, create_held)
    return node_uid(written)


def hold_taint(taint_key: str) -> dict[str, str]:
    return {"key": taint_key, "value": HOLD_VALUE, "effect": "NoSchedule"}


async def ensure_node(kube: Kube, node_name: str, labels: Mapping[str, str], taint_key: str) -> str | None:
    """Create the Node with the hold taint, or, if it exists (a re-join), add the attested labels
    and the hold taint when the node carries no hold taint at all. Other taints stay untouched.
    Returns the uid of the Node written (None: the API returned none)."""
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node_name, "labels": dict(labels)},
        "spec": {"taints": [hold_taint(taint_key)]},
    }
    created = await _applied(kube.create_node(body))
    if created is not None:
        return node_uid(created)
    for _ in range(_PATCH_ATTEMPTS):
        node = await kube.get_node(node_name)
        if node is None:  # deleted in between: create again
            created = await _applied(kube.create_node(body))
            if created is not None:
                return node_uid(created)
            continue
        meta = node.get("metadata") or {}
        taints = list((node.get("spec") or {}).get("taints") or [])
        patch: dict[str, Any] = {
            "metadata": {"resourceVersion": meta.get("resourceVersion"), "labels": label_patch(labels)}
        }
        if not any(isinstance(t, dict) and t.get("key") == taint_key for t in taints):
            patch["spec"] = {"taints": [*taints, hold_taint(taint_key)]}
        patched = await _applied(kube.patch_node(node_name, patch))
        if patched is not None:
            return node_uid(patched)
    raise Conflict(f"node {node_name} kept changing while nodegate updated it")


async def _applied(write: Awaitable[dict[str, Any]]) -> dict[str, Any] | None:
    """The object written; None on 409 (exists, or a stale resourceVersion): the caller re-reads."""
    try:
        return await write
    except Conflict:
        return None


def csr_name(node_name: str, session_id: str) -> str:
    return f"nodegate-{hashlib.sha256(node_name.encode()).hexdigest()[:16]}-{session_id[:16]}"


async def issue_kubelet_certificate(
    kube: Kube,
    *,
    node_name: str,
    session_id: str,
    csr_pem: bytes,
    spiffe_id: str,
    expiration_seconds: int,
    timeout: float,
) -> bytes:
    """Create the CSR, approve it as nodegate (the attestation is the reason), wait for the signer."""
    name = csr_name(node_name, session_id)
    with contextlib.suppress(Conflict):  # a retry of the same session: the CSR is already there
        await kube.create_csr(
            name,
            csr_pem,
            signer=SIGNER,
            usages=USAGES,
            expiration_seconds=max(600, expiration_seconds),
            labels={"app.kubernetes.io/managed-by": "nodegate"},
        )
    await kube.approve_csr(
        name, reason="NodegateAttested", message=f"TPM attestation verified for {spiffe_id}"[:1024]
    )
    return await kube.wait_csr_certificate(name, timeout=timeout)


def kubeconfig(*, node_name: str, server: str, ca_pem: bytes | None, client_cert_pem: bytes) -> str:
    """A kubelet kubeconfig whose user has the certificate but no key (the node adds
    ``client-key-data`` from its own key file)."""
    cluster: dict[str, Any] = {"server": server}
    if ca_pem:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    user = f"system:node:{node_name}"
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kubernetes", "cluster": cluster}],
        "users": [
            {"name": user, "user": {"client-certificate-data": base64.b64encode(client_cert_pem).decode()}}
        ],
        "contexts": [{"name": "kubelet", "context": {"cluster": "kubernetes", "user": user}}],
        "current-context": "kubelet",
    }
    return yaml.safe_dump(doc, sort_keys=False)
