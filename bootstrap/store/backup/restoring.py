"""``restore``: an archive back into a state_dir. The whole archive (decryption, CA set, session
keys, sqlite integrity and schema version) and the target are checked before the first byte is
written; the CA index is written last, since it names the files written before it."""

from __future__ import annotations

import os
import sqlite3
import stat
from datetime import UTC, datetime
from pathlib import Path

from bootstrap.config import Settings
from bootstrap.files import create_exclusive, ensure_dir, write_atomic
from bootstrap.store.backup.checks import check_ca, check_disk_keys, check_integrity, count_session_keys
from bootstrap.store.backup.container import MAX_ARCHIVE, check_passphrase, open_sealed
from bootstrap.store.backup.contents import (
    CA_INDEX,
    DISK_KEYS,
    SESSION_KEY,
    STORE_DB,
    BackupInfo,
    Content,
    unpack,
)
from bootstrap.store.backup.errors import (
    ArchiveCorrupt,
    ArchiveTooLarge,
    BackupIoError,
    RestoreMismatch,
    StateDirNotEmpty,
    StateMissing,
    StoreInUse,
)
from bootstrap.store.diskkeys import MARKER as DISK_MARKER
from bootstrap.store.model import StoreSchemaError
from bootstrap.store.sqlite import SCHEMA_VERSION, read_schema_version

__all__ = ["open_archive", "restore"]


def restore(settings: Settings, archive: Path, *, passphrase: bytes, force: bool = False) -> BackupInfo:
    """Restore ``archive`` into ``settings.state_dir``: a missing or empty folder, or with
    ``force`` an existing one whose CA, session keys and store are replaced. Stop the service
    first. Everything is checked before anything is written."""
    content, size = open_archive(archive, passphrase)
    files = content.files
    info = _verify(settings, archive, size, content)

    state = settings.state_dir
    if state.exists() and not state.is_dir():
        raise BackupIoError(f"state_dir {state} is not a folder")
    # lost+found: a freshly formatted volume mounted as state_dir is still empty
    if state.is_dir() and any(e.name != "lost+found" for e in state.iterdir()) and not force:
        raise StateDirNotEmpty(
            f"state_dir {state} is not empty; restore into a fresh folder, or pass --force to "
            "replace its CA, session keys and store (stop the service first)"
        )
    db_path = state / STORE_DB
    if force and settings.store == "sqlite" and db_path.exists():
        _refuse_if_in_use(db_path)

    try:
        ensure_dir(state)
        ensure_dir(state / "ca")
        _private_dir(state)
        _private_dir(state / "ca")
        write_atomic(state / SESSION_KEY, files[SESSION_KEY])
        if DISK_KEYS in files:
            write_atomic(state / DISK_KEYS, files[DISK_KEYS])
            if not (state / DISK_MARKER).exists():
                create_exclusive(state / DISK_MARKER, b"disk-key secret restored from a backup\n")
        if STORE_DB in files:
            # The old database's journal must not be replayed onto the restored file.
            for suffix in ("-wal", "-shm", "-journal"):
                (state / f"{STORE_DB}{suffix}").unlink(missing_ok=True)
            write_atomic(db_path, files[STORE_DB])
        for name, data in files.items():
            if name.startswith("ca/") and name != CA_INDEX:
                write_atomic(state / name, data)
        write_atomic(state / CA_INDEX, files[CA_INDEX])  # last: it names files that now exist
        keep = {n.removeprefix("ca/") for n in files if n.startswith("ca/")}
        for leftover in os.listdir(state / "ca"):
            if not leftover.startswith(".") and leftover not in keep:
                (state / "ca" / leftover).unlink(missing_ok=True)  # authorities the archive retired
    except OSError as exc:
        raise BackupIoError(
            f"restoring into {state} failed part way ({exc.strerror or exc}); fix the cause and "
            "restore again with --force"
        ) from None
    return info


