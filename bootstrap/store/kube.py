"""The shared store: NodeAttestation objects (nodegate.io/v1alpha1, cluster scoped, name = node name).

The CRD contract (DESIGN.md) is ``spec: {ekSha256, spiffeId, revoked}`` and ``status: {attestedAt,
expiresAt}``; the gate owns the other status fields and we never touch them (merge patches only
carry our keys). Bookkeeping outside that contract lives in ``nodegate.io/`` annotations on the same
object, so one write carries the binding, the used session and the audit entry together:

- ``ak-public`` (base64), ``counters`` (JSON), ``svid-serials`` (JSON, newest 32),
- ``used-sessions`` (JSON list of ``{id, exp}``, expired entries dropped on every write),
- ``audit`` (JSON, newest 20),
- ``attested-at`` / ``expires-at``: copies of the status fields. The status subresource cannot be
  written in the same request as the spec, so a crash between the two leaves the status behind;
  reads notice (status older than the copies) and re-publish it.

Single use across replicas: a session belongs to one node name, so its id is recorded on that
node's object, and every write carries the resourceVersion it read (a concurrent writer -> 409 ->
re-read, re-check, retry). A forgotten node keeps its object (for the audit trail and the used
sessions) without ``spec.ekSha256``; such a tombstone reads as "no record".

One EK, one name, across replicas: the reverse lookup (this EK bound to another name) is a
label-selector list, which is not a lock, so a commit first *claims* the EK with a Lease named
``ek-<sha256>`` in nodegate's namespace, holder = the node name. A create is atomic (409 for the
second), so of two names racing with one EK only one holds the claim. A claim whose holder has no
record with that EK (a crash between claim and write, or a forgotten node) is taken over, but only
after ``CLAIM_STALE`` (far longer than a commit can take), so a claim in progress is never stolen.
``forget`` deletes the claim.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Final, TypeVar

from bootstrap.kube import Conflict, Kube, KubeUnavailable, NotFound
from bootstrap.problems import NodeNameConflict, SessionReused
from bootstrap.store.model import (
    Attestation,
    AuditEntry,
    Check,
    NodeRecord,
    StoreUnavailable,
    check_action,
    check_actor,
    check_attestation,
    check_code,
    check_counters,
    check_ek,
    check_limit,
    check_node_name,
    check_session_id,
    check_time,
    clip,
    record_from,
    utcnow,
)
from bootstrap.times import micro_time, parse_time, rfc3339_exact

log = logging.getLogger("nodegate.store")
T = TypeVar("T")

GROUP: Final = "nodegate.io"
VERSION: Final = "v1alpha1"
PLURAL: Final = "nodeattestations"
KIND: Final = "NodeAttestation"
LABEL_EK: Final = "nodegate.io/ek-sha256"
ANN_AK: Final = "nodegate.io/ak-public"
ANN_COUNTERS: Final = "nodegate.io/counters"
ANN_SERIALS: Final = "nodegate.io/svid-serials"
ANN_SESSIONS: Final = "nodegate.io/used-sessions"
ANN_AUDIT: Final = "nodegate.io/audit"
ANN_ATTESTED: Final = "nodegate.io/attested-at"
ANN_EXPIRES: Final = "nodegate.io/expires-at"
MAX_AUDIT: Final = 20
MAX_ANNOTATION: Final = 256 * 1024  # the API server's limit for all annotations together
ATTEMPTS: Final = 8
CLAIM_PREFIX: Final = "ek-"
CLAIM_LABEL: Final = "nodegate.io/claim"
CLAIM_STALE: Final = timedelta(minutes=10)


class _Corrupt(Exception):
    pass


def _time(value: object, what: str) -> datetime:
    when = parse_time(value)
    if when is None:
        raise _Corrupt(f"{what} is not an RFC 3339 time with a zone")
    return when


def _opt_claim_time(value: object) -> datetime | None:
    """A claim's acquireTime; an unreadable one counts as stale (a claim must not block forever)."""
    try:
        return _opt_time(value, "acquireTime")
    except _Corrupt:
        return None


def _opt_time(value: object, what: str) -> datetime | None:
    return None if value is None or value == "" else _time(value, what)


