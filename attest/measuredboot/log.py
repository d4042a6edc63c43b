"""The TCG PC Client firmware event log, parsed and replayed. Pure: bytes in.

The log is what the firmware left in ``/sys/kernel/security/tpm0/binary_bios_measurements``
(TCG PC Client Platform Firmware Profile, section 10), crypto-agile or SHA-1 only (record formats
in ``tcglog``). Nothing in a log is trusted until it replays to the PCR values the TPM signed
(:func:`verify_replay`), and even then only each event's *digest* is vouched for: its type and
data are not covered, so what a policy reads is decided by ``events`` and ``facts``, which trust
a type and data only where they are exactly what the specification defines. Every failure here is
:class:`~attest.errors.EventLogInvalid` (``event_log_invalid``) or
:class:`~attest.errors.EventLogMismatch` (``event_log_mismatch``).

PCR 0 starts where the platform's CRTM left it (PFP 10.4.5.3, TPM 2.0 Part 1 section 34.3): at
all zeros, at the StartupLocality (0 or 3) when the log records one, or, on a platform with a
hardware CRTM, at locality 4 (``00..04``) before the EV_EFI_HCRTM_EVENT's digest is extended,
in every bank, SM3-256 included.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import operator
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from attest.errors import EventLogInvalid, EventLogMismatch
from attest.measuredboot import facts
from attest.measuredboot.tcglog import (
    EV_EFI_HCRTM_EVENT,
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

HCRTM_DATA = b"HCRTM"  # PFP: the event data of EV_EFI_HCRTM_EVENT is exactly this string
HCRTM_LOCALITY = 4
_TYPE = operator.itemgetter(2)  # Event.type
_IS_NO_ACTION = functools.partial(operator.eq, EV_NO_ACTION)

__all__ = ["MAX_EVENTS", "MAX_LOG_BYTES", "Event", "EventLog", "SpecId", "parse", "verify_replay"]


@dataclass(frozen=True, slots=True)
class EventLog:
    events: tuple[Event, ...]
    banks: tuple[str, ...]  # banks the log carries digests for, in log order
    spec: SpecId | None  # None: a SHA-1-only log
    startup_locality: int | None = None
    unknown_algorithms: tuple[int, ...] = field(default=())  # listed in the Spec ID, not replayable
    hcrtm: bool = False  # a hardware CRTM measured itself first (EV_EFI_HCRTM_EVENT)

    def replay(self, banks: Collection[str] | None = None) -> dict[str, dict[int, bytes]]:
        """Every PCR that any event extends, per bank (all of the log's, or ``banks``), from the
        reset value (PCR 0 from the StartupLocality or the H-CRTM's locality 4)."""
        out: dict[str, dict[int, bytes]] = {}
        for bank in self.banks:
            if banks is not None and bank not in banks:
                continue
            new = hasher(bank)
            size = new(b"").digest_size
            pcrs: dict[int, bytes] = {}
            get = pcrs.get
            for _, pcr, etype, digests, _ in self.events:  # unpacked: cheaper than attributes
                digest = digests.get(bank)
                if digest is None or etype == EV_NO_ACTION:
                    continue
                current = get(pcr)
                if current is None:
                    current = self.reset_value(pcr, size)
                pcrs[pcr] = new(current + digest).digest()
            out[bank] = pcrs
        return out

    @property
    def pcr0_locality(self) -> int | None:
        return HCRTM_LOCALITY if self.hcrtm else self.startup_locality

    def reset_value(self, pcr: int, size: int) -> bytes:
        locality = self.pcr0_locality
        if pcr == 0 and locality:
            return bytes(size - 1) + bytes([locality])
        if 17 <= pcr <= 22:  # the DRTM PCRs start at all ones until a dynamic launch resets them
            return b"\xff" * size
        return bytes(size)

    @property
    def secure_boot(self) -> bool | None:
        """The SecureBoot variable as the firmware measured it into PCR 7 before the separator;
        None when the log does not show it (no such event, or one the firmware profile does not
        allow: see ``attest.measuredboot.facts``)."""
        return facts.secure_boot(self.events, facts.preferred_bank(self.banks))


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
    # Each event's type once, in C: the StartupLocality and H-CRTM checks below only need the
    # few EV_NO_ACTION events and, when there is one, the H-CRTM event.
    types = list(map(_TYPE, events))
    skip = 1 if spec else 0
    locality = None
    for ev in itertools.compress(events[skip:], map(_IS_NO_ACTION, types[skip:])):
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
    hcrtm = _hcrtm(events, locality) if EV_EFI_HCRTM_EVENT in types else False
    return EventLog(tuple(events), banks, spec, locality, unknown, hcrtm)


def _hcrtm(events: list[Event], locality: int | None) -> bool:
    """Whether a hardware CRTM opened PCR 0 (PFP 3.3.2 and 10.4.5.3): its EV_EFI_HCRTM_EVENT, data
    "HCRTM", must be the first event extending PCR 0, and only one; a StartupLocality, when
    logged too, must then be 4. Anything else about an H-CRTM event is an invalid log."""
    found = False
    first_pcr0 = True
    for ev in events:
        if ev.type != EV_EFI_HCRTM_EVENT:
            if first_pcr0 and ev.pcr == 0 and ev.type != EV_NO_ACTION:
                first_pcr0 = False
            continue
        if ev.pcr != 0 or not first_pcr0 or found:
            raise EventLogInvalid(f"{ev.where()}: an H-CRTM event must be the first event of PCR 0")
        if ev.data != HCRTM_DATA:
            raise EventLogInvalid(f"{ev.where()}: an H-CRTM event's data must be {HCRTM_DATA!r}")
        found = True
        first_pcr0 = False
    if found and locality not in (None, HCRTM_LOCALITY):
        raise EventLogInvalid(f"an H-CRTM event with StartupLocality {locality} (an H-CRTM starts at 4)")
    return found


def _available(bank: str) -> bool:
    if bank in ("sha1", "sha256", "sha384", "sha512"):  # hashlib guarantees these constructors
        return True
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
        ours = replayed[bank]
        for index in sorted(values):
            got = ours.get(index)
            if got is None:  # no event extends it: still at its reset value
                got = log.reset_value(index, size)
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
