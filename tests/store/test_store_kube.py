"""What only the kubernetes store has, against kmock through tests/support/kshim.py: the
NodeAttestation objects it writes, resourceVersion conflicts between replicas, the EK claim
Leases, the status it publishes for the gate, damaged objects. The Store contract itself is
test_contract.py, for both backends."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kmock._internal import enums

from attest.bootrecord.model import BootRecord
from attest.errors import CounterRegressed
from attest.tpm import Counters
from bootstrap.kube import Kube, KubeUnavailable
from bootstrap.problems import NodeNameConflict, NodeRecordDamaged, NodeRevoked, SessionReused
from bootstrap.store import NodeRecord, StoreUnavailable, open_store
from bootstrap.store.kube import (
    ANN_AUDIT,
    ANN_BOOT_ID,
    ANN_BOOT_RECORD,
    ANN_COUNTERS,
    ANN_MEASURED_BOOT_CLASS,
    ANN_SESSIONS,
    LABEL_EK,
    MAX_AUDIT,
    KubeStore,
)
from tests.store.common import C0, EK_A, EK_B, PATH, RES, T0, Ticker, allow, commit, make_att
from tests.support import bootrecords
from tests.support import eventlogs as el
from tests.support.kshim import ShimEmulator

pytestmark = pytest.mark.kmock(cls=ShimEmulator)
G, V = "nodegate.io", "v1alpha1"


class HookedKube(Kube):
    """A Kube that runs ``after_get`` once a read has its answer and before the caller sees it:
    exactly the window in which another replica's write makes the reader's version stale."""

    after_get: Callable[[], Awaitable[None]] | None = None

    async def get_cluster_object(
        self, group: str, version: str, plural: str, name: str
    ) -> dict[str, Any] | None:
        out = await super().get_cluster_object(group, version, plural, name)
        hook, self.after_get = self.after_get, None
        if hook is not None:
            await hook()
        return out

    after_list: Callable[[], Awaitable[None]] | None = None

    async def list_cluster_objects(
        self, group: str, version: str, plural: str, *, label_selector: str | None = None
    ) -> tuple[list[dict[str, Any]], str]:
        out = await super().list_cluster_objects(group, version, plural, label_selector=label_selector)
        hook, self.after_list = self.after_list, None
        if hook is not None:
            await hook()
        return out


@pytest.fixture
async def kubes(kmock: Any) -> AsyncIterator[tuple[HookedKube, HookedKube]]:
    kmock.resources[RES] = {"kind": "NodeAttestation", "namespaced": False}
    a = HookedKube.for_host(str(kmock.url), timeout=2.0)
    b = HookedKube.for_host(str(kmock.url), timeout=2.0)
    yield a, b
    await a.close()
    await b.close()


@pytest.fixture
def stores(kubes: tuple[HookedKube, HookedKube]) -> tuple[KubeStore, KubeStore]:
    """Two replicas of the service sharing one API server."""
    return (
        KubeStore(kubes[0], clock=Ticker(), backoff=0.0),
        KubeStore(kubes[1], clock=Ticker(), backoff=0.0),
    )


@pytest.fixture
def store(stores: tuple[KubeStore, KubeStore]) -> KubeStore:
    return stores[0]


def stored(kmock: Any, name: str = "gpu-1") -> dict[str, Any]:
    raw: dict[str, Any] = kmock.objects[RES, None, name].raw
    return raw


def annotation(kmock: Any, key: str, name: str = "gpu-1") -> Any:
    return json.loads(stored(kmock, name)["metadata"]["annotations"][key])


# -- records ----------------------------------------------------------------------------------


async def test_record_round_trip_and_object_layout(kmock: Any, store: KubeStore) -> None:
    rec = await commit(store, make_att(), "s1")
    assert rec == NodeRecord(
        node_name="gpu-1",
        ek_sha256=EK_A,
        ak_public=b"\x00\x10ak-gpu-1",
        spiffe_id="spiffe://example.org/node/gpu-1",
        counters=C0,
        attested_at=T0,
        expires_at=T0 + timedelta(hours=1),
        revoked=False,
        svid_serials=("01",),
    )
    assert await store.get("gpu-1") == rec
    obj = stored(kmock)
    assert obj["apiVersion"] == "nodegate.io/v1alpha1"
    assert obj["kind"] == "NodeAttestation"
    assert obj["spec"] == {"ekSha256": EK_A, "spiffeId": "spiffe://example.org/node/gpu-1", "revoked": False}
    assert obj["status"] == {
        "attestedAt": "2026-03-01T12:00:00Z",
        "expiresAt": "2026-03-01T13:00:00Z",
        "resetCount": 1,  # no bootID: this attestation reported none
    }
    assert obj["metadata"]["labels"] == {LABEL_EK: EK_A[:63]}
    assert annotation(kmock, ANN_COUNTERS) == {"resetCount": 1, "restartCount": 0, "clock": 100}
    assert [s["id"] for s in annotation(kmock, ANN_SESSIONS)] == ["s1"]
    # every write is a merge patch (never the client's JSON-patch default)
    patches = list(kmock[enums.method.PATCH])
    assert patches
    assert all(p.headers["Content-Type"] == "application/merge-patch+json" for p in patches)


async def test_boot_id_and_reset_count_reach_the_status_at_join_and_renewal(
    kmock: Any, store: KubeStore
) -> None:
    """status.bootID and status.resetCount (the gate compares the Node's bootID with the attested
    one) are written with attestedAt/expiresAt; the measured-boot class stays an annotation."""
    boot1, boot2 = "0f3c1b9e-7a2d-4c55-9e61-2d0b8f7a1c34", "5b1d2e3f-0000-4aaa-8bbb-ccccdddd0001"
    await commit(store, replace(make_att(), boot_id=boot1, measured_boot_class="uefi-sb"), "s1")
    obj = stored(kmock)
    assert obj["status"]["bootID"] == boot1
    assert obj["status"]["resetCount"] == 1
    assert obj["metadata"]["annotations"][ANN_BOOT_ID] == boot1
    assert obj["metadata"]["annotations"][ANN_MEASURED_BOOT_CLASS] == "uefi-sb"
    later = T0 + timedelta(minutes=20)
    renewed = replace(make_att(serial="02", at=later, counters=Counters(2, 0, 5)), boot_id=boot2)
    rec = await commit(store, renewed, "s2", "renew")
    assert (rec.boot_id, rec.measured_boot_class) == (boot2, None)
    obj = stored(kmock)
    assert (obj["status"]["bootID"], obj["status"]["resetCount"]) == (boot2, 2)
    assert ANN_MEASURED_BOOT_CLASS not in obj["metadata"]["annotations"]  # the latest reported none
    assert await store.get("gpu-1") == rec


async def test_the_node_uid_reaches_the_status_and_a_lost_status_write_republishes_it(
    kmock: Any, kubes: tuple[HookedKube, HookedKube], store: KubeStore
) -> None:
    """status.nodeUID (the gate holds a Node of another uid) is published with attestedAt, from
    the nodegate.io/node-uid annotation; forget clears both."""
    uid = "5f0c9a3e-1b2d-4c6e-8f7a-9b0c1d2e3f4a"
    await commit(store, replace(make_att(), node_uid=uid), "s1")
    obj = stored(kmock)
    assert obj["status"]["nodeUID"] == uid
    assert obj["metadata"]["annotations"]["nodegate.io/node-uid"] == uid
    real = Kube.patch_cluster_object

    async def no_status(self: Kube, *args: Any, status: bool = False) -> dict[str, Any]:
        if status:
            raise KubeUnavailable("crash")
        return await real(self, *args, status=status)

    kubes[0].patch_cluster_object = no_status.__get__(kubes[0])  # type: ignore[method-assign]
    other = "8a7b6c5d-4e3f-4a1b-9c8d-7e6f5a4b3c2d"
    await commit(
        store, replace(make_att(serial="02", at=T0 + timedelta(minutes=30)), node_uid=other), "s2", "renew"
    )
    assert stored(kmock)["status"]["nodeUID"] == uid  # behind
    del kubes[0].patch_cluster_object
    await store.get("gpu-1")
    assert stored(kmock)["status"]["nodeUID"] == other
    assert await store.forget("gpu-1", actor="alice", reason="re-imaged")
    assert (stored(kmock).get("status") or {}).get("nodeUID") is None
    assert "nodegate.io/node-uid" not in stored(kmock)["metadata"]["annotations"]


async def test_a_forgotten_node_loses_its_boot_status(kmock: Any, store: KubeStore) -> None:
    await commit(store, replace(make_att(), boot_id="ab-12"), "s1")
    assert await store.forget("gpu-1", actor="alice", reason="re-imaged")
    status = stored(kmock).get("status") or {}
    assert {k: v for k, v in status.items() if v is not None} == {}
    assert ANN_BOOT_ID not in stored(kmock)["metadata"]["annotations"]


async def test_a_lost_status_write_republishes_the_boot_id(
    kmock: Any, kubes: tuple[HookedKube, HookedKube], store: KubeStore
) -> None:
    await commit(store, make_att(), "s1")
    real = Kube.patch_cluster_object

    async def no_status(self: Kube, *args: Any, status: bool = False) -> dict[str, Any]:
        if status:
            raise KubeUnavailable("crash")
        return await real(self, *args, status=status)

    kubes[0].patch_cluster_object = no_status.__get__(kubes[0])  # type: ignore[method-assign]
    later = T0 + timedelta(minutes=30)
    await commit(store, replace(make_att(serial="02", at=later), boot_id="cafe-01"), "s2", "renew")
    assert "bootID" not in stored(kmock)["status"]
    del kubes[0].patch_cluster_object
    await store.get("gpu-1")
    assert stored(kmock)["status"]["bootID"] == "cafe-01"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("nodegate.io/boot-id", "NOT A BOOT ID"),
        ("nodegate.io/measured-boot-class", "x" * 129),
        ("nodegate.io/node-uid", "not a uid"),
    ],
)
async def test_a_damaged_boot_annotation_is_not_trusted(
    kmock: Any, store: KubeStore, key: str, value: str
) -> None:
    await commit(store, make_att(), "s1")
    kmock.objects[RES, None, "gpu-1"].patch({"metadata": {"annotations": {key: value}}})
    with pytest.raises(NodeRecordDamaged, match="gpu-1"):
        await store.get("gpu-1")


async def test_list_nodes_and_open_store(kubes: tuple[HookedKube, HookedKube], tmp_path: Path) -> None:
    store = await open_store("kubernetes", state_dir=tmp_path, kube=kubes[0])
    assert isinstance(store, KubeStore)
    assert await store.list_nodes() == []
    exp = T0 + timedelta(days=3650)  # this store uses the real clock
    for name, ek in (("gpu-2", EK_B), ("gpu-1", EK_A)):
        await store.commit(
            make_att(name, ek), session_id=f"s-{name}", session_expires_at=exp, action="join", check=allow
        )
    assert [r.node_name for r in await store.list_nodes()] == ["gpu-1", "gpu-2"]
    await store.close()


async def test_the_audit_annotation_keeps_the_newest(kmock: Any, store: KubeStore) -> None:
    """The audit trail lives on the node's object, the newest MAX_AUDIT entries (sqlite keeps a
    table that prune caps: test_store.py)."""
    await commit(store, make_att(), "s1")
    for i in range(2, MAX_AUDIT + 5):
        at = T0 + timedelta(seconds=i)
        await commit(
            store, make_att(serial=f"{i:x}", counters=Counters(1, 0, 100 + i), at=at), f"s{i}", "renew"
        )
    assert len(annotation(kmock, ANN_AUDIT)) == MAX_AUDIT
    assert len(await store.audit("gpu-1")) == MAX_AUDIT


# -- single use and serialisation across replicas -----------------------------------------------


async def test_first_join_on_two_replicas_wins_once(kmock: Any, stores: tuple[KubeStore, KubeStore]) -> None:
    a, b = stores
    results = await asyncio.gather(
        commit(a, make_att(serial="0a"), "shared"),
        commit(b, make_att(serial="0b"), "shared"),
        return_exceptions=True,
    )
    assert sum(isinstance(r, NodeRecord) for r in results) == 1, results
    assert sum(isinstance(r, SessionReused) for r in results) == 1
    posts = [r for r in kmock[enums.method.POST] if r.resource.plural == "nodeattestations"]
    assert len(posts) == 2  # both created; one got 409 and re-read


async def test_two_names_racing_with_one_ek_bind_one(
    kmock: Any, kubes: tuple[HookedKube, HookedKube], stores: tuple[KubeStore, KubeStore]
) -> None:
    """Replica B binds gpu-2 to the EK after replica A's reverse lookup found nothing: the EK
    claim (a Lease, created atomically) still refuses A's gpu-1."""
    a, b = stores
    won: list[NodeRecord] = []

    async def other_replica() -> None:
        won.append(await commit(b, make_att("gpu-2"), "s-b"))

    kubes[0].after_list = other_replica
    with pytest.raises(NodeNameConflict, match="gpu-2"):
        await commit(a, make_att("gpu-1"), "s-a")
    assert [r.node_name for r in won] == ["gpu-2"]
    assert await a.get("gpu-1") is None
    lease = kmock.objects["coordination.k8s.io/v1/leases", "nodegate", f"ek-{EK_A}"].raw
    assert lease["spec"]["holderIdentity"] == "gpu-2"


