"""The shared store: node records in NodeAttestation objects (see ``objects``), so every replica
of the join service shares them through etcd.

Single use across replicas: a session belongs to one node name, so its id is recorded on that
node's object, and every write carries the resourceVersion it read (a concurrent writer -> 409 ->
re-read, re-check, retry). One EK, one name: a commit first claims the EK (see ``claims``).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Collection
from dataclasses import replace
from datetime import datetime
from typing import Any, Final, TypeVar

from bootstrap.kube import Conflict, Kube, KubeUnavailable, NotFound
from bootstrap.problems import NodeNameConflict, SessionReused
from bootstrap.store.kube.anchors import TrustAnchors
from bootstrap.store.kube.claims import EkClaims
from bootstrap.store.kube.dbx import DbxLeases
from bootstrap.store.kube.objects import (
    ANN_AUDIT,
    ANN_REFUSED_AT,
    ANN_SESSIONS,
    GROUP,
    KIND,
    LABEL_EK,
    PLURAL,
    VERSION,
    Corrupt,
    NodeObject,
    Published,
    Session,
    audit_entry,
    audit_value,
    exhausted,
    field,
    forget_patch,
    parse,
    published_copies,
    published_from,
    read,
    refuse_damaged,
    required_time,
    sessions_json,
    sessions_value,
    status_patch,
    without_unset,
    written_annotations,
)
from bootstrap.store.kube.watched import WatchedNodes
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
    utcnow,
)
from bootstrap.store.records import check_disk_event, commit_detail, quarantined, record_from
from bootstrap.times import rfc3339_exact

__all__ = ["ATTEMPTS", "KubeStore"]

log = logging.getLogger("nodegate.store")
T = TypeVar("T")

ATTEMPTS: Final = 8


class KubeStore:
    """The store in NodeAttestation objects; ``kube`` stays the caller's (close does not close it)."""

    def __init__(
        self,
        kube: Kube,
        *,
        clock: Callable[[], datetime] = utcnow,
        attempts: int = ATTEMPTS,
        backoff: float = 0.02,
        namespace: str = "nodegate",
    ) -> None:
        self._kube = kube
        self._clock = clock
        self._attempts = attempts
        self._backoff = backoff
        self._claims = EkClaims(kube, namespace=namespace, clock=clock, attempts=attempts, pause=self._pause)
        self._anchors = TrustAnchors(kube, namespace=namespace, attempts=attempts, pause=self._pause)
        self._dbx = DbxLeases(kube, namespace=namespace)
        self._watched = WatchedNodes(kube)  # the periodic passes' copy (watched.py)

    # -- plumbing ---------------------------------------------------------------------------------

    async def _unavailable(self, work: Awaitable[T]) -> T:
        try:
            return await work
        except KubeUnavailable as exc:
            raise StoreUnavailable(str(exc)) from None

    async def _pause(self, attempt: int) -> None:
        # jittered and growing: replicas that collided should not collide again in lock step
        await asyncio.sleep(self._backoff * (2**attempt) * random.random())  # noqa: S311  (not a secret)

    async def _read(self, name: str) -> NodeObject | None:
        return await read(self._kube, name)

    async def _list(self, *, label_selector: str | None = None) -> list[dict[str, Any]]:
        items, _rv = await self._kube.list_cluster_objects(
            GROUP, VERSION, PLURAL, label_selector=label_selector
        )
        return items

    async def _patch(self, name: str, patch: dict[str, Any], *, status: bool = False) -> dict[str, Any]:
        return await self._kube.patch_cluster_object(GROUP, VERSION, PLURAL, name, patch, status=status)

    def _audit_value(self, obj: NodeObject | None, action: str, actor: str, code: str, detail: str) -> str:
        return audit_value(obj, audit_entry(self._clock(), action, actor, code, detail))

    def _sessions_value(self, obj: NodeObject | None, extra: Session | None = None) -> str:
        return sessions_value(obj, self._clock(), extra)

    async def _publish(self, name: str, rv: str, pub: Published) -> bool:
        """Write status.attestedAt/expiresAt/bootID/resetCount/nodeUID, guarded by the resourceVersion so
        an older writer cannot overwrite a newer one's status. False when it did not land (the
        next read repairs it)."""
        for attempt in range(self._attempts):
            try:
                await self._patch(name, status_patch(rv, pub), status=True)
            except Conflict:  # the gate (or another replica) wrote meanwhile: publish what is there now
                await self._pause(attempt)
                fresh = await self._kube.get_cluster_object(GROUP, VERSION, PLURAL, name)
                if fresh is None:
                    return False
                rv = str(field(fresh, "metadata").get("resourceVersion", ""))
                try:
                    pub = published_copies(fresh)
                except Corrupt:
                    return False
                continue
            except (NotFound, KubeUnavailable) as exc:
                log.warning("NodeAttestation %s: status not written (%s); a later read repairs it", name, exc)
                return False
            return True
        log.warning("NodeAttestation %s: status still conflicting; a later read repairs it", name)
        return False

    async def _repair(self, obj: NodeObject) -> None:
        if obj.status_behind:
            await self._publish(obj.name, obj.rv, published_from(obj.record))

    def _exhausted(self, name: str) -> StoreUnavailable:
        return exhausted(name, self._attempts)

    # -- reads ------------------------------------------------------------------------------------

    async def get(self, node_name: str) -> NodeRecord | None:
        check_node_name(node_name)

        async def run() -> NodeRecord | None:
            obj = await self._read(node_name)
            if obj is None:
                return None
            refuse_damaged(obj)
            await self._repair(obj)
            return obj.record

        return await self._unavailable(run())

    async def keep_current(self) -> None:
        await self._watched.run()

    async def _objects(self, *, recent: bool) -> list[NodeObject]:
        cached = self._watched.objects() if recent else None
        if cached is not None:
            return cached
        return [parse(raw) for raw in await self._unavailable(self._list())]

    async def list_nodes(self, *, recent: bool = False) -> list[NodeRecord]:
        out = []
        for obj in await self._objects(recent=recent):
            if obj.damaged is not None:  # one damaged object must not hide every other node
                log.warning("%s", obj.damaged)
            elif obj.record is not None:
                out.append(obj.record)
        return sorted(out, key=lambda r: r.node_name)

    async def damaged_nodes(self) -> list[DamagedRecord]:
        objs = [parse(raw) for raw in await self._unavailable(self._list())]
        return sorted(
            (DamagedRecord(o.name, o.damaged) for o in objs if o.damaged is not None),
            key=lambda d: d.node_name,
        )

    async def dbx_digests(self, identities: Collection[str]) -> dict[str, bytes]:
        return await self._unavailable(self._dbx.read([check_dbx_id(i) for i in identities]))

    async def session_used(self, session_id: str, *, node_name: str | None = None) -> bool:
        check_session_id(session_id)
        if node_name is not None:
            check_node_name(node_name)
            obj = await self._unavailable(self._read(node_name))
            return obj is not None and any(s.id == session_id for s in obj.sessions)
        for raw in await self._unavailable(self._list()):
            if any(s.id == session_id for s in parse(raw).sessions):
                return True
        return False

    async def audit(self, node_name: str | None = None, limit: int = 100) -> list[AuditEntry]:
        check_limit(limit)
        if node_name is not None:
            check_node_name(node_name)
            obj = await self._unavailable(self._read(node_name))
            objs = [] if obj is None else [obj]
        else:
            objs = []
            objs = [parse(raw) for raw in await self._unavailable(self._list())]
        entries: list[tuple[datetime, int, AuditEntry]] = []
        for obj in objs:
            for i, e in enumerate(obj.audit):
                try:
                    at = required_time(e["at"], "an audit time")
                except Corrupt:
                    continue
                entries.append(
                    (at, i, AuditEntry(at, obj.name, e["action"], e["actor"], e["code"], e["detail"]))
                )
        entries.sort(key=lambda t: (t[0], t[1]), reverse=True)
        return [e for _at, _i, e in entries[:limit]]

    # -- writes -----------------------------------------------------------------------------------

    async def _ek_taken(self, ek: str, node_name: str) -> str | None:
        for raw in await self._list(label_selector=f"{LABEL_EK}={ek[:63]}"):
            name = str(field(raw, "metadata").get("name", ""))
            if name != node_name and field(raw, "spec").get("ekSha256") == ek:
                return name
        return None

    async def commit(
        self, att: Attestation, *, session_id: str, session_expires_at: datetime, action: str, check: Check
    ) -> NodeRecord:
        check_attestation(att)
        check_session_id(session_id)
        session = Session(session_id, check_time(session_expires_at, "session_expires_at"))
        check_action(action)
        return await self._unavailable(self._commit(att, session, action, check))

    async def _commit(self, att: Attestation, session: Session, action: str, check: Check) -> NodeRecord:
        name = att.node_name
        await self._dbx.keep(att.dbx)  # before the record that names it
        for attempt in range(self._attempts):
            obj = await self._read(name)
            refuse_damaged(obj)  # neither trusted nor overwritten
            if obj is not None and any(s.id == session.id for s in obj.sessions):
                raise SessionReused("this session already finished")
            other = await self._ek_taken(att.ek_sha256, name)
            if other is not None:
                raise NodeNameConflict(f"this TPM is bound to another node name ({other})")
            existing = obj.record if obj else None
            if existing is None or existing.ek_sha256 != att.ek_sha256:
                await self._claims.claim(att.ek_sha256, name)
            check(existing)
            rec = record_from(att, action=action, existing=existing)
            detail = commit_detail(rec, att, existing)
            annotations = written_annotations(
                rec,
                sessions=self._sessions_value(obj, session),
                audit=self._audit_value(obj, action, "node", "", detail),
            )
            labels = {LABEL_EK: att.ek_sha256[:63]}
            spec = {
                "ekSha256": rec.ek_sha256,
                "spiffeId": rec.spiffe_id,
                "revoked": rec.revoked,
                "quarantine": rec.quarantine.to_json() if rec.quarantine is not None else None,
            }
            try:
                if obj is None:
                    body = {
                        "apiVersion": f"{GROUP}/{VERSION}",
                        "kind": KIND,
                        "metadata": {
                            "name": name,
                            "labels": labels,
                            "annotations": without_unset(annotations),
                        },
                        "spec": without_unset(spec),
                    }
                    written = await self._kube.create_cluster_object(GROUP, VERSION, PLURAL, body)
                else:
                    meta = {"resourceVersion": obj.rv, "labels": labels, "annotations": annotations}
                    written = await self._patch(name, {"metadata": meta, "spec": spec})
            except (Conflict, NotFound):  # someone wrote (or deleted) it since we read: start over
                await self._pause(attempt)
                continue
            rv = str(field(written, "metadata").get("resourceVersion", ""))
            await self._publish(name, rv, published_from(rec))
            return rec
        raise self._exhausted(name)

    async def _update(
        self, name: str, build: Callable[[NodeObject], dict[str, Any] | None]
    ) -> tuple[NodeObject, dict[str, Any]] | None:
        """Read, build a patch from what was read (None: nothing to write), write it guarded by
        the resourceVersion; on a conflict start over. Returns (what was read, what was written)."""
        for attempt in range(self._attempts):
            obj = await self._read(name)
            if obj is None:
                return None
            patch = build(obj)
            if patch is None:
                return obj, {}
            patch.setdefault("metadata", {})["resourceVersion"] = obj.rv
            try:
                return obj, await self._patch(name, patch)
            except (Conflict, NotFound):
                await self._pause(attempt)
        raise self._exhausted(name)

    async def record_refusal(self, node_name: str, code: str, detail: str, *, evidence: bool = False) -> None:
        check_node_name(node_name)
        check_code(code)
        text = clip(detail)

        def build(obj: NodeObject) -> dict[str, Any]:
            ann = {ANN_AUDIT: self._audit_value(obj, "refused", "node", code, text)}
            if evidence and obj.record is not None:
                ann[ANN_REFUSED_AT] = rfc3339_exact(self._clock())
            return {"metadata": {"annotations": ann}}

        done = await self._unavailable(self._update(node_name, build))
        if done is None:
            # No object: unauthenticated callers must not be able to create objects in etcd.
            log.info("refused %s: %s", node_name, code)

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
        session = None if checked is None else Session(*checked)

        def build(obj: NodeObject) -> dict[str, Any]:
            refuse_damaged(obj)
            ann = {ANN_AUDIT: self._audit_value(obj, action, actor, "", text)}
            if session is not None:
                if any(s.id == session.id for s in obj.sessions):
                    raise SessionReused("this session already finished")
                ann[ANN_SESSIONS] = self._sessions_value(obj, session)
            return {"metadata": {"annotations": ann}}

        done = await self._unavailable(self._update(node_name, build))
        if done is None:
            log.info("%s %s: no NodeAttestation to record it on", action, node_name)
            return False
        return True

    async def revoke(self, node_name: str, *, actor: str, reason: str, revoked: bool = True) -> NodeRecord:
        check_node_name(node_name)
        check_actor(actor)
        text = clip(reason)
        entry_action = "revoke" if revoked else "unrevoke"

        def build(obj: NodeObject) -> dict[str, Any]:
            refuse_damaged(obj)
            if obj.record is None:
                raise KeyError(node_name)
            ann = {ANN_AUDIT: self._audit_value(obj, entry_action, actor, "", text)}
            return {"metadata": {"annotations": ann}, "spec": {"revoked": revoked}}

        done = await self._unavailable(self._update(node_name, build))
        if done is None:
            raise KeyError(node_name)
        read, _written = done
        assert read.record is not None  # noqa: S101  (build refused a tombstone)
        return replace(read.record, revoked=revoked)

    async def quarantine(self, node_name: str, *, actor: str, reason: str) -> NodeRecord:
        check_node_name(node_name)
        check_actor(actor)
        text = clip(reason)
        held: list[NodeRecord] = []

        def build(obj: NodeObject) -> dict[str, Any]:
            refuse_damaged(obj)
            if obj.record is None:
                raise KeyError(node_name)
            q = quarantined(obj.record, actor=actor, reason=text, at=self._clock())
            held[:] = [replace(obj.record, quarantine=q)]
            ann = {ANN_AUDIT: self._audit_value(obj, "quarantine", actor, "", text)}
            return {"metadata": {"annotations": ann}, "spec": {"quarantine": q.to_json()}}

        done = await self._unavailable(self._update(node_name, build))
        if done is None or not held:
            raise KeyError(node_name)
        return held[0]

    async def forget(self, node_name: str, *, actor: str, reason: str) -> bool:
        check_node_name(node_name)
        check_actor(actor)
        text = clip(reason)

        def build(obj: NodeObject) -> dict[str, Any] | None:
            if obj.record is None and obj.damaged is None:
                return None
            return forget_patch(
                sessions=self._sessions_value(obj), audit=self._audit_value(obj, "forget", actor, "", text)
            )

        async def run() -> bool:
            done = await self._update(node_name, build)
            if done is None:
                return False
            read, written = done
            if written or read.status_set:
                # The gate must not keep seeing an attestation for a machine we no longer know.
                rv = str(field(written, "metadata").get("resourceVersion", "")) if written else read.rv
                if not await self._publish(node_name, rv, Published()):
                    raise StoreUnavailable(f"NodeAttestation {node_name}: the status could not be cleared")
            if read.record is not None:
                await self._claims.release(read.record.ek_sha256, node_name)  # the TPM may join anew
            return bool(written)

        return await self._unavailable(run())

    @property
    def prune_interval(self) -> float:
        # A prune lists every NodeAttestation (tens of MB at 10,000 nodes), and each write of a
        # node's sessions already drops its expired ones (sessions_value): what is left for the
        # prune is a node's last few sessions after it stopped joining, a few hundred bytes.
        return 3600.0

    async def prune(self, now: datetime) -> int:
        cutoff = check_time(now, "now")

        async def run() -> int:
            dropped = 0
            for first in await self._objects(recent=True):
                if first.damaged is not None or not any(s.exp < cutoff for s in first.sessions):
                    continue
                removed: list[int] = []

                def build(obj: NodeObject, removed: list[int] = removed) -> dict[str, Any] | None:
                    keep = [s for s in obj.sessions if s.exp >= cutoff]
                    removed[:] = [len(obj.sessions) - len(keep)]
                    if not removed[0]:
                        return None
                    return {"metadata": {"annotations": {ANN_SESSIONS: sessions_json(keep)}}}

                try:
                    done = await self._update(first.name, build)
                except StoreUnavailable as exc:  # contention on one object: the next prune gets it
                    log.info("%s", exc)
                    continue
                if done is not None and done[1]:
                    dropped += removed[0]
            return dropped

        return await self._unavailable(run())

    async def has_nodes(self) -> bool:
        for raw in await self._unavailable(self._list()):
            if field(raw, "spec").get("ekSha256") not in (None, ""):
                return True
        return False

    async def trust_anchors(self) -> frozenset[str]:
        return await self._unavailable(self._anchors.read())

    async def remember_trust_anchors(self, anchors: frozenset[str]) -> None:
        check_anchors(anchors)
        await self._unavailable(self._anchors.add(anchors))

    async def close(self) -> None:
        return None
