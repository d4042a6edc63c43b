"""Schema versioning of the sqlite store: forward migrations at open, refusal of newer files."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from attest.tpm import Counters
from bootstrap.store import Attestation, NodeRecord, StoreSchemaError, StoreUnavailable
from bootstrap.store.sqlite import SCHEMA, SCHEMA_VERSION, Migration, SqliteStore, read_schema_version

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def att(node: str) -> Attestation:
    return Attestation(
        node_name=node,
        ek_sha256="c" * 64,
        ak_public=b"\x00\x10ak",
        spiffe_id=f"spiffe://example.org/node/{node}",
        counters=Counters(1, 0, 100),
        svid_serial="01",
        attested_at=T0,
        expires_at=T0 + timedelta(hours=1),
    )


async def v1_file(path: Path) -> None:
    """A file as this release writes it, holding one node."""
    store = await SqliteStore.open(path)
    try:
        await store.commit(
            att("gpu-1"),
            session_id="s1",
            session_expires_at=T0 + timedelta(minutes=1),
            action="join",
            check=lambda _r: None,
        )
    finally:
        await store.close()


def query(path: Path, sql: str) -> list[tuple[object, ...]]:
    db = sqlite3.connect(path)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


def version(path: Path) -> int | None:
    db = sqlite3.connect(path)
    try:
        return read_schema_version(db)
    finally:
        db.close()


def columns(path: Path, table: str) -> list[str]:
    return [str(row[1]) for row in query(path, f"PRAGMA table_info({table})")]


def recording(calls: list[int], n: int, step: Migration) -> Migration:
    def run(db: sqlite3.Connection) -> None:
        calls.append(n)
        step(db)

    return run


def v2(db: sqlite3.Connection) -> None:
    db.execute("ALTER TABLE nodes ADD COLUMN labels TEXT NOT NULL DEFAULT '{}'")


def v3(db: sqlite3.Connection) -> None:  # needs v2's column: only right when run after it
    db.execute("UPDATE nodes SET labels = json_object('pool', 'a100')")


async def test_new_file_is_created_at_the_current_version(tmp_path: Path) -> None:
    path = tmp_path / "nodegate.db"
    await (await SqliteStore.open(path)).close()
    assert version(path) == SCHEMA_VERSION == len(SCHEMA)


async def test_an_old_file_is_migrated_in_order_keeping_its_data(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "nodegate.db"
    await v1_file(path)
    calls: list[int] = []
    n = SCHEMA_VERSION
    steps = (*SCHEMA, recording(calls, n + 1, v2), recording(calls, n + 2, v3))
    with caplog.at_level(logging.INFO, logger="nodegate.store"):
        store = await SqliteStore.open(path, _migrations=steps)
    try:
        rec = await store.get("gpu-1")
        assert rec is not None
        assert rec.svid_serials == ("01",)
        assert await store.session_used("s1")
    finally:
        await store.close()
    assert calls == [n + 1, n + 2]
    assert version(path) == n + 2
    assert query(path, "SELECT labels FROM nodes") == [('{"pool":"a100"}',)]
    assert f"from version {n} to {n + 2}" in caplog.text

    store = await SqliteStore.open(path, _migrations=steps)  # already there: no step runs again
    await store.close()
    assert calls == [n + 1, n + 2]


async def test_a_failing_step_leaves_the_file_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "nodegate.db"
    await v1_file(path)

    def broken(db: sqlite3.Connection) -> None:
        db.execute("INSERT INTO nodes (node_name) VALUES ('x')")  # NOT NULL columns: IntegrityError

    n = SCHEMA_VERSION
    with pytest.raises(StoreSchemaError, match=f"version {n + 2} failed") as info:
        await SqliteStore.open(path, _migrations=(*SCHEMA, v2, broken))
    assert not isinstance(info.value, StoreUnavailable)  # retrying would not help
    assert f"unchanged at version {n}" in str(info.value)
    assert version(path) == n
    assert "labels" not in columns(path, "nodes")  # v2 ran, and was rolled back with the rest
    store = await SqliteStore.open(path, _migrations=(*SCHEMA, v2, v3))  # a fixed release goes on
    await store.close()
    assert version(path) == n + 2


async def test_a_step_must_not_commit(tmp_path: Path) -> None:
    path = tmp_path / "nodegate.db"
    await v1_file(path)

    def commits(db: sqlite3.Connection) -> None:
        v2(db)
        db.execute("COMMIT")

    with pytest.raises(StoreSchemaError, match="committed on its own"):
        await SqliteStore.open(path, _migrations=(*SCHEMA, commits))


async def test_a_newer_file_is_refused_before_any_step(tmp_path: Path) -> None:
    path = tmp_path / "nodegate.db"
    await v1_file(path)
    db = sqlite3.connect(path)
    db.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    db.commit()
    db.close()
    before = query(path, "SELECT type, name, sql FROM sqlite_master ORDER BY name")
    calls: list[int] = []
    with pytest.raises(StoreSchemaError, match=f"schema version {SCHEMA_VERSION + 1}") as info:
        await SqliteStore.open(path, _migrations=(recording(calls, 1, SCHEMA[0]),))
    assert "upgrade nodegate or restore a backup" in str(info.value)
    assert calls == []
    assert version(path) == SCHEMA_VERSION + 1
    assert query(path, "SELECT type, name, sql FROM sqlite_master ORDER BY name") == before
    assert query(path, "SELECT node_name FROM nodes") == [("gpu-1",)]


@pytest.mark.parametrize(
    "damage",
    [
        lambda db: db.execute("INSERT INTO schema_version VALUES (1)"),  # two rows
        lambda db: db.execute("UPDATE schema_version SET version = 'one'"),
        lambda db: db.execute("UPDATE schema_version SET version = 0"),
        lambda db: db.execute("UPDATE schema_version SET version = -4"),
        lambda db: db.execute("DELETE FROM schema_version"),
        lambda db: db.execute("DROP TABLE schema_version"),
    ],
)
async def test_a_damaged_version_is_refused(
    tmp_path: Path, damage: Callable[[sqlite3.Connection], object]
) -> None:
    path = tmp_path / "nodegate.db"
    await v1_file(path)
    db = sqlite3.connect(path)
    damage(db)
    db.commit()
    db.close()
    with pytest.raises(StoreSchemaError):
        await SqliteStore.open(path)
    assert query(path, "SELECT node_name FROM nodes") == [("gpu-1",)]


def test_reading_the_version_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    db = sqlite3.connect(path)
    try:
        assert read_schema_version(db) is None
        assert db.execute("SELECT count(*) FROM sqlite_master").fetchone() == (0,)
        db.execute("CREATE TABLE unrelated (x)")
        assert read_schema_version(db) is None  # not ours, but nothing of ours in the way either
    finally:
        db.close()


async def test_two_stores_opening_a_new_file_at_once(tmp_path: Path) -> None:
    path = tmp_path / "nodegate.db"
    calls: list[int] = []
    steps = (recording(calls, 1, SCHEMA[0]),)
    stores = await asyncio.gather(*(SqliteStore.open(path, _migrations=steps) for _ in range(4)))
    for store in stores:
        await store.close()
    assert calls == [1]  # one opener created the schema, the others found it
    assert query(path, "SELECT version FROM schema_version") == [(1,)]


async def test_a_file_of_the_first_release_gains_the_boot_columns(tmp_path: Path) -> None:
    """Schema 1 -> 2: the boot id and measured-boot class columns arrive empty, the data stays."""
    path = tmp_path / "nodegate.db"
    await (await SqliteStore.open(path, _migrations=SCHEMA[:1])).close()
    db = sqlite3.connect(path)
    db.execute(
        "INSERT INTO nodes (node_name, ek_sha256, ak_public, spiffe_id, counters, attested_at, expires_at, "
        "revoked, svid_serials) VALUES ('gpu-1', ?, x'0010', 'spiffe://example.org/node/gpu-1', "
        "'[1, 0, 100]', 0, 3600000000, 0, '[\"01\"]')",
        ("c" * 64,),
    )
    db.commit()
    db.close()
    store = await SqliteStore.open(path)
    try:
        rec = await store.get("gpu-1")
        assert rec is not None
        assert (rec.boot_id, rec.measured_boot_class) == (None, None)
        assert rec.svid_serials == ("01",)
        assert rec.counters == Counters(1, 0, 100)
    finally:
        await store.close()
    assert {"boot_id", "measured_boot_class"} <= set(columns(path, "nodes"))
    assert version(path) == SCHEMA_VERSION


async def migrated_row(tmp_path: Path, version_before: int, extra: dict[str, str]) -> NodeRecord:
    """A file at ``version_before`` holding one node row (with ``extra`` columns as SQL literals),
    opened by this nodegate (migrated to the current schema): that node's record."""
    path = tmp_path / "nodegate.db"
    await (await SqliteStore.open(path, _migrations=SCHEMA[:version_before])).close()
    names = ", ".join(extra)
    values = ", ".join(extra.values())
    db = sqlite3.connect(path)
    db.execute(
        "INSERT INTO nodes (node_name, ek_sha256, ak_public, spiffe_id, counters, attested_at, expires_at, "  # noqa: S608  (test literals)
        f"revoked, svid_serials, {names}) VALUES ('gpu-1', ?, x'0010', 'spiffe://example.org/node/gpu-1', "
        f"'[1, 0, 100]', 0, 3600000000, 0, '[\"01\"]', {values})",
        ("c" * 64,),
    )
    db.commit()
    db.close()
    store = await SqliteStore.open(path)
    try:
        rec = await store.get("gpu-1")
    finally:
        await store.close()
    assert rec is not None
    assert (rec.ek_sha256, rec.svid_serials) == ("c" * 64, ("01",))
    assert version(path) == SCHEMA_VERSION
    return rec