async def test_a_stale_ek_claim_is_taken_over_a_young_one_is_not(kmock: Any, store: KubeStore) -> None:
    async def claim(holder: str, at: datetime, ek: str) -> None:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": f"ek-{ek}", "namespace": "nodegate"},
            "spec": {"holderIdentity": holder, "acquireTime": at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")},
        }
        await store._kube.create_lease("nodegate", body)

    await claim("ghost", T0 - timedelta(hours=1), EK_A)  # a crash between claim and write, long ago
    assert (await commit(store, make_att("gpu-1"), "s1")).node_name == "gpu-1"
    lease = kmock.objects["coordination.k8s.io/v1/leases", "nodegate", f"ek-{EK_A}"].raw
    assert lease["spec"]["holderIdentity"] == "gpu-1"
    await claim("gpu-9", T0, EK_B)  # another name's join in progress right now
    with pytest.raises(NodeNameConflict, match="right now"):
        await commit(store, make_att("gpu-2", EK_B), "s2")


async def test_forget_releases_the_ek_claim(kmock: Any, store: KubeStore) -> None:
    await commit(store, make_att("gpu-1"), "s1")
    with pytest.raises(NodeNameConflict):
        await commit(store, make_att("gpu-2"), "s2")
    assert await store.forget("gpu-1", actor="alice", reason="re-imaged as gpu-2")
    assert ("coordination.k8s.io/v1/leases", "nodegate", f"ek-{EK_A}") not in kmock.objects
    assert (await commit(store, make_att("gpu-2"), "s3")).node_name == "gpu-2"


