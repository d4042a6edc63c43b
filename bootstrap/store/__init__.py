"""Node records and where they are kept: sqlite (one host) or NodeAttestation objects (replicas).

The contract (``Store`` and its records) is in ``model``; the backends are the ``sqlite`` and
``kube`` packages, and ``open_store`` picks one. ``backup`` is `nodegate backup` / `restore`.
"""

from __future__ import annotations

from pathlib import Path

from bootstrap.kube import Kube
from bootstrap.store.kube import KubeStore
from bootstrap.store.model import (
    MAX_SERIALS,
    MAX_SPIFFE_ID,
    Attestation,
    AuditEntry,
    DamagedRecord,
    NodeRecord,
    Store,
    StoreSchemaError,
    StoreUnavailable,
)
from bootstrap.store.sqlite import SqliteStore

__all__ = [
    "MAX_SERIALS",
    "MAX_SPIFFE_ID",
    "Attestation",
    "AuditEntry",
    "DamagedRecord",
    "NodeRecord",
    "Store",
    "StoreSchemaError",
    "StoreUnavailable",
    "open_store",
]


async def open_store(kind: str, *, state_dir: Path, kube: Kube | None, namespace: str = "nodegate") -> Store:
    """``"sqlite"``: ``<state_dir>/nodegate.db``; ``"kubernetes"``: NodeAttestation objects."""
    if kind == "sqlite":
        return await SqliteStore.open(state_dir / "nodegate.db")
    if kind == "kubernetes":
        if kube is None:
            raise ValueError("store: kubernetes needs a cluster (kubernetes.kubeconfig or in-cluster)")
        return KubeStore(kube, namespace=namespace)
    raise ValueError(f"unknown store kind {kind!r} (sqlite or kubernetes)")
