"""How a node record sits in the sqlite file: the ``nodes`` row (times as integer microseconds,
counters and serials as JSON) and the ``meta`` facts, read back strictly: a row that does not
read back as written is damaged (NodeRecordDamaged), never half-trusted."""

from __future__ import annotations

import json
import os
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

from attest.bootrecord.model import BootRecord
from bootstrap.problems import NodeNameConflict, NodeRecordDamaged
from bootstrap.store.model import (
    AuditEntry,
    NodeRecord,
    check_boot_id,
    check_counters,
    check_ek,
    check_measured_boot_class,
    check_node_uid,
    check_x509pop_attestation,
    quarantine_of,
)

__all__ = [
    "COLUMNS",
    "create_private",
    "from_us",
    "put_dbx",
    "put_record",
    "read_anchors",
    "read_audit",
    "read_dbx",
    "record_of",
    "to_us",
]

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_US: Final = timedelta(microseconds=1)
COLUMNS: Final = (
    "node_name, ek_sha256, ak_public, spiffe_id, counters, attested_at, expires_at, revoked, "
    "svid_serials, boot_id, measured_boot_class, node_uid, x509pop_attestation, refused_at, "
    "boot_record, quarantine"
)


def to_us(dt: datetime) -> int:
    """Times are stored as integer microseconds since the epoch: exact, and they sort."""
    return (dt - _EPOCH) // _US


def from_us(value: int | None) -> datetime | None:
    return None if value is None else _EPOCH + value * _US


