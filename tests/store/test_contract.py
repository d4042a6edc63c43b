"""The Store contract (bootstrap/store/model.py), asserted for both backends.

Every test runs against the sqlite store (a file in tmp_path) and the kubernetes store (NodeAttestation
objects on the emulated API, kmock through tests/support/kshim.py). Where the two legitimately
differ, the test says so and asserts each side. What only one backend has (sqlite's file, schema
and group commit; the kubernetes store's objects, resourceVersion conflicts and EK claim Leases)
is tested in test_store.py, test_store_schema.py and test_store_kube.py.
"""

from __future__ import annotations

import asyncio
import sqlite3
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import kmock
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attest.errors import CounterRegressed
from attest.tpm import Counters
from bootstrap.kube import Kube
from bootstrap.problems import BootIdRequired, NodeNameConflict, NodeRecordDamaged, NodeRevoked, SessionReused
from bootstrap.store import MAX_SERIALS, Attestation, NodeRecord, Store
from bootstrap.store.kube import ATTEMPTS, CLAIM_STALE, KubeStore
from bootstrap.store.model import MAX_ANCHORS
from bootstrap.store.sqlite import SqliteStore
from tests.store.common import C0, EK_A, EK_B, RES, T0, Ticker, allow, commit, make_att
from tests.support import bootrecords
from tests.support import eventlogs as el
from tests.support.kshim import ShimEmulator

pytestmark = pytest.mark.kmock(cls=ShimEmulator)

KINDS = ["sqlite", "kubernetes"]


@dataclass
class Backend:
    """Stores of one kind over one shared state: opening another is a restart (after close) or a
    second process / replica (while the first is open)."""

    kind: str
    opener: Callable[[Ticker, int], Awaitable[Store]]
    opened: list[Store] = field(default_factory=list)
    clock: Ticker = field(default_factory=Ticker)  # the clock of the ``store`` fixture

    async def open(self, clock: Ticker | None = None, *, attempts: int = ATTEMPTS) -> Store:
        """``attempts``: the kubernetes store's writes per operation before it gives up on
        conflicts (StoreUnavailable); sqlite waits for its write lock instead."""
        store = await self.opener(Ticker() if clock is None else clock, attempts)
        self.opened.append(store)
        return store

    @property
    def sqlite(self) -> bool:
        return self.kind == "sqlite"


def register(api: Any) -> None:
    api.resources[RES] = {"kind": "NodeAttestation", "namespaced": False}


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def api(kind: str, request: pytest.FixtureRequest) -> Any:
    """The emulated API server for the kubernetes store (None for sqlite, which needs none)."""
    if kind == "sqlite":
        return None
    server = request.getfixturevalue("kmock")
    register(server)
    return server


@pytest.fixture
async def backend(kind: str, api: Any, tmp_path: Path) -> AsyncIterator[Backend]:
    kubes: list[Kube] = []

    async def open_sqlite(clock: Ticker, _attempts: int) -> Store:
        return await SqliteStore.open(tmp_path / "nodegate.db", clock=clock)

    async def open_kube(clock: Ticker, attempts: int) -> Store:
        kube = Kube.for_host(str(api.url), timeout=2.0)  # one client per replica
        kubes.append(kube)
        return KubeStore(kube, clock=clock, backoff=0.0, attempts=attempts)

    backend = Backend(kind, open_sqlite if kind == "sqlite" else open_kube)
    yield backend
    for store in backend.opened:
        await store.close()
    for kube in kubes:
        await kube.close()


@pytest.fixture
async def store(backend: Backend) -> Store:
    return await backend.open(backend.clock)


# -- records, restart -----------------------------------------------------------------------------


async def test_commit_round_trip_and_restart(backend: Backend) -> None:
    store = await backend.open()
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
    assert await store.get("gpu-1") == rec
    await store.close()

    again = await backend.open()
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


async def test_renewal_keeps_revoked_flag_and_appends_serials(store: Store) -> None:
    for i in range(MAX_SERIALS + 3):
        await commit(store, make_att(serial=f"{i:x}", counters=Counters(1, 0, 100 + i)), f"s{i}", "renew")
    rec = await store.get("gpu-1")
    assert rec is not None
    assert rec.svid_serials == tuple(f"{i:x}" for i in range(3, MAX_SERIALS + 3))
    assert rec.counters == Counters(1, 0, 100 + MAX_SERIALS + 2)
    await store.revoke("gpu-1", actor="admin@example.org", reason="stolen")
    rec = await commit(store, make_att(serial="ff"), "s-after")
    assert rec.revoked  # only an admin clears it