def open_archive(archive: Path, passphrase: bytes) -> tuple[Content, int]:
    """The archive's content (decrypted, authenticated, its names and sizes checked) and its size;
    nothing is written (``restore``, and ``nodegate disk recover``, which reads one file of it)."""
    check_passphrase(passphrase, creating=False)
    try:
        size = archive.stat().st_size
    except OSError as exc:
        raise BackupIoError(f"cannot read {archive}: {exc.strerror or exc}") from None
    if size > MAX_ARCHIVE:
        raise ArchiveTooLarge(f"{archive} is {size} bytes; an archive is at most {MAX_ARCHIVE}")
    return unpack(open_sealed(archive, passphrase)), size


def _verify(settings: Settings, archive: Path, size: int, content: Content) -> BackupInfo:
    m, files = content.manifest, content.files
    if m["trust_domain"] != settings.trust_domain:
        raise RestoreMismatch(
            f"the archive is for trust domain {m['trust_domain']}, the config says {settings.trust_domain}"
        )
    if m["store"] != settings.store:
        raise RestoreMismatch(
            f"the archive was made with store: {m['store']}, the config says store: {settings.store}; "
            "nodegate does not convert between stores"
        )
    cas = check_ca(files, settings.trust_domain, "the archive's CA", ArchiveCorrupt, RestoreMismatch)
    try:
        keys = count_session_keys(files[SESSION_KEY], "the archive's session.key")
    except StateMissing as exc:
        raise ArchiveCorrupt(exc.detail) from None
    if DISK_KEYS in files:
        check_disk_keys(files[DISK_KEYS], "the archive's disk-key secret", ArchiveCorrupt)
    schema: int | None = None
    if STORE_DB in files:
        schema = _check_store(files[STORE_DB])
        if schema != m["store_schema"]:
            raise ArchiveCorrupt("the archive's store does not match its manifest")
    return BackupInfo(
        archive=archive,
        created_at=datetime.fromisoformat(m["created_at"]).astimezone(UTC),
        trust_domain=settings.trust_domain,
        store=m["store"],
        store_included=STORE_DB in files,
        store_schema=schema,
        files=tuple(files),
        authorities=len(cas.authorities),
        session_keys=keys,
        size=size,
        disk_keys=DISK_KEYS in files,
    )


def _check_store(data: bytes) -> int | None:
    db = sqlite3.connect(":memory:", isolation_level=None)
    try:
        db.deserialize(data)
        check_integrity(db, "the archive's store", ArchiveCorrupt)
        schema = read_schema_version(db)
    except StoreSchemaError as exc:
        raise ArchiveCorrupt(f"the archive's store: {exc}") from None
    except sqlite3.Error as exc:
        raise ArchiveCorrupt(f"the archive's store is not a sqlite database: {exc}") from None
    finally:
        db.close()
    if schema is not None and schema > SCHEMA_VERSION:
        raise RestoreMismatch(
            f"the archive's store has schema version {schema}; this nodegate knows 1..{SCHEMA_VERSION}: "
            "restore with the nodegate version that made the backup (or a newer one)"
        )
    return schema


def _refuse_if_in_use(db_path: Path) -> None:
    """A running service keeps its WAL connection open, which makes an exclusive lock impossible:
    replacing the file under it would lose its writes and confuse its WAL."""
    try:
        db = sqlite3.connect(db_path, timeout=0, isolation_level=None)
    except sqlite3.Error:
        return  # unreadable: it is being replaced anyway
    try:
        db.execute("PRAGMA locking_mode = EXCLUSIVE")
        db.execute("BEGIN EXCLUSIVE")
        db.execute("ROLLBACK")
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            raise StoreInUse(
                f"the store {db_path} is in use (is nodegate serve running?); stop it and restore again"
            ) from None
    except sqlite3.Error:
        pass  # damaged: it is being replaced anyway
    finally:
        db.close()


def _private_dir(path: Path) -> None:
    if stat.S_IMODE(path.stat().st_mode) & 0o077:
        path.chmod(0o700)