async def test_stale_version_rereads_and_rechecks(
    kmock: Any, kubes: tuple[HookedKube, HookedKube], stores: tuple[KubeStore, KubeStore]
) -> None:
    a, b = stores
    await commit(a, make_att(), "s0")
    seen: list[Counters | None] = []

    def monotonic(existing: NodeRecord | None) -> None:
        seen.append(existing.counters if existing else None)

    async def other_replica_renews() -> None:
        await commit(b, make_att(serial="bb", counters=Counters(1, 0, 200)), "s-b", "renew")

    kubes[0].after_get = other_replica_renews
    rec = await commit(a, make_att(serial="aa", counters=Counters(1, 0, 300)), "s-a", "renew", monotonic)
    assert seen == [C0, Counters(1, 0, 200)]  # check ran again on the fresh record
    assert rec.svid_serials == ("01", "bb", "aa")
    assert [s["id"] for s in annotation(kmock, ANN_SESSIONS)] == ["s0", "s-b", "s-a"]


async def test_stale_version_with_the_same_session_is_reused(
    kmock: Any, kubes: tuple[HookedKube, HookedKube], stores: tuple[KubeStore, KubeStore]
) -> None:
    a, b = stores
    await commit(a, make_att(), "s0")

    async def other_replica_finishes_it() -> None:
        await commit(b, make_att(serial="bb"), "shared", "renew")

    kubes[0].after_get = other_replica_finishes_it
    with pytest.raises(SessionReused):
        await commit(a, make_att(serial="aa"), "shared", "renew")
    rec = await a.get("gpu-1")
    assert rec is not None
    assert rec.svid_serials == ("01", "bb")