async def test_renewal_updates_and_keeps_history(store: Store) -> None:
    await commit(store, make_att(), "s1")
    for i in range(2, 40):
        at = T0 + timedelta(seconds=i)
        await commit(
            store, make_att(serial=f"{i:x}", counters=Counters(1, 0, 100 + i), at=at), f"s{i}", "renew"
        )
    rec = await store.get("gpu-1")
    assert rec is not None
    assert rec.counters == Counters(1, 0, 139)
    assert rec.svid_serials == tuple(f"{i:x}" for i in range(8, 40))  # the newest 32
    assert rec.attested_at == T0 + timedelta(seconds=39)
    assert [e.action for e in await store.audit("gpu-1", limit=3)] == ["renew"] * 3


async def test_a_rejoin_supersedes_the_svids_of_the_previous_join(store: Store) -> None:
    """join, renew, renew, join: only the second join's SVID may renew (docs/protocol.md)."""
    await commit(store, make_att(serial="a1"), "s1")
    for n, serial in enumerate(("a2", "a3"), start=2):
        renewal = make_att(serial=serial, at=T0 + timedelta(minutes=n), counters=Counters(1, 0, 100 + n))
        await commit(store, renewal, f"s{n}", "renew")
    before = await store.get("gpu-1")
    assert before is not None
    assert before.svid_serials == ("a1", "a2", "a3")
    rejoin = await commit(store, make_att(serial="b1", at=T0 + timedelta(minutes=9)), "s9")
    assert rejoin.svid_serials == ("b1",)
    renewed = await commit(store, make_att(serial="b2", at=T0 + timedelta(minutes=10)), "s10", "renew")
    assert renewed.svid_serials == ("b1", "b2")
    assert await store.get("gpu-1") == renewed


async def test_boot_id_and_measured_boot_class_round_trip(backend: Backend) -> None:
    store = await backend.open()
    boot = "0f3c1b9e-7a2d-4c55-9e61-2d0b8f7a1c34"
    att = replace(make_att(), boot_id=boot, measured_boot_class="dgx-h100 / uefi-2.9")
    rec = await commit(store, att, "s1")
    assert (rec.boot_id, rec.measured_boot_class) == (boot, "dgx-h100 / uefi-2.9")
    assert await store.get("gpu-1") == rec
    later = replace(make_att(serial="02", at=T0 + timedelta(minutes=5)), boot_id="ab-1")
    renewed = await commit(store, later, "s2", "renew")
    assert (renewed.boot_id, renewed.measured_boot_class) == ("ab-1", None)  # what the latest reported
    await store.close()
    again = await backend.open()
    assert await again.get("gpu-1") == renewed
    assert await again.list_nodes() == [renewed]


async def test_the_node_uid_round_trips_and_survives_an_attestation_without_a_node(backend: Backend) -> None:
    """The uid of the Node the join service labelled (issue 33, finding 4 follow-up): recorded at
    join, replaced by a renewal that labelled another Node, kept by one that found no Node (the
    gate then holds whatever Node the kubelet registers next), restored after a restart."""
    store = await backend.open()
    uid_a, uid_b = "5f0c9a3e-1b2d-4c6e-8f7a-9b0c1d2e3f4a", "8a7b6c5d-4e3f-4a1b-9c8d-7e6f5a4b3c2d"
    rec = await commit(store, replace(make_att(), node_uid=uid_a), "s1")
    assert rec.node_uid == uid_a
    assert await store.get("gpu-1") == rec
    no_node = await commit(store, make_att(serial="02", at=T0 + timedelta(minutes=1)), "s2", "renew")
    assert no_node.node_uid == uid_a
    other = replace(make_att(serial="03", at=T0 + timedelta(minutes=2)), node_uid=uid_b)
    adopted = await commit(store, other, "s3", "renew")
    assert adopted.node_uid == uid_b
    await store.close()
    again = await backend.open()
    assert await again.get("gpu-1") == adopted
    assert (await again.list_nodes())[0].node_uid == uid_b
    never = await commit(again, make_att("gpu-2", EK_B), "s9")
    assert never.node_uid is None  # a join service without a cluster labels no Node


