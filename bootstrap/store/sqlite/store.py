"""The embedded store: one sqlite file, ``<state_dir>/nodegate.db``.

Durability: WAL with ``synchronous=FULL``, so a commit that returned survives a power loss.
Atomicity: :meth:`SqliteStore.commit` is one ``BEGIN IMMEDIATE`` transaction; the used-session row
and the node row land together or not at all, and the session's primary key makes a second finish
of the same session fail even from another process on the same file.

The connection lives on one dedicated worker thread: sqlite calls block, and the event loop must
not. That thread also serialises this object's writes; other processes (or other objects on the
same file) queue on sqlite's write lock, bounded by ``busy_timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any, Final, TypeVar

from bootstrap.files import ensure_dir
from bootstrap.problems import NodeNameConflict, NodeRecordDamaged, SessionReused
from bootstrap.store.model import (
    Attestation,
    AuditEntry,
    Check,
    DamagedRecord,
    NodeRecord,
    StoreUnavailable,
    check_action,
    check_actor,
    check_anchors,
    check_attestation,
    check_code,
    check_dbx_id,
    check_limit,
    check_node_name,
    check_session_id,
    check_time,
    clip,
    merged_anchors,
    utcnow,
)
from bootstrap.store.records import check_disk_event, commit_detail, quarantined, record_from
from bootstrap.store.sqlite.rows import (
    COLUMNS,
    create_private,
    put_dbx,
    put_record,
    read_anchors,
    read_audit,
    read_dbx,
    record_of,
    to_us,
)
from bootstrap.store.sqlite.schema import SCHEMA, Migration, migrate

T = TypeVar("T")
log = logging.getLogger("nodegate.store")

DEFAULT_BUSY_TIMEOUT: Final = 5.0
DEFAULT_AUDIT_ROWS: Final = 100_000  # prune() trims the audit table to this many newest rows


class SqliteStore:
    """Use :meth:`open`; every method is a coroutine that runs on the store's own thread."""

    def __init__(
        self,
        path: Path,
        *,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        audit_rows: int = DEFAULT_AUDIT_ROWS,
        clock: Callable[[], datetime] = utcnow,
        _migrations: tuple[Migration, ...] = SCHEMA,
    ) -> None:
        self.path = path
        self._busy_timeout = busy_timeout
        self._audit_rows = audit_rows
        self._clock = clock
        self._migrations = _migrations
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nodegate-store")
        self._db: sqlite3.Connection | None = None
        # Point reads by primary key run inline on the event loop with their own connection: in
        # WAL mode a reader never waits for the writer, and a ~20 µs lookup is cheaper than the
        # ~150 µs round trip through the worker thread (two of them per join).
        self._reader: sqlite3.Connection | None = None
        self._plock = threading.Lock()
        self._pending: list[tuple[Callable[[sqlite3.Connection], Any], asyncio.Future[Any]]] = []
        self._flush_scheduled = False
        self._closed = False

    @classmethod
    async def open(cls, path: Path, **kwargs: Any) -> SqliteStore:
        store = cls(path, **kwargs)
        try:
            await store._run(store._open)
        except BaseException:
            await store.close()
            raise
        return store

    # -- plumbing ---------------------------------------------------------------------------------

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise StoreUnavailable("the store is closed")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, functools.partial(self._guarded, fn, *args))
        except RuntimeError as exc:  # the pool was shut down under us
            if self._closed:
                raise StoreUnavailable("the store is closed") from None
            raise exc from None

    @staticmethod
    def _guarded(fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except sqlite3.IntegrityError:
            raise  # callers map the constraint they expect; anything else is a bug
        except (sqlite3.OperationalError, sqlite3.DatabaseError) as exc:
            # locked past busy_timeout, disk full, I/O error, a damaged file: retry later (503)
            raise StoreUnavailable(f"sqlite: {exc}") from None

    @property
    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise StoreUnavailable("the store is not open")
        return self._db

    def _open(self) -> None:
        ensure_dir(self.path.parent)
        create_private(self.path)
        db = sqlite3.connect(
            self.path, timeout=self._busy_timeout, isolation_level=None, check_same_thread=False
        )
        try:
            db.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
            mode = self._wal(db)
            if not mode or str(mode[0]).lower() != "wal":
                raise StoreUnavailable(f"sqlite: cannot use WAL on {self.path} (got {mode!r})")  # noqa: TRY301
            db.execute("PRAGMA synchronous = FULL")
            migrate(db, self._migrations)
            reader = sqlite3.connect(
                self.path, timeout=self._busy_timeout, isolation_level=None, check_same_thread=False
            )
            reader.execute("PRAGMA query_only = ON")
        except BaseException:
            db.close()
            raise
        self._db = db
        self._reader = reader

    def _wal(self, db: sqlite3.Connection) -> Any:
        """Switch to WAL. Two openers switching a new file at once get SQLITE_BUSY at once (sqlite
        does not call the busy handler for this lock), so retry within ``busy_timeout``."""
        deadline = time.monotonic() + self._busy_timeout
        while True:
            try:
                return db.execute("PRAGMA journal_mode = WAL").fetchone()
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    raise
            time.sleep(0.005)  # on the store's own thread, never the event loop

    def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """One ``BEGIN IMMEDIATE`` transaction: the write lock is taken before the first read, so
        what ``fn`` reads cannot change before it writes."""
        db = self._conn
        db.execute("BEGIN IMMEDIATE")
        try:
            out = fn(db)
            db.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            raise
        return out

    async def _grouped(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Group commit: commits that arrive while the store thread is busy (typically waiting for
        the previous fsync) share one transaction and one fsync. Each runs in its own savepoint,
        so one that raises (SessionReused, a failed check) is rolled back alone; a failed COMMIT
        fails them all, and none of them returned before its data was on disk."""
        if self._closed:
            raise StoreUnavailable("the store is closed")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        with self._plock:
            self._pending.append((fn, fut))
            start = not self._flush_scheduled
            self._flush_scheduled = True
        if start:
            try:
                self._pool.submit(self._flush, loop)
            except RuntimeError:  # the pool was shut down under us
                raise StoreUnavailable("the store is closed") from None
        result: T = await fut
        return result

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._plock:
            batch, self._pending = self._pending, []
            self._flush_scheduled = False
        outcomes: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []
        try:
            db = self._conn
            db.execute("BEGIN IMMEDIATE")
            try:
                for fn, fut in batch:
                    db.execute("SAVEPOINT job")
                    try:
                        outcomes.append((fut, fn(db), None))
                    except Exception as exc:  # noqa: BLE001  (handed to that job's caller)
                        db.execute("ROLLBACK TO job")
                        err: BaseException = exc
                        if isinstance(exc, sqlite3.OperationalError | sqlite3.DatabaseError):
                            err = StoreUnavailable(f"sqlite: {exc}")
                        outcomes.append((fut, None, err))
                    db.execute("RELEASE job")
                db.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
                raise
        except (sqlite3.Error, StoreUnavailable) as exc:
            failed = exc if isinstance(exc, StoreUnavailable) else StoreUnavailable(f"sqlite: {exc}")
            outcomes = [(fut, None, failed) for _, fut in batch]
        for fut, value, error in outcomes:
            loop.call_soon_threadsafe(_settle, fut, value, error)

    def _audit(
        self, db: sqlite3.Connection, node: str, action: str, actor: str, code: str, detail: str
    ) -> None:
        db.execute(
            "INSERT INTO audit (at, node_name, action, actor, code, detail) VALUES (?, ?, ?, ?, ?, ?)",
            (to_us(self._clock()), node, action, actor, code, detail),
        )

    # -- reads ------------------------------------------------------------------------------------

    def _get(self, db: sqlite3.Connection, node_name: str) -> NodeRecord | None:
        row = db.execute(f"SELECT {COLUMNS} FROM nodes WHERE node_name = ?", (node_name,)).fetchone()  # noqa: S608  (constant columns)
        return None if row is None else record_of(row)

    async def get(self, node_name: str) -> NodeRecord | None:
        check_node_name(node_name)
        if self._closed or self._reader is None:
            raise StoreUnavailable("the store is closed")
        return self._guarded(self._get, self._reader, node_name)

    def _rows(self) -> list[tuple[Any, ...]]:
        return self._conn.execute(f"SELECT {COLUMNS} FROM nodes ORDER BY node_name").fetchall()  # noqa: S608

    async def keep_current(self) -> None:
        return  # every read is a local query: no copy to keep

    async def list_nodes(self, *, recent: bool = False) -> list[NodeRecord]:
        def run() -> list[NodeRecord]:
            out = []
            for row in self._rows():
                try:
                    out.append(record_of(row))
                except NodeRecordDamaged as exc:  # one damaged row must not hide every other node
                    log.warning("%s", exc.detail)
            return out

        return await self._run(run)

    async def damaged_nodes(self) -> list[DamagedRecord]:
        def run() -> list[DamagedRecord]:
            out = []
            for row in self._rows():
                try:
                    record_of(row)
                except NodeRecordDamaged as exc:
                    out.append(DamagedRecord(str(row[0]), exc.detail))
            return out

        return await self._run(run)

    async def dbx_digests(self, identities: Collection[str]) -> dict[str, bytes]:
        wanted = sorted({check_dbx_id(i) for i in identities})

        return await self._run(lambda: read_dbx(self._conn, wanted))

    async def session_used(self, session_id: str, *, node_name: str | None = None) -> bool:
        check_session_id(session_id)
        if node_name is not None:
            check_node_name(node_name)
        return await self._run(
            lambda: (
                self._conn.execute("SELECT 1 FROM used_sessions WHERE id = ?", (session_id,)).fetchone()
                is not None
            )
        )

    async def audit(self, node_name: str | None = None, limit: int = 100) -> list[AuditEntry]:
        check_limit(limit)
        if node_name is not None:
            check_node_name(node_name)
        return await self._run(lambda: read_audit(self._conn, node_name, limit))

    # -- writes -----------------------------------------------------------------------------------

    async def commit(
        self, att: Attestation, *, session_id: str, session_expires_at: datetime, action: str, check: Check
    ) -> NodeRecord:
        check_attestation(att)
        check_session_id(session_id)
        session_exp = check_time(session_expires_at, "session_expires_at")
        check_action(action)

        def run(db: sqlite3.Connection) -> NodeRecord:
            if db.execute("SELECT 1 FROM used_sessions WHERE id = ?", (session_id,)).fetchone():
                raise SessionReused("this session already finished")
            other = db.execute(
                "SELECT node_name FROM nodes WHERE ek_sha256 = ? AND node_name != ?",
                (att.ek_sha256, att.node_name),
            ).fetchone()
            if other is not None:
                raise NodeNameConflict(f"this TPM is bound to another node name ({other[0]})")
            existing = self._get(db, att.node_name)
            check(existing)
            rec = record_from(att, action=action, existing=existing)
            try:
                db.execute(
                    "INSERT INTO used_sessions (id, expires_at) VALUES (?, ?)",
                    (session_id, to_us(session_exp)),
                )
            except sqlite3.IntegrityError:
                raise SessionReused("this session already finished") from None
            put_record(db, rec)
            put_dbx(db, att.dbx)
            self._audit(db, rec.node_name, action, "node", "", commit_detail(rec, att, existing))
            return rec

        return await self._grouped(run)

    async def record_refusal(self, node_name: str, code: str, detail: str, *, evidence: bool = False) -> None:
        check_node_name(node_name)
        check_code(code)
        text = clip(detail)

        def run(db: sqlite3.Connection) -> None:
            if evidence:
                db.execute(
                    "UPDATE nodes SET refused_at = ? WHERE node_name = ?", (to_us(self._clock()), node_name)
                )
            self._audit(db, node_name, "refused", "node", code, text)

        await self._run(self._write, run)

    async def record_disk(
        self,
        node_name: str,
        *,
        action: str,
        actor: str,
        detail: str,
        session_id: str | None = None,
        session_expires_at: datetime | None = None,
    ) -> bool:
        text, checked = check_disk_event(node_name, action, actor, detail, session_id, session_expires_at)
        session = None if checked is None else (checked[0], to_us(checked[1]))

        def run(db: sqlite3.Connection) -> bool:
            if session is not None:
                try:
                    db.execute("INSERT INTO used_sessions (id, expires_at) VALUES (?, ?)", session)
                except sqlite3.IntegrityError:
                    raise SessionReused("this session already finished") from None
            self._audit(db, node_name, action, actor, "", text)
            return True

        return await self._run(self._write, run)

    async def revoke(self, node_name: str, *, actor: str, reason: str, revoked: bool = True) -> NodeRecord:
        check_node_name(node_name)
        check_actor(actor)
        text = clip(reason)

        def run(db: sqlite3.Connection) -> NodeRecord:
            cur = db.execute("UPDATE nodes SET revoked = ? WHERE node_name = ?", (int(revoked), node_name))
            if cur.rowcount == 0:
                raise KeyError(node_name)
            self._audit(db, node_name, "revoke" if revoked else "unrevoke", actor, "", text)
            rec = self._get(db, node_name)
            assert rec is not None  # noqa: S101  (inside the same transaction)
            return rec

        return await self._run(self._write, run)

    async def quarantine(self, node_name: str, *, actor: str, reason: str) -> NodeRecord:
        check_node_name(node_name)
        check_actor(actor)
        text = clip(reason)

        def run(db: sqlite3.Connection) -> NodeRecord:
            rec = self._get(db, node_name)
            if rec is None:
                raise KeyError(node_name)
            held = quarantined(rec, actor=actor, reason=text, at=self._clock())
            db.execute(
                "UPDATE nodes SET quarantine = ? WHERE node_name = ?", (json.dumps(held.to_json()), node_name)
            )
            self._audit(db, node_name, "quarantine", actor, "", text)
            return replace(rec, quarantine=held)

        return await self._run(self._write, run)

    async def forget(self, node_name: str, *, actor: str, reason: str) -> bool:
        check_node_name(node_name)
        check_actor(actor)
        text = clip(reason)

        def run(db: sqlite3.Connection) -> bool:
            if db.execute("DELETE FROM nodes WHERE node_name = ?", (node_name,)).rowcount == 0:
                return False
            self._audit(db, node_name, "forget", actor, "", text)
            return True

        return await self._run(self._write, run)

    @property
    def prune_interval(self) -> float:
        return 60.0  # two indexed DELETEs in a local file

    async def prune(self, now: datetime) -> int:
        cutoff = to_us(check_time(now, "now"))

        def run(db: sqlite3.Connection) -> int:
            n = db.execute("DELETE FROM used_sessions WHERE expires_at < ?", (cutoff,)).rowcount
            # the audit table is the one thing unauthenticated clients can grow (refusals)
            db.execute(
                "DELETE FROM audit WHERE id <= (SELECT id FROM audit ORDER BY id DESC LIMIT 1 OFFSET ?)",
                (self._audit_rows,),
            )
            return int(n)

        return await self._run(self._write, run)

    async def has_nodes(self) -> bool:
        return await self._run(
            lambda: self._conn.execute("SELECT 1 FROM nodes LIMIT 1").fetchone() is not None
        )

    async def trust_anchors(self) -> frozenset[str]:
        return frozenset(await self._run(lambda: read_anchors(self._conn)))

    async def remember_trust_anchors(self, anchors: frozenset[str]) -> None:
        check_anchors(anchors)

        def run(db: sqlite3.Connection) -> None:
            merged = merged_anchors(read_anchors(db), anchors)
            db.execute(
                "INSERT INTO meta (key, value) VALUES ('trust_anchors', ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (json.dumps(merged),),
            )

        await self._run(self._write, run)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()

        def shut() -> None:
            if self._db is not None:
                self._db.close()
                self._db = None

        with contextlib.suppress(sqlite3.Error):
            await loop.run_in_executor(self._pool, shut)
        self._pool.shutdown(wait=True)
        if self._reader is not None:
            with contextlib.suppress(sqlite3.Error):
                self._reader.close()
            self._reader = None


def _settle(fut: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if fut.cancelled():  # the caller went away; its commit stands (or failed) regardless
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)
