"""What only the sqlite store has: its file (mode, WAL, schema version), sqlite's locks, the worker
thread and group commit, the audit table's cap. The Store contract itself is test_contract.py,
for both backends; schema migrations are test_store_schema.py."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import stat
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bootstrap.problems import NodeRevoked
from bootstrap.store import NodeRecord, StoreSchemaError, StoreUnavailable, open_store
from bootstrap.store.sqlite import SCHEMA, SCHEMA_VERSION, SqliteStore
from tests.store.common import T0, Ticker, allow, commit, make_att


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = await SqliteStore.open(tmp_path / "nodegate.db", clock=Ticker())
    yield s
    await s.close()


async def test_open_store_keeps_the_file_in_state_dir(tmp_path: Path) -> None:
    store = await open_store("sqlite", state_dir=tmp_path / "state", kube=None)
    assert isinstance(store, SqliteStore)
    assert store.path == tmp_path / "state" / "nodegate.db"
    rec = await commit(store, make_att(), "s1")
    await store.close()

    again = await open_store("sqlite", state_dir=tmp_path / "state", kube=None)
    try:
        assert await again.get("gpu-1") == rec
        assert await again.session_used("s1")
    finally:
        await again.close()


async def test_open_store_kinds(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs a cluster"):
        await open_store("kubernetes", state_dir=tmp_path, kube=None)
    with pytest.raises(ValueError, match="unknown store"):
        await open_store("etcd", state_dir=tmp_path, kube=None)


async def test_check_runs_off_the_event_loop_thread(store: SqliteStore) -> None:
    threads: list[threading.Thread] = []
    await commit(store, make_att(), "s1", check=lambda _e: threads.append(threading.current_thread()))
    assert threads
    assert threads[0] is not threading.current_thread()


async def test_prune_caps_the_audit_table(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "nodegate.db", audit_rows=3)
    try:
        for i in range(5):
            await store.record_refusal("gpu-1", "proof_invalid", f"try {i}")
        await store.prune(T0)
        assert [e.detail for e in await store.audit()] == ["try 4", "try 3", "try 2"]
    finally:
        await store.close()


# -- the file ---------------------------------------------------------------------------------


async def test_file_is_private_even_with_a_loose_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        store = await SqliteStore.open(tmp_path / "state" / "nodegate.db")
        await commit(store, make_att(), "s1")
    finally:
        os.umask(old)
    try:
        for name in ("nodegate.db", "nodegate.db-wal", "nodegate.db-shm"):  # all exist while open
            path = tmp_path / "state" / name
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, name
        assert stat.S_IMODE((tmp_path / "state").stat().st_mode) == 0o700
    finally:
        await store.close()


async def test_wal_and_schema_version_recorded(tmp_path: Path) -> None:
    path = tmp_path / "nodegate.db"
    await (await SqliteStore.open(path)).close()
    db = sqlite3.connect(path)
    try:
        assert db.execute("SELECT version FROM schema_version").fetchall() == [(len(SCHEMA),)]
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        db.close()


async def test_future_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "nodegate.db"
    await (await SqliteStore.open(path)).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE schema_version SET version = 99")
    db.commit()
    db.close()
    with pytest.raises(StoreSchemaError, match="schema version 99"):
        await SqliteStore.open(path)


async def test_foreign_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "nodegate.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE nodes (x)")
    db.commit()
    db.close()
    with pytest.raises(StoreSchemaError, match="no schema version"):
        await SqliteStore.open(path)


async def test_next_schema_version_is_one_function(tmp_path: Path) -> None:
    path = tmp_path / "nodegate.db"
    store = await SqliteStore.open(path)
    await commit(store, make_att(), "s1")
    await store.close()

    def v2(db: sqlite3.Connection) -> None:
        db.execute("ALTER TABLE nodes ADD COLUMN labels TEXT NOT NULL DEFAULT '{}'")

    store = await SqliteStore.open(path, _migrations=(*SCHEMA, v2))
    try:
        assert await store.get("gpu-1") is not None
    finally:
        await store.close()
    db = sqlite3.connect(path)
    try:
        assert db.execute("SELECT version FROM schema_version").fetchone() == (SCHEMA_VERSION + 1,)
        assert db.execute("SELECT labels FROM nodes").fetchone() == ("{}",)
    finally:
        db.close()
    with pytest.raises(StoreSchemaError):  # and the old code now refuses the file
        await SqliteStore.open(path)


async def test_locked_database_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "nodegate.db"
    store = await SqliteStore.open(path, busy_timeout=0.01)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreUnavailable, match="locked"):
            await commit(store, make_att(), "s1")
        other.execute("ROLLBACK")
        assert (await commit(store, make_att(), "s1")).node_name == "gpu-1"
    finally:
        other.close()
        await store.close()


async def test_closed_store_is_unavailable(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "nodegate.db")
    await store.close()
    await store.close()  # twice is fine
    with pytest.raises(StoreUnavailable):
        await store.get("gpu-1")


async def test_group_commit_rolls_back_only_the_failing_job(store: SqliteStore) -> None:
    """Commits that arrive together share one transaction; one whose check fails leaves no trace
    and the others land."""
    flushes: list[int] = []
    original = store._flush

    def counting(loop: asyncio.AbstractEventLoop) -> None:
        flushes.append(len(store._pending))
        original(loop)

    store._flush = counting  # type: ignore[method-assign]

    def refuse(_existing: NodeRecord | None) -> None:
        raise NodeRevoked("no")

    eks = [f"{i:064x}" for i in range(1, 11)]
    results = await asyncio.gather(
        *(
            commit(store, make_att(f"g-{i}", eks[i]), f"s{i}", check=refuse if i == 4 else allow)
            for i in range(10)
        ),
        return_exceptions=True,
    )
    assert [type(r).__name__ for r in results].count("NodeRevoked") == 1
    assert isinstance(results[4], NodeRevoked)
    assert max(flushes) > 1  # they really were grouped
    assert await store.get("g-4") is None
    assert not await store.session_used("s4")
    assert sorted(r.node_name for r in await store.list_nodes()) == sorted(
        f"g-{i}" for i in range(10) if i != 4
    )
    assert {a.node_name for a in await store.audit()} == {f"g-{i}" for i in range(10) if i != 4}