async def test_a_refusal_of_the_evidence_marks_the_record_until_the_next_attestation(
    backend: Backend,
) -> None:
    """docs/spire.md: a refusal of the node's evidence is kept on its record (``refused_at``), which
    only its next join or renewal clears; other refusals leave the record as it was; the x509pop
    attestation fact of each commit replaces the last, and both survive a restart."""
    clock = Ticker()
    store = await backend.open(clock)
    pop_a, pop_b = "a" * 32, "b" * 32
    rec = await commit(store, replace(make_att(), x509pop_attestation=pop_a), "s1")
    assert (rec.x509pop_attestation, rec.refused_at) == (pop_a, None)
    await store.record_refusal("gpu-1", "proof_invalid", "anyone can send this")
    assert await store.get("gpu-1") == rec
    await store.record_refusal("gpu-1", "measured_boot_violation", "a refused boot", evidence=True)
    refused = await store.get("gpu-1")
    assert refused is not None
    assert refused.refused_at is not None
    assert refused == replace(rec, refused_at=refused.refused_at)
    await store.record_refusal("gpu-2", "pcr_policy_violation", "no record: nothing to mark", evidence=True)
    assert await store.get("gpu-2") is None
    await store.close()
    store = await backend.open(clock)
    assert await store.get("gpu-1") == refused  # a restart keeps it
    assert (await store.list_nodes())[0].refused_at == refused.refused_at
    renewed = await commit(
        store,
        replace(make_att(serial="02", at=T0 + timedelta(minutes=1)), x509pop_attestation=pop_b),
        "s2",
        "renew",
    )
    assert (renewed.x509pop_attestation, renewed.refused_at) == (pop_b, None)
    assert await store.get("gpu-1") == renewed
    revoked = await store.revoke("gpu-1", actor="admin", reason="r")
    assert (revoked.x509pop_attestation, revoked.refused_at) == (pop_b, None)
    plain = await commit(store, make_att(serial="03", at=T0 + timedelta(minutes=2)), "s3", "renew")
    assert plain.x509pop_attestation is None  # no x509pop certificate with this one


async def test_a_recorded_boot_id_is_never_dropped(backend: Backend) -> None:
    """Issue 21, finding 5: a renewal without a boot id cleared the recorded one (and the gate's
    reboot hold with it). Whatever check the caller passes, the store refuses such a commit with
    boot_id_required and keeps the record as it was; a record without a boot id (an agent that
    never sent one) stays renewable without one."""
    store = await backend.open()
    boot = "0f3c1b9e-7a2d-4c55-9e61-2d0b8f7a1c34"
    first = await commit(store, replace(make_att(), boot_id=boot), "s1")
    for n, action in enumerate(("renew", "join"), start=2):
        later = make_att(serial=f"0{n}", at=T0 + timedelta(minutes=n))
        with pytest.raises(BootIdRequired) as err:
            await commit(store, later, f"s{n}", action)
        assert err.value.code == "boot_id_required"
        assert await store.get("gpu-1") == first
    other = await commit(store, make_att("gpu-2", EK_B), "s9")
    renewed = await commit(
        store, make_att("gpu-2", EK_B, serial="0a", at=T0 + timedelta(minutes=1)), "s10", "renew"
    )
    assert (other.boot_id, renewed.boot_id) == (None, None)
    await store.close()
    again = await backend.open()
    assert await again.get("gpu-1") == first


async def test_has_nodes(store: Store) -> None:
    assert not await store.has_nodes()
    await commit(store, make_att(), "s1")
    assert await store.has_nodes()
    await store.forget("gpu-1", actor="admin", reason="re-imaged")
    assert not await store.has_nodes()


async def test_trust_anchors_are_remembered_merged_and_bounded(backend: Backend) -> None:
    store = await backend.open()
    assert await store.trust_anchors() == frozenset()
    first = frozenset({"a" * 64})
    await store.remember_trust_anchors(first)
    await store.remember_trust_anchors(frozenset({"b" * 64, "a" * 64}))
    assert await store.trust_anchors() == {"a" * 64, "b" * 64}
    many = [f"{i:064x}" for i in range(MAX_ANCHORS + 5)]
    for a in many:
        await store.remember_trust_anchors(frozenset({a}))
    await store.close()
    again = await backend.open()
    assert await again.trust_anchors() == frozenset(many[-MAX_ANCHORS:])  # the newest, after a restart
    with pytest.raises(ValueError, match="trust anchors"):
        await again.remember_trust_anchors(frozenset({"not hex"}))


async def damage(backend: Backend, api: Any, tmp_path: Path, node: str) -> None:
    """What an adversarial run did to one node: its counters no longer read back."""
    if backend.sqlite:
        db = sqlite3.connect(tmp_path / "nodegate.db")
        db.execute("UPDATE nodes SET counters = '[1, \"two\"' WHERE node_name = ?", (node,))
        db.commit()
        db.close()
    else:
        api.objects[RES, None, node].patch({"metadata": {"annotations": {"nodegate.io/counters": "{no"}}})


