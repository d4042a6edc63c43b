"""``nodegate backup`` and ``nodegate restore`` (docs/backup.md): the passphrase (from a file or
the environment, never the command line), messages and exit codes. Arguments: cli/arguments.py."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import stat
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

from bootstrap.cli.arguments import PASSPHRASE_ENV
from bootstrap.config import ConfigError, Settings, load_settings
from bootstrap.files import read_limited
from bootstrap.kube import Kube, KubeConfigError, KubeUnavailable
from bootstrap.store.backup import BackupError, backup, restore
from bootstrap.store.backup.container import MAX_PASSPHRASE
from bootstrap.store.diskkeys import KubeVault, VaultDamaged, VaultUnavailable

__all__ = ["PASSPHRASE_ENV", "cli_backup", "cli_restore", "read_passphrase", "run"]


def read_passphrase(path: Path | None, env: Mapping[str, str] | None = None) -> bytes:
    """The passphrase from ``path`` or, without one, from $NODEGATE_BACKUP_PASSPHRASE; ValueError
    when there is none (never taken from the command line, where ``ps`` would show it)."""
    environ: Mapping[str, str] = os.environ if env is None else env
    if path is not None:
        try:
            raw = read_limited(path, MAX_PASSPHRASE + 2)
        except OSError as exc:
            raise ValueError(f"cannot read the passphrase file {path}: {exc.strerror or exc}") from None
        if raw.endswith(b"\r\n"):
            raw = raw[:-2]
        elif raw.endswith(b"\n"):
            raw = raw[:-1]
    elif environ.get(PASSPHRASE_ENV):
        raw = os.fsencode(environ[PASSPHRASE_ENV])
    else:
        raise ValueError(f"no passphrase: pass --passphrase-file FILE or set {PASSPHRASE_ENV}")
    if not raw:
        raise ValueError("the passphrase is empty")
    return raw


def _cli_inputs(args: argparse.Namespace, command: str) -> tuple[Settings, bytes] | None:
    try:
        settings = load_settings(args.config) if args.config is not None else Settings()
        passphrase = read_passphrase(args.passphrase_file)
    except (ConfigError, ValueError) as exc:
        print(f"nodegate {command}: {exc}", file=sys.stderr)
        return None
    if args.passphrase_file is not None:
        with contextlib.suppress(OSError):
            if stat.S_IMODE(args.passphrase_file.stat().st_mode) & 0o077:
                print(
                    f"nodegate {command}: warning: {args.passphrase_file} is readable by other users",
                    file=sys.stderr,
                )
    return settings, passphrase


def cli_backup(args: argparse.Namespace) -> int:
    """``nodegate backup``: 0 written, 1 refused, 2 usage or config error."""
    inputs = _cli_inputs(args, "backup")
    if inputs is None:
        return 2
    settings, passphrase = inputs
    try:
        in_cluster = settings.disk_keys is not None and settings.store == "kubernetes"
        disk_keys = asyncio.run(_disk_keys_from_cluster(settings)) if in_cluster else None
        info = backup(settings, args.out, passphrase=passphrase, now=datetime.now(UTC), disk_keys=disk_keys)
    except (VaultDamaged, VaultUnavailable, KubeUnavailable, KubeConfigError) as exc:
        print(f"nodegate backup: the disk-key secret: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    except BackupError as exc:
        print(f"nodegate backup: {exc.detail} [{exc.code}]", file=sys.stderr)
        return 1
    print(f"nodegate backup: wrote {info.archive} ({info.size} bytes): {info.note}")
    return 0


def cli_restore(args: argparse.Namespace) -> int:
    """``nodegate restore``: 0 restored, 1 refused (nothing written), 2 usage or config error."""
    inputs = _cli_inputs(args, "restore")
    if inputs is None:
        return 2
    settings, passphrase = inputs
    try:
        info = restore(settings, args.archive, passphrase=passphrase, force=args.force)
    except BackupError as exc:
        print(f"nodegate restore: {exc.detail} [{exc.code}]", file=sys.stderr)
        return 1
    made = info.created_at.isoformat(timespec="seconds")
    print(f"nodegate restore: restored the backup of {made} into {settings.state_dir}: {info.note}")
    if info.disk_keys and settings.store == "kubernetes" and settings.disk_keys is not None:
        name, ns = settings.disk_keys.secret_name, settings.kubernetes.namespace
        path = settings.state_dir / "disk-keys.json"
        print(
            f"nodegate restore: the disk-key secret is in {path}; put it back into the Secret {ns}/{name} "
            f"(kubectl -n {ns} create secret generic {name} --from-file={path} --dry-run=client -o yaml "
            "| kubectl apply -f -)"
        )
    return 0


async def _disk_keys_from_cluster(settings: Settings) -> bytes | None:
    """With store: kubernetes the disk-key secret is a Secret (docs/disk-keys.md): read it for the
    archive. None otherwise (a sqlite state_dir holds it as a file)."""
    if settings.disk_keys is None or settings.store != "kubernetes":
        return None
    kube = await Kube.from_settings(settings.kubernetes)
    if kube is None:
        raise KubeUnavailable("no cluster: set kubernetes.kubeconfig to back up the disk-key Secret")
    try:
        doc = await KubeVault(kube, settings.kubernetes.namespace, settings.disk_keys.secret_name).read()
    finally:
        await kube.close()
    if doc is None:
        raise VaultDamaged("the disk-key Secret holds no document (has nodegate serve started?)")
    return doc.dump()


def run(args: argparse.Namespace) -> int:
    return cli_backup(args) if args.command == "backup" else cli_restore(args)
