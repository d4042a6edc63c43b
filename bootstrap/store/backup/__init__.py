"""`nodegate backup` / `nodegate restore`: the CA keys, the session keys and the store in one
encrypted file (docs/backup.md).

- ``container``: the encrypted envelope (header, scrypt, AES-256-GCM with the header as AAD);
- ``contents``: the manifest and the fixed set of files inside it;
- ``checks``: what a usable CA set, session key file and sqlite file look like;
- ``snapshot``: :func:`backup`, a consistent copy of a running service's state_dir;
- ``restoring``: :func:`restore`, everything checked before anything is written;
- ``cli``: the two commands' arguments, passphrase input and exit codes.
"""

from __future__ import annotations

from bootstrap.store.backup.container import HEADER_SIZE, MAGIC
from bootstrap.store.backup.contents import FORMAT_VERSION, BackupInfo
from bootstrap.store.backup.errors import (
    ArchiveCorrupt,
    ArchiveTooLarge,
    ArchiveTruncated,
    BackupError,
    BackupIoError,
    NotAnArchive,
    RestoreMismatch,
    StateDirNotEmpty,
    StateMissing,
    StoreInUse,
    TrailingData,
    UnsupportedVersion,
    WrongPassphrase,
)
from bootstrap.store.backup.restoring import open_archive, restore
from bootstrap.store.backup.snapshot import backup

__all__ = [
    "FORMAT_VERSION",
    "HEADER_SIZE",
    "MAGIC",
    "ArchiveCorrupt",
    "ArchiveTooLarge",
    "ArchiveTruncated",
    "BackupError",
    "BackupInfo",
    "BackupIoError",
    "NotAnArchive",
    "RestoreMismatch",
    "StateDirNotEmpty",
    "StateMissing",
    "StoreInUse",
    "TrailingData",
    "UnsupportedVersion",
    "WrongPassphrase",
    "backup",
    "open_archive",
    "restore",
]