async def test_a_check_that_fails_after_a_conflict_writes_nothing(
    kmock: Any, kubes: tuple[HookedKube, HookedKube], stores: tuple[KubeStore, KubeStore]
) -> None:
    a, b = stores
    await commit(a, make_att(), "s0")

    def no_regression(existing: NodeRecord | None) -> None:
        if existing and existing.counters and existing.counters > Counters(1, 0, 150):
            raise CounterRegressed("counters went back")

    async def other_replica_renews() -> None:
        await commit(b, make_att(serial="bb", counters=Counters(1, 0, 200)), "s-b", "renew")

    kubes[0].after_get = other_replica_renews
    with pytest.raises(CounterRegressed):
        await commit(a, make_att(serial="aa", counters=Counters(1, 0, 150)), "s-a", "renew", no_regression)
    assert not await a.session_used("s-a", node_name="gpu-1")


async def test_endless_conflicts_are_unavailable(kmock: Any, kubes: tuple[HookedKube, HookedKube]) -> None:
    b = KubeStore(kubes[1], clock=Ticker(), backoff=0.0)
    a = KubeStore(kubes[0], clock=Ticker(), backoff=0.0, attempts=3)
    await commit(a, make_att(), "s0")
    n = [0]

    async def again() -> None:
        n[0] += 1
        await commit(b, make_att(serial=f"{n[0]:02x}"), f"b{n[0]}", "renew")
        if n[0] < 5:
            kubes[0].after_get = again

    kubes[0].after_get = again
    with pytest.raises(StoreUnavailable, match="conflicting after 3 attempts"):
        await commit(a, make_att(serial="aa"), "s-a", "renew")


