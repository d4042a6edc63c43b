"""TCG PC Client firmware event log records: the two wire formats, bounded and strict. Pure.

The log is what the firmware left in ``/sys/kernel/security/tpm0/binary_bios_measurements``
(TCG PC Client Platform Firmware Profile, section 10). Two formats exist:

- crypto-agile: a first event in the SHA-1 format (EV_NO_ACTION, "Spec ID Event03") that lists
  the banks and their digest sizes, then TCG_PCR_EVENT2 records with one digest per bank;
- SHA-1 only: TCG_PCClientPCREvent records throughout (older firmware).

``attest.measuredboot.log`` builds the log from these records; every failure here is
:class:`~attest.errors.EventLogInvalid` (``event_log_invalid``).
"""

from __future__ import annotations

import functools
import hashlib
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from attest.errors import EventLogInvalid

MAX_LOG_BYTES: Final = 1024 * 1024  # the protocol's limit for the raw log
MAX_EVENTS: Final = 16384  # real firmware logs hold tens to a few thousand events
MAX_PCR: Final = 23
MAX_BANKS: Final = 8

EV_POST_CODE: Final = 0x00000001
EV_NO_ACTION: Final = 0x00000003
EV_SEPARATOR: Final = 0x00000004
EV_ACTION: Final = 0x00000005
EV_EVENT_TAG: Final = 0x00000006
EV_S_CRTM_VERSION: Final = 0x00000008
EV_IPL: Final = 0x0000000D
EV_OMIT_BOOT_DEVICE_EVENTS: Final = 0x00000012
EV_EFI_VARIABLE_DRIVER_CONFIG: Final = 0x80000001
EV_EFI_VARIABLE_BOOT: Final = 0x80000002
EV_EFI_BOOT_SERVICES_APPLICATION: Final = 0x80000003
EV_EFI_BOOT_SERVICES_DRIVER: Final = 0x80000004
EV_EFI_ACTION: Final = 0x80000007
EV_EFI_VARIABLE_BOOT2: Final = 0x8000000C
EV_EFI_HCRTM_EVENT: Final = 0x80000010
EV_EFI_VARIABLE_AUTHORITY: Final = 0x800000E0

# TPM_ALG_ID -> (bank name, hashlib name); SM3 only where the local OpenSSL offers it.
HASHES: Final[dict[int, tuple[str, str]]] = {
    0x0004: ("sha1", "sha1"),
    0x000B: ("sha256", "sha256"),
    0x000C: ("sha384", "sha384"),
    0x000D: ("sha512", "sha512"),
    0x0012: ("sm3_256", "sm3"),
}
DIGEST_SIZES: Final = {0x0004: 20, 0x000B: 32, 0x000C: 48, 0x000D: 64, 0x0012: 32}

EVENT_TYPES: Final[dict[int, str]] = {
    0x00000000: "EV_PREBOOT_CERT",
    0x00000001: "EV_POST_CODE",
    0x00000002: "EV_UNUSED",
    0x00000003: "EV_NO_ACTION",
    0x00000004: "EV_SEPARATOR",
    0x00000005: "EV_ACTION",
    0x00000006: "EV_EVENT_TAG",
    0x00000007: "EV_S_CRTM_CONTENTS",
    0x00000008: "EV_S_CRTM_VERSION",
    0x00000009: "EV_CPU_MICROCODE",
    0x0000000A: "EV_PLATFORM_CONFIG_FLAGS",
    0x0000000B: "EV_TABLE_OF_DEVICES",
    0x0000000C: "EV_COMPACT_HASH",
    0x0000000D: "EV_IPL",
    0x0000000E: "EV_IPL_PARTITION_DATA",
    0x0000000F: "EV_NONHOST_CODE",
    0x00000010: "EV_NONHOST_CONFIG",
    0x00000011: "EV_NONHOST_INFO",
    0x00000012: "EV_OMIT_BOOT_DEVICE_EVENTS",
    0x00000013: "EV_POST_CODE2",
    0x80000001: "EV_EFI_VARIABLE_DRIVER_CONFIG",
    0x80000002: "EV_EFI_VARIABLE_BOOT",
    0x80000003: "EV_EFI_BOOT_SERVICES_APPLICATION",
    0x80000004: "EV_EFI_BOOT_SERVICES_DRIVER",
    0x80000005: "EV_EFI_RUNTIME_SERVICES_DRIVER",
    0x80000006: "EV_EFI_GPT_EVENT",
    0x80000007: "EV_EFI_ACTION",
    0x80000008: "EV_EFI_PLATFORM_FIRMWARE_BLOB",
    0x80000009: "EV_EFI_HANDOFF_TABLES",
    0x8000000A: "EV_EFI_PLATFORM_FIRMWARE_BLOB2",
    0x8000000B: "EV_EFI_HANDOFF_TABLES2",
    0x8000000C: "EV_EFI_VARIABLE_BOOT2",
    0x8000000D: "EV_EFI_GPT_EVENT2",
    0x80000010: "EV_EFI_HCRTM_EVENT",
    0x800000E0: "EV_EFI_VARIABLE_AUTHORITY",
    0x800000E1: "EV_EFI_SPDM_FIRMWARE_BLOB",
    0x800000E2: "EV_EFI_SPDM_FIRMWARE_CONFIG",
    0x800000E3: "EV_EFI_SPDM_DEVICE_POLICY",
    0x800000E4: "EV_EFI_SPDM_DEVICE_AUTHORITY",
}

