"""The sqlite file's schema and its forward migrations.

``SCHEMA[i]`` migrates version ``i`` to version ``i + 1``; the ``schema_version`` table records the
version a file is at. A file written by a newer nodegate is refused, never touched.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Callable
from typing import Final

from bootstrap.store.model import StoreSchemaError

__all__ = ["SCHEMA", "SCHEMA_VERSION", "Migration", "migrate", "read_schema_version"]

log = logging.getLogger("nodegate.store")

# Upgrading nodegate never needs a manual step: open() brings an older file forward inside one
# transaction. To change the schema, append one function and never edit a released one. A step
# runs inside that transaction, so it must not commit (no executescript, no COMMIT, no VACUUM);
# sqlite's DDL is transactional, so a failing step leaves the file exactly as it was.


def _v1(db: sqlite3.Connection) -> None:
    db.execute(
        """CREATE TABLE nodes (
            node_name TEXT PRIMARY KEY,
            ek_sha256 TEXT NOT NULL UNIQUE,
            ak_public BLOB NOT NULL,
            spiffe_id TEXT NOT NULL,
            counters TEXT,
            attested_at INTEGER,
            expires_at INTEGER,
            revoked INTEGER NOT NULL DEFAULT 0,
            svid_serials TEXT NOT NULL DEFAULT '[]'
        )"""
    )
    db.execute("CREATE TABLE used_sessions (id TEXT PRIMARY KEY, expires_at INTEGER NOT NULL)")
    db.execute("CREATE INDEX used_sessions_expiry ON used_sessions (expires_at)")
    db.execute(
        """CREATE TABLE audit (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            at INTEGER NOT NULL,
            node_name TEXT NOT NULL,
            action TEXT NOT NULL,
            actor TEXT NOT NULL,
            code TEXT NOT NULL,
            detail TEXT NOT NULL
        )"""
    )
    db.execute("CREATE INDEX audit_by_node ON audit (node_name, id)")


def _v2(db: sqlite3.Connection) -> None:
    """What a join or renewal reports beside the quote: the kernel boot id and the measured-boot
    class that matched (NULL for records written before, and when not reported)."""
    db.execute("ALTER TABLE nodes ADD COLUMN boot_id TEXT")
    db.execute("ALTER TABLE nodes ADD COLUMN measured_boot_class TEXT")


def _v3(db: sqlite3.Connection) -> None:
    """Facts about the store as a whole: the CA certificates its SVIDs were issued under."""
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")


def _v4(db: sqlite3.Connection) -> None:
    """The uid of the Node object nodegate labelled at the last join or renewal (NULL for records
    written before, and where no Node was written)."""
    db.execute("ALTER TABLE nodes ADD COLUMN node_uid TEXT")


def _v5(db: sqlite3.Connection) -> None:
    """SPIRE (docs/spire.md): the attestation fact of the node's x509pop certificates, and when
    its evidence was last refused since its last join or renewal (NULL: never, or not recorded)."""
    db.execute("ALTER TABLE nodes ADD COLUMN x509pop_attestation TEXT")
    db.execute("ALTER TABLE nodes ADD COLUMN refused_at INTEGER")


def _v6(db: sqlite3.Connection) -> None:
    """Boot records (issue 43): the facts of the last accepted attestation, as JSON (NULL for
    records written before), each distinct dbx's image digests, kept once by its identity, and an
    admin's quarantine of the node (JSON; NULL: none)."""
    db.execute("ALTER TABLE nodes ADD COLUMN boot_record TEXT")
    db.execute("ALTER TABLE nodes ADD COLUMN quarantine TEXT")
    db.execute("CREATE TABLE dbx (sha256 TEXT PRIMARY KEY, digests BLOB NOT NULL)")


Migration = Callable[[sqlite3.Connection], None]
SCHEMA: Final[tuple[Migration, ...]] = (_v1, _v2, _v3, _v4, _v5, _v6)
SCHEMA_VERSION: Final = len(SCHEMA)


def read_schema_version(db: sqlite3.Connection) -> int | None:
    """The schema version a nodegate file records, without changing anything (None: no nodegate
    tables yet). Refuses files that are damaged or not nodegate's; a version newer than this code
    is returned as is (``migrate`` refuses it; a backup may still copy it)."""
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    rows = db.execute("SELECT version FROM schema_version").fetchall() if "schema_version" in tables else []
    if len(rows) > 1 or (rows and (not isinstance(rows[0][0], int) or rows[0][0] < 1)):
        raise StoreSchemaError("the schema_version table is damaged")
    if rows:
        return int(rows[0][0])
    if "nodes" in tables:
        raise StoreSchemaError("the database has nodegate tables but no schema version")
    return None


def _found_version(db: sqlite3.Connection, latest: int) -> int | None:
    """The file's schema version (None: a new file); refuses what this code must not touch."""
    found = read_schema_version(db)
    if found is not None and found > latest:
        # A downgrade: the newer code may have moved data this code would misread or overwrite.
        raise StoreSchemaError(
            f"the database has schema version {found}, which this nodegate does not understand "
            f"(it knows 1..{latest}); upgrade nodegate or restore a backup"
        )
    return found


def _apply(db: sqlite3.Connection, migrations: tuple[Migration, ...], found: int) -> None:
    for version in range(found + 1, len(migrations) + 1):
        try:
            migrations[version - 1](db)
        except sqlite3.Error as exc:
            # not StoreUnavailable: retrying will not help, the file or the step is at fault
            raise StoreSchemaError(
                f"migrating the store to schema version {version} failed ({exc}); "
                f"the file is unchanged at version {found}"
            ) from None
        if not db.in_transaction:
            raise StoreSchemaError(
                f"schema step {version} committed on its own; the file may be half-migrated"
            )


def migrate(db: sqlite3.Connection, migrations: tuple[Migration, ...]) -> int:
    """Bring the file up to ``len(migrations)`` in one transaction; returns the version found
    (0 for a new file). A step that fails raises StoreSchemaError and leaves the file unchanged."""
    latest = len(migrations)
    db.execute("BEGIN IMMEDIATE")  # two replicas opening one new file: the second sees the first's work
    try:
        found = _found_version(db, latest)
        if found is None:
            db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        _apply(db, migrations, found or 0)
        if found is None:
            db.execute("INSERT INTO schema_version (version) VALUES (?)", (latest,))
        elif found != latest:
            db.execute("UPDATE schema_version SET version = ?", (latest,))
        db.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):  # the original error is the one worth reporting
            db.execute("ROLLBACK")
        raise
    if found and found != latest:
        log.info("store schema migrated from version %d to %d", found, latest)
    return found or 0
