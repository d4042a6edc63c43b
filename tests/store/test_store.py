"""bootstrap/store.py contract and the sqlite backend (bootstrap/store_sqlite.py)."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import stat
import tempfile
import threading
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attest.errors import CounterRegressed
from attest.tpm import Counters
from bootstrap.problems import NodeNameConflict, NodeRevoked, SessionReused
from bootstrap.store import (
    MAX_SERIALS,
    Attestation,
    NodeRecord,
    StoreSchemaError,
    StoreUnavailable,
    open_store,
)
from bootstrap.store.sqlite import SCHEMA, SqliteStore

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
C0 = Counters(1, 0, 100)
EK_A = "a" * 64
EK_B = "b" * 64


def make_att(
    node: str = "gpu-1",
    ek: str = EK_A,
    *,
    serial: str = "01",
    counters: Counters = C0,
    at: datetime = T0,
) -> Attestation:
    return Attestation(
        node_name=node,
        ek_sha256=ek,
        ak_public=b"\x00\x10ak-" + node.encode(),
        spiffe_id=f"spiffe://example.org/node/{node}",
        counters=counters,
        svid_serial=serial,
        attested_at=at,
        expires_at=at + timedelta(hours=1),
    )


def allow(_existing: NodeRecord | None) -> None:
    return None


class Ticker:
    """A clock for audit timestamps that moves one second per reading."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now


async def commit(
    store: SqliteStore, att: Attestation, session: str, action: str = "join", check: object = allow
) -> NodeRecord:
    return await store.commit(
        att,
        session_id=session,
        session_expires_at=att.attested_at + timedelta(seconds=60),
        action=action,
        check=check,  # type: ignore[arg-type]
    )


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = await SqliteStore.open(tmp_path / "nodegate.db", clock=Ticker())
    yield s
    await s.close()


# -- records, restart -----------------------------------------------------------------------------


async def test_commit_round_trip_and_restart(tmp_path: Path) -> None:
    store = await open_store("sqlite", state_dir=tmp_path / "state", kube=None)
    rec = await store.commit(
        make_att(), session_id="s1", session_expires_at=T0 + timedelta(minutes=1), action="join", check=allow
    )
    assert rec == NodeRecord(
        node_name="gpu-1",
        ek_sha256=EK_A,
        ak_public=b"\x00\x10ak-gpu-1",
        spiffe_id="spiffe://example.org/node/gpu-1",
        counters=Counters(1, 0, 100),
        attested_at=T0,
        expires_at=T0 + timedelta(hours=1),
        revoked=False,
        svid_serials=("01",),
    )
    await store.close()

    again = await open_store("sqlite", state_dir=tmp_path / "state", kube=None)
    try:
        got = await again.get("gpu-1")
        assert got == rec
        assert got is not None
        assert got.attested_at is not None
        assert got.attested_at.tzinfo is not None
        assert await again.list_nodes() == [rec]
        assert await again.session_used("s1")
        assert not await again.session_used("s2")
        with pytest.raises(SessionReused):
            await again.commit(
                make_att(serial="02"),
                session_id="s1",
                session_expires_at=T0 + timedelta(minutes=1),
                action="renew",
                check=allow,
            )
        assert [e.action for e in await again.audit()] == ["join"]
    finally:
        await again.close()


async def test_renewal_keeps_revoked_flag_and_appends_serials(store: SqliteStore) -> None:
    for i in range(MAX_SERIALS + 3):
        await commit(store, make_att(serial=f"{i:x}", counters=Counters(1, 0, 100 + i)), f"s{i}", "renew")
    rec = await store.get("gpu-1")
    assert rec is not None
    assert rec.svid_serials == tuple(f"{i:x}" for i in range(3, MAX_SERIALS + 3))
    assert rec.counters == Counters(1, 0, 100 + MAX_SERIALS + 2)
    await store.revoke("gpu-1", actor="admin@example.org", reason="stolen")
    rec = await commit(store, make_att(serial="ff"), "s-after")
    assert rec.revoked  # only an admin clears it