async def test_ek_bound_to_another_name_conflicts(kmock: Any, store: KubeStore) -> None:
    await commit(store, make_att("gpu-1", EK_A), "s1")
    with pytest.raises(NodeNameConflict, match="gpu-1"):
        await commit(store, make_att("gpu-2", EK_A), "s2")
    assert (RES, None, "gpu-2") not in kmock.objects
    assert kmock[enums.action.LIST][-1].params["labelSelector"] == f"{LABEL_EK}={EK_A[:63]}"
    # a label match alone (first 63 hex digits) is not a binding
    other = EK_A[:63] + "f"
    assert (await commit(store, make_att("gpu-3", other), "s3")).ek_sha256 == other


async def test_a_failed_check_creates_no_object(kmock: Any, store: KubeStore) -> None:
    def refuse(_existing: NodeRecord | None) -> None:
        raise NodeRevoked("revoked")

    with pytest.raises(NodeRevoked):
        await commit(store, make_att(), "s1", check=refuse)
    assert (RES, None, "gpu-1") not in kmock.objects
    assert not await store.session_used("s1")


# -- status: the gate's fields, crash repair ----------------------------------------------------


async def test_gate_status_fields_are_preserved(kmock: Any, store: KubeStore) -> None:
    await commit(store, make_att(), "s1")
    kmock.objects[RES, None, "gpu-1"].patch(
        {"status": {"phase": "Held", "reason": "packages-pending", "packages": [{"cr": "x"}]}}
    )
    later = T0 + timedelta(minutes=30)
    await commit(store, make_att(serial="02", at=later), "s2", "renew")
    await store.revoke("gpu-1", actor="alice", reason="r")
    status = stored(kmock)["status"]
    assert status == {
        "phase": "Held",
        "reason": "packages-pending",
        "packages": [{"cr": "x"}],
        "attestedAt": "2026-03-01T12:30:00Z",
        "expiresAt": "2026-03-01T13:30:00Z",
        "resetCount": 1,
    }


