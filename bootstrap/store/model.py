"""The join service's state: node bindings, used sessions and an audit trail, in one of two backends.

``sqlite`` (the embedded default) keeps everything in ``<state_dir>/nodegate.db``; ``kubernetes``
keeps it in NodeAttestation objects so every replica of the service shares it through etcd. Both
honour one contract, :class:`Store`, whose central operation is :meth:`Store.commit`: a successful
join or renewal is written in one atomic step that also marks the session used, so a session
finishes at most once across every replica.

Timestamps are timezone-aware; the stores return them in UTC.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Protocol

from attest.bootrecord.model import BootRecord
from attest.tpm import Counters
from bootstrap.names import is_node_name
from bootstrap.times import parse_time, rfc3339_exact

__all__ = [
    "ACTIONS",
    "MAX_SERIALS",
    "Attestation",
    "AuditEntry",
    "Check",
    "DamagedRecord",
    "NodeRecord",
    "Quarantine",
    "Store",
    "StoreSchemaError",
    "StoreUnavailable",
]

MAX_SERIALS: Final = 32  # SVID serials remembered per node, newest last
MAX_SESSION_ID: Final = 64
MAX_SPIFFE_ID: Final = 2048  # the SPIFFE spec's limit for an ID
MAX_AK_PUBLIC: Final = 4096  # a TPM2B_PUBLIC is well under this
MAX_ACTOR: Final = 256
MAX_CODE: Final = 64
MAX_DETAIL: Final = 1024  # audit details are truncated, never refused
MAX_ANCHORS: Final = 32  # CA certificates remembered per store (a rotation adds one)
MAX_BOOT_ID: Final = 64  # /proc/sys/kernel/random/boot_id is a 36-character UUID
MAX_MEASURED_BOOT_CLASS: Final = 128
MAX_NODE_UID: Final = 128  # the API server writes a 36-character UUID
MAX_DBX_BYTES: Final = 32 * 8192  # a 2024 dbx holds ~430 image digests; the UEFI variable limit bounds it
ACTIONS: Final = frozenset(
    {
        "join",
        "renew",
        "refused",
        "revoke",
        "unrevoke",
        "forget",
        "quarantine",
        "disk-release",
        "disk-revoke",
        "disk-recover",
    }
)
COMMIT_ACTIONS: Final = frozenset({"join", "renew"})
DISK_ACTIONS: Final = frozenset({"disk-release", "disk-revoke", "disk-recover"})

_HEX64 = re.compile(r"[0-9a-f]{64}")
_SERIAL = re.compile(r"[0-9a-f]{1,64}")
_CODE = re.compile(r"[a-z0-9_]{0,64}")
_BOOT_ID = re.compile(r"[0-9a-f-]{1,64}")
_NODE_UID = re.compile(r"[0-9A-Za-z._:-]{1,128}")
_X509POP_ATTESTATION = re.compile(r"[0-9a-f]{32}")
_U64 = 1 << 64


class StoreUnavailable(Exception):
    """The backend is down, locked or timed out: the service answers 503 and the node retries."""


class StoreSchemaError(Exception):
    """The database was written by a newer nodegate (or is not a nodegate database): refusing it
    protects data that this version does not understand."""


@dataclass(frozen=True, slots=True)
class Quarantine:
    """An admin held the node (``nodegate nodes quarantine``): the gate holds it ``quarantined``
    until an attestation of a new boot (the TPM's resetCount above ``reset_count``, the one of the
    attestation quarantined) is accepted by the policy in force; renewals of the same boot keep it."""

    reason: str
    actor: str
    at: datetime
    reset_count: int

    def lifted_by(self, reset_count: int) -> bool:
        """Whether evidence with the TPM's ``reset_count`` is of a new boot (releases it)."""
        return reset_count > self.reset_count

    def to_json(self) -> dict[str, object]:
        return {
            "reason": self.reason,
            "actor": self.actor,
            "at": rfc3339_exact(self.at),
            "resetCount": self.reset_count,
        }