async def test_time_zones_are_normalised_to_utc(store: SqliteStore) -> None:
    plus2 = T0.astimezone(timezone(timedelta(hours=2)))
    rec = await commit(store, make_att(at=plus2), "s1")
    got = await store.get("gpu-1")
    assert got == rec
    assert got is not None
    assert got.attested_at == T0
    assert got.attested_at is not None
    assert got.attested_at.utcoffset() == timedelta(0)


# -- the atomic commit ----------------------------------------------------------------------------


async def test_one_session_committed_concurrently_wins_once(store: SqliteStore) -> None:
    results = await asyncio.gather(
        *(commit(store, make_att(serial=f"{i:02x}"), "same-session") for i in range(8)),
        return_exceptions=True,
    )
    wins = [r for r in results if isinstance(r, NodeRecord)]
    assert len(wins) == 1
    assert all(isinstance(r, SessionReused) for r in results if r not in wins)
    rec = await store.get("gpu-1")
    assert rec is not None
    assert rec.svid_serials == wins[0].svid_serials
    assert len(await store.audit("gpu-1")) == 1


async def test_two_stores_on_one_file_agree_on_single_use(tmp_path: Path) -> None:
    a = await SqliteStore.open(tmp_path / "nodegate.db")
    b = await SqliteStore.open(tmp_path / "nodegate.db")
    try:
        results = await asyncio.gather(
            *(commit(s, make_att(serial=f"{i:02x}"), "shared") for i, s in enumerate([a, b] * 4)),
            return_exceptions=True,
        )
        assert sum(isinstance(r, NodeRecord) for r in results) == 1
        assert sum(isinstance(r, SessionReused) for r in results) == 7
        assert await a.get("gpu-1") == await b.get("gpu-1")
        assert await b.session_used("shared")
    finally:
        await a.close()
        await b.close()


async def test_concurrent_commits_for_one_node_see_each_other(tmp_path: Path) -> None:
    """Each check() sees the record the previous commit wrote (here: counters never go back)."""
    a = await SqliteStore.open(tmp_path / "nodegate.db")
    b = await SqliteStore.open(tmp_path / "nodegate.db")
    seen: list[Counters | None] = []

    def monotonic(c: Counters) -> object:
        def check(existing: NodeRecord | None) -> None:
            seen.append(existing.counters if existing else None)
            if existing and existing.counters and existing.counters > c:
                raise CounterRegressed("counters went back")

        return check

    try:
        atts = [make_att(serial=f"{i:02x}", counters=Counters(1, 0, 100 + i)) for i in range(10)]
        results = await asyncio.gather(
            *(
                commit([a, b][i % 2], att, f"s{i}", "renew", monotonic(att.counters))
                for i, att in enumerate(atts)
            ),
            return_exceptions=True,
        )
        won = [r for r in results if isinstance(r, NodeRecord)]
        assert all(isinstance(r, NodeRecord | CounterRegressed) for r in results)
        final = await a.get("gpu-1")
        assert final is not None
        assert final.counters == max(r.counters for r in won if r.counters)
        assert len(final.svid_serials) == len(won)  # every win built on the previous one
        assert seen.count(None) == 1  # only the first writer saw no record
    finally:
        await a.close()
        await b.close()


async def test_failed_check_writes_nothing(store: SqliteStore) -> None:
    def refuse(_existing: NodeRecord | None) -> None:
        raise NodeRevoked("revoked by an administrator")

    with pytest.raises(NodeRevoked):
        await commit(store, make_att(), "s1", check=refuse)
    assert await store.get("gpu-1") is None
    assert not await store.session_used("s1")
    assert await store.audit() == []
    # the session is still good for a commit that passes its checks
    assert (await commit(store, make_att(), "s1")).node_name == "gpu-1"


async def test_check_gets_the_existing_record(store: SqliteStore) -> None:
    seen: list[NodeRecord | None] = []
    first = await commit(store, make_att(), "s1", check=seen.append)
    await commit(store, make_att(serial="02"), "s2", "renew", check=seen.append)
    assert seen == [None, first]


async def test_check_runs_off_the_event_loop_thread(store: SqliteStore) -> None:
    threads: list[threading.Thread] = []
    await commit(store, make_att(), "s1", check=lambda _e: threads.append(threading.current_thread()))
    assert threads
    assert threads[0] is not threading.current_thread()


