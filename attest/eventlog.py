"""Measured boot: the TCG PC Client firmware event log, parsed and replayed. Pure: bytes in.

The log is what the firmware left in ``/sys/kernel/security/tpm0/binary_bios_measurements``
(TCG PC Client Platform Firmware Profile, section 10), crypto-agile or SHA-1 only (record formats
in ``attest.tcglog``). Nothing in a log is trusted until it replays to the PCR values the TPM
signed (:func:`verify_replay`): the event *type* and *data* are not covered by the digests at
all, so the facts a policy reads (``attest.bootevents``) come only from events whose data is shown
to hash to their digests. Every failure is :class:`~attest.errors.EventLogInvalid`
(``event_log_invalid``) or :class:`~attest.errors.EventLogMismatch` (``event_log_mismatch``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from attest import bootevents
from attest.errors import EventLogInvalid, EventLogMismatch
from attest.tcglog import (
    EV_NO_ACTION,
    HASHES,
    MAX_EVENTS,
    MAX_LOG_BYTES,
    SPEC_ID_03,
    Event,
    SpecId,
    agile_records,
    hasher,
    hashlib_name,
    sha1_records,
    spec_id,
    startup_locality,
)

__all__ = ["MAX_EVENTS", "MAX_LOG_BYTES", "Event", "EventLog", "SpecId", "parse", "verify_replay"]


@dataclass(frozen=True, slots=True)
class EventLog:
    events: tuple[Event, ...]
    banks: tuple[str, ...]  # banks the log carries digests for, in log order
    spec: SpecId | None  # None: a SHA-1-only log
    startup_locality: int | None = None
    unknown_algorithms: tuple[int, ...] = field(default=())  # listed in the Spec ID, not replayable

    def replay(self, banks: Collection[str] | None = None) -> dict[str, dict[int, bytes]]:
        """Every PCR that any event extends, per bank (all of the log's, or ``banks``), from the
        reset value (PCR 0 starts at the StartupLocality value when the log records one)."""
        out: dict[str, dict[int, bytes]] = {}
        for bank in self.banks:
            if banks is not None and bank not in banks:
                continue
            new = hasher(bank)
            size = new(b"").digest_size
            pcrs: dict[int, bytes] = {}
            for ev in self.events:
                digest = ev.digests.get(bank)
                if digest is None or ev.type == EV_NO_ACTION:
                    continue
                pcr = ev.pcr
                current = pcrs.get(pcr)
                if current is None:
                    current = self.reset_value(pcr, size)
                pcrs[pcr] = new(current + digest).digest()
            out[bank] = pcrs
        return out

    def reset_value(self, pcr: int, size: int) -> bytes:
        if pcr == 0 and self.startup_locality is not None:
            return bytes(size - 1) + bytes([self.startup_locality])
        if 17 <= pcr <= 22:  # the DRTM PCRs start at all ones until a dynamic launch resets them
            return b"\xff" * size
        return bytes(size)

    @property
    def secure_boot(self) -> bool | None:
        """The SecureBoot variable as the firmware measured it; None when the log has no such
        event or its data does not hash to its digests."""
        return bootevents.secure_boot(self.events, bootevents.preferred_bank(self.banks))


def parse(data: bytes) -> EventLog:
    """Parse a whole log; the last event must end exactly at the end of ``data``."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise EventLogInvalid("the event log must be bytes")
    data = bytes(data)
    if not data:
        raise EventLogInvalid("the event log is empty")
    if len(data) > MAX_LOG_BYTES:
        raise EventLogInvalid(f"the event log is larger than {MAX_LOG_BYTES} bytes")
    (first,), pos = sha1_records(data, 0, 0, 1)
    spec: SpecId | None = None
    if first.type == EV_NO_ACTION and first.data.startswith(SPEC_ID_03):
        if first.pcr != 0 or any(first.digests["sha1"]):
            raise EventLogInvalid("the Spec ID event must be for PCR 0 with a zero digest")
        spec = spec_id(first.data)
        rest = agile_records(data, pos, 1, MAX_EVENTS - 1, dict(spec.algorithms))
    else:  # SHA-1 records throughout (a TPM 1.2-era "Spec ID Event00/02" log, or none at all)
        rest, _ = sha1_records(data, pos, 1, MAX_EVENTS - 1)
    events = [first, *rest]
    locality = None
    for ev in events[1:] if spec else events:
        found = startup_locality(ev)
        if found is not None:
            if locality is not None:
                raise EventLogInvalid(f"{ev.where()}: a second StartupLocality event")
            locality = found
    if spec:
        banks = tuple(HASHES[a][0] for a, _ in spec.algorithms if a in HASHES)
        unknown = tuple(a for a, _ in spec.algorithms if a not in HASHES)
    else:
        banks, unknown = ("sha1",), ()
    banks = tuple(b for b in banks if _available(b))
    return EventLog(tuple(events), banks, spec, locality, unknown)


def _available(bank: str) -> bool:
    try:
        hashlib.new(hashlib_name(bank))
    except ValueError:
        return False
    return True


def verify_replay(log: EventLog, quoted: Mapping[str, Mapping[int, bytes]]) -> dict[str, dict[int, bytes]]:
    """Require the replay of every quoted PCR to equal the quoted (signed) value; returns the
    replay. A quoted bank the log has no digests for cannot be shown and is a mismatch."""
    replayed = log.replay(banks=[b for b, v in quoted.items() if v])
    for bank, values in quoted.items():
        if not values:
            continue
        if bank not in replayed:
            raise EventLogMismatch(f"the event log has no {bank} digests; the quote covers {bank}")
        size = len(next(iter(values.values())))
        for index in sorted(values):
            got = replayed[bank].get(index, log.reset_value(index, size))
            if got != values[index]:
                last = _last_event(log, bank, index)
                after = f" (last event extending it: {last.where()})" if last else " (no event extends it)"
                raise EventLogMismatch(
                    f"the event log replays {bank}:{index} to {got.hex()}, the quote says "
                    f"{values[index].hex()}{after}"
                )
    return replayed


def _last_event(log: EventLog, bank: str, pcr: int) -> Event | None:
    for ev in reversed(log.events):
        if ev.pcr == pcr and ev.type != EV_NO_ACTION and bank in ev.digests:
            return ev
    return None
