"""RFC 3339 times as the protocol and Kubernetes objects carry them. Pure: no clock reads.

The one place that formats and parses them (wire responses, NodeAttestation status, Leases).
"""

from __future__ import annotations

from datetime import UTC, datetime

MAX_TIME_TEXT = 64  # longer text is not a time, whatever it parses as


def parse_time(value: object) -> datetime | None:
    """An RFC 3339 time with a zone, in UTC; None for anything else (absent, not text, too long,
    malformed, no zone): callers treat an unreadable time as missing."""
    if not isinstance(value, str) or not value or len(value) > MAX_TIME_TEXT:
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        return None
    return when.astimezone(UTC) if when.tzinfo is not None else None


def rfc3339(when: datetime | float) -> str:
    """Whole seconds in UTC with a "Z" (metav1.Time); a float is a POSIX timestamp."""
    if isinstance(when, int | float):
        when = datetime.fromtimestamp(when, UTC)
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_exact(when: datetime) -> str:
    """UTC with a "Z"; microseconds only when there are some (times that must round-trip)."""
    when = when.astimezone(UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if when.microsecond else "%Y-%m-%dT%H:%M:%SZ")


def micro_time(when: datetime) -> str:
    """Microseconds in UTC with a "Z" (metav1.MicroTime, as Lease times are)."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def optional_rfc3339(when: datetime | None) -> str | None:
    return None if when is None else rfc3339(when)
