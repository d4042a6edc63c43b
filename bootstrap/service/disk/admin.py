"""``nodegate disk revoke|rotate|recover`` (docs/disk-keys.md, "Operations"): changes to the
disk-key secret made where it is kept (state_dir, or the Secret through the API), each with a
line in the node's audit trail. A running service sees a change at its next release."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

from attest import diskkey
from bootstrap.config import Settings
from bootstrap.kube import Kube
from bootstrap.service.disk.secret import vault_for
from bootstrap.store import Store, open_store
from bootstrap.store.diskkeys import VaultDoc

__all__ = ["Recovered", "Revoked", "derive_for", "revoke", "rotate", "tools"]


@dataclass(frozen=True)
class Tools:
    settings: Settings
    store: Store
    kube: Kube | None


@asynccontextmanager
async def tools(settings: Settings) -> AsyncIterator[Tools]:
    """The store and (with store: kubernetes) the cluster, as ``serve`` would open them."""
    kube = await Kube.from_settings(settings.kubernetes) if settings.store == "kubernetes" else None
    try:
        store = await open_store(
            settings.store, state_dir=settings.state_dir, kube=kube, namespace=settings.kubernetes.namespace
        )
        try:
            yield Tools(settings, store, kube)
        finally:
            await store.close()
    finally:
        if kube is not None:
            await kube.close()


@dataclass(frozen=True)
class Revoked:
    node: str
    ek_sha256: str
    epoch: int
    audited: bool


async def revoke(t: Tools, node: str, *, ek_sha256: str | None, actor: str, reason: str) -> Revoked:
    """The node's TPM one epoch up: its keys so far are never released again. The EK comes from the
    node's record (``ek_sha256`` for a node the store forgot). The change comes first: an audit
    that cannot be written does not leave the keys releasable."""
    if ek_sha256 is None:
        record = await t.store.get(node)
        if record is None:
            raise KeyError(node)
        ek_sha256 = record.ek_sha256
    ek = ek_sha256
    doc = await vault_for(t.settings, t.kube).update(lambda d: d.revoked(ek))
    epoch = doc.epoch(ek)
    audited = await t.store.record_disk(
        node, action="disk-revoke", actor=actor, detail=f"ek={ek} now at epoch {epoch}: {reason}"
    )
    return Revoked(node, ek, epoch, audited)


async def rotate(t: Tools, *, retire: int | None, now: datetime | None = None) -> VaultDoc:
    """A new current version (nodes re-key at their next ``nodegate disk rekey``), or with
    ``retire`` an old version dropped (its keys are never released again)."""
    vault = vault_for(t.settings, t.kube)
    if retire is not None:
        version = retire
        return await vault.update(lambda d: d.retired(version))
    when = now if now is not None else datetime.now(UTC)
    return await vault.update(lambda d: d.rotated(when))


@dataclass(frozen=True)
class Recovered:
    key: bytes
    revoked: bool  # the binding's epoch was revoked since: recovered all the same, on purpose


def derive_for(doc: VaultDoc, *, ek_sha256: str, volume: str, epoch: int, version: int) -> Recovered:
    """A binding's key from a backup's document (``nodegate disk recover``)."""
    secret = doc.secret(version)
    if secret is None:
        raise ValueError(f"the backup holds no key version {version} (it holds {list(doc.versions)})")
    key = diskkey.derive_key(
        secret, ek_sha256=ek_sha256, volume=uuid.UUID(volume), epoch=epoch, version=version
    )
    return Recovered(key, epoch < doc.epoch(ek_sha256))
