"""Why a backup or restore was refused: one exception per machine code, nothing written."""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "ArchiveCorrupt",
    "ArchiveTooLarge",
    "ArchiveTruncated",
    "BackupError",
    "BackupIoError",
    "NotAnArchive",
    "RestoreMismatch",
    "StateDirNotEmpty",
    "StateMissing",
    "StoreInUse",
    "TrailingData",
    "UnsupportedVersion",
    "WrongPassphrase",
]


class BackupError(Exception):
    """A backup or restore that was refused; nothing was written. ``code`` is for machines."""

    code: ClassVar[str] = "backup_failed"

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, detail={self.detail!r})"


class NotAnArchive(BackupError):
    code = "backup_not_an_archive"


class UnsupportedVersion(BackupError):
    code = "backup_version_unsupported"


class ArchiveTruncated(BackupError):
    code = "backup_truncated"


class TrailingData(BackupError):
    code = "backup_trailing_data"


class ArchiveTooLarge(BackupError):
    code = "backup_too_large"


class WrongPassphrase(BackupError):
    code = "backup_wrong_passphrase"


class ArchiveCorrupt(BackupError):
    """The header looks right but the content does not authenticate or does not make sense."""

    code = "backup_corrupt"


class StateMissing(BackupError):
    """state_dir has nothing (or something unusable) to back up."""

    code = "backup_state_missing"


class RestoreMismatch(BackupError):
    """The archive is fine but belongs to another setup (trust domain, store kind, newer schema)."""

    code = "restore_mismatch"


class StateDirNotEmpty(BackupError):
    code = "restore_target_not_empty"


class StoreInUse(BackupError):
    code = "restore_store_in_use"


class BackupIoError(BackupError):
    code = "backup_io_error"