async def test_ek_bound_to_another_name_conflicts(store: SqliteStore) -> None:
    await commit(store, make_att("gpu-1", EK_A), "s1")
    with pytest.raises(NodeNameConflict):
        await commit(store, make_att("gpu-2", EK_A), "s2")
    assert await store.get("gpu-2") is None
    assert not await store.session_used("s2")
    # another EK under the same name is the caller's decision (check); allowing it re-binds
    rec = await commit(store, make_att("gpu-1", EK_B, serial="02"), "s3")
    assert rec.ek_sha256 == EK_B
    assert (await commit(store, make_att("gpu-2", EK_A), "s4")).ek_sha256 == EK_A


async def test_session_check_comes_first(store: SqliteStore) -> None:
    await commit(store, make_att("gpu-1", EK_A), "s1")
    with pytest.raises(SessionReused):
        await commit(store, make_att("gpu-2", EK_A), "s1")


# -- admin operations, audit, prune ---------------------------------------------------------------


async def test_revoke_unrevoke_forget_and_audit(store: SqliteStore) -> None:
    await commit(store, make_att("gpu-1"), "s1")
    await commit(store, make_att("gpu-2", EK_B), "s2")
    await store.record_refusal("gpu-3", "node_name_conflict", "x" * 5000)
    rec = await store.revoke("gpu-1", actor="alice", reason="lost in transit")
    assert rec.revoked
    assert (await store.revoke("gpu-1", actor="bob", reason="found", revoked=False)).revoked is False
    with pytest.raises(KeyError):
        await store.revoke("ghost", actor="alice", reason="?")
    assert await store.forget("gpu-1", actor="alice", reason="re-imaged")
    assert not await store.forget("gpu-1", actor="alice", reason="again")
    assert await store.get("gpu-1") is None
    assert [r.node_name for r in await store.list_nodes()] == ["gpu-2"]

    entries = await store.audit()
    assert [(e.node_name, e.action, e.actor) for e in entries] == [
        ("gpu-1", "forget", "alice"),
        ("gpu-1", "unrevoke", "bob"),
        ("gpu-1", "revoke", "alice"),
        ("gpu-3", "refused", "node"),
        ("gpu-2", "join", "node"),
        ("gpu-1", "join", "node"),
    ]
    assert [e.at for e in entries] == sorted((e.at for e in entries), reverse=True)
    assert entries[3].code == "node_name_conflict"
    assert len(entries[3].detail) == 1024
    assert entries[2].detail == "lost in transit"
    assert [e.action for e in await store.audit("gpu-1", limit=2)] == ["forget", "unrevoke"]
    assert await store.audit("gpu-1", limit=0) == []
    # the forgotten name (and its EK) are free again; the audit trail stayed
    assert (await commit(store, make_att("gpu-9", EK_A), "s3")).node_name == "gpu-9"
    assert len(await store.audit("gpu-1")) == 4


async def test_prune_drops_expired_sessions_only(store: SqliteStore) -> None:
    for i, exp in enumerate([T0, T0 + timedelta(seconds=30), T0 + timedelta(seconds=90)]):
        await store.commit(
            make_att(serial=f"{i + 1:02x}"),
            session_id=f"s{i}",
            session_expires_at=exp,
            action="renew",
            check=allow,
        )
    assert await store.prune(T0 + timedelta(seconds=60)) == 2
    assert [await store.session_used(f"s{i}") for i in range(3)] == [False, False, True]
    assert await store.prune(T0 + timedelta(seconds=60)) == 0
    assert await store.get("gpu-1") is not None


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
        assert db.execute("SELECT version FROM schema_version").fetchone() == (2,)
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