SPEC_ID_03: Final = b"Spec ID Event03\x00"
SPEC_ID_LEGACY: Final = (b"Spec ID Event00\x00", b"Spec ID Event02\x00")
_STARTUP_LOCALITY: Final = b"StartupLocality\x00"


_CONSTRUCTORS: Final[dict[str, Callable[[bytes], Any]]] = {
    "sha1": hashlib.sha1,
    "sha256": hashlib.sha256,
    "sha384": hashlib.sha384,
    "sha512": hashlib.sha512,
}
DIGEST_BYTES: Final = {name: DIGEST_SIZES[alg] for alg, (name, _) in HASHES.items()}


def event_type_name(event_type: int) -> str:
    return EVENT_TYPES.get(event_type, f"EV_UNKNOWN_0x{event_type:08x}")


class Event(NamedTuple):
    """One record. ``number`` counts from 0 in log order, the Spec ID event included (as
    ``tpm2_eventlog`` numbers them). ``digests`` maps bank name to digest. A named tuple: logs
    hold thousands of these and a tuple is the cheapest immutable record to build."""

    number: int
    pcr: int
    type: int
    digests: Mapping[str, bytes]
    data: bytes

    @property
    def type_name(self) -> str:
        return event_type_name(self.type)

    def where(self) -> str:
        """How a message names this event: number, PCR and type."""
        return f"event {self.number} (PCR {self.pcr}, {self.type_name})"


@dataclass(frozen=True, slots=True)
class SpecId:
    """The Spec ID event of a crypto-agile log: which banks every later event may carry."""

    platform_class: int
    version: tuple[int, int, int]  # major, minor, errata
    uintn_size: int
    algorithms: tuple[tuple[int, int], ...]  # (TPM_ALG_ID, digest size) in log order
    vendor_info: bytes


def hasher(bank: str) -> Callable[[bytes], Any]:
    """The hashlib constructor of a bank (faster than ``hashlib.new`` per extend)."""
    fn = _CONSTRUCTORS.get(bank)
    if fn is None:
        name = hashlib_name(bank)
        return functools.partial(hashlib.new, name)
    return fn


def hashlib_name(bank: str) -> str:
    for name, lib in HASHES.values():
        if name == bank:
            return lib
    raise EventLogInvalid(f"bank {bank} cannot be replayed")


def _pcr(value: int, event_type: int, number: int) -> int:
    # EV_NO_ACTION records are never extended; firmware files some under PCR 0xFFFFFFFF.
    if value > MAX_PCR and event_type != EV_NO_ACTION:
        raise EventLogInvalid(f"event {number} names PCR {value} (at most {MAX_PCR})")
    return value


# A named tuple's own constructor is a Python function; tuple.__new__ builds the same record
# without it (thousands of records per log).
_new_event = tuple.__new__
_SHA1_HEAD = struct.Struct("<II20xI")  # PCR, type, (the SHA-1 digest), data size
_AGILE_HEAD = struct.Struct("<III")
_SPEC_HEAD = struct.Struct("<IBBBBI")  # after the signature: class, minor, major, errata, uintn, count
_ALG_SIZE = struct.Struct("<HH")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")


def _short(number: int, what: str, pos: int) -> EventLogInvalid:
    return EventLogInvalid(f"event log ends inside event {number}'s {what} at offset {pos}")


