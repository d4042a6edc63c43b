"""``nodegate backup`` and ``nodegate restore`` (docs/backup.md)."""

from __future__ import annotations

import argparse

from bootstrap.store import backup


def run(args: argparse.Namespace) -> int:
    return backup.cli_backup(args) if args.command == "backup" else backup.cli_restore(args)