async def test_a_damaged_record_is_listed_refused_and_forgettable(
    backend: Backend, api: Any, tmp_path: Path
) -> None:
    """Before: one damaged row made the whole listing (and that node's join) fail with a traceback."""
    store = await backend.open()
    await commit(store, make_att("gpu-1"), "s1")
    good = await commit(store, make_att("gpu-2", EK_B), "s2")
    await damage(backend, api, tmp_path, "gpu-1")
    assert await store.list_nodes() == [good]
    damaged = await store.damaged_nodes()
    assert [d.node_name for d in damaged] == ["gpu-1"]
    assert "gpu-1" in damaged[0].problem
    with pytest.raises(NodeRecordDamaged):
        await store.get("gpu-1")
    with pytest.raises(NodeRecordDamaged):  # neither trusted nor overwritten by a join
        await commit(store, make_att("gpu-1", serial="05"), "s3")
    with pytest.raises(NodeRecordDamaged):
        await store.revoke("gpu-1", actor="admin", reason="r")
    await store.record_refusal("gpu-1", "node_record_damaged", "refused")  # the audit still works
    assert await store.has_nodes()
    assert await store.forget("gpu-1", actor="admin", reason="damaged")  # the fix
    assert await store.damaged_nodes() == []
    rec = await commit(store, make_att("gpu-1", serial="06"), "s4")
    assert await store.get("gpu-1") == rec


async def test_time_zones_are_normalised_to_utc(store: Store) -> None:
    plus2 = T0.astimezone(timezone(timedelta(hours=2)))
    rec = await commit(store, make_att(at=plus2), "s1")
    got = await store.get("gpu-1")
    assert got == rec
    assert got is not None
    assert got.attested_at == T0
    assert got.attested_at is not None
    assert got.attested_at.utcoffset() == timedelta(0)


async def test_microseconds_survive(store: Store) -> None:
    at = T0 + timedelta(microseconds=123456)
    rec = await commit(store, make_att(at=at), "s1")
    assert (await store.get("gpu-1")) == rec
    assert rec.attested_at == at


async def test_list_nodes_is_sorted_by_name(store: Store) -> None:
    assert await store.list_nodes() == []
    for name, ek in (("gpu-2", EK_B), ("gpu-1", EK_A)):
        await commit(store, make_att(name, ek), f"s-{name}")
    assert [r.node_name for r in await store.list_nodes()] == ["gpu-1", "gpu-2"]


# -- the atomic commit ----------------------------------------------------------------------------


async def test_one_session_committed_concurrently_wins_once(store: Store) -> None:
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


async def test_two_stores_on_one_state_agree_on_single_use(backend: Backend) -> None:
    """A first join: two processes on one sqlite file, two replicas on one API server."""
    a, b = await backend.open(), await backend.open()
    results = await asyncio.gather(
        *(commit(s, make_att(serial=f"{i:02x}"), "shared") for i, s in enumerate([a, b] * 4)),
        return_exceptions=True,
    )
    assert sum(isinstance(r, NodeRecord) for r in results) == 1, results
    assert sum(isinstance(r, SessionReused) for r in results) == 7
    assert await a.get("gpu-1") == await b.get("gpu-1")
    assert await b.session_used("shared")


async def test_one_session_on_two_stores_wins_once(backend: Backend) -> None:
    """A renewal: the record exists, both stores race to update it."""
    a, b = await backend.open(), await backend.open()
    await commit(a, make_att(), "s0")
    results = await asyncio.gather(
        *(commit(s, make_att(serial=f"{i:02x}"), "shared", "renew") for i, s in enumerate([a, b, a, b])),
        return_exceptions=True,
    )
    wins = [r for r in results if isinstance(r, NodeRecord)]
    assert len(wins) == 1, results
    assert all(isinstance(r, SessionReused) for r in results if r not in wins)
    assert await b.session_used("shared", node_name="gpu-1")
    assert await a.session_used("shared")
    rec = await b.get("gpu-1")
    assert rec is not None
    assert rec.svid_serials == ("01", wins[0].svid_serials[-1])


async def test_concurrent_commits_for_one_node_see_each_other(backend: Backend) -> None:
    """Each check() sees the record the previous commit wrote (here: counters never go back)."""
    # Ten writers on one object: a kubernetes store's write may lose to every other commit and to
    # each one's status write; it gives up after ``attempts`` (test_store_kube.py covers that).
    a, b = await backend.open(attempts=25), await backend.open(attempts=25)
    seen: list[Counters | None] = []

    def monotonic(c: Counters) -> Callable[[NodeRecord | None], None]:
        def check(existing: NodeRecord | None) -> None:
            seen.append(existing.counters if existing else None)
            if existing and existing.counters and existing.counters > c:
                raise CounterRegressed("counters went back")

        return check

    atts = [make_att(serial=f"{i:02x}", counters=Counters(1, 0, 100 + i)) for i in range(10)]
    results = await asyncio.gather(
        *(
            commit([a, b][i % 2], att, f"s{i}", "renew", monotonic(att.counters))
            for i, att in enumerate(atts)
        ),
        return_exceptions=True,
    )
    won = [r for r in results if isinstance(r, NodeRecord)]
    assert all(isinstance(r, NodeRecord | CounterRegressed) for r in results), results
    final = await a.get("gpu-1")
    assert final is not None
    assert final.counters == max(r.counters for r in won if r.counters)
    assert len(final.svid_serials) == len(won)  # every win built on the previous one
    if backend.sqlite:
        assert seen.count(None) == 1  # only the first writer saw no record
    else:
        # Optimistic: every racer may read "no record" and run its check before the first write
        # lands; a racer that then loses the write (409) re-reads and checks again.
        assert seen.count(None) >= 1
        assert len(seen) >= len(results)


