"""What an archive holds, once decrypted: a manifest and the files it lists.

The plaintext is a 4-byte manifest length, the manifest (JSON: created_at, trust_domain, store,
store_schema, files as [name, size] pairs) and the files' bytes in manifest order.

File names come from a fixed set (``session.key``, ``nodegate.db``, ``ca/index.json``,
``ca/ca-<16 hex>.key|pem`` and, with disk keys, ``disk-keys.json``), so a crafted archive cannot
write anywhere else.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from attest import ca
from bootstrap.store.backup.errors import ArchiveCorrupt
from bootstrap.store.diskkeys import FILE_NAME as DISK_KEYS_FILE
from bootstrap.store.diskkeys import MAX_DOCUMENT as MAX_DISK_KEYS

__all__ = [
    "CA_INDEX",
    "CA_LIMITS",
    "DISK_KEYS",
    "MAX_DISK_KEYS",
    "FORMAT_VERSION",
    "MAX_MANIFEST",
    "MAX_PLAINTEXT",
    "MAX_SESSION_KEY_FILE",
    "MAX_STORE_BYTES",
    "SESSION_KEY",
    "STORE_DB",
    "BackupInfo",
    "Content",
    "pack",
    "unpack",
]

FORMAT_VERSION: Final = 1
MAX_STORE_BYTES: Final = 256 * 1024 * 1024  # the whole archive is held in memory once or twice
MAX_MANIFEST: Final = 64 * 1024
MAX_SESSION_KEY_FILE: Final = 64 * 1024  # what bootstrap.service.join.sessions.load_keys reads
MAX_PLAINTEXT: Final = MAX_STORE_BYTES + 8 * 1024 * 1024

SESSION_KEY: Final = "session.key"
STORE_DB: Final = "nodegate.db"
DISK_KEYS: Final = DISK_KEYS_FILE  # the disk-key secret (docs/disk-keys.md), when there is one
CA_INDEX: Final = f"ca/{ca.INDEX_FILE}"
CA_LIMITS: Final = {"key": ca.MAX_KEY_FILE, "pem": ca.MAX_CERT_FILE}
_CA_FILE = re.compile(r"ca/(ca-[0-9a-f]{16})\.(key|pem)")


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
    disk_keys: bool = False  # the disk-key secret is in it

    @property
    def note(self) -> str:
        """One line for people about what the archive covers."""
        ca_part = f"CA ({self.authorities} {'authority' if self.authorities == 1 else 'authorities'})"
        keys = f"session key{'s' if self.session_keys != 1 else ''} ({self.session_keys})"
        if self.disk_keys:
            keys += ", the disk-key secret"
        if self.store_included:
            return f"{ca_part}, {keys}, sqlite store (schema version {self.store_schema})"
        return (
            f"{ca_part}, {keys}; NOT the store: with store: kubernetes the node bindings and used "
            "sessions are NodeAttestation objects in the cluster (back up etcd or those objects separately)"
        )


@dataclass(frozen=True, slots=True)
class Content:
    manifest: dict[str, Any]
    files: dict[str, bytes]


def pack(manifest: dict[str, Any], bodies: list[bytes]) -> bytes:
    doc = json.dumps(manifest, separators=(",", ":"), sort_keys=True).encode()
    return struct.pack(">I", len(doc)) + doc + b"".join(bodies)


def unpack(plain: bytes) -> Content:
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
    return Content(m, files)


def _limit(name: str) -> int:
    """The size limit of an allowed archive name; anything else (``../x``, ``/etc/...``) is refused."""
    if name == SESSION_KEY:
        return MAX_SESSION_KEY_FILE
    if name == STORE_DB:
        return MAX_STORE_BYTES
    if name == DISK_KEYS:
        return MAX_DISK_KEYS
    if name == CA_INDEX:
        return ca.MAX_INDEX_FILE
    m = _CA_FILE.fullmatch(name)
    if m is None:
        raise ArchiveCorrupt(f"the archive holds a file nodegate does not restore: {name[:80]!r}")
    return CA_LIMITS[m.group(2)]