async def test_status_lost_in_a_crash_is_repaired_on_read(
    kmock: Any, kubes: tuple[HookedKube, HookedKube], store: KubeStore
) -> None:
    await commit(store, make_att(), "s1")
    calls: list[bool] = []
    real = Kube.patch_cluster_object

    async def no_status(self: Kube, *args: Any, status: bool = False) -> dict[str, Any]:
        calls.append(status)
        if status:
            raise KubeUnavailable("crash")
        return await real(self, *args, status=status)

    later = T0 + timedelta(minutes=30)
    kubes[0].patch_cluster_object = no_status.__get__(kubes[0])  # type: ignore[method-assign]
    rec = await commit(store, make_att(serial="02", at=later), "s2", "renew")
    assert calls == [False, True]
    assert stored(kmock)["status"]["attestedAt"] == "2026-03-01T12:00:00Z"  # behind
    del kubes[0].patch_cluster_object
    assert await store.get("gpu-1") == rec  # the annotation copies win over a stale status
    assert stored(kmock)["status"]["attestedAt"] == "2026-03-01T12:30:00Z"  # and it was re-published


async def test_status_edited_by_an_admin_wins(kmock: Any, store: KubeStore) -> None:
    await commit(store, make_att(), "s1")
    kmock.objects[RES, None, "gpu-1"].patch({"status": {"expiresAt": "2026-03-01T12:05:00Z"}})
    rec = await store.get("gpu-1")
    assert rec is not None
    assert rec.expires_at == T0 + timedelta(minutes=5)


# -- admin operations, audit, prune ---------------------------------------------------------------


async def test_revoke_and_forget_leave_a_tombstone(kmock: Any, store: KubeStore) -> None:
    await commit(store, make_att("gpu-1"), "s1")
    await store.record_refusal("ghost", "proof_invalid", "no object for this one")
    assert (RES, None, "ghost") not in kmock.objects  # refusals never create objects
    assert (await store.revoke("gpu-1", actor="alice", reason="lost")).revoked
    assert stored(kmock)["spec"]["revoked"] is True
    assert not (await store.revoke("gpu-1", actor="bob", reason="found", revoked=False)).revoked
    assert stored(kmock)["spec"]["revoked"] is False

    kmock.objects[RES, None, "gpu-1"].patch({"status": {"phase": "Ready"}})
    assert await store.forget("gpu-1", actor="alice", reason="re-imaged")
    obj = stored(kmock)  # the object stays as a tombstone: audit and used sessions kept
    assert "ekSha256" not in obj["spec"]
    assert LABEL_EK not in obj["metadata"].get("labels", {})
    assert obj["status"] == {"phase": "Ready"}  # not attested any more, the gate's field kept
    assert await store.session_used("s1", node_name="gpu-1")
    assert len(await store.audit("gpu-1")) == 4

    rec = await commit(store, make_att("gpu-1", "c" * 64, serial="09"), "s9")
    assert rec.svid_serials == ("09",)
    assert stored(kmock)["status"]["phase"] == "Ready"


async def test_prune_rewrites_the_sessions_annotation(kmock: Any, store: KubeStore) -> None:
    for i, exp in enumerate(
        [T0 + timedelta(seconds=30), T0 + timedelta(seconds=40), T0 + timedelta(hours=1)]
    ):
        await commit(store, make_att(serial=f"{i + 1:02x}"), f"s{i}", "renew", exp=exp)
    await commit(store, make_att("gpu-2", EK_B), "t0", exp=T0 + timedelta(seconds=10))
    assert await store.prune(T0 + timedelta(minutes=1)) == 3
    assert [s["id"] for s in annotation(kmock, ANN_SESSIONS)] == ["s2"]
    assert annotation(kmock, ANN_SESSIONS, "gpu-2") == []


async def test_writes_drop_expired_sessions(kmock: Any, kubes: tuple[HookedKube, HookedKube]) -> None:
    clock = Ticker()
    store = KubeStore(kubes[0], clock=clock, backoff=0.0)
    await commit(store, make_att(), "s1", exp=T0 + timedelta(seconds=30))
    clock.now = T0 + timedelta(minutes=5)
    await commit(store, make_att(serial="02"), "s2", "renew", exp=T0 + timedelta(minutes=6))
    assert [s["id"] for s in annotation(kmock, ANN_SESSIONS)] == ["s2"]


