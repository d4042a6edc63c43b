"""Service-level failures (beyond attestation) and the HTTP status of every machine code.

One table decides the status; the middleware in ``bootstrap.service.app`` is the only place that turns
an exception into a response, always ``application/problem+json`` with the code.
"""

from __future__ import annotations

from typing import ClassVar

from attest.errors import AttestationError


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


STATUS_BY_CODE: dict[str, int] = {
    "malformed_request": 400,
    "payload_too_large": 413,
    "rate_limited": 429,
    "node_name_conflict": 409,
    "session_expired": 410,
}


def attestation_status(exc: AttestationError) -> int:
    """DESIGN.md: 400 malformed, 413, 429, 409 conflict, 410 expired, 403 for every other failure."""
    return STATUS_BY_CODE.get(exc.code, 403)
