"""The stable measured-boot API: ``attest.eventlog.parse(data) -> EventLog`` (``.events``,
``.banks``, ``.replay()``, ``.secure_boot``) and ``verify_replay``. The code lives in
``attest.measuredboot`` (``log``, ``events``, ``facts``, ``policy``)."""

from __future__ import annotations

from attest.measuredboot.log import MAX_EVENTS, MAX_LOG_BYTES, Event, EventLog, SpecId, parse, verify_replay

__all__ = ["MAX_EVENTS", "MAX_LOG_BYTES", "Event", "EventLog", "SpecId", "parse", "verify_replay"]
