"""The failures of the service and its store, and the HTTP status of every machine code.

Evidence failures (``attest.errors``) and these share one base, ``AttestationError``, so one
middleware (``bootstrap.service.http.middleware``) turns every one into ``application/problem+json`` with its
code; the table below decides the status. The codes are listed in docs/protocol.md.
"""

from __future__ import annotations

from typing import ClassVar

from attest.errors import AttestationError

# -- join-level failures: service and store verdicts that carry a machine code -------------------


class PayloadTooLarge(AttestationError):
    """A request body above the protocol's 64 KiB limit."""

    code = "payload_too_large"


class RateLimited(AttestationError):
    """Too many join or admin requests from one client address, or too many bearer tokens being
    checked at once; ``retry_after`` is the Retry-After header."""

    code = "rate_limited"

    def __init__(self, detail: str, *, retry_after: float | None = None) -> None:
        super().__init__(detail)
        self.retry_after = retry_after


class NodeNameConflict(AttestationError):
    """The node name is bound to another EK (or this EK to another name)."""

    code = "node_name_conflict"


class NodeNotEnrolled(AttestationError):
    """Inventory enrollment: this EK is not listed for this node name."""

    code = "node_not_enrolled"


class NodeRevoked(AttestationError):
    """An administrator revoked this node; it may not join or renew until un-revoked."""

    code = "node_revoked"


class NodeRecordDamaged(AttestationError):
    """The node's stored record cannot be read (edited badly, or damaged on disk). It is neither
    trusted nor overwritten: an administrator fixes or forgets it (docs/troubleshooting.md)."""

    code = "node_record_damaged"


class BootIdRequired(AttestationError):
    """A boot id is recorded for this node and the join, renewal or attestation carries none. The
    gate holds a rebooted node until a quote from its new boot arrives; an attestation without a
    boot id would clear the recorded one and with it that hold (issue 21), so it is refused."""

    code = "boot_id_required"


class SessionUnknown(AttestationError):
    """The session token does not open with any session key (forged, corrupted or foreign)."""

    code = "session_unknown"


class SessionExpired(AttestationError):
    """The session's lifetime is over; start again."""

    code = "session_expired"


class SessionReused(AttestationError):
    """The session already finished once (on this or another replica)."""

    code = "session_reused"


# -- disk-key releases (docs/disk-keys.md) ----------------------------------------------------------


class DiskKeysDisabled(AttestationError):
    """No disk keys for this node: ``disk_keys`` is not configured, or the node's boot matched
    no class that ``disk_keys.classes`` names."""

    code = "disk_keys_disabled"


class DiskKeyRevoked(AttestationError):
    """The key asked for is gone for good: ``nodegate disk revoke`` moved the node's TPM to a later
    epoch, or its server-secret version was retired (``nodegate disk rotate --retire``)."""

    code = "disk_key_revoked"


class NodeQuarantined(AttestationError):
    """The node's last attestation is older than ``gate.attestation_lifetime`` (the gate holds it
    quarantined; no disk key until an operator acts), or an admin quarantined the boot that asks
    (``nodegate nodes quarantine``; keys again after a new boot): docs/disk-keys.md."""

    code = "node_quarantined"


class ServiceError(Exception):
    code: ClassVar[str] = "service_error"
    status: ClassVar[int] = 400

    def __init__(self, detail: str, *, retry_after: float | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.retry_after = retry_after


class Unauthenticated(ServiceError):
    """No client certificate or bearer token where one is required, or one that does not verify."""

    code = "unauthenticated"
    status = 401


class Forbidden(ServiceError):
    """An authenticated caller without the permission for this endpoint."""

    code = "forbidden"
    status = 403


class NotFound(ServiceError):
    code = "not_found"
    status = 404


class MethodNotAllowed(ServiceError):
    code = "method_not_allowed"
    status = 405


class UnsupportedMediaType(ServiceError):
    code = "unsupported_media_type"
    status = 415


class Unavailable(ServiceError):
    """A dependency (store, Kubernetes API, CA files) is down: retry later; nothing was issued."""

    code = "unavailable"
    status = 503


JOIN_FAILURES: tuple[type[AttestationError], ...] = (
    PayloadTooLarge,
    RateLimited,
    NodeNameConflict,
    NodeNotEnrolled,
    NodeRevoked,
    NodeRecordDamaged,
    BootIdRequired,
    SessionUnknown,
    SessionExpired,
    SessionReused,
    DiskKeysDisabled,
    DiskKeyRevoked,
    NodeQuarantined,
)

STATUS_BY_CODE: dict[str, int] = {
    "malformed_request": 400,
    "event_log_invalid": 400,
    "boot_id_required": 400,
    "payload_too_large": 413,
    "rate_limited": 429,
    "node_name_conflict": 409,
    "node_record_damaged": 409,
    "session_expired": 410,
}


def attestation_status(exc: AttestationError) -> int:
    """docs/protocol.md: 400 malformed, 413, 429, 409 conflict (and a damaged record), 410
    expired, 403 for every other failure."""
    return STATUS_BY_CODE.get(exc.code, 403)