def _event_data(data: bytes, pos: int, number: int) -> tuple[bytes, int]:
    """The event's data (u32 size, then the bytes) at ``pos``, and the offset after it."""
    if pos + 4 > len(data):
        raise _short(number, "data size", pos)
    (size,) = _U32.unpack_from(data, pos)
    pos += 4
    if size > len(data) - pos:
        raise EventLogInvalid(f"event {number} claims {size} bytes of data; {len(data) - pos} are left")
    return data[pos : pos + size], pos + size


def sha1_records(data: bytes, pos: int, first: int, limit: int) -> tuple[list[Event], int]:
    """TCG_PCClientPCREvent records from ``pos`` to the end (at most ``limit`` of them, or
    exactly one when ``limit`` is 1): the events and the offset after the last one."""
    out: list[Event] = []
    end = len(data)
    number = first
    while pos < end:
        if len(out) >= limit:
            if limit == 1:
                break
            raise EventLogInvalid(f"the event log holds more than {MAX_EVENTS} events")
        if pos + 28 > end:
            raise _short(number, "header", pos)
        if pos + 32 > end:
            raise _short(number, "data size", pos + 28)
        pcr, etype, size = _SHA1_HEAD.unpack_from(data, pos)
        if pcr > MAX_PCR:
            _pcr(pcr, etype, number)  # raises unless an EV_NO_ACTION
        at = pos + 32
        if size > end - at:
            raise EventLogInvalid(f"event {number} claims {size} bytes of data; {end - at} are left")
        out.append(
            _new_event(Event, (number, pcr, etype, {"sha1": data[pos + 8 : pos + 28]}, data[at : at + size]))
        )
        pos = at + size
        number += 1
    return out, pos


def _agile_digests(
    data: bytes, pos: int, number: int, count: int, sizes: Mapping[int, int], names: Mapping[int, str]
) -> tuple[dict[str, bytes], int]:
    """An event's TPML_DIGEST_VALUES read one by one (fewer banks, another order, or banks that
    cannot be replayed), and the offset after them."""
    end = len(data)
    digests: dict[str, bytes] = {}
    other: list[int] = []  # algorithms listed in the Spec ID that cannot be replayed (rare)
    for _ in range(count):
        if pos + 2 > end:
            raise _short(number, "digest algorithm", pos)
        (alg,) = _U16.unpack_from(data, pos)
        size = sizes.get(alg)
        if size is None:
            raise EventLogInvalid(f"event {number} carries a digest for 0x{alg:04x}, not a bank of this log")
        name = names.get(alg)
        if (name in digests) if name is not None else (alg in other):
            raise EventLogInvalid(f"event {number} carries two digests for 0x{alg:04x}")
        pos += 2
        if pos + size > end:
            raise _short(number, "digest", pos)
        if name is not None:
            digests[name] = data[pos : pos + size]
        else:
            other.append(alg)
        pos += size
    return digests, pos


@functools.lru_cache(maxsize=16)
def _record_struct(sizes: tuple[int, ...]) -> struct.Struct:
    """A crypto-agile record with every bank: header, (algorithm, digest) pairs, data size.
    Cached like ``struct``'s own format cache: a log's bank sizes recur across logs."""
    return struct.Struct("<III" + "".join(f"H{size}s" for size in sizes) + "I")


