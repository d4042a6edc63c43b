"""Durations: a package's ``gracefulShutdown`` (and, for NodeWright, ``stageTimeout`` and
``spec.drainConfig.timeout``/``gracePeriod``) must be Go durations such as ``46s`` or ``1h30m``,
which the operator's decoder reads or refuses; NodeWright also refuses negative ones (rule
"duration")."""

from __future__ import annotations

from typing import Any

from admission.reading.checks.ranks import DURATIONS, Found
from admission.reading.checks.values import NotCanonical
from admission.reading.godecode import DurationError, parse_duration
from admission.violations import Violation


def duration_rule(path: str, value: Any, found: Found, *, non_negative: bool, check: bool = True) -> None:
    """The duration at ``path``, if set (``check``: judged, else only read for its type)."""
    if value is None:
        return
    if type(value) is not str:
        raise NotCanonical
    if not check:
        return
    try:
        nanos = parse_duration(value)
    except DurationError as exc:
        found.append((DURATIONS, Violation("duration", path, str(exc), "use a duration such as 90s or 5m")))
        return
    if non_negative and nanos < 0:
        found.append((DURATIONS, Violation("duration", path, "must not be negative", "use 0 or more")))


def drain_rules(value: Any, found: Found, check: bool) -> None:
    """spec.drainConfig (its flags are not checked); ``check``: a NodeWright CR, whose webhook
    judges the durations."""
    if value is None:
        return
    if type(value) is not dict:
        raise NotCanonical
    for name in ("timeout", "gracePeriod"):
        duration_rule(f"spec.drainConfig.{name}", value.get(name), found, non_negative=True, check=check)