async def test_failed_check_writes_nothing(store: Store) -> None:
    def refuse(_existing: NodeRecord | None) -> None:
        raise NodeRevoked("revoked by an administrator")

    with pytest.raises(NodeRevoked):
        await commit(store, make_att(), "s1", check=refuse)
    assert await store.get("gpu-1") is None
    assert not await store.session_used("s1")
    assert await store.audit() == []
    # the session is still good for a commit that passes its checks
    assert (await commit(store, make_att(), "s1")).node_name == "gpu-1"


async def test_check_gets_the_existing_record(store: Store) -> None:
    seen: list[NodeRecord | None] = []
    first = await commit(store, make_att(), "s1", check=seen.append)
    await commit(store, make_att(serial="02"), "s2", "renew", check=seen.append)
    assert seen == [None, first]


async def test_ek_bound_to_another_name_conflicts(backend: Backend, store: Store) -> None:
    await commit(store, make_att("gpu-1", EK_A), "s1")
    with pytest.raises(NodeNameConflict, match="gpu-1"):
        await commit(store, make_att("gpu-2", EK_A), "s2")
    assert await store.get("gpu-2") is None
    assert not await store.session_used("s2")
    # an EK that differs in its last digit is another TPM (the kubernetes store's label holds 63)
    other = EK_A[:63] + "f"
    assert (await commit(store, make_att("gpu-3", other), "s3")).ek_sha256 == other
    # another EK under the same name is the caller's decision (check); allowing it re-binds
    rec = await commit(store, make_att("gpu-1", EK_B, serial="02"), "s4")
    assert rec.ek_sha256 == EK_B
    if not backend.sqlite:
        # The kubernetes store's claim on the old EK (a Lease held by gpu-1) is only taken over
        # once it is stale: until then it may be a join in progress. sqlite frees the EK at once.
        with pytest.raises(NodeNameConflict, match="right now"):
            await commit(store, make_att("gpu-2", EK_A), "s5")
        backend.clock.now += CLAIM_STALE
    assert (await commit(store, make_att("gpu-2", EK_A), "s5")).ek_sha256 == EK_A


async def test_session_check_comes_first(backend: Backend, store: Store) -> None:
    await commit(store, make_att("gpu-1", EK_A), "s1")
    # A session belongs to one node name. sqlite keeps one table of used sessions; the kubernetes
    # store records a session on its node's object and looks for it there, so under another
    # name the EK check is the one that refuses.
    with pytest.raises(SessionReused if backend.sqlite else NodeNameConflict):
        await commit(store, make_att("gpu-2", EK_A), "s1")


# -- admin operations, audit, prune ---------------------------------------------------------------


