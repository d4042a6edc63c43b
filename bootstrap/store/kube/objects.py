"""NodeAttestation objects (nodegate.io/v1alpha1, cluster scoped, name = node name) as the
kubernetes store reads and writes them.

The CRD (charts/nodegate/crds/nodeattestations.yaml) is ``spec: {ekSha256, spiffeId, revoked}``
and ``status: {attestedAt, expiresAt, bootID, resetCount, nodeUID}`` as far as this store is concerned;
the gate owns the other status fields and the store never touches them (merge patches only carry
the store's keys). Bookkeeping outside the CRD lives in ``nodegate.io/`` annotations on the same
object, so one write carries the binding, the used session and the audit entry together:

- ``ak-public`` (base64), ``counters`` (JSON), ``svid-serials`` (JSON, newest 32),
- ``boot-id``, ``measured-boot-class``: what the last join or renewal reported (absent: nothing),
- ``node-uid``: the uid of the Node object nodegate labelled at the last join or renewal,
- ``x509pop-attestation``: the attestation fact of its x509pop certificates, and ``refused-at``:
  when its evidence was last refused since (docs/spire.md; absent: none),
- ``boot-record``: the boot record of the last join or renewal (attest.bootrecord, compact JSON),
  published whole as ``status.boot``,
- ``used-sessions`` (JSON list of ``{id, exp}``, expired entries dropped on every write),
- ``audit`` (JSON, newest 20),
- ``attested-at`` / ``expires-at``: copies of the status times. The status subresource cannot be
  written in the same request as the spec, so a crash between the two leaves the status behind;
  reads notice (status older than the copies) and re-publish it, with ``bootID`` (from
  ``boot-id``), ``resetCount`` (from ``counters``) and ``nodeUID`` (from ``node-uid``), which are
  always published together with the times.

A forgotten node keeps its object (for the audit trail and the used sessions) without
``spec.ekSha256``; such a tombstone reads as "no record".
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from attest.bootrecord.model import BootRecord
from attest.tpm import Counters
from bootstrap.kube import Kube
from bootstrap.problems import NodeRecordDamaged
from bootstrap.store.kube.bootstatus import ANN_BOOT_RECORD, BootRecordUnreadable, boot_record, boot_status
from bootstrap.store.model import (
    NodeRecord,
    StoreUnavailable,
    check_boot_id,
    check_counters,
    check_ek,
    check_measured_boot_class,
    check_node_uid,
    check_x509pop_attestation,
    quarantine_of,
)
from bootstrap.times import parse_time, rfc3339_exact

__all__ = [
    "ANN_AK",
    "ANN_BOOT_RECORD",
    "ANN_ATTESTED",
    "ANN_AUDIT",
    "ANN_BOOT_ID",
    "ANN_COUNTERS",
    "ANN_EXPIRES",
    "ANN_MEASURED_BOOT_CLASS",
    "ANN_NODE_UID",
    "ANN_REFUSED_AT",
    "ANN_SERIALS",
    "ANN_SESSIONS",
    "ANN_X509POP_ATTESTATION",
    "GROUP",
    "KIND",
    "LABEL_EK",
    "MAX_ANNOTATION",
    "MAX_AUDIT",
    "PLURAL",
    "VERSION",
    "Corrupt",
    "NodeObject",
    "Published",
    "Session",
    "audit_entry",
    "audit_value",
    "exhausted",
    "field",
    "forget_patch",
    "optional_time",
    "parse",
    "published_copies",
    "published_from",
    "status_patch",
    "read",
    "refuse_damaged",
    "required_time",
    "sessions_json",
    "sessions_value",
    "without_unset",
    "written_annotations",
]

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
ANN_BOOT_ID: Final = "nodegate.io/boot-id"
ANN_MEASURED_BOOT_CLASS: Final = "nodegate.io/measured-boot-class"
ANN_NODE_UID: Final = "nodegate.io/node-uid"
ANN_X509POP_ATTESTATION: Final = "nodegate.io/x509pop-attestation"
ANN_REFUSED_AT: Final = "nodegate.io/refused-at"
MAX_AUDIT: Final = 20
MAX_ANNOTATION: Final = 256 * 1024  # the API server's limit for all annotations together


class Corrupt(Exception):
    """An object this store cannot trust (someone edited it badly)."""


def required_time(value: object, what: str) -> datetime:
    when = parse_time(value)
    if when is None:
        raise Corrupt(f"{what} is not an RFC 3339 time with a zone")
    return when


def optional_time(value: object, what: str) -> datetime | None:
    return None if value is None or value == "" else required_time(value, what)


def field(obj: object, key: str) -> dict[str, Any]:
    """``obj[key]`` when both are objects, else an empty one (API objects are read leniently)."""
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if isinstance(value, dict) else {}


def _json(annotations: dict[str, Any], key: str) -> Any:
    text = annotations.get(key)
    if text is None:
        return None
    if not isinstance(text, str) or len(text) > MAX_ANNOTATION:
        raise Corrupt(f"annotation {key} is not text")
    try:
        return json.loads(text)
    except ValueError:
        raise Corrupt(f"annotation {key} is not JSON") from None


@dataclass(frozen=True, slots=True)
class Session:
    id: str
    exp: datetime


@dataclass(frozen=True, slots=True)
class Published:
    """The status fields this store writes: ``attestedAt``, ``expiresAt``, ``bootID``, ``resetCount``,
    ``nodeUID``, ``boot``."""

    attested_at: datetime | None = None
    expires_at: datetime | None = None
    boot_id: str | None = None
    reset_count: int | None = None
    node_uid: str | None = None
    boot: BootRecord | None = None


@dataclass(frozen=True, slots=True)
class NodeObject:
    """One NodeAttestation as this store reads it."""

    name: str
    rv: str
    record: NodeRecord | None  # None: no binding (a tombstone, or made by someone else)
    sessions: tuple[Session, ...]
    audit: tuple[dict[str, str], ...]  # oldest first, as stored
    status_behind: bool  # status attestedAt/expiresAt differ from what the last write published
    status_set: bool  # status carries one of the fields this store writes
    damaged: str | None = None  # what cannot be read (then record is None): see parse


# -- reading ------------------------------------------------------------------------------------


def _sessions(annotations: dict[str, Any]) -> tuple[Session, ...]:
    raw = _json(annotations, ANN_SESSIONS)
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise Corrupt(f"annotation {ANN_SESSIONS} is not a list")
    out = []
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            raise Corrupt(f"annotation {ANN_SESSIONS} has a malformed entry")
        out.append(Session(item["id"], required_time(item.get("exp"), "a used session's expiry")))
    return tuple(out)


def _audit(annotations: dict[str, Any]) -> tuple[dict[str, str], ...]:
    """Lenient: a damaged audit trail is dropped (and replaced on the next write) rather than
    making the node unusable."""
    try:
        raw = _json(annotations, ANN_AUDIT)
    except Corrupt:
        return ()
    if not isinstance(raw, list):
        return ()
    keys = ("at", "action", "actor", "code", "detail")
    return tuple(
        {k: e[k] for k in keys}
        for e in raw
        if isinstance(e, dict) and all(isinstance(e.get(k), str) for k in keys)
    )


def _counters(annotations: dict[str, Any]) -> Counters | None:
    raw = _json(annotations, ANN_COUNTERS)
    if raw is None:
        return None
    try:
        if not isinstance(raw, dict):
            raise ValueError("not an object")  # noqa: TRY004,TRY301  (folded into Corrupt below)
        return check_counters((raw.get("resetCount"), raw.get("restartCount"), raw.get("clock")))
    except ValueError:
        raise Corrupt(f"annotation {ANN_COUNTERS} is malformed") from None


def _record(
    name: str, spec: dict[str, Any], annotations: dict[str, Any], times: tuple[Any, Any]
) -> NodeRecord | None:
    ek = spec.get("ekSha256")
    if ek is None or ek == "":
        return None
    try:
        check_ek(ek)
    except ValueError:
        raise Corrupt("spec.ekSha256 is not 64 lowercase hex characters") from None
    spiffe = spec.get("spiffeId", "")
    revoked = spec.get("revoked", False)
    if not isinstance(spiffe, str) or not isinstance(revoked, bool):
        raise Corrupt("spec.spiffeId or spec.revoked has the wrong type")
    ak_text = annotations.get(ANN_AK, "")
    try:
        ak = base64.b64decode(ak_text, validate=True) if isinstance(ak_text, str) else None
    except (binascii.Error, ValueError):
        ak = None
    if ak is None:
        raise Corrupt(f"annotation {ANN_AK} is not base64")
    counters = _counters(annotations)
    serials = _json(annotations, ANN_SERIALS) or []
    if not isinstance(serials, list) or not all(isinstance(s, str) for s in serials):
        raise Corrupt(f"annotation {ANN_SERIALS} is malformed")
    try:
        boot_id = check_boot_id(_unset_if_empty(annotations.get(ANN_BOOT_ID)))
        mb_class = check_measured_boot_class(_unset_if_empty(annotations.get(ANN_MEASURED_BOOT_CLASS)))
        uid = check_node_uid(_unset_if_empty(annotations.get(ANN_NODE_UID)))
        pop = check_x509pop_attestation(_unset_if_empty(annotations.get(ANN_X509POP_ATTESTATION)))
    except ValueError as exc:
        raise Corrupt(
            f"annotation {ANN_BOOT_ID}, {ANN_MEASURED_BOOT_CLASS}, {ANN_NODE_UID} or "
            f"{ANN_X509POP_ATTESTATION}: {exc}"
        ) from None
    refused = optional_time(annotations.get(ANN_REFUSED_AT), ANN_REFUSED_AT)
    try:
        held = quarantine_of(spec.get("quarantine"))
    except ValueError as exc:
        raise Corrupt(f"spec.quarantine: {exc}") from None
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
        boot_id=boot_id,
        measured_boot_class=mb_class,
        node_uid=uid,
        x509pop_attestation=pop,
        refused_at=refused,
        boot_record=_record_of(annotations),
        quarantine=held,
    )


def parse(obj: dict[str, Any]) -> NodeObject:
    """The object as this store reads it. One it cannot trust (someone edited it badly) comes
    back ``damaged``, without a record: refused to its node, listed for the admin, forgettable."""
    meta = field(obj, "metadata")
    name = str(meta.get("name", ""))
    try:
        annotations = field(meta, "annotations")
        status = field(obj, "status")
        published = (
            optional_time(status.get("attestedAt"), "status.attestedAt"),
            optional_time(status.get("expiresAt"), "status.expiresAt"),
        )
        copies = (
            optional_time(annotations.get(ANN_ATTESTED), ANN_ATTESTED),
            optional_time(annotations.get(ANN_EXPIRES), ANN_EXPIRES),
        )
        spec = field(obj, "spec")
        bound = spec.get("ekSha256") not in (None, "")
        # Prefer the status (an admin may have edited it) unless it is behind our last write.
        behind = (copies[0] is not None and (published[0] is None or published[0] < copies[0])) or (
            copies[1] is not None and published[1] is None
        )
        ours_set = published != (None, None) or any(
            status.get(k) is not None for k in ("bootID", "resetCount", "nodeUID", "boot")
        )
        if not bound:
            behind = ours_set  # a forgotten node must not look attested
        times = copies if behind or published[0] is None else published
        return NodeObject(
            name=name,
            rv=str(meta.get("resourceVersion", "")),
            record=_record(name, spec, annotations, times),
            sessions=_sessions(annotations),
            audit=_audit(annotations),
            status_behind=behind,
            status_set=ours_set,
        )
    except Corrupt as exc:
        annotations = field(meta, "annotations")
        try:
            sessions = _sessions(annotations)
        except Corrupt:
            sessions = ()
        return NodeObject(
            name=name,
            rv=str(meta.get("resourceVersion", "")),
            record=None,
            sessions=sessions,
            audit=_audit(annotations),
            status_behind=False,
            status_set=bool(field(obj, "status")),
            damaged=f"NodeAttestation {name}: {exc}; fix or forget it",
        )


def _record_of(annotations: dict[str, Any]) -> BootRecord | None:
    try:
        return boot_record(annotations, MAX_ANNOTATION)
    except BootRecordUnreadable as exc:
        raise Corrupt(str(exc)) from None


def refuse_damaged(obj: NodeObject | None) -> None:
    if obj is not None and obj.damaged is not None:
        raise NodeRecordDamaged(obj.damaged)


async def read(kube: Kube, name: str) -> NodeObject | None:
    raw = await kube.get_cluster_object(GROUP, VERSION, PLURAL, name)
    return None if raw is None else parse(raw)


def exhausted(name: str, attempts: int) -> StoreUnavailable:
    return StoreUnavailable(f"NodeAttestation {name}: still conflicting after {attempts} attempts")


def _unset_if_empty(value: object) -> object:
    """An annotation value the API server stored as "" for a null this store once sent in a create
    body (a real API server keeps the key with an empty value; kmock dropped it): unset."""
    return None if value == "" else value


def without_unset(annotations: dict[str, Any]) -> dict[str, Any]:
    """The annotations of a create body: null means "remove" only in a merge patch; in a create
    the API server stores it as an empty string (tests/cluster/test_store.py found it)."""
    return {k: v for k, v in annotations.items() if v is not None}


def published_copies(obj: dict[str, Any]) -> Published:
    """What the status should say, from the object's annotations; Corrupt when unreadable."""
    ann = field(field(obj, "metadata"), "annotations")
    counters = _counters(ann)
    try:
        boot_id = check_boot_id(_unset_if_empty(ann.get(ANN_BOOT_ID)))
        uid = check_node_uid(_unset_if_empty(ann.get(ANN_NODE_UID)))
    except ValueError:
        raise Corrupt(f"annotation {ANN_BOOT_ID} or {ANN_NODE_UID} is malformed") from None
    return Published(
        optional_time(ann.get(ANN_ATTESTED), ANN_ATTESTED),
        optional_time(ann.get(ANN_EXPIRES), ANN_EXPIRES),
        boot_id,
        counters.reset_count if counters is not None else None,
        uid,
        _record_of(ann),
    )