def quarantine_of(value: object) -> Quarantine | None:
    """A Quarantine from its JSON (``to_json``); ValueError when it is not one."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError("quarantine is not an object")  # noqa: TRY004  (ValueError is the contract)
    reason, actor, reset = value.get("reason"), value.get("actor"), value.get("resetCount")
    at = parse_time(value.get("at"))
    if not isinstance(reason, str) or not isinstance(actor, str) or at is None:
        raise ValueError("quarantine lacks its reason, actor or time")
    if not isinstance(reset, int) or isinstance(reset, bool) or not 0 <= reset < _U64:
        raise ValueError("quarantine's resetCount is not a counter")
    return Quarantine(clip(reason), check_actor(actor), at, reset)


@dataclass(frozen=True, slots=True)
class NodeRecord:
    node_name: str
    ek_sha256: str  # the binding
    ak_public: bytes  # marshalled TPM2B_PUBLIC of the AK of the last attestation (renewal uses it)
    spiffe_id: str
    counters: Counters | None  # last seen TPM counters for this EK
    attested_at: datetime | None
    expires_at: datetime | None
    revoked: bool
    # Hex serials of the SVIDs that may renew, oldest first: those of the latest join and its
    # renewals (a join supersedes every earlier SVID), at most MAX_SERIALS.
    svid_serials: tuple[str, ...]
    # What the latest join or renewal reported (None: not reported): the kernel boot id and the
    # measured-boot policy class that matched. Each commit replaces both.
    boot_id: str | None = None
    measured_boot_class: str | None = None
    # The uid of the Node object nodegate last wrote its attested labels on (join or renewal);
    # kept when a later attestation found no Node. The gate holds a Node of this name with another
    # uid: it was deleted and re-created since (docs/gate.md). None: never recorded.
    node_uid: str | None = None
    # SPIRE (docs/spire.md): the ``attestation`` fact of the x509pop certificates this attestation
    # was given (None: none issued), and when a refusal of this node's evidence (its TPM answered,
    # and the quote or the boot it describes was refused) was recorded since; a join or renewal
    # clears it. Neither is ever guessed: a record written before either existed has None.
    x509pop_attestation: str | None = None
    refused_at: datetime | None = None
    # The facts the latest accepted join or renewal verified (attest.bootrecord); None for records
    # written before boot records existed. Each commit replaces it.
    boot_record: BootRecord | None = None
    quarantine: Quarantine | None = None  # held by an admin until a new boot attests


@dataclass(frozen=True, slots=True)
class Attestation:
    """What a successful join or renewal commits."""

    node_name: str
    ek_sha256: str
    ak_public: bytes
    spiffe_id: str
    counters: Counters
    svid_serial: str
    attested_at: datetime
    expires_at: datetime
    boot_id: str | None = None  # /proc/sys/kernel/random/boot_id as the node reported it
    measured_boot_class: str | None = None  # the measured-boot policy class that matched
    node_uid: str | None = None  # metadata.uid of the Node labelled with it (None: no Node written)
    x509pop_attestation: str | None = None  # the attestation fact of its x509pop certificate
    boot_record: BootRecord | None = None  # what the verdict read (attest.bootrecord.build)
    # The image digests of the record's dbx, by its identity: kept once per distinct dbx.
    dbx: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class DamagedRecord:
    """A stored node this store cannot read: listed for the admin, refused to the node
    (``node_record_damaged``), never trusted or overwritten; ``forget`` removes it."""

    node_name: str
    problem: str


@dataclass(frozen=True, slots=True)
class AuditEntry:
    at: datetime
    node_name: str
    action: str  # one of ACTIONS
    actor: str  # "node" or the admin identity
    code: str  # machine code for refusals, "" otherwise
    detail: str


# Raises an AttestationError to abort the commit. The sqlite backend calls it on its worker thread
# inside the write transaction, so it must be quick and must not touch the event loop.
Check = Callable[[NodeRecord | None], None]


class Store(Protocol):
    async def get(self, node_name: str) -> NodeRecord | None: ...

    async def list_nodes(self, *, recent: bool = False) -> list[NodeRecord]:
        """Every readable record, by name; damaged ones are in ``damaged_nodes``. ``get`` and
        ``commit`` of a damaged one raise NodeRecordDamaged. ``recent``: a copy kept current by a
        watch will do (a periodic pass), when the store keeps one (``keep_current``)."""
        ...

    async def keep_current(self) -> None:
        """Until cancelled: keep current the copy ``list_nodes(recent=True)`` reads, for a store
        that keeps one; returns at once for one that does not."""
        ...

    async def damaged_nodes(self) -> list[DamagedRecord]: ...

    async def dbx_digests(self, identities: Collection[str]) -> dict[str, bytes]:
        """The image digests (32 bytes each, sorted) of the dbx values with these identities
        (SHA-256 of the value, hex), as commits kept them; an identity not kept is left out."""
        ...

    async def commit(
        self, att: Attestation, *, session_id: str, session_expires_at: datetime, action: str, check: Check
    ) -> NodeRecord:
        """One atomic step: (1) ``session_id`` already used -> SessionReused; (2) ``att.ek_sha256``
        bound to another node name -> NodeNameConflict; (3) ``check(existing record)``, whose
        exceptions propagate with nothing written; (4) write the record (a renewal appends its
        serial, a join replaces the serials: it supersedes the SVIDs of earlier joins), mark the
        session used until ``session_expires_at``, append an audit entry (actor "node")."""
        ...

    async def session_used(self, session_id: str, *, node_name: str | None = None) -> bool:
        """A fast pre-check (commit is authoritative). ``node_name`` (the session's node) lets the
        kubernetes backend read one object instead of listing them all."""
        ...

    async def record_refusal(self, node_name: str, code: str, detail: str, *, evidence: bool = False) -> None:
        """Audit a refusal; ``evidence``: the node's own evidence was refused (docs/spire.md), so
        its record (when it has one) gets ``refused_at`` until its next join or renewal."""
        ...

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
        """A disk-key event in the node's audit trail (docs/disk-keys.md): ``disk-release`` (by the
        node; its ``session_id`` is marked used in the same step, SessionReused when it already
        was), ``disk-revoke`` and ``disk-recover`` (by an operator). False when this store keeps no
        trail for ``node_name`` (the kubernetes store keeps it on the node's object)."""
        ...

    async def revoke(self, node_name: str, *, actor: str, reason: str, revoked: bool = True) -> NodeRecord:
        """Set (or with ``revoked=False`` clear) the revoked flag; KeyError for an unknown node."""
        ...

    async def quarantine(self, node_name: str, *, actor: str, reason: str) -> NodeRecord:
        """Hold the node ``quarantined`` (audited, actor ``actor``) until an attestation of a new
        boot is accepted (see Quarantine); KeyError for an unknown node. Quarantining a node that
        is already quarantined replaces the reason."""
        ...

    async def forget(self, node_name: str, *, actor: str, reason: str) -> bool:
        """Drop the binding (a re-imaged machine may join again); the audit trail stays.
        False when there was no binding."""
        ...

    async def audit(self, node_name: str | None = None, limit: int = 100) -> list[AuditEntry]:
        """Newest first."""
        ...

    async def prune(self, now: datetime) -> int:
        """Forget used sessions whose expiry has passed; returns how many."""
        ...

    @property
    def prune_interval(self) -> float:
        """Seconds between the service's ``prune`` calls: what a prune costs decides."""
        ...

    async def has_nodes(self) -> bool:
        """Whether any node is bound (damaged records count: they were nodes)."""
        ...

    async def trust_anchors(self) -> frozenset[str]:
        """The CA certificates (SHA-256 of the DER, hex) that this store's SVIDs were issued
        under, as remembered; the service refuses to start on a CA that shares none of them
        while the store holds nodes (docs/backup.md)."""
        ...

    async def remember_trust_anchors(self, anchors: frozenset[str]) -> None:
        """Add ``anchors`` to the remembered set (the newest MAX_ANCHORS are kept)."""
        ...

    async def close(self) -> None: ...


# -- validation at the boundary: these are programmer errors, so ValueError -------------------------


def check_node_name(name: object) -> str:
    if not isinstance(name, str) or not is_node_name(name):
        raise ValueError(f"{name!r:.80} is not a node name (a DNS subdomain of at most 253 characters)")
    return name


def check_ek(ek_sha256: object) -> str:
    if not isinstance(ek_sha256, str) or _HEX64.fullmatch(ek_sha256) is None:
        raise ValueError("ek_sha256 must be 64 lowercase hex characters")
    return ek_sha256


def check_session_id(session_id: object) -> str:
    if not isinstance(session_id, str) or not 0 < len(session_id) <= MAX_SESSION_ID:
        raise ValueError(f"a session id is a non-empty string of at most {MAX_SESSION_ID} characters")
    return session_id


def check_time(value: object, what: str) -> datetime:
    if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} must be a timezone-aware datetime")
    return value.astimezone(UTC)