# -- failures -------------------------------------------------------------------------------------


async def test_unreachable_api_is_unavailable() -> None:
    dead = Kube.for_host("http://127.0.0.1:9", timeout=1.0)
    store = KubeStore(dead, backoff=0.0)
    try:
        with pytest.raises(StoreUnavailable):
            await store.get("gpu-1")
        with pytest.raises(StoreUnavailable):
            await commit(store, make_att(), "s1")
        with pytest.raises(StoreUnavailable):
            await store.list_nodes()
    finally:
        await dead.close()


async def test_api_errors_are_unavailable(kmock: Any, store: KubeStore) -> None:
    kmock[f"get {PATH}/gpu-1"] << 503 << {"kind": "Status", "code": 503, "message": "etcd"}
    with pytest.raises(StoreUnavailable, match="503"):
        await commit(store, make_att(), "s1")


async def test_damaged_objects_are_refused_not_trusted(kmock: Any, store: KubeStore) -> None:
    await commit(store, make_att("gpu-1"), "s1")
    await commit(store, make_att("gpu-2", EK_B), "s2")
    kmock.objects[RES, None, "gpu-1"].patch({"metadata": {"annotations": {ANN_SESSIONS: "{not json"}}})
    with pytest.raises(NodeRecordDamaged, match="gpu-1"):
        await store.get("gpu-1")
    with pytest.raises(NodeRecordDamaged, match="gpu-1"):
        await commit(store, make_att("gpu-1", serial="02"), "s3", "renew")
    assert [r.node_name for r in await store.list_nodes()] == ["gpu-2"]  # one bad object hides no other
    assert [d.node_name for d in await store.damaged_nodes()] == ["gpu-1"]
    kmock.objects[RES, None, "gpu-2"].patch({"metadata": {"annotations": {ANN_AUDIT: "[1, 2"}}})
    assert (await store.get("gpu-2")) is not None  # a damaged audit trail is only dropped
    kmock.objects[RES, None, "gpu-2"].patch({"spec": {"ekSha256": "XYZ"}})
    with pytest.raises(NodeRecordDamaged, match="ekSha256"):
        await store.get("gpu-2")


async def test_objects_made_elsewhere_read_without_bookkeeping(kmock: Any, store: KubeStore) -> None:
    kmock.objects[RES, None, "gpu-7"] = {
        "apiVersion": f"{G}/{V}",
        "kind": "NodeAttestation",
        "metadata": {"name": "gpu-7", "resourceVersion": "7"},
        "spec": {"ekSha256": EK_B, "spiffeId": "spiffe://example.org/node/gpu-7"},
    }
    rec = await store.get("gpu-7")
    assert rec is not None
    assert (rec.ak_public, rec.counters, rec.attested_at, rec.revoked, rec.svid_serials) == (
        b"",
        None,
        None,
        False,
        (),
    )


async def test_a_join_without_boot_id_is_published_when_the_gate_writes_first(
    kmock: Any, kubes: tuple[HookedKube, HookedKube], store: KubeStore
) -> None:
    """Found against the real API server (tests/cluster/test_store.py): the create body carried
    the unset boot-id and measured-boot-class annotations as null, which the API server stores as
    "" (the shim does too now). Every such NodeAttestation then read back damaged, and when the
    gate's status write landed between the create and the store's status publish, the retried
    publish gave up silently: the node stayed held unattested for good."""
    real = Kube.patch_cluster_object
    gate_wrote: list[bool] = []

    async def gate_first(self: Kube, *args: Any, status: bool = False) -> dict[str, Any]:
        if status and not gate_wrote:  # the gate's watch saw the create and wrote its verdict
            gate_wrote.append(True)
            kmock.objects[RES, None, "gpu-1"].patch({"status": {"phase": "Held", "reason": "unattested"}})
            kmock.objects[RES, None, "gpu-1"].patch({"metadata": {"resourceVersion": "999999"}})
        return await real(self, *args, status=status)

    kubes[0].patch_cluster_object = gate_first.__get__(kubes[0])  # type: ignore[method-assign]
    rec = await commit(store, make_att(), "s1")
    del kubes[0].patch_cluster_object
    assert gate_wrote
    annotations = stored(kmock)["metadata"]["annotations"]
    assert "nodegate.io/boot-id" not in annotations
    assert "nodegate.io/measured-boot-class" not in annotations
    status = stored(kmock)["status"]
    assert status["attestedAt"] == "2026-03-01T12:00:00Z"
    assert status["phase"] == "Held"
    assert await store.get("gpu-1") == rec  # not damaged