async def test_a_schema_3_file_gains_the_node_uid_column(tmp_path: Path) -> None:
    """Schema 3 -> 4: the Node uid column arrives empty (NULL: not recorded), the data stays."""
    rec = await migrated_row(tmp_path, 3, {"boot_id": "'ab-1'"})
    assert (rec.node_uid, rec.boot_id) == (None, "ab-1")
    assert "node_uid" in columns(tmp_path / "nodegate.db", "nodes")


async def test_a_schema_4_file_gains_the_spire_columns(tmp_path: Path) -> None:
    """Schema 4 -> 5: the x509pop attestation and refused-at columns arrive empty (NULL: no x509pop
    certificate recorded, no refusal), the data stays, and a node of such a file is not refused."""
    rec = await migrated_row(tmp_path, 4, {"boot_id": "'ab-1'", "node_uid": "'u-1'"})
    assert (rec.x509pop_attestation, rec.refused_at) == (None, None)
    assert (rec.boot_id, rec.node_uid) == ("ab-1", "u-1")
    assert {"x509pop_attestation", "refused_at"} <= set(columns(tmp_path / "nodegate.db", "nodes"))


async def test_a_schema_5_file_gains_boot_records_and_the_dbx_table(tmp_path: Path) -> None:
    """Schema 5 -> 6 (issue 43): the boot record and quarantine columns arrive empty (NULL: none
    kept yet) and the dbx table empty; the node's record reads back unchanged."""
    rec = await migrated_row(tmp_path, 5, {"boot_id": "'ab-1'", "node_uid": "'u-1'"})
    assert (rec.boot_record, rec.quarantine, rec.node_uid, rec.boot_id) == (None, None, "u-1", "ab-1")
    assert {"boot_record", "quarantine"} <= set(columns(tmp_path / "nodegate.db", "nodes"))
    store = await SqliteStore.open(tmp_path / "nodegate.db")
    try:
        assert await store.dbx_digests(["d" * 64]) == {}
    finally:
        await store.close()
    assert SCHEMA_VERSION == 6