def check_counters(value: object) -> Counters:
    if not isinstance(value, tuple) or len(value) != 3:
        raise ValueError("counters must be attest.tpm.Counters")
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < _U64 for v in value):
        raise ValueError("TPM counters are unsigned 64-bit integers")
    return Counters(*value)


def check_attestation(att: object) -> Attestation:
    if not isinstance(att, Attestation):
        raise ValueError("commit takes an Attestation")  # noqa: TRY004  (ValueError is the contract)
    check_node_name(att.node_name)
    check_ek(att.ek_sha256)
    if not isinstance(att.ak_public, bytes) or not 0 < len(att.ak_public) <= MAX_AK_PUBLIC:
        raise ValueError(f"ak_public must be 1..{MAX_AK_PUBLIC} bytes")
    if not isinstance(att.spiffe_id, str) or not att.spiffe_id.startswith("spiffe://"):
        raise ValueError("spiffe_id must be a spiffe:// URI")
    if len(att.spiffe_id) > MAX_SPIFFE_ID:
        raise ValueError(f"spiffe_id is longer than {MAX_SPIFFE_ID} characters")
    if not isinstance(att.svid_serial, str) or _SERIAL.fullmatch(att.svid_serial) is None:
        raise ValueError("svid_serial must be 1..64 lowercase hex characters")
    check_counters(att.counters)
    check_boot_id(att.boot_id)
    check_measured_boot_class(att.measured_boot_class)
    check_node_uid(att.node_uid)
    check_x509pop_attestation(att.x509pop_attestation)
    check_boot_record(att.boot_record)
    check_dbx(att.dbx)
    attested = check_time(att.attested_at, "attested_at")
    expires = check_time(att.expires_at, "expires_at")
    if expires < attested:
        raise ValueError("expires_at is before attested_at")
    return att