def agile_records(data: bytes, pos: int, first: int, limit: int, sizes: Mapping[int, int]) -> list[Event]:
    """TCG_PCR_EVENT2 records from ``pos`` to the end of ``data``; ``sizes`` maps each bank the
    Spec ID event lists to its digest size."""
    out: list[Event] = []
    end = len(data)
    number = first
    names = {alg: HASHES[alg][0] for alg in sizes if alg in HASHES}
    banks = len(sizes)
    # Nearly every event carries every bank in the Spec ID's order: one precompiled struct reads
    # its header, every (algorithm, digest) pair and the data size at once.
    whole = _record_struct(tuple(sizes.values()))
    expected = tuple(sizes)
    bank_names = tuple(names.get(alg, "") for alg in sizes)
    fast = len(names) == banks
    n0, n1, n2 = (*bank_names, "", "", "")[:3]
    # The loop's names bound locally (it runs once per event): no attribute lookups inside.
    append, unpack, new_event, max_pcr = out.append, whole.unpack_from, _new_event, MAX_PCR
    head = whole.size if fast else end + 1  # without the fast path, every record goes below
    stop = first + limit  # number - first is len(out)
    while pos < end:
        if pos + head <= end:
            fields = unpack(data, pos)
            if fields[2] == banks and fields[3:-1:2] == expected and fields[0] <= max_pcr:
                size = fields[-1]
                at = pos + head
                if size > end - at:
                    raise EventLogInvalid(f"event {number} claims {size} bytes of data; {end - at} are left")
                if number >= stop:
                    raise EventLogInvalid(f"the event log holds more than {MAX_EVENTS} events")
                # A dict display is several times cheaper than dict(zip(...)) for a few banks.
                if banks == 1:
                    digests = {n0: fields[4]}
                elif banks == 2:
                    digests = {n0: fields[4], n1: fields[6]}
                elif banks == 3:
                    digests = {n0: fields[4], n1: fields[6], n2: fields[8]}
                else:
                    digests = dict(zip(bank_names, fields[4:-1:2], strict=True))
                append(new_event(Event, (number, fields[0], fields[1], digests, data[at : at + size])))
                pos = at + size
                number += 1
                continue
        if len(out) >= limit:
            raise EventLogInvalid(f"the event log holds more than {MAX_EVENTS} events")
        if pos + 12 > end:
            raise _short(number, "header", pos)
        raw_pcr, etype, count = _AGILE_HEAD.unpack_from(data, pos)
        pcr = _pcr(raw_pcr, etype, number)
        if count > banks:
            raise EventLogInvalid(f"event {number} carries {count} digests; the log has {banks} banks")
        digests, pos = _agile_digests(data, pos + 12, number, count, sizes, names)
        body, pos = _event_data(data, pos, number)
        append(Event(number, pcr, etype, digests, body))
        number += 1
    return out


def spec_id(data: bytes) -> SpecId:
    """The Spec ID Event03 structure (PFP 10.4.5.1): read with precompiled structs (it opens every
    crypto-agile log), each part bounds-checked, no trailing bytes."""
    end = len(data)
    if end < 28:
        raise EventLogInvalid(f"event log ends inside the Spec ID header at offset {end}")
    platform_class, minor, major, errata, uintn, count = _SPEC_HEAD.unpack_from(data, 16)
    if not 1 <= count <= MAX_BANKS:
        raise EventLogInvalid(f"the Spec ID event lists {count} algorithms (1 to {MAX_BANKS})")
    pos = 28 + 4 * count
    if pos > end:
        raise EventLogInvalid(f"event log ends inside the Spec ID algorithm list at offset {end}")
    algs: list[tuple[int, int]] = []
    for alg, size in _ALG_SIZE.iter_unpack(data[28:pos]):
        if any(a == alg for a, _ in algs):
            raise EventLogInvalid(f"the Spec ID event lists algorithm 0x{alg:04x} twice")
        known = DIGEST_SIZES.get(alg)
        if known is not None and known != size:
            raise EventLogInvalid(f"the Spec ID event gives algorithm 0x{alg:04x} a {size}-byte digest")
        if not 1 <= size <= 64:
            raise EventLogInvalid(f"the Spec ID event gives algorithm 0x{alg:04x} a {size}-byte digest")
        algs.append((alg, size))
    if pos >= end:
        raise EventLogInvalid(f"event log ends inside the vendor info size at offset {pos}")
    vendor_end = pos + 1 + data[pos]
    if vendor_end > end:
        raise EventLogInvalid(f"event log ends inside the vendor info at offset {pos + 1}")
    if vendor_end < end:
        raise EventLogInvalid(f"the Spec ID event has {end - vendor_end} trailing bytes")
    return SpecId(platform_class, (major, minor, errata), uintn, tuple(algs), data[pos + 1 : vendor_end])


def startup_locality(ev: Event) -> int | None:
    if ev.type != EV_NO_ACTION or ev.pcr != 0 or not ev.data.startswith(_STARTUP_LOCALITY):
        return None
    if len(ev.data) != len(_STARTUP_LOCALITY) + 1:
        raise EventLogInvalid(f"{ev.where()}: a StartupLocality event holds one byte after its signature")
    locality = ev.data[-1]
    if locality not in (0, 3, 4):
        raise EventLogInvalid(f"{ev.where()}: StartupLocality {locality} (0, 3 or 4)")
    return locality