async def test_revoke_unrevoke_forget_and_audit(backend: Backend, store: Store) -> None:
    await commit(store, make_att("gpu-1"), "s1")
    await commit(store, make_att("gpu-2", EK_B), "s2")
    await store.record_refusal("gpu-1", "node_name_conflict", "x" * 5000)
    await store.record_refusal("gpu-3", "proof_invalid", "no record for this one")
    rec = await store.revoke("gpu-1", actor="alice", reason="lost in transit")
    assert rec.revoked
    assert (await store.revoke("gpu-1", actor="bob", reason="found", revoked=False)).revoked is False
    with pytest.raises(KeyError):
        await store.revoke("ghost", actor="alice", reason="?")
    assert await store.forget("gpu-1", actor="alice", reason="re-imaged")
    assert not await store.forget("gpu-1", actor="alice", reason="again")
    assert await store.get("gpu-1") is None
    assert [r.node_name for r in await store.list_nodes()] == ["gpu-2"]
    with pytest.raises(KeyError):
        await store.revoke("gpu-1", actor="alice", reason="gone")
    assert await store.session_used("s1", node_name="gpu-1")  # used sessions outlive the binding

    entries = await store.audit()
    # A refusal for a name without a record: sqlite keeps it (prune caps the table); the
    # kubernetes store only logs it, so unauthenticated callers cannot create objects in etcd.
    unknown = [("gpu-3", "refused", "node")] if backend.sqlite else []
    assert [(e.node_name, e.action, e.actor) for e in entries] == [
        ("gpu-1", "forget", "alice"),
        ("gpu-1", "unrevoke", "bob"),
        ("gpu-1", "revoke", "alice"),
        *unknown,
        ("gpu-1", "refused", "node"),
        ("gpu-2", "join", "node"),
        ("gpu-1", "join", "node"),
    ]
    assert [e.at for e in entries] == sorted((e.at for e in entries), reverse=True)
    refusal = entries[-3]
    assert refusal.code == "node_name_conflict"
    assert len(refusal.detail) == 1024
    assert entries[2].detail == "lost in transit"
    if backend.sqlite:
        assert [(e.code, e.detail) for e in await store.audit("gpu-3")] == [
            ("proof_invalid", "no record for this one")
        ]
    else:
        assert await store.audit("gpu-3") == []
    assert [e.action for e in await store.audit("gpu-1", limit=2)] == ["forget", "unrevoke"]
    assert await store.audit("gpu-1", limit=0) == []
    assert await store.audit("ghost") == []

    # a replay of an old session is still refused; the name and the EK are free again; the
    # audit trail stayed
    with pytest.raises(SessionReused):
        await commit(store, make_att("gpu-1", EK_A), "s1")
    assert (await commit(store, make_att("gpu-9", EK_A), "s3")).node_name == "gpu-9"
    assert len(await store.audit("gpu-1")) == 5
    rec = await commit(store, make_att("gpu-1", "c" * 64, serial="09"), "s9")
    assert rec.svid_serials == ("09",)
    assert not rec.revoked
    assert len(await store.audit("gpu-1")) == 6


async def test_prune_drops_expired_sessions_only(store: Store) -> None:
    for i, exp in enumerate(
        [T0 + timedelta(seconds=30), T0 + timedelta(seconds=40), T0 + timedelta(seconds=90)]
    ):
        await commit(store, make_att(serial=f"{i + 1:02x}"), f"s{i}", "renew", exp=exp)
    await commit(store, make_att("gpu-2", EK_B), "t0", exp=T0 + timedelta(seconds=10))
    assert await store.prune(T0 + timedelta(seconds=60)) == 3
    assert [await store.session_used(s) for s in ("s0", "s1", "s2", "t0")] == [False, False, True, False]
    assert await store.prune(T0 + timedelta(seconds=60)) == 0
    assert await store.get("gpu-1") is not None
    assert await store.get("gpu-2") is not None


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
        {"boot_id": ""},
        {"boot_id": "0F3C1B9E"},  # the kernel writes lowercase
        {"boot_id": "a" * 65},
        {"boot_id": "ab cd"},
        {"measured_boot_class": ""},
        {"measured_boot_class": "x" * 129},
        {"measured_boot_class": "a\nb"},
        {"node_uid": ""},
        {"node_uid": "a b"},
        {"node_uid": "u" * 129},
        {"x509pop_attestation": ""},
        {"x509pop_attestation": "A" * 32},
        {"x509pop_attestation": "a" * 64},
    ],
)
async def test_bad_attestations_are_value_errors(store: Store, change: dict[str, object]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011
        await commit(store, replace(make_att(), **change), "s1")  # type: ignore[arg-type]
    assert await store.list_nodes() == []


async def test_bad_arguments_are_value_errors(store: Store) -> None:
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


# -- property: the store behaves like a dictionary --------------------------------------------

NAMES = ["n1", "n2", "n3"]
EKS = ["1" * 64, "2" * 64, "3" * 64]
ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("commit"),
            st.sampled_from(NAMES),
            st.sampled_from(EKS),
            st.integers(0, 5),
            st.sampled_from(["join", "renew"]),
            st.sampled_from([None, "0f3c1b9e-7a2d-4c55-9e61-2d0b8f7a1c34", "ab-1"]),
        ),
        st.tuples(st.just("revoke"), st.sampled_from(NAMES), st.booleans()),
        st.tuples(st.just("forget"), st.sampled_from(NAMES)),
    ),
    max_size=25,
)


