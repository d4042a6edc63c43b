"""`nodegate backup` / `nodegate restore`: the CA keys, the session keys and the store in one
encrypted file.

Archive format, version 1 (all integers big-endian)::

    offset size
    0      8    magic b"NGBACKUP"
    8      2    format version (1)
    10     1    KDF (1 = scrypt)
    11     1    scrypt log2(N)
    12     1    scrypt r
    13     1    scrypt p
    14     16   salt
    30     16   passphrase check: HMAC-SHA256(scrypt output[32:], CHECK_LABEL)[:16]
    46     1    AEAD (1 = AES-256-GCM)
    47     12   nonce
    59     8    ciphertext length (tag included)
    67     ...  ciphertext: AES-256-GCM(key = scrypt output[:32], aad = bytes 0..66)

The plaintext is a 4-byte manifest length, the manifest (JSON: created_at, trust_domain, store,
store_schema, files as [name, size] pairs) and the files' bytes in manifest order. Nothing may
follow the ciphertext. The passphrase check only makes "wrong passphrase" distinguishable from
"damaged archive"; it is no easier to guess against than the GCM tag it sits next to.

File names come from a fixed set (``session.key``, ``nodegate.db``, ``ca/index.json`` and
``ca/ca-<16 hex>.key|pem``), so a crafted archive cannot write anywhere else. Restore checks the
whole archive (decryption, CA set, session keys, sqlite integrity and schema version) before it
writes the first byte.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import hmac
import json
import os
import re
import sqlite3
import stat
import struct
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO, ClassVar, Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from attest import ca
from bootstrap.config import ConfigError, Settings, load_settings
from bootstrap.files import create_exclusive, ensure_dir, read_limited, write_atomic
from bootstrap.store.model import StoreSchemaError
from bootstrap.store.sqlite import SCHEMA_VERSION, read_schema_version

__all__ = [
    "ArchiveCorrupt",
    "ArchiveTooLarge",
    "ArchiveTruncated",
    "BackupError",
    "BackupInfo",
    "BackupIoError",
    "NotAnArchive",
    "PASSPHRASE_ENV",
    "RestoreMismatch",
    "StateDirNotEmpty",
    "StateMissing",
    "StoreInUse",
    "TrailingData",
    "UnsupportedVersion",
    "WrongPassphrase",
    "add_backup_arguments",
    "add_restore_arguments",
    "backup",
    "cli_backup",
    "cli_restore",
    "read_passphrase",
    "restore",
]

MAGIC: Final = b"NGBACKUP"
FORMAT_VERSION: Final = 1
KDF_SCRYPT: Final = 1
AEAD_AES256GCM: Final = 1
CHECK_LABEL: Final = b"nodegate-backup-v1 passphrase check"
_PREFIX = struct.Struct(">8sH")  # magic, version: read first, so an unknown version is named
_HEADER_V1 = struct.Struct(">8sHBBBB16s16sB12sQ")
HEADER_SIZE: Final = _HEADER_V1.size  # 67

# scrypt cost of new archives: N = 2^17, r = 8 -> 128 MiB and about a second per backup or
# restore, which is what an interactive, rare operation can afford. (A module variable, not a
# constant, so tests can make archives quickly; restore reads the cost from the header.)
SCRYPT_LOG2_N = 17
SCRYPT_R = 8
SCRYPT_P = 1
# What restore accepts: a header could otherwise ask for gigabytes of memory.
_LOG2_N_RANGE = range(10, 21)
_MAX_R, _MAX_P = 16, 4
_MAX_SCRYPT_MEMORY = 512 * 1024 * 1024

MAX_STORE_BYTES: Final = 256 * 1024 * 1024  # the whole archive is held in memory once or twice
MAX_MANIFEST: Final = 64 * 1024
MAX_SESSION_KEY_FILE: Final = 64 * 1024  # what bootstrap.service.sessions.load_keys reads
MAX_PLAINTEXT: Final = MAX_STORE_BYTES + 8 * 1024 * 1024
MAX_ARCHIVE: Final = HEADER_SIZE + MAX_PLAINTEXT + 16
MIN_PASSPHRASE: Final = 12
MAX_PASSPHRASE: Final = 4096
PASSPHRASE_ENV: Final = "NODEGATE_BACKUP_PASSPHRASE"  # noqa: S105  (the variable's name)

SESSION_KEY: Final = "session.key"
STORE_DB: Final = "nodegate.db"
CA_INDEX: Final = f"ca/{ca.INDEX_FILE}"
_CA_FILE = re.compile(r"ca/(ca-[0-9a-f]{16})\.(key|pem)")
_STEM = re.compile(r"ca-[0-9a-f]{16}")
_KEY_LINE = re.compile(r"[0-9a-f]{64}")
_CA_LIMITS = {"key": ca.MAX_KEY_FILE, "pem": ca.MAX_CERT_FILE}


# -- errors -----------------------------------------------------------------------------------------


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


# -- what a backup holds ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BackupInfo:
    archive: Path
    created_at: datetime
    trust_domain: str
    store: str  # the store kind the archive was made with: "sqlite" or "kubernetes"
    store_included: bool  # False for the kubernetes store: its state lives in the cluster
    store_schema: int | None  # the sqlite file's schema version
    files: tuple[str, ...]  # archive names, e.g. "ca/index.json"
    authorities: int
    session_keys: int
    size: int  # bytes of the archive file

    @property
    def note(self) -> str:
        """One line for people about what the archive covers."""
        ca_part = f"CA ({self.authorities} {'authority' if self.authorities == 1 else 'authorities'})"
        keys = f"session key{'s' if self.session_keys != 1 else ''} ({self.session_keys})"
        if self.store_included:
            return f"{ca_part}, {keys}, sqlite store (schema version {self.store_schema})"
        return (
            f"{ca_part}, {keys}; NOT the store: with store: kubernetes the node bindings and used "
            "sessions are NodeAttestation objects in the cluster (back up etcd or those objects separately)"
        )


@dataclass(frozen=True, slots=True)
class _Content:
    manifest: dict[str, Any]
    files: dict[str, bytes]


# -- backup -------------------------------------------------------------------------------------------


def backup(settings: Settings, out: Path, *, passphrase: bytes, now: datetime) -> BackupInfo:
    """Write an encrypted archive of ``settings.state_dir`` to ``out`` (mode 0600, never over an
    existing file). Safe while the service runs: the sqlite store is copied with sqlite's online
    backup API, the CA files are read until the index is stable."""
    _check_passphrase(passphrase, creating=True)
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    state = settings.state_dir
    files = _read_ca(state / "ca", settings.trust_domain)
    session = _read_file(state / SESSION_KEY, MAX_SESSION_KEY_FILE, "the session key")
    keys = _session_keys(session, SESSION_KEY)
    files[SESSION_KEY] = session
    schema: int | None = None
    if settings.store == "sqlite":
        files[STORE_DB], schema = _copy_sqlite(state / STORE_DB)
    names = [SESSION_KEY, *sorted(n for n in files if n.startswith("ca/") and n != CA_INDEX), CA_INDEX]
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
    blob = _seal(_pack(manifest, [files[n] for n in names]), passphrase)
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
    )


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
                for ext, limit in _CA_LIMITS.items():
                    files[f"ca/{stem}.{ext}"] = read_limited(folder / f"{stem}.{ext}", limit)
        except FileNotFoundError:
            continue  # pruned by a rotation under us: read again
        except (OSError, ValueError) as exc:
            raise BackupIoError(f"cannot read the CA in {folder}: {exc}") from None
        if _read_file(folder / ca.INDEX_FILE, ca.MAX_INDEX_FILE, "the CA index") == index:
            _check_ca(files, trust_domain, f"the CA in {folder}", StateMissing, StateMissing)
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


def _check_ca(
    files: dict[str, bytes],
    trust_domain: str,
    what: str,
    error: type[BackupError],
    mismatch: type[BackupError],
) -> ca.CaSet:
    plain = {n.removeprefix("ca/"): data for n, data in files.items() if n.startswith("ca/")}
    try:
        cas = ca.CaSet.load(plain)
    except ca.CaStoreError as exc:
        raise error(f"{what}: {exc}") from None
    named = {f"{a.stem}.{ext}" for a in cas.authorities for ext in ("key", "pem")} | {ca.INDEX_FILE}
    if set(plain) != named:
        raise error(f"{what}: files the index does not name: {sorted(set(plain) - named)}")
    if cas.trust_domain != trust_domain:
        raise mismatch(f"{what} is for trust domain {cas.trust_domain}, the config says {trust_domain}")
    return cas


def _session_keys(data: bytes, what: str) -> int:
    """The number of keys in a session key file, checked as bootstrap.service.sessions.load_keys does."""
    try:
        lines = [ln.strip() for ln in data.decode("ascii").splitlines()]
    except UnicodeDecodeError:
        lines = ["?"]
    keys = [ln for ln in lines if ln and not ln.startswith("#")]
    if not keys or not all(_KEY_LINE.fullmatch(k) for k in keys):
        raise StateMissing(f"{what}: expected lines of 64 lowercase hex characters")
    return len(keys)


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
            _check_integrity(dst, f"the store {path}", StateMissing)
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


def _check_integrity(db: sqlite3.Connection, what: str, error: type[BackupError]) -> None:
    rows = db.execute("PRAGMA quick_check").fetchall()
    if rows != [("ok",)]:
        raise error(f"{what} fails sqlite's integrity check: {str(rows[0][0])[:200]}")


# -- container ----------------------------------------------------------------------------------------


def _check_passphrase(passphrase: object, *, creating: bool) -> bytes:
    if not isinstance(passphrase, bytes):
        raise TypeError("the passphrase is bytes")
    if not passphrase:
        raise BackupError("the passphrase is empty")
    if len(passphrase) > MAX_PASSPHRASE:
        raise BackupError(f"the passphrase is longer than {MAX_PASSPHRASE} bytes")
    if creating and len(passphrase) < MIN_PASSPHRASE:
        raise BackupError(f"use a passphrase of at least {MIN_PASSPHRASE} bytes")
    return passphrase


def _derive(passphrase: bytes, salt: bytes, log2_n: int, r: int, p: int) -> tuple[bytes, bytes]:
    km = Scrypt(salt=salt, length=64, n=1 << log2_n, r=r, p=p).derive(passphrase)
    check = hmac.new(km[32:], CHECK_LABEL, hashlib.sha256).digest()[:16]
    return km[:32], check


def _seal(plain: bytes, passphrase: bytes) -> bytes:
    salt, nonce = os.urandom(16), os.urandom(12)
    key, check = _derive(passphrase, salt, SCRYPT_LOG2_N, SCRYPT_R, SCRYPT_P)
    header = _HEADER_V1.pack(
        MAGIC,
        FORMAT_VERSION,
        KDF_SCRYPT,
        SCRYPT_LOG2_N,
        SCRYPT_R,
        SCRYPT_P,
        salt,
        check,
        AEAD_AES256GCM,
        nonce,
        len(plain) + 16,
    )
    return header + AESGCM(key).encrypt(nonce, plain, header)


def _read_exact(f: BinaryIO, n: int, what: str) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise ArchiveTruncated(f"the archive is truncated ({what}: {len(data)} of {n} bytes)")
    return data


def _open(archive: Path, passphrase: bytes) -> bytes:
    """The authenticated plaintext of ``archive``."""
    try:
        with archive.open("rb") as f:
            prefix = f.read(_PREFIX.size)
            if len(prefix) < len(MAGIC) or prefix[: len(MAGIC)] != MAGIC:
                raise NotAnArchive(f"{archive} is not a nodegate backup (no NGBACKUP header)")
            if len(prefix) < _PREFIX.size:
                raise ArchiveTruncated("the archive is truncated (in the header)")
            _, version = _PREFIX.unpack(prefix)
            if version != FORMAT_VERSION:
                raise UnsupportedVersion(
                    f"the archive has format version {version}; this nodegate reads version "
                    f"{FORMAT_VERSION} (restore it with the nodegate that wrote it, or a newer one)"
                )
            header = prefix + _read_exact(f, HEADER_SIZE - _PREFIX.size, "header")
            _, _, kdf, log2_n, r, p, salt, check, aead, nonce, length = _HEADER_V1.unpack(header)
            if kdf != KDF_SCRYPT or aead != AEAD_AES256GCM:
                raise UnsupportedVersion(f"the archive uses an unknown KDF ({kdf}) or cipher ({aead})")
            if log2_n not in _LOG2_N_RANGE or not 1 <= r <= _MAX_R or not 1 <= p <= _MAX_P:
                raise ArchiveCorrupt(
                    f"the archive's scrypt parameters are out of range (2^{log2_n}, {r}, {p})"
                )
            if 128 * r * (1 << log2_n) > _MAX_SCRYPT_MEMORY:
                raise ArchiveCorrupt("the archive's scrypt parameters need more memory than allowed")
            if not 16 < length <= MAX_PLAINTEXT + 16:
                raise ArchiveTooLarge(
                    f"the archive declares {length} bytes of content (at most {MAX_PLAINTEXT})"
                )
            sealed = _read_exact(f, length, "content")
            if f.read(1):
                raise TrailingData("the archive has bytes after its end; it was altered or concatenated")
    except FileNotFoundError:
        raise BackupIoError(f"{archive} does not exist") from None
    except IsADirectoryError:
        raise BackupIoError(f"{archive} is a directory") from None
    except OSError as exc:
        raise BackupIoError(f"cannot read {archive}: {exc.strerror or exc}") from None
    key, expected = _derive(passphrase, salt, log2_n, r, p)
    if not hmac.compare_digest(check, expected):
        raise WrongPassphrase("wrong passphrase (or the archive's header is damaged)")
    try:
        return AESGCM(key).decrypt(nonce, sealed, header)
    except InvalidTag:
        raise ArchiveCorrupt("the archive is damaged: its content does not authenticate") from None


def _pack(manifest: dict[str, Any], bodies: list[bytes]) -> bytes:
    doc = json.dumps(manifest, separators=(",", ":"), sort_keys=True).encode()
    return struct.pack(">I", len(doc)) + doc + b"".join(bodies)


def _unpack(plain: bytes) -> _Content:
    """Manifest and files; every name, size and count checked (the AEAD says who wrote it, not
    that the writer was sane)."""
    if len(plain) < 4:
        raise ArchiveCorrupt("the archive's content is too short")
    (n,) = struct.unpack_from(">I", plain)
    if n > MAX_MANIFEST or 4 + n > len(plain):
        raise ArchiveCorrupt("the archive's manifest is out of bounds")
    try:
        m = json.loads(plain[4 : 4 + n])
        if not isinstance(m, dict) or not isinstance(m.get("files"), list):
            raise TypeError  # noqa: TRY301  (one message for every shape error)
        entries = m["files"]
        listed = [(str(e[0]), e[1]) for e in entries if isinstance(e, list) and len(e) == 2]
        created = datetime.fromisoformat(str(m["created_at"]))
    except (ValueError, KeyError, TypeError, IndexError):
        raise ArchiveCorrupt("the archive's manifest is not understood") from None
    if (
        m.get("format") != FORMAT_VERSION
        or len(listed) != len(entries)
        or created.tzinfo is None
        or not isinstance(m.get("trust_domain"), str)
        or m.get("store") not in ("sqlite", "kubernetes")
        or not (m.get("store_schema") is None or type(m.get("store_schema")) is int)
    ):
        raise ArchiveCorrupt("the archive's manifest is not understood")
    files: dict[str, bytes] = {}
    offset = 4 + n
    for name, size in listed:
        if type(size) is not int or size < 0 or name in files:
            raise ArchiveCorrupt(f"the archive's manifest has a bad entry for {name[:80]!r}")
        limit = _limit(name)
        if size > limit:
            raise ArchiveCorrupt(f"{name} in the archive is larger than {limit} bytes")
        if offset + size > len(plain):
            raise ArchiveCorrupt("the archive's files run past its end")
        files[name] = plain[offset : offset + size]
        offset += size
    if offset != len(plain):
        raise ArchiveCorrupt("the archive has content its manifest does not list")
    required = {SESSION_KEY, CA_INDEX} | ({STORE_DB} if m["store"] == "sqlite" else set())
    if not required <= set(files) or (m["store"] == "kubernetes" and STORE_DB in files):
        raise ArchiveCorrupt(f"the archive must hold exactly {sorted(required)} plus the CA files")
    return _Content(m, files)


def _limit(name: str) -> int:
    """The size limit of an allowed archive name; anything else (``../x``, ``/etc/...``) is refused."""
    if name == SESSION_KEY:
        return MAX_SESSION_KEY_FILE
    if name == STORE_DB:
        return MAX_STORE_BYTES
    if name == CA_INDEX:
        return ca.MAX_INDEX_FILE
    m = _CA_FILE.fullmatch(name)
    if m is None:
        raise ArchiveCorrupt(f"the archive holds a file nodegate does not restore: {name[:80]!r}")
    return _CA_LIMITS[m.group(2)]


# -- restore ------------------------------------------------------------------------------------------


def restore(settings: Settings, archive: Path, *, passphrase: bytes, force: bool = False) -> BackupInfo:
    """Restore ``archive`` into ``settings.state_dir``: a missing or empty folder, or with
    ``force`` an existing one whose CA, session keys and store are replaced. Stop the service
    first. Everything is checked before anything is written."""
    _check_passphrase(passphrase, creating=False)
    try:
        size = archive.stat().st_size
    except OSError as exc:
        raise BackupIoError(f"cannot read {archive}: {exc.strerror or exc}") from None
    if size > MAX_ARCHIVE:
        raise ArchiveTooLarge(f"{archive} is {size} bytes; an archive is at most {MAX_ARCHIVE}")
    content = _unpack(_open(archive, passphrase))
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


def _verify(settings: Settings, archive: Path, size: int, content: _Content) -> BackupInfo:
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
    cas = _check_ca(files, settings.trust_domain, "the archive's CA", ArchiveCorrupt, RestoreMismatch)
    try:
        keys = _session_keys(files[SESSION_KEY], "the archive's session.key")
    except StateMissing as exc:
        raise ArchiveCorrupt(exc.detail) from None
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
    )


def _check_store(data: bytes) -> int | None:
    db = sqlite3.connect(":memory:", isolation_level=None)
    try:
        db.deserialize(data)
        _check_integrity(db, "the archive's store", ArchiveCorrupt)
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


# -- command line -------------------------------------------------------------------------------------


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