# -- validation at the boundary ---------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        {"node_name": "Bad_Name"},
        {"node_name": "a" * 254},
        {"ek_sha256": "A" * 64},
        {"ek_sha256": "a" * 63},
        {"ak_public": b""},
        {"spiffe_id": "https://x"},
        {"svid_serial": "XYZ"},
        {"counters": Counters(-1, 0, 0)},
        {"counters": Counters(0, 0, 1 << 64)},
        {"attested_at": datetime(2026, 1, 1)},  # naive on purpose
        {"expires_at": T0 - timedelta(seconds=1)},
    ],
)
async def test_bad_attestations_are_value_errors(store: SqliteStore, change: dict[str, object]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011
        await commit(store, replace(make_att(), **change), "s1")  # type: ignore[arg-type]
    assert await store.list_nodes() == []


async def test_bad_arguments_are_value_errors(store: SqliteStore) -> None:
    with pytest.raises(ValueError, match="session id"):
        await commit(store, make_att(), "s" * 65)
    with pytest.raises(ValueError, match="session id"):
        await store.session_used("")
    with pytest.raises(ValueError, match="action"):
        await commit(store, make_att(), "s1", action="refused")
    with pytest.raises(ValueError, match="node name"):
        await store.get("-x")
    with pytest.raises(ValueError, match="code"):
        await store.record_refusal("gpu-1", "Not A Code", "")
    with pytest.raises(ValueError, match="actor"):
        await store.revoke("gpu-1", actor="", reason="")
    with pytest.raises(ValueError, match="limit"):
        await store.audit(limit=-1)
    with pytest.raises(ValueError, match="timezone"):
        await store.prune(datetime(2026, 1, 1))


async def test_open_store_kinds(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs a cluster"):
        await open_store("kubernetes", state_dir=tmp_path, kube=None)
    with pytest.raises(ValueError, match="unknown store"):
        await open_store("etcd", state_dir=tmp_path, kube=None)


# -- property: the store behaves like a dictionary --------------------------------------------

NAMES = ["n1", "n2", "n3"]
EKS = ["1" * 64, "2" * 64, "3" * 64]
ops = st.lists(
    st.one_of(
        st.tuples(st.just("commit"), st.sampled_from(NAMES), st.sampled_from(EKS), st.integers(0, 5)),
        st.tuples(st.just("revoke"), st.sampled_from(NAMES), st.booleans()),
        st.tuples(st.just("forget"), st.sampled_from(NAMES)),
    ),
    max_size=25,
)


class Model:
    """What the store must be: a dict of records plus a set of used sessions."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeRecord] = {}
        self.sessions: set[str] = set()

    def commit(self, att: Attestation, session: str) -> NodeRecord | type[Exception]:
        if session in self.sessions:
            return SessionReused
        if any(r.ek_sha256 == att.ek_sha256 and n != att.node_name for n, r in self.nodes.items()):
            return NodeNameConflict
        old = self.nodes.get(att.node_name)
        serials = (*(old.svid_serials if old else ()), att.svid_serial)[-MAX_SERIALS:]
        rec = NodeRecord(
            att.node_name,
            att.ek_sha256,
            att.ak_public,
            att.spiffe_id,
            att.counters,
            att.attested_at,
            att.expires_at,
            old.revoked if old else False,
            serials,
        )
        self.nodes[att.node_name] = rec
        self.sessions.add(session)
        return rec


async def _run_ops(path: Path, steps: list[tuple[object, ...]]) -> None:
    store = await SqliteStore.open(path)
    model = Model()
    try:
        for i, step in enumerate(steps):
            match step:
                case ("commit", str(name), str(ek), int(s)):
                    att = make_att(name, ek, serial=f"{i + 1:x}", at=T0 + timedelta(seconds=i))
                    want = model.commit(att, f"s{s}")
                    if isinstance(want, NodeRecord):
                        assert await commit(store, att, f"s{s}") == want
                    else:
                        with pytest.raises(want):
                            await commit(store, att, f"s{s}")
                case ("revoke", str(name), bool(flag)):
                    if name in model.nodes:
                        model.nodes[name] = replace(model.nodes[name], revoked=flag)
                        assert (
                            await store.revoke(name, actor="a", reason="r", revoked=flag) == model.nodes[name]
                        )
                    else:
                        with pytest.raises(KeyError):
                            await store.revoke(name, actor="a", reason="r", revoked=flag)
                case ("forget", str(name)):
                    assert await store.forget(name, actor="a", reason="r") == (
                        model.nodes.pop(name, None) is not None
                    )
            assert await store.list_nodes() == [model.nodes[n] for n in sorted(model.nodes)]
        for s in range(6):
            assert await store.session_used(f"s{s}") == (f"s{s}" in model.sessions)
    finally:
        await store.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=ops)
def test_store_matches_a_model(steps: list[tuple[object, ...]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(_run_ops(Path(tmp) / "nodegate.db", steps))


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