class Model:
    """What the store must be: a dict of records plus the used sessions.

    Two things differ in the kubernetes store (``kube``): a session is recorded on its node's
    object, so a commit only finds it used under the same name (the service never finishes a
    session under another name); and an EK stays claimed by the name that last bound it until that
    name is forgotten or the claim goes stale (CLAIM_STALE, never reached here), so a name that
    re-binds to another EK leaves its old EK refused to other names for that long.
    """

    def __init__(self, *, kube: bool) -> None:
        self.kube = kube
        self.nodes: dict[str, NodeRecord] = {}
        self.sessions: dict[str, set[str]] = {}  # node name -> sessions used under it
        self.claims: dict[str, str] = {}  # EK -> the name holding its claim (kube)

    def used(self, session: str, name: str | None = None) -> bool:
        if name is not None and self.kube:
            return session in self.sessions.get(name, set())
        return any(session in used for used in self.sessions.values())

    def commit(self, att: Attestation, session: str, action: str = "join") -> NodeRecord | type[Exception]:
        if self.used(session, att.node_name):
            return SessionReused
        if any(r.ek_sha256 == att.ek_sha256 and n != att.node_name for n, r in self.nodes.items()):
            return NodeNameConflict
        old = self.nodes.get(att.node_name)
        if self.kube and (old is None or old.ek_sha256 != att.ek_sha256):
            if self.claims.get(att.ek_sha256, att.node_name) != att.node_name:
                return NodeNameConflict
            self.claims[att.ek_sha256] = att.node_name
        if old is not None and old.boot_id is not None and att.boot_id is None:
            return BootIdRequired  # a recorded boot id is never dropped
        # a renewal adds to the serial history; a join starts a new one (it supersedes older SVIDs)
        history = old.svid_serials if old is not None and action == "renew" else ()
        serials = (*history, att.svid_serial)[-MAX_SERIALS:]
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
            att.boot_id,
            att.measured_boot_class,
        )
        self.nodes[att.node_name] = rec
        self.sessions.setdefault(att.node_name, set()).add(session)
        return rec

    def forget(self, name: str) -> bool:
        old = self.nodes.pop(name, None)
        if old is not None and self.claims.get(old.ek_sha256) == name:
            del self.claims[old.ek_sha256]
        return old is not None


async def _run_ops(store: Store, model: Model, steps: list[tuple[object, ...]]) -> None:
    exp = T0 + timedelta(days=1)  # sessions stay live: the kubernetes store drops expired ones on writes
    for i, step in enumerate(steps):
        match step:
            case ("commit", str(name), str(ek), int(s), str(action), boot):
                att = make_att(name, ek, serial=f"{i + 1:x}", at=T0 + timedelta(seconds=i))
                att = replace(att, boot_id=boot, measured_boot_class=f"class-{boot}" if boot else None)
                want = model.commit(att, f"s{s}", action)
                if isinstance(want, NodeRecord):
                    assert await commit(store, att, f"s{s}", action, exp=exp) == want
                else:
                    with pytest.raises(want):
                        await commit(store, att, f"s{s}", action, exp=exp)
            case ("revoke", str(name), bool(flag)):
                if name in model.nodes:
                    model.nodes[name] = replace(model.nodes[name], revoked=flag)
                    assert await store.revoke(name, actor="a", reason="r", revoked=flag) == model.nodes[name]
                else:
                    with pytest.raises(KeyError):
                        await store.revoke(name, actor="a", reason="r", revoked=flag)
            case ("forget", str(name)):
                assert await store.forget(name, actor="a", reason="r") == model.forget(name)
        assert await store.list_nodes() == [model.nodes[n] for n in sorted(model.nodes)]
    for s in range(6):
        assert await store.session_used(f"s{s}") == model.used(f"s{s}")