def published_from(rec: NodeRecord | None) -> Published:
    """What the status says for ``rec`` (all unset for no record: a forgotten node)."""
    if rec is None:
        return Published()
    reset = rec.counters.reset_count if rec.counters is not None else None
    return Published(rec.attested_at, rec.expires_at, rec.boot_id, reset, rec.node_uid, rec.boot_record)


def status_patch(rv: str, pub: Published) -> dict[str, Any]:
    """A merge patch of the status subresource guarded by ``rv``; None values remove the field."""
    return {
        "metadata": {"resourceVersion": rv},
        "status": {
            "attestedAt": rfc3339_exact(pub.attested_at) if pub.attested_at else None,
            "expiresAt": rfc3339_exact(pub.expires_at) if pub.expires_at else None,
            "bootID": pub.boot_id,
            "resetCount": pub.reset_count,
            "nodeUID": pub.node_uid,
            "boot": boot_status(pub.boot),
        },
    }


# -- writing ------------------------------------------------------------------------------------


def audit_entry(at: datetime, action: str, actor: str, code: str, detail: str) -> dict[str, str]:
    return {"at": rfc3339_exact(at), "action": action, "actor": actor, "code": code, "detail": detail}


def audit_value(obj: NodeObject | None, entry: dict[str, str]) -> str:
    """The audit annotation with ``entry`` appended: the newest MAX_AUDIT entries."""
    return json.dumps([*(obj.audit if obj else ()), entry][-MAX_AUDIT:], separators=(",", ":"))