def _json(annotations: dict[str, Any], key: str) -> Any:
    text = annotations.get(key)
    if text is None:
        return None
    if not isinstance(text, str) or len(text) > MAX_ANNOTATION:
        raise _Corrupt(f"annotation {key} is not text")
    try:
        return json.loads(text)
    except ValueError:
        raise _Corrupt(f"annotation {key} is not JSON") from None


def _dict(obj: object, key: str) -> dict[str, Any]:
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True, slots=True)
class _Session:
    id: str
    exp: datetime


@dataclass(frozen=True, slots=True)
class _Obj:
    """One NodeAttestation as this store reads it."""

    name: str
    rv: str
    record: NodeRecord | None  # None: no binding (a tombstone, or made by someone else)
    sessions: tuple[_Session, ...]
    audit: tuple[dict[str, str], ...]  # oldest first, as stored
    status_behind: bool  # status attestedAt/expiresAt differ from what the last write published
    status_set: bool  # status carries attestedAt or expiresAt


def _sessions(annotations: dict[str, Any]) -> tuple[_Session, ...]:
    raw = _json(annotations, ANN_SESSIONS)
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _Corrupt(f"annotation {ANN_SESSIONS} is not a list")
    out = []
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            raise _Corrupt(f"annotation {ANN_SESSIONS} has a malformed entry")
        out.append(_Session(item["id"], _time(item.get("exp"), "a used session's expiry")))
    return tuple(out)


def _audit(annotations: dict[str, Any]) -> tuple[dict[str, str], ...]:
    """Lenient: a damaged audit trail is dropped (and replaced on the next write) rather than
    making the node unusable."""
    try:
        raw = _json(annotations, ANN_AUDIT)
    except _Corrupt:
        return ()
    if not isinstance(raw, list):
        return ()
    keys = ("at", "action", "actor", "code", "detail")
    return tuple(
        {k: e[k] for k in keys}
        for e in raw
        if isinstance(e, dict) and all(isinstance(e.get(k), str) for k in keys)
    )


def _record(
    name: str, spec: dict[str, Any], annotations: dict[str, Any], times: tuple[Any, Any]
) -> NodeRecord | None:
    ek = spec.get("ekSha256")
    if ek is None or ek == "":
        return None
    try:
        check_ek(ek)
    except ValueError:
        raise _Corrupt("spec.ekSha256 is not 64 lowercase hex characters") from None
    spiffe = spec.get("spiffeId", "")
    revoked = spec.get("revoked", False)
    if not isinstance(spiffe, str) or not isinstance(revoked, bool):
        raise _Corrupt("spec.spiffeId or spec.revoked has the wrong type")
    ak_text = annotations.get(ANN_AK, "")
    try:
        ak = base64.b64decode(ak_text, validate=True) if isinstance(ak_text, str) else None
    except (binascii.Error, ValueError):
        ak = None
    if ak is None:
        raise _Corrupt(f"annotation {ANN_AK} is not base64")
    raw_counters = _json(annotations, ANN_COUNTERS)
    counters = None
    if raw_counters is not None:
        try:
            if not isinstance(raw_counters, dict):
                raise ValueError("not an object")  # noqa: TRY004,TRY301  (folded into _Corrupt below)
            counters = check_counters(
                (raw_counters.get("resetCount"), raw_counters.get("restartCount"), raw_counters.get("clock"))
            )
        except ValueError:
            raise _Corrupt(f"annotation {ANN_COUNTERS} is malformed") from None
    serials = _json(annotations, ANN_SERIALS) or []
    if not isinstance(serials, list) or not all(isinstance(s, str) for s in serials):
        raise _Corrupt(f"annotation {ANN_SERIALS} is malformed")
    return NodeRecord(
        node_name=name,
        ek_sha256=ek,
        ak_public=ak,
        spiffe_id=spiffe,
        counters=counters,
        attested_at=times[0],
        expires_at=times[1],
        revoked=revoked,
        svid_serials=tuple(serials),
    )