async def test_empty_boot_annotations_written_by_older_versions_read_as_unset(
    kmock: Any, store: KubeStore
) -> None:
    rec = await commit(store, make_att(), "s1")
    kmock.objects[RES, None, "gpu-1"].patch(
        {"metadata": {"annotations": {"nodegate.io/boot-id": "", "nodegate.io/measured-boot-class": ""}}}
    )
    assert await store.get("gpu-1") == rec
    assert await store.damaged_nodes() == []


# -- boot records (issue 43) ------------------------------------------------------------------------


async def test_the_boot_record_is_published_whole_as_status_boot(kmock: Any, store: KubeStore) -> None:
    """status.boot is a merge patch that replaces the whole record: nothing of an earlier record
    (its EK facts, a PCR bank or index it had) survives into the next one."""
    big = bootrecords.synthetic()
    await commit(store, replace(make_att(), boot_record=big.record), "s1")
    assert BootRecord.model_validate(stored(kmock)["status"]["boot"]) == big.record
    kmock.objects[RES, None, "gpu-1"].patch({"status": {"boot": {"pcrs": {"sha1": {"9": "00" * 20}}}}})
    small = bootrecords.synthetic(el.boot(secure=False), ek=False)
    later = replace(make_att(serial="02", at=T0 + timedelta(minutes=1)), boot_record=small.record)
    await commit(store, later, "s2", "renew")
    boot = stored(kmock)["status"]["boot"]
    assert "ek" not in boot
    assert set(boot["pcrs"]) == {"sha256"}
    assert BootRecord.model_validate(boot) == small.record
    assert (
        BootRecord.model_validate_json(stored(kmock)["metadata"]["annotations"][ANN_BOOT_RECORD])
        == small.record
    )


async def test_a_status_boot_left_behind_is_republished_from_the_annotation(
    kmock: Any, kubes: tuple[HookedKube, HookedKube], store: KubeStore
) -> None:
    built = bootrecords.synthetic()
    rec = await commit(store, replace(make_att(), boot_record=built.record), "s1")
    kmock.objects[RES, None, "gpu-1"].patch({"status": {"attestedAt": None, "boot": None}})
    assert await store.get("gpu-1") == rec
    assert BootRecord.model_validate(stored(kmock)["status"]["boot"]) == built.record


async def test_each_dbx_is_kept_once_in_a_lease_and_a_damaged_one_is_not_at_hand(
    kmock: Any, store: KubeStore
) -> None:
    built = bootrecords.synthetic()
    ((dbx_id, digests),) = built.dbx.items()
    await commit(store, replace(make_att(), boot_record=built.record, dbx=tuple(built.dbx.items())), "s1")
    key = ("coordination.k8s.io/v1/leases", "nodegate", f"nodegate-dbx-{dbx_id}")
    assert kmock.objects[key].raw["metadata"]["labels"] == {"nodegate.io/kind": "dbx"}
    assert await store.dbx_digests([dbx_id]) == {dbx_id: digests}
    kmock.objects[key].patch({"metadata": {"annotations": {"nodegate.io/dbx-digests": "not base64!"}}})
    assert await store.dbx_digests([dbx_id]) == {}


async def test_an_unreadable_boot_record_makes_the_node_record_damaged(kmock: Any, store: KubeStore) -> None:
    await commit(store, replace(make_att(), boot_record=bootrecords.synthetic().record), "s1")
    kmock.objects[RES, None, "gpu-1"].patch(
        {"metadata": {"annotations": {ANN_BOOT_RECORD: '{"version": 9}'}}}
    )
    with pytest.raises(NodeRecordDamaged, match="boot-record"):
        await store.get("gpu-1")
