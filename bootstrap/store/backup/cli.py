"""The command line of ``nodegate backup`` and ``nodegate restore``: arguments, the passphrase
(from a file or the environment, never the command line), messages and exit codes."""

from __future__ import annotations

import argparse
import contextlib
import os
import stat
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from bootstrap.config import ConfigError, Settings, load_settings
from bootstrap.files import read_limited
from bootstrap.store.backup.container import MAX_PASSPHRASE
from bootstrap.store.backup.errors import BackupError
from bootstrap.store.backup.restoring import restore
from bootstrap.store.backup.snapshot import backup

__all__ = [
    "PASSPHRASE_ENV",
    "add_backup_arguments",
    "add_restore_arguments",
    "cli_backup",
    "cli_restore",
    "read_passphrase",
]

PASSPHRASE_ENV: Final = "NODEGATE_BACKUP_PASSPHRASE"  # noqa: S105  (the variable's name)


def add_backup_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, metavar="FILE", help="the service's config (state_dir, store)")
    p.add_argument("--out", type=Path, metavar="FILE", required=True, help="the archive to write (0600)")
    _passphrase_argument(p)


def add_restore_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, metavar="FILE", help="the config of the service to restore")
    p.add_argument(
        "--archive", type=Path, metavar="FILE", required=True, help="an archive from nodegate backup"
    )
    _passphrase_argument(p)
    p.add_argument(
        "--force",
        action="store_true",
        help="restore into a non-empty state_dir, replacing its CA, session keys and store",
    )


class _NoInlinePassphrase(argparse.Action):
    """``--passphrase VALUE`` is refused without echoing VALUE (argparse would print it back as an
    unrecognised argument)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object, **__: object) -> None:
        parser.error(
            "--passphrase is not accepted: the command line is visible to other users (ps, shell "
            f"history); use --passphrase-file FILE or ${PASSPHRASE_ENV}"
        )


def _passphrase_argument(p: argparse.ArgumentParser) -> None:
    # otherwise `--passphrase-f` style prefixes match, and `--passphrase SECRET` would be taken
    # as `--passphrase-file SECRET`, printing SECRET in the "cannot read" message
    p.allow_abbrev = False
    p.add_argument("--passphrase", action=_NoInlinePassphrase, help=argparse.SUPPRESS)
    p.add_argument(
        "--passphrase-file",
        type=Path,
        metavar="FILE",
        help=f"file holding the passphrase (one trailing newline is dropped); default: ${PASSPHRASE_ENV}",
    )


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
        info = backup(settings, args.out, passphrase=passphrase, now=datetime.now(UTC))
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
    return 0
