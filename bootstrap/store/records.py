"""What a store writes, as both backends compute it (pure): the record a commit makes from the
one it replaces and its audit line, an admin's quarantine, and a disk event's checked arguments."""

from __future__ import annotations

from datetime import UTC, datetime

from attest.tpm import Counters
from bootstrap.problems import BootIdRequired
from bootstrap.store.model import (
    DISK_ACTIONS,
    MAX_SERIALS,
    Attestation,
    NodeRecord,
    Quarantine,
    check_action,
    check_actor,
    check_node_name,
    check_session_id,
    check_time,
    clip,
)


def check_disk_event(
    node_name: object,
    action: object,
    actor: object,
    detail: object,
    session_id: object,
    session_expires_at: object,
) -> tuple[str, tuple[str, datetime] | None]:
    """``record_disk``'s arguments, as both backends check them: (the clipped detail, the
    session and its expiry, or None)."""
    check_node_name(node_name)
    check_action(action, DISK_ACTIONS)
    check_actor(actor)
    if session_id is None and session_expires_at is None:
        return clip(detail), None
    return clip(detail), (check_session_id(session_id), check_time(session_expires_at, "session_expires_at"))


def with_serial(serials: tuple[str, ...], serial: str) -> tuple[str, ...]:
    return (*serials, serial)[-MAX_SERIALS:]


def record_from(att: Attestation, *, action: str, existing: NodeRecord | None) -> NodeRecord:
    """The record a commit writes, given the one it replaces: the revoked flag stays (only an
    admin clears it); a renewal adds its serial to the history, a join starts a new one, so the
    SVIDs of earlier joins can no longer renew (docs/protocol.md)."""
    kept = existing.svid_serials if existing is not None and action == "renew" else ()
    if existing is not None and existing.boot_id is not None and att.boot_id is None:
        # Whatever the caller checked: a recorded boot id is never dropped (the gate's reboot
        # hold compares the Node's boot with it), in every backend.
        raise BootIdRequired(f"{att.node_name} has a recorded boot id; this attestation carries none")
    held = existing.quarantine if existing is not None else None
    if held is not None and held.lifted_by(att.counters.reset_count):
        held = None  # a new boot, accepted by the policy in force: released
    return NodeRecord(
        node_name=att.node_name,
        ek_sha256=att.ek_sha256,
        ak_public=att.ak_public,
        spiffe_id=att.spiffe_id,
        counters=Counters(*att.counters),
        attested_at=att.attested_at.astimezone(UTC),
        expires_at=att.expires_at.astimezone(UTC),
        revoked=existing.revoked if existing is not None else False,
        svid_serials=with_serial(kept, att.svid_serial),
        boot_id=att.boot_id,
        measured_boot_class=att.measured_boot_class,
        # An attestation that wrote no Node (it was deleted) keeps the uid of the last one written:
        # a Node its kubelet registers afterwards is another object, and the gate holds it.
        node_uid=att.node_uid if att.node_uid is not None else (existing.node_uid if existing else None),
        x509pop_attestation=att.x509pop_attestation,
        refused_at=None,  # accepted now: an earlier refusal no longer describes the node
        boot_record=att.boot_record,
        quarantine=held,
    )


def commit_detail(rec: NodeRecord, att: Attestation, existing: NodeRecord | None) -> str:
    """The audit line of a commit; it says when the commit released a quarantine."""
    released = existing is not None and existing.quarantine is not None and rec.quarantine is None
    return f"spiffe_id={rec.spiffe_id} serial={att.svid_serial}" + (
        " (a new boot: released from quarantine)" if released else ""
    )


def quarantined(rec: NodeRecord, *, actor: str, reason: str, at: datetime) -> Quarantine:
    """The quarantine of ``rec``'s current boot (the resetCount of its last attestation)."""
    reset = rec.counters.reset_count if rec.counters is not None else 0
    return Quarantine(clip(reason), check_actor(actor), at.astimezone(UTC), reset)
