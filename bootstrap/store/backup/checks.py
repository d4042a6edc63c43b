"""What a usable state looks like, checked the same way when a backup reads it and when a restore
is about to write it: the CA set, the session key file, the sqlite file and the disk-key secret."""

from __future__ import annotations

import re
import sqlite3

from attest import ca
from bootstrap.store.backup.errors import BackupError, StateMissing
from bootstrap.store.diskkeys import VaultDamaged, VaultDoc, parse_document

__all__ = ["check_ca", "check_disk_keys", "check_integrity", "count_session_keys"]

_KEY_LINE = re.compile(r"[0-9a-f]{64}")


def check_ca(
    files: dict[str, bytes],
    trust_domain: str,
    what: str,
    error: type[BackupError],
    mismatch: type[BackupError],
) -> ca.CaSet:
    """The CA set in ``files`` (archive names): ``error`` when it is damaged or holds files its
    index does not name, ``mismatch`` when it belongs to another trust domain."""
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


def count_session_keys(data: bytes, what: str) -> int:
    """The number of keys in a session key file, checked as bootstrap.service.join.sessions.load_keys does."""
    try:
        lines = [ln.strip() for ln in data.decode("ascii").splitlines()]
    except UnicodeDecodeError:
        lines = ["?"]
    keys = [ln for ln in lines if ln and not ln.startswith("#")]
    if not keys or not all(_KEY_LINE.fullmatch(k) for k in keys):
        raise StateMissing(f"{what}: expected lines of 64 lowercase hex characters")
    return len(keys)


def check_integrity(db: sqlite3.Connection, what: str, error: type[BackupError]) -> None:
    rows = db.execute("PRAGMA quick_check").fetchall()
    if rows != [("ok",)]:
        raise error(f"{what} fails sqlite's integrity check: {str(rows[0][0])[:200]}")


def check_disk_keys(data: bytes, what: str, error: type[BackupError]) -> VaultDoc:
    """The disk-key document in ``data`` (docs/disk-keys.md); ``error`` when it is not one."""
    try:
        return parse_document(data, what)
    except VaultDamaged as exc:
        raise error(str(exc)) from None
