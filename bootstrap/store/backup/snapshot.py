"""``backup``: a consistent snapshot of a state_dir, taken while the service runs, sealed into a new
archive: the CA files (read until the index is stable), the session keys and, with the sqlite
store, a copy made with sqlite's online backup API."""

from __future__ import annotations

import json
import re
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

from attest import ca
from bootstrap.config import Settings
from bootstrap.files import create_exclusive, read_limited
from bootstrap.store.backup.checks import check_ca, check_disk_keys, check_integrity, count_session_keys
from bootstrap.store.backup.container import check_passphrase, seal
from bootstrap.store.backup.contents import (
    CA_INDEX,
    CA_LIMITS,
    DISK_KEYS,
    FORMAT_VERSION,
    MAX_DISK_KEYS,
    MAX_SESSION_KEY_FILE,
    MAX_STORE_BYTES,
    SESSION_KEY,
    STORE_DB,
    BackupInfo,
    pack,
)
from bootstrap.store.backup.errors import ArchiveTooLarge, BackupIoError, StateMissing
from bootstrap.store.model import StoreSchemaError
from bootstrap.store.sqlite import read_schema_version

__all__ = ["backup"]

_STEM = re.compile(r"ca-[0-9a-f]{16}")


def backup(
    settings: Settings, out: Path, *, passphrase: bytes, now: datetime, disk_keys: bytes | None = None
) -> BackupInfo:
    """Write an encrypted archive of ``settings.state_dir`` to ``out`` (mode 0600, never over an
    existing file). Safe while the service runs: the sqlite store is copied with sqlite's online
    backup API, the CA files are read until the index is stable. The disk-key secret is
    ``disk_keys`` (read from the Secret with store: kubernetes), else state_dir's when there is
    one; with ``disk_keys`` configured it must be there."""
    check_passphrase(passphrase, creating=True)
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    state = settings.state_dir
    files = _read_ca(state / "ca", settings.trust_domain)
    session = _read_file(state / SESSION_KEY, MAX_SESSION_KEY_FILE, "the session key")
    keys = count_session_keys(session, SESSION_KEY)
    files[SESSION_KEY] = session
    schema: int | None = None
    if settings.store == "sqlite":
        files[STORE_DB], schema = _copy_sqlite(state / STORE_DB)
    document = disk_keys if disk_keys is not None else _disk_keys(state, settings)
    if document is not None:
        files[DISK_KEYS] = document
    names = [SESSION_KEY, *sorted(n for n in files if n.startswith("ca/") and n != CA_INDEX), CA_INDEX]
    if DISK_KEYS in files:
        names.insert(1, DISK_KEYS)
    if STORE_DB in files:
        names.insert(1, STORE_DB)
    manifest = {
        "format": FORMAT_VERSION,
        "created_at": now.astimezone(UTC).isoformat(),
        "trust_domain": settings.trust_domain,
        "store": settings.store,
        "store_schema": schema,
        "files": [[n, len(files[n])] for n in names],
    }
    blob = seal(pack(manifest, [files[n] for n in names]), passphrase)
    try:
        if not create_exclusive(out, blob):
            raise BackupIoError(f"{out} exists; choose a new name (a backup never overwrites another)")
    except OSError as exc:
        raise BackupIoError(f"cannot write {out}: {exc.strerror or exc}") from None
    return BackupInfo(
        archive=out,
        created_at=now.astimezone(UTC),
        trust_domain=settings.trust_domain,
        store=settings.store,
        store_included=STORE_DB in files,
        store_schema=schema,
        files=tuple(names),
        authorities=sum(1 for n in names if n.endswith(".key") and n.startswith("ca/")),
        session_keys=keys,
        size=len(blob),
        disk_keys=DISK_KEYS in files,
    )


def _disk_keys(state: Path, settings: Settings) -> bytes | None:
    """state_dir's disk-key secret, checked; None when there is none and none is configured."""
    path = state / DISK_KEYS
    if not path.exists():
        if settings.disk_keys is not None and settings.store == "sqlite":
            raise StateMissing(f"disk_keys is configured but {path} does not exist: has the service started?")
        return None
    data = _read_file(path, MAX_DISK_KEYS, "the disk-key secret")
    check_disk_keys(data, str(path), StateMissing)
    return data