async def _on_sqlite(steps: list[tuple[object, ...]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = await SqliteStore.open(Path(tmp) / "nodegate.db")
        try:
            await _run_ops(store, Model(kube=False), steps)
        finally:
            await store.close()


async def _on_kube(steps: list[tuple[object, ...]]) -> None:
    # a fresh API server per example: hypothesis runs many examples in one test
    async with ShimEmulator() as emulator, kmock.Server(emulator) as server:
        register(emulator)
        kube = Kube.for_host(str(server.url), timeout=2.0)
        try:
            await _run_ops(KubeStore(kube, clock=Ticker(), backoff=0.0), Model(kube=True), steps)
        finally:
            await kube.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=ops)
@pytest.mark.parametrize("kind", KINDS)
def test_store_matches_a_model(kind: str, steps: list[tuple[object, ...]]) -> None:
    asyncio.run(_on_sqlite(steps) if kind == "sqlite" else _on_kube(steps))


# -- disk-key events (docs/disk-keys.md) -------------------------------------------------------------


async def test_a_disk_release_marks_its_session_used_once_and_is_audited(backend: Backend) -> None:
    store = await backend.open()
    other = await backend.open()  # a second replica on the same state
    await commit(store, make_att("gpu-1"), "s1")
    exp = T0 + timedelta(minutes=1)
    detail = "volume=6f1d2a3b-4c5d-4e6f-8a9b-0c1d2e3f4a5b version=1"
    assert await store.record_disk(
        "gpu-1", action="disk-release", actor="node", detail=detail, session_id="d1", session_expires_at=exp
    )
    with pytest.raises(SessionReused):
        await other.record_disk(
            "gpu-1",
            action="disk-release",
            actor="node",
            detail=detail,
            session_id="d1",
            session_expires_at=exp,
        )
    assert await other.session_used("d1", node_name="gpu-1")
    with pytest.raises(SessionReused):  # a join may not finish on a release's session either
        await commit(other, make_att("gpu-1", serial="02"), "d1", "renew")
    await store.record_disk("gpu-1", action="disk-revoke", actor="alice", detail="stolen")
    assert [(e.action, e.actor, e.detail) for e in await other.audit("gpu-1", limit=3)] == [
        ("disk-revoke", "alice", "stolen"),
        ("disk-release", "node", detail),
        ("join", "node", "spiffe_id=spiffe://example.org/node/gpu-1 serial=01"),
    ]


async def test_disk_events_for_a_node_without_a_record(backend: Backend, store: Store) -> None:
    # sqlite keeps a trail for any name (a recovery of a forgotten node is audited); the kubernetes
    # store keeps it on the node's object and says it could not.
    recorded = await store.record_disk("gone-1", action="disk-recover", actor="alice", detail="lost node")
    assert recorded is backend.sqlite
    assert [e.action for e in await store.audit("gone-1")] == (["disk-recover"] if backend.sqlite else [])


async def test_disk_events_refuse_other_actions_and_half_a_session(store: Store) -> None:
    with pytest.raises(ValueError, match="action"):
        await store.record_disk("gpu-1", action="join", actor="node", detail="")
    with pytest.raises(ValueError, match="session"):
        await store.record_disk("gpu-1", action="disk-release", actor="node", detail="", session_id="x")


# -- boot records (issue 43) ------------------------------------------------------------------------


async def test_the_boot_record_and_its_dbx_round_trip_and_each_commit_replaces_it(backend: Backend) -> None:
    store = await backend.open()
    first = bootrecords.synthetic()
    dbx_id = next(iter(first.dbx))
    att = replace(make_att(), boot_record=first.record, dbx=tuple(first.dbx.items()))
    rec = await commit(store, att, "s1")
    assert rec.boot_record == first.record
    assert await store.get("gpu-1") == rec
    assert await store.dbx_digests([dbx_id, "f" * 64]) == first.dbx  # an unknown identity: left out
    second = bootrecords.synthetic(el.boot(kernel="/vmlinuz-6.9 ro"), boot_id="ab-1")
    later = replace(make_att(serial="02", at=T0 + timedelta(minutes=5)), boot_record=second.record)
    renewed = await commit(store, later, "s2", "renew")
    assert renewed.boot_record == second.record
    without = await commit(store, make_att(serial="03", at=T0 + timedelta(minutes=6)), "s3", "renew")
    assert without.boot_record is None  # the record is what the latest attestation showed
    await store.close()
    again = await backend.open()
    assert await again.get("gpu-1") == without
    assert await again.dbx_digests([dbx_id]) == first.dbx  # kept once, by identity, for good


async def test_a_quarantine_holds_until_a_new_boot_is_accepted(backend: Backend) -> None:
    """``nodegate nodes quarantine``: audited; a renewal of the same boot (the TPM's resetCount
    unchanged) keeps it; the first accepted attestation of a new boot releases it, and says so."""
    store = await backend.open()
    await commit(store, make_att(), "s1")
    held = await store.quarantine("gpu-1", actor="alice", reason="shim CVE-2023-40547")
    assert held.quarantine is not None
    assert (held.quarantine.reason, held.quarantine.actor, held.quarantine.reset_count) == (
        "shim CVE-2023-40547",
        "alice",
        C0.reset_count,
    )
    assert await store.get("gpu-1") == held
    same_boot = make_att(serial="02", counters=Counters(C0.reset_count, 0, 200), at=T0 + timedelta(minutes=5))
    renewed = await commit(store, same_boot, "s2", "renew")
    assert renewed.quarantine == held.quarantine
    new_boot = make_att(
        serial="03", counters=Counters(C0.reset_count + 1, 0, 10), at=T0 + timedelta(minutes=9)
    )
    released = await commit(store, new_boot, "s3", "renew")
    assert released.quarantine is None
    trail = await store.audit("gpu-1")
    assert [(a.action, a.actor) for a in trail[:3]] == [
        ("renew", "node"),
        ("renew", "node"),
        ("quarantine", "alice"),
    ]
    assert "released from quarantine" in trail[0].detail
    assert "released" not in trail[1].detail
    with pytest.raises(KeyError):
        await store.quarantine("gpu-9", actor="alice", reason="x")
    await store.close()
    again = await backend.open()
    assert (await again.get("gpu-1")) == released
