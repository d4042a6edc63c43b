"""The disk-key server secret when ``nodegate serve`` starts (docs/disk-keys.md, "Where the secret
lives"). Created on the first start with ``disk_keys``, never silently re-created:

- sqlite: ``state_dir/disk-keys.json`` next to a marker, ``disk-keys.id``. The document missing
  while the marker is there means it was lost: the start is refused (restore it from a backup:
  every volume bound to it needs it).
- kubernetes: the Secret ``disk_keys.secret_name`` (the chart makes it empty). Empty: filled now;
  missing: refused, since a deleted Secret is a lost secret.
"""

from __future__ import annotations

import logging
from datetime import datetime

from bootstrap.config import Settings
from bootstrap.files import create_exclusive
from bootstrap.kube import Kube, KubeUnavailable
from bootstrap.service.pki.startup import StartupError
from bootstrap.store.diskkeys import (
    MARKER,
    DiskVault,
    FileVault,
    KubeVault,
    VaultDamaged,
    VaultDoc,
    VaultUnavailable,
)
from bootstrap.times import rfc3339

log = logging.getLogger("nodegate.disk")

_RESTORE = "restore it from a backup (nodegate restore, docs/disk-keys.md): every volume bound to it needs it"


def vault_for(settings: Settings, kube: Kube | None) -> DiskVault:
    """Where ``settings`` keeps the disk-key document (no I/O)."""
    if settings.store == "kubernetes":
        if kube is None:
            raise StartupError("disk_keys with store: kubernetes needs a cluster (kubernetes.kubeconfig)")
        name = settings.disk_keys.secret_name if settings.disk_keys else "nodegate-disk-keys"
        return KubeVault(kube, settings.kubernetes.namespace, name)
    return FileVault(settings.state_dir)


async def open_vault(settings: Settings, kube: Kube | None, now: datetime) -> DiskVault | None:
    """The vault with a document in it (created here on the first start); None without disk_keys."""
    if settings.disk_keys is None:
        return None
    vault = vault_for(settings, kube)
    try:
        doc = await vault.read()
        if doc is None:
            await _first(settings, vault, kube, now)
    except VaultDamaged as exc:
        raise StartupError(f"{exc}; fix it or {_RESTORE}") from None
    except VaultUnavailable as exc:
        raise StartupError(f"disk-key secret: {exc}; retry once it can be read") from None
    return vault


async def _first(settings: Settings, vault: DiskVault, kube: Kube | None, now: datetime) -> None:
    if isinstance(vault, FileVault):
        marker = settings.state_dir / MARKER
        if marker.exists():
            raise StartupError(f"{vault.where} is missing, but {marker} says one was made here; {_RESTORE}")
        await vault.create(VaultDoc.new(now))
        text = f"disk-key secret {vault.path.name} since {rfc3339(now)}; if it goes missing, {_RESTORE}\n"
        create_exclusive(marker, text.encode())
    else:
        assert kube is not None  # noqa: S101  (vault_for made a KubeVault only with one)
        namespace = settings.kubernetes.namespace
        name = settings.disk_keys.secret_name if settings.disk_keys else ""
        try:
            exists = await kube.get_secret(namespace, name) is not None
        except KubeUnavailable as exc:
            raise VaultUnavailable(str(exc)) from None
        if not exists:
            raise StartupError(
                f"{vault.where} does not exist: the chart makes it (diskKeys); if it was deleted, {_RESTORE}"
            )
        await vault.create(VaultDoc.new(now))
    log.warning("created the disk-key secret", extra={"error": vault.where})