def check_boot_id(value: object) -> str | None:
    if value is not None and (not isinstance(value, str) or _BOOT_ID.fullmatch(value) is None):
        raise ValueError(f"boot_id must be 1..{MAX_BOOT_ID} characters of [0-9a-f-]")
    return value


def check_boot_record(value: object) -> BootRecord | None:
    if value is not None and not isinstance(value, BootRecord):
        raise ValueError("boot_record must be an attest.bootrecord.model.BootRecord")
    return value


def check_dbx_id(value: object) -> str:
    if not isinstance(value, str) or _HEX64.fullmatch(value) is None:
        raise ValueError("a dbx identity is 64 lowercase hex characters")
    return value


def check_dbx(value: object) -> tuple[tuple[str, bytes], ...]:
    if not isinstance(value, tuple):
        raise ValueError("dbx must be a tuple of (identity, digests)")  # noqa: TRY004
    for item in value:
        if not isinstance(item, tuple) or len(item) != 2:
            raise ValueError("dbx must be a tuple of (identity, digests)")
        check_dbx_id(item[0])
        if not isinstance(item[1], bytes) or len(item[1]) % 32 or len(item[1]) > MAX_DBX_BYTES:
            raise ValueError(f"dbx digests are whole 32-byte digests, at most {MAX_DBX_BYTES} bytes")
    return value


def check_node_uid(value: object) -> str | None:
    if value is not None and (not isinstance(value, str) or _NODE_UID.fullmatch(value) is None):
        raise ValueError(f"node_uid must be 1..{MAX_NODE_UID} characters of [0-9A-Za-z._:-]")
    return value


def check_x509pop_attestation(value: object) -> str | None:
    if value is not None and (not isinstance(value, str) or _X509POP_ATTESTATION.fullmatch(value) is None):
        raise ValueError("x509pop_attestation must be 32 lowercase hex characters")
    return value


def check_measured_boot_class(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= MAX_MEASURED_BOOT_CLASS:
        raise ValueError(f"measured_boot_class must be 1..{MAX_MEASURED_BOOT_CLASS} characters")
    if not value.isprintable():
        raise ValueError("measured_boot_class must be printable")
    return value


def check_anchors(anchors: object) -> frozenset[str]:
    if not isinstance(anchors, frozenset) or not all(
        isinstance(a, str) and _HEX64.fullmatch(a) for a in anchors
    ):
        raise ValueError("trust anchors are a frozenset of 64 lowercase hex characters each")
    return anchors


def merged_anchors(known: list[str], add: frozenset[str]) -> list[str]:
    """``known`` (oldest first) with the new ``add`` appended, the newest MAX_ANCHORS."""
    out = [a for a in known if _HEX64.fullmatch(a)]
    out += sorted(a for a in add if a not in out)
    return out[-MAX_ANCHORS:]


def check_action(action: object, allowed: frozenset[str] = COMMIT_ACTIONS) -> str:
    if not isinstance(action, str) or action not in allowed:
        raise ValueError(f"action must be one of {sorted(allowed)}")
    return action


def check_actor(actor: object) -> str:
    if not isinstance(actor, str) or not 0 < len(actor) <= MAX_ACTOR:
        raise ValueError(f"actor must be a non-empty string of at most {MAX_ACTOR} characters")
    return actor


def check_code(code: object) -> str:
    if not isinstance(code, str) or _CODE.fullmatch(code) is None:
        raise ValueError("code must be a machine code such as node_name_conflict")
    return code


def check_limit(limit: object) -> int:
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise ValueError("limit must be a non-negative integer")
    return limit


def clip(detail: object) -> str:
    """Audit details are for people: cap the length rather than refuse the event."""
    if not isinstance(detail, str):
        raise ValueError("detail must be a string")  # noqa: TRY004  (ValueError is the contract)
    return detail[:MAX_DETAIL]


def utcnow() -> datetime:
    return datetime.now(UTC)