def parse(obj: dict[str, Any]) -> _Obj:
    """Raises StoreUnavailable for an object this store cannot trust (someone edited it badly)."""
    meta = _dict(obj, "metadata")
    name = str(meta.get("name", ""))
    try:
        annotations = _dict(meta, "annotations")
        status = _dict(obj, "status")
        published = (
            _opt_time(status.get("attestedAt"), "status.attestedAt"),
            _opt_time(status.get("expiresAt"), "status.expiresAt"),
        )
        copies = (
            _opt_time(annotations.get(ANN_ATTESTED), ANN_ATTESTED),
            _opt_time(annotations.get(ANN_EXPIRES), ANN_EXPIRES),
        )
        spec = _dict(obj, "spec")
        bound = spec.get("ekSha256") not in (None, "")
        # Prefer the status (an admin may have edited it) unless it is behind our last write.
        behind = (copies[0] is not None and (published[0] is None or published[0] < copies[0])) or (
            copies[1] is not None and published[1] is None
        )
        if not bound:
            behind = published != (None, None)  # a forgotten node must not look attested
        times = copies if behind or published[0] is None else published
        return _Obj(
            name=name,
            rv=str(meta.get("resourceVersion", "")),
            record=_record(name, spec, annotations, times),
            sessions=_sessions(annotations),
            audit=_audit(annotations),
            status_behind=behind,
            status_set=published != (None, None),
        )
    except _Corrupt as exc:
        raise StoreUnavailable(f"NodeAttestation {name}: {exc}; fix or forget it") from None


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
        self._namespace = namespace
        self._clock = clock
        self._attempts = attempts
        self._backoff = backoff

    # -- plumbing ---------------------------------------------------------------------------------

    async def _unavailable(self, work: Awaitable[T]) -> T:
        try:
            return await work
        except KubeUnavailable as exc:
            raise StoreUnavailable(str(exc)) from None

    async def _pause(self, attempt: int) -> None:
        # jittered and growing: replicas that collided should not collide again in lock step
        await asyncio.sleep(self._backoff * (2**attempt) * random.random())  # noqa: S311  (not a secret)

    async def _read(self, name: str) -> _Obj | None:
        raw = await self._kube.get_cluster_object(GROUP, VERSION, PLURAL, name)
        return None if raw is None else parse(raw)

    async def _list(self, *, label_selector: str | None = None) -> list[dict[str, Any]]:
        items, _rv = await self._kube.list_cluster_objects(
            GROUP, VERSION, PLURAL, label_selector=label_selector
        )
        return items

    async def _patch(self, name: str, patch: dict[str, Any], *, status: bool = False) -> dict[str, Any]:
        return await self._kube.patch_cluster_object(GROUP, VERSION, PLURAL, name, patch, status=status)

    def _entry(self, action: str, actor: str, code: str, detail: str) -> dict[str, str]:
        return {
            "at": rfc3339_exact(self._clock()),
            "action": action,
            "actor": actor,
            "code": code,
            "detail": detail,
        }

    @staticmethod
    def _audit_value(obj: _Obj | None, entry: dict[str, str]) -> str:
        return json.dumps([*(obj.audit if obj else ()), entry][-MAX_AUDIT:], separators=(",", ":"))

    def _sessions_value(self, obj: _Obj | None, extra: _Session | None = None) -> str:
        now = self._clock()
        keep = [s for s in (obj.sessions if obj else ()) if s.exp >= now]
        if extra is not None:
            keep.append(extra)
        return json.dumps([{"id": s.id, "exp": rfc3339_exact(s.exp)} for s in keep], separators=(",", ":"))

    async def _publish(self, name: str, rv: str, times: tuple[datetime | None, datetime | None]) -> bool:
        """Write status.attestedAt/expiresAt from our annotation copies, guarded by the
        resourceVersion so an older writer cannot overwrite a newer one's status. False when it
        did not land (the next read repairs it)."""
        for attempt in range(self._attempts):
            patch = {
                "metadata": {"resourceVersion": rv},
                "status": {
                    "attestedAt": rfc3339_exact(times[0]) if times[0] else None,
                    "expiresAt": rfc3339_exact(times[1]) if times[1] else None,
                },
            }
            try:
                await self._patch(name, patch, status=True)
            except Conflict:  # the gate (or another replica) wrote meanwhile: publish what is there now
                await self._pause(attempt)
                fresh = await self._kube.get_cluster_object(GROUP, VERSION, PLURAL, name)
                if fresh is None:
                    return False
                meta, ann = _dict(fresh, "metadata"), _dict(_dict(fresh, "metadata"), "annotations")
                rv = str(meta.get("resourceVersion", ""))
                try:
                    times = (
                        _opt_time(ann.get(ANN_ATTESTED), ANN_ATTESTED),
                        _opt_time(ann.get(ANN_EXPIRES), ANN_EXPIRES),
                    )
                except _Corrupt:
                    return False
                continue
            except (NotFound, KubeUnavailable) as exc:
                log.warning("NodeAttestation %s: status not written (%s); a later read repairs it", name, exc)
                return False
            return True
        log.warning("NodeAttestation %s: status still conflicting; a later read repairs it", name)
        return False

    async def _repair(self, obj: _Obj) -> None:
        if obj.status_behind:
            rec = obj.record
            await self._publish(obj.name, obj.rv, (rec.attested_at, rec.expires_at) if rec else (None, None))

    def _exhausted(self, name: str) -> StoreUnavailable:
        return StoreUnavailable(f"NodeAttestation {name}: still conflicting after {self._attempts} attempts")

    # -- reads ------------------------------------------------------------------------------------

    async def get(self, node_name: str) -> NodeRecord | None:
        check_node_name(node_name)

        async def run() -> NodeRecord | None:
            obj = await self._read(node_name)
            if obj is None:
                return None
            await self._repair(obj)
            return obj.record

        return await self._unavailable(run())

    async def list_nodes(self) -> list[NodeRecord]:
        out = []
        for raw in await self._unavailable(self._list()):
            try:
                rec = parse(raw).record
            except StoreUnavailable as exc:  # one damaged object must not hide every other node
                log.warning("%s", exc)
                continue
            if rec is not None:
                out.append(rec)
        return sorted(out, key=lambda r: r.node_name)

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
            for raw in await self._unavailable(self._list()):
                try:
                    objs.append(parse(raw))
                except StoreUnavailable as exc:
                    log.warning("%s", exc)
        entries: list[tuple[datetime, int, AuditEntry]] = []
        for obj in objs:
            for i, e in enumerate(obj.audit):
                try:
                    at = _time(e["at"], "an audit time")
                except _Corrupt:
                    continue
                entries.append(
                    (at, i, AuditEntry(at, obj.name, e["action"], e["actor"], e["code"], e["detail"]))
                )
        entries.sort(key=lambda t: (t[0], t[1]), reverse=True)
        return [e for _at, _i, e in entries[:limit]]

    # -- writes -----------------------------------------------------------------------------------

    async def _claim_ek(self, ek: str, node_name: str) -> None:
        """Hold the EK's claim for ``node_name`` (see the module docstring), or raise
        NodeNameConflict. Idempotent for the holder."""
        ns, name = self._namespace, f"{CLAIM_PREFIX}{ek}"
        for attempt in range(self._attempts):
            now = self._clock()
            claim: dict[str, Any] = {"holderIdentity": node_name, "acquireTime": micro_time(now)}
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": name, "namespace": ns, "labels": {CLAIM_LABEL: "ek"}},
                "spec": claim,
            }
            try:
                await self._kube.create_lease(ns, body)
            except Conflict:
                pass  # it exists: whose is it?
            else:
                return
            lease = await self._kube.get_lease(ns, name)
            if lease is None:
                continue  # deleted since: create again
            spec = _dict(lease, "spec")
            holder = str(spec.get("holderIdentity") or "")
            if holder == node_name:
                return
            other = await self._read(holder) if holder else None
            if other is not None and other.record is not None and other.record.ek_sha256 == ek:
                raise NodeNameConflict(f"this TPM is bound to another node name ({holder})")
            acquired = _opt_claim_time(spec.get("acquireTime"))
            if acquired is not None and now - acquired < CLAIM_STALE:
                raise NodeNameConflict(
                    f"another node name ({holder}) is joining with this TPM right now; retry later"
                )
            # Stale: its holder never committed (or was forgotten). Take it over, guarded by rv.
            taken = {**lease, "spec": {**spec, **claim}}  # metadata as read: its resourceVersion guards
            try:
                await self._kube.replace_lease(ns, name, taken)
            except (Conflict, NotFound):
                await self._pause(attempt)
                continue
            log.info("EK claim %s taken over from %s by %s", ek[:16], holder or "nobody", node_name)
            return
        raise self._exhausted(name)

    async def _release_claim(self, ek: str, node_name: str) -> None:
        ns, name = self._namespace, f"{CLAIM_PREFIX}{ek}"
        lease = await self._kube.get_lease(ns, name)
        if lease is None or _dict(lease, "spec").get("holderIdentity") != node_name:
            return
        await self._kube.delete_lease(ns, name)

    async def _ek_taken(self, ek: str, node_name: str) -> str | None:
        for raw in await self._list(label_selector=f"{LABEL_EK}={ek[:63]}"):
            name = str(_dict(raw, "metadata").get("name", ""))
            if name != node_name and _dict(raw, "spec").get("ekSha256") == ek:
                return name
        return None

    async def commit(
        self, att: Attestation, *, session_id: str, session_expires_at: datetime, action: str, check: Check
    ) -> NodeRecord:
        check_attestation(att)
        check_session_id(session_id)
        session = _Session(session_id, check_time(session_expires_at, "session_expires_at"))
        check_action(action)
        return await self._unavailable(self._commit(att, session, action, check))

    async def _commit(self, att: Attestation, session: _Session, action: str, check: Check) -> NodeRecord:
        name = att.node_name
        for attempt in range(self._attempts):
            obj = await self._read(name)
            if obj is not None and any(s.id == session.id for s in obj.sessions):
                raise SessionReused("this session already finished")
            other = await self._ek_taken(att.ek_sha256, name)
            if other is not None:
                raise NodeNameConflict(f"this TPM is bound to another node name ({other})")
            existing = obj.record if obj else None
            if existing is None or existing.ek_sha256 != att.ek_sha256:
                await self._claim_ek(att.ek_sha256, name)
            check(existing)
            rec = record_from(
                att,
                revoked=existing.revoked if existing else False,
                serials=existing.svid_serials if existing else (),
            )
            assert rec.counters is not None  # noqa: S101  (record_from sets them)
            c = rec.counters
            detail = f"spiffe_id={rec.spiffe_id} serial={att.svid_serial}"
            annotations = {
                ANN_AK: base64.b64encode(rec.ak_public).decode("ascii"),
                ANN_COUNTERS: json.dumps(
                    {"resetCount": c.reset_count, "restartCount": c.restart_count, "clock": c.clock}
                ),
                ANN_SERIALS: json.dumps(list(rec.svid_serials), separators=(",", ":")),
                ANN_SESSIONS: self._sessions_value(obj, session),
                ANN_AUDIT: self._audit_value(obj, self._entry(action, "node", "", detail)),
                ANN_ATTESTED: rfc3339_exact(att.attested_at),
                ANN_EXPIRES: rfc3339_exact(att.expires_at),
            }
            labels = {LABEL_EK: att.ek_sha256[:63]}
            spec = {"ekSha256": rec.ek_sha256, "spiffeId": rec.spiffe_id, "revoked": rec.revoked}
            try:
                if obj is None:
                    body = {
                        "apiVersion": f"{GROUP}/{VERSION}",
                        "kind": KIND,
                        "metadata": {"name": name, "labels": labels, "annotations": annotations},
                        "spec": spec,
                    }
                    written = await self._kube.create_cluster_object(GROUP, VERSION, PLURAL, body)
                else:
                    meta = {"resourceVersion": obj.rv, "labels": labels, "annotations": annotations}
                    written = await self._patch(name, {"metadata": meta, "spec": spec})
            except (Conflict, NotFound):  # someone wrote (or deleted) it since we read: start over
                await self._pause(attempt)
                continue
            rv = str(_dict(written, "metadata").get("resourceVersion", ""))
            await self._publish(name, rv, (rec.attested_at, rec.expires_at))
            return rec
        raise self._exhausted(name)

    async def _update(
        self, name: str, build: Callable[[_Obj], dict[str, Any] | None]
    ) -> tuple[_Obj, dict[str, Any]] | None:
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

    async def record_refusal(self, node_name: str, code: str, detail: str) -> None:
        check_node_name(node_name)
        check_code(code)
        text = clip(detail)

        def build(obj: _Obj) -> dict[str, Any]:
            ann = {ANN_AUDIT: self._audit_value(obj, self._entry("refused", "node", code, text))}
            return {"metadata": {"annotations": ann}}

        done = await self._unavailable(self._update(node_name, build))
        if done is None:
            # No object: unauthenticated callers must not be able to create objects in etcd.
            log.info("refused %s: %s", node_name, code)

    async def revoke(self, node_name: str, *, actor: str, reason: str, revoked: bool = True) -> NodeRecord:
        check_node_name(node_name)
        check_actor(actor)
        text = clip(reason)
        entry_action = "revoke" if revoked else "unrevoke"

        def build(obj: _Obj) -> dict[str, Any]:
            if obj.record is None:
                raise KeyError(node_name)
            ann = {ANN_AUDIT: self._audit_value(obj, self._entry(entry_action, actor, "", text))}
            return {"metadata": {"annotations": ann}, "spec": {"revoked": revoked}}

        done = await self._unavailable(self._update(node_name, build))
        if done is None:
            raise KeyError(node_name)
        read, _written = done
        assert read.record is not None  # noqa: S101  (build refused a tombstone)
        return replace(read.record, revoked=revoked)

    async def forget(self, node_name: str, *, actor: str, reason: str) -> bool:
        check_node_name(node_name)
        check_actor(actor)
        text = clip(reason)

        def build(obj: _Obj) -> dict[str, Any] | None:
            if obj.record is None:
                return None
            ann: dict[str, Any] = dict.fromkeys(
                (ANN_AK, ANN_COUNTERS, ANN_SERIALS, ANN_ATTESTED, ANN_EXPIRES)
            )
            ann[ANN_SESSIONS] = self._sessions_value(obj)
            ann[ANN_AUDIT] = self._audit_value(obj, self._entry("forget", actor, "", text))
            return {
                "metadata": {"labels": {LABEL_EK: None}, "annotations": ann},
                "spec": {"ekSha256": None, "spiffeId": None, "revoked": None},
            }

        async def run() -> bool:
            done = await self._update(node_name, build)
            if done is None:
                return False
            read, written = done
            if written or read.status_set:
                # The gate must not keep seeing an attestation for a machine we no longer know.
                rv = str(_dict(written, "metadata").get("resourceVersion", "")) if written else read.rv
                if not await self._publish(node_name, rv, (None, None)):
                    raise StoreUnavailable(f"NodeAttestation {node_name}: the status could not be cleared")
            if read.record is not None:
                await self._release_claim(read.record.ek_sha256, node_name)  # the TPM may join anew
            return bool(written)

        return await self._unavailable(run())

    async def prune(self, now: datetime) -> int:
        cutoff = check_time(now, "now")

        async def run() -> int:
            dropped = 0
            for raw in await self._list():
                try:
                    first = parse(raw)
                except StoreUnavailable as exc:
                    log.warning("%s", exc)
                    continue
                if not any(s.exp < cutoff for s in first.sessions):
                    continue
                removed: list[int] = []

                def build(obj: _Obj, removed: list[int] = removed) -> dict[str, Any] | None:
                    keep = [s for s in obj.sessions if s.exp >= cutoff]
                    removed[:] = [len(obj.sessions) - len(keep)]
                    if not removed[0]:
                        return None
                    value = json.dumps(
                        [{"id": s.id, "exp": rfc3339_exact(s.exp)} for s in keep], separators=(",", ":")
                    )
                    return {"metadata": {"annotations": {ANN_SESSIONS: value}}}

                try:
                    done = await self._update(first.name, build)
                except StoreUnavailable as exc:  # contention on one object: the next prune gets it
                    log.info("%s", exc)
                    continue
                if done is not None and done[1]:
                    dropped += removed[0]
            return dropped

        return await self._unavailable(run())

    async def close(self) -> None:
        return None