def sessions_json(sessions: Iterable[Session]) -> str:
    return json.dumps([{"id": s.id, "exp": rfc3339_exact(s.exp)} for s in sessions], separators=(",", ":"))


def sessions_value(obj: NodeObject | None, now: datetime, extra: Session | None = None) -> str:
    """The used-sessions annotation: the sessions still live at ``now``, plus ``extra``."""
    keep = [s for s in (obj.sessions if obj else ()) if s.exp >= now]
    if extra is not None:
        keep.append(extra)
    return sessions_json(keep)


def written_annotations(rec: NodeRecord, *, sessions: str, audit: str) -> dict[str, str | None]:
    """The annotations a commit writes for ``rec`` (a commit's record carries counters and times)."""
    assert rec.counters is not None  # noqa: S101  (record_from sets them)
    assert rec.attested_at is not None  # noqa: S101
    assert rec.expires_at is not None  # noqa: S101
    c = rec.counters
    return {
        ANN_AK: base64.b64encode(rec.ak_public).decode("ascii"),
        ANN_COUNTERS: json.dumps(
            {"resetCount": c.reset_count, "restartCount": c.restart_count, "clock": c.clock}
        ),
        ANN_SERIALS: json.dumps(list(rec.svid_serials), separators=(",", ":")),
        ANN_SESSIONS: sessions,
        ANN_AUDIT: audit,
        ANN_ATTESTED: rfc3339_exact(rec.attested_at),
        ANN_EXPIRES: rfc3339_exact(rec.expires_at),
        # None removes a value an earlier commit wrote: the record says what the latest reported
        ANN_BOOT_ID: rec.boot_id,
        ANN_MEASURED_BOOT_CLASS: rec.measured_boot_class,
        ANN_NODE_UID: rec.node_uid,
        ANN_X509POP_ATTESTATION: rec.x509pop_attestation,
        ANN_REFUSED_AT: rfc3339_exact(rec.refused_at) if rec.refused_at else None,
        ANN_BOOT_RECORD: rec.boot_record.to_json() if rec.boot_record is not None else None,
    }


def forget_patch(*, sessions: str, audit: str) -> dict[str, Any]:
    """Drops the binding and its bookkeeping; the used sessions and the audit trail stay."""
    ann: dict[str, Any] = dict.fromkeys(
        (
            ANN_AK,
            ANN_COUNTERS,
            ANN_SERIALS,
            ANN_ATTESTED,
            ANN_EXPIRES,
            ANN_BOOT_ID,
            ANN_MEASURED_BOOT_CLASS,
            ANN_NODE_UID,
            ANN_X509POP_ATTESTATION,
            ANN_REFUSED_AT,
            ANN_BOOT_RECORD,
        )
    )
    ann[ANN_SESSIONS] = sessions
    ann[ANN_AUDIT] = audit
    return {
        "metadata": {"labels": {LABEL_EK: None}, "annotations": ann},
        "spec": {"ekSha256": None, "spiffeId": None, "revoked": None, "quarantine": None},
    }