def create_private(path: Path) -> None:
    """The file exists with mode 0600 before sqlite writes a byte (sqlite gives the -wal and -shm
    files the same mode as the database)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def record_of(row: tuple[Any, ...]) -> NodeRecord:
    """The record in ``row`` (COLUMNS); NodeRecordDamaged when a column does not read back."""
    (
        name,
        ek,
        ak,
        spiffe,
        counters,
        attested,
        expires,
        revoked,
        serials,
        boot_id,
        mb_class,
        uid,
        pop,
        refused,
        boot,
        held,
    ) = row
    try:
        parsed = None if counters is None else check_counters(tuple(json.loads(counters)))
        history = json.loads(serials)
        if not isinstance(history, list) or not all(isinstance(x, str) for x in history):
            raise ValueError("svid_serials is not a list of serials")  # noqa: TRY301  (folded below)
        for number in (attested, expires, refused):
            if number is not None and not isinstance(number, int):
                raise ValueError("a time is not an integer")  # noqa: TRY301
        return NodeRecord(
            node_name=name,
            ek_sha256=check_ek(ek),
            ak_public=bytes(ak),
            spiffe_id=str(spiffe),
            counters=parsed,
            attested_at=from_us(attested),
            expires_at=from_us(expires),
            revoked=bool(revoked),
            svid_serials=tuple(history),
            boot_id=check_boot_id(boot_id),
            measured_boot_class=check_measured_boot_class(mb_class),
            node_uid=check_node_uid(uid),
            x509pop_attestation=check_x509pop_attestation(pop),
            refused_at=from_us(refused),
            boot_record=None if boot is None else BootRecord.model_validate_json(boot),
            quarantine=None if held is None else quarantine_of(json.loads(held)),
        )
    except (ValueError, TypeError, OverflowError) as exc:
        raise NodeRecordDamaged(
            f"the stored record of node {name} is damaged ({exc}); fix or forget it"
        ) from None


def put_record(db: sqlite3.Connection, rec: NodeRecord) -> None:
    # commit's records always carry these
    assert rec.counters is not None  # noqa: S101
    assert rec.attested_at is not None  # noqa: S101
    assert rec.expires_at is not None  # noqa: S101
    try:
        db.execute(
            """INSERT INTO nodes (node_name, ek_sha256, ak_public, spiffe_id, counters, attested_at,
                                  expires_at, revoked, svid_serials, boot_id, measured_boot_class,
                                  node_uid, x509pop_attestation, refused_at, boot_record, quarantine)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
               ON CONFLICT (node_name) DO UPDATE SET
                 ek_sha256 = excluded.ek_sha256, ak_public = excluded.ak_public,
                 spiffe_id = excluded.spiffe_id, counters = excluded.counters,
                 attested_at = excluded.attested_at, expires_at = excluded.expires_at,
                 revoked = excluded.revoked, svid_serials = excluded.svid_serials,
                 boot_id = excluded.boot_id, measured_boot_class = excluded.measured_boot_class,
                 node_uid = excluded.node_uid, x509pop_attestation = excluded.x509pop_attestation,
                 refused_at = excluded.refused_at, boot_record = excluded.boot_record,
                 quarantine = excluded.quarantine""",
            (
                rec.node_name,
                rec.ek_sha256,
                rec.ak_public,
                rec.spiffe_id,
                json.dumps(list(rec.counters)),
                to_us(rec.attested_at),
                to_us(rec.expires_at),
                int(rec.revoked),
                json.dumps(list(rec.svid_serials)),
                rec.boot_id,
                rec.measured_boot_class,
                rec.node_uid,
                rec.x509pop_attestation,
                None if rec.refused_at is None else to_us(rec.refused_at),
                rec.boot_record.to_json() if rec.boot_record is not None else None,
                json.dumps(rec.quarantine.to_json()) if rec.quarantine is not None else None,
            ),
        )
    except sqlite3.IntegrityError:  # the UNIQUE(ek_sha256) backstop
        raise NodeNameConflict("this TPM is bound to another node name") from None


def put_dbx(db: sqlite3.Connection, dbx: tuple[tuple[str, bytes], ...]) -> None:
    """A dbx's digests by its identity, once: the identity is the SHA-256 of the value they
    came from, so a second writer writes the same bytes."""
    db.executemany("INSERT OR IGNORE INTO dbx (sha256, digests) VALUES (?, ?)", dbx)


def read_dbx(db: sqlite3.Connection, wanted: list[str]) -> dict[str, bytes]:
    """The digests of the dbx identities in ``wanted`` that are kept (the others left out)."""
    out: dict[str, bytes] = {}
    for i in range(0, len(wanted), 500):  # sqlite's bound parameters per statement
        chunk = wanted[i : i + 500]
        marks = ",".join("?" * len(chunk))
        sql = f"SELECT sha256, digests FROM dbx WHERE sha256 IN ({marks})"  # noqa: S608  (placeholders)
        out.update((str(k), bytes(v)) for k, v in db.execute(sql, chunk))
    return out


def read_audit(db: sqlite3.Connection, node_name: str | None, limit: int) -> list[AuditEntry]:
    """The newest ``limit`` audit entries, of ``node_name`` or of every node, newest first."""
    cols = "at, node_name, action, actor, code, detail"
    if node_name is None:
        sql, args = f"SELECT {cols} FROM audit ORDER BY id DESC LIMIT ?", (limit,)  # noqa: S608
    else:
        sql = f"SELECT {cols} FROM audit WHERE node_name = ? ORDER BY id DESC LIMIT ?"  # noqa: S608
        args = (node_name, limit)  # type: ignore[assignment]
    out = []
    for at, node, action, actor, code, detail in db.execute(sql, args):
        when = from_us(at)
        assert when is not None  # noqa: S101  (NOT NULL column)
        out.append(AuditEntry(when, node, action, actor, code, detail))
    return out


def read_anchors(db: sqlite3.Connection) -> list[str]:
    """The remembered CA certificates (oldest first); unreadable reads as none (the next start
    writes them anew)."""
    row = db.execute("SELECT value FROM meta WHERE key = 'trust_anchors'").fetchone()
    try:
        value = json.loads(row[0]) if row else []
    except ValueError:
        return []
    return [a for a in value if isinstance(a, str)] if isinstance(value, list) else []