def _read_file(path: Path, limit: int, what: str) -> bytes:
    try:
        return read_limited(path, limit)
    except FileNotFoundError:
        raise StateMissing(f"{what} ({path}) does not exist: has the service ever started here?") from None
    except ValueError as exc:
        raise StateMissing(str(exc)) from None
    except OSError as exc:
        raise BackupIoError(f"cannot read {path}: {exc.strerror or exc}") from None


def _read_ca(folder: Path, trust_domain: str) -> dict[str, bytes]:
    """The files the CA index names. A rotation replaces the index last and deletes old files
    after it, so a set read between two identical reads of the index is consistent."""
    for _ in range(5):
        index = _read_file(folder / ca.INDEX_FILE, ca.MAX_INDEX_FILE, "the CA index")
        files = {CA_INDEX: index}
        try:
            for stem in _index_stems(index):
                for ext, limit in CA_LIMITS.items():
                    files[f"ca/{stem}.{ext}"] = read_limited(folder / f"{stem}.{ext}", limit)
        except FileNotFoundError:
            continue  # pruned by a rotation under us: read again
        except (OSError, ValueError) as exc:
            raise BackupIoError(f"cannot read the CA in {folder}: {exc}") from None
        if _read_file(folder / ca.INDEX_FILE, ca.MAX_INDEX_FILE, "the CA index") == index:
            check_ca(files, trust_domain, f"the CA in {folder}", StateMissing, StateMissing)
            return files
    raise BackupIoError(f"the CA in {folder} kept changing while it was read; run the backup again")


def _index_stems(index: bytes) -> list[str]:
    try:
        doc = json.loads(index)
        entries = doc["authorities"]
        stems = [e["stem"] for e in entries]
    except (ValueError, KeyError, TypeError):
        raise StateMissing("the CA index (ca/index.json) is damaged") from None
    if not all(isinstance(s, str) and _STEM.fullmatch(s) for s in stems) or len(stems) > ca.MAX_AUTHORITIES:
        raise StateMissing("the CA index (ca/index.json) names invalid authorities")
    return stems


def _copy_sqlite(path: Path) -> tuple[bytes, int | None]:
    """A consistent copy of the live database (the writer keeps going: WAL readers never block it)."""
    if not path.is_file():
        raise StateMissing(f"the store ({path}) does not exist: has the service ever started here?")
    uri = path.resolve().as_uri() + "?mode=rw"  # never creates an empty file where one is missing
    try:
        src = sqlite3.connect(uri, uri=True, timeout=5.0, isolation_level=None)
    except sqlite3.Error as exc:
        raise BackupIoError(f"cannot open the store {path}: {exc}") from None
    try:
        dst = sqlite3.connect(":memory:", isolation_level=None)
        try:
            src.execute("PRAGMA query_only = ON")
            pages, page_size = (
                src.execute("PRAGMA page_count").fetchone()[0],
                src.execute("PRAGMA page_size").fetchone()[0],
            )
            if pages * page_size > MAX_STORE_BYTES:
                raise ArchiveTooLarge(
                    f"the store is {pages * page_size} bytes; backups hold at most {MAX_STORE_BYTES} "
                    "(prune the audit trail, or copy the file with the service stopped)"
                )
            src.backup(dst)  # all pages in one step: one read snapshot
            check_integrity(dst, f"the store {path}", StateMissing)
            schema = read_schema_version(dst)
            # Bytes 18-19 of the header still say WAL (2, 2), which an image in memory cannot be;
            # 1, 1 is the rollback-journal format, and the store switches the file to WAL on open.
            image = bytearray(dst.serialize())
            image[18:20] = b"\x01\x01"
            data = bytes(image)
        finally:
            dst.close()
    except StoreSchemaError as exc:
        raise StateMissing(f"the store {path}: {exc}") from None
    except sqlite3.Error as exc:
        raise BackupIoError(f"cannot copy the store {path}: {exc}") from None
    finally:
        src.close()
    if len(data) > MAX_STORE_BYTES:
        raise ArchiveTooLarge(f"the store is larger than {MAX_STORE_BYTES} bytes")
    return data, schema
