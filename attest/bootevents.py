"""What a measured-boot policy reads from an event log, and only what the log proves. Pure.

An event's type and data are not covered by the TPM's signature; only its digest is, through the
replay. So a fact is taken from an event only when (1) the event extends a PCR the quote covers,
and (2) for events whose digest the specification defines over their data (EFI variables,
authorities, separators, actions, grub's strings), that data hashes to the digest in the quoted
bank. An event that fails (2) is listed as ``unverified`` and contributes nothing: a forged log
cannot show harmless data next to the digest of something else. Events of types this module does
not know are kept in ``other`` and shown; they never vanish. Since a forger can also retype an
event (the type is not covered either), a policy rule about a PCR must treat every event there
that is not proven (``unproven(pcr)``) as a violation: hiding an event must not hide its digest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Final

from cryptography import x509

from attest import efi
from attest.tcglog import EV_NO_ACTION, EV_SEPARATOR, Event, hasher

EV_ACTION: Final = 0x00000005
EV_IPL: Final = 0x0000000D
EV_EFI_VARIABLE_DRIVER_CONFIG: Final = 0x80000001
EV_EFI_VARIABLE_BOOT: Final = 0x80000002
EV_EFI_BOOT_SERVICES_APPLICATION: Final = 0x80000003
EV_EFI_ACTION: Final = 0x80000007
EV_EFI_VARIABLE_BOOT2: Final = 0x8000000C
EV_EFI_VARIABLE_AUTHORITY: Final = 0x800000E0

SECURE_BOOT_PCR: Final = 7
_GRUB_PREFIXES: Final = (b"grub_cmd: ", b"kernel_cmdline: ", b"module_cmdline: ")
_SECURE_BOOT_KEYS: Final = ("PK", "KEK", "db", "dbx")
# Types whose digest the PFP specification defines over the event data as logged.
# (Authorities are checked on their own: see _authority_bytes.)
_DATA_DIGESTS: Final = frozenset({EV_SEPARATOR, EV_ACTION, EV_EFI_ACTION, EV_EFI_VARIABLE_DRIVER_CONFIG})


@dataclass(frozen=True, slots=True)
class Authority:
    """A certificate (or hash) that verified a boot application (EV_EFI_VARIABLE_AUTHORITY)."""

    event: Event
    variable: str  # "db", "MokListRT", "Shim", "SbatLevel"...
    sha256: str  # of the certificate DER (or of the raw value when it is not a certificate)
    subject: str | None  # RFC 4514, when the value is a certificate that parses


@dataclass(frozen=True, slots=True)
class BootApplication:
    event: Event
    digest: str  # hex, in the trusted bank: the Authenticode digest of the image
    path: str  # from the device path, for people; not trusted


@dataclass(frozen=True, slots=True)
class Text:
    event: Event
    text: str


@dataclass(frozen=True, slots=True)
class BootFacts:
    bank: str
    secure_boot: bool | None
    secure_boot_event: Event | None
    keys: dict[str, tuple[efi.Signature, ...]]  # PK, KEK, db, dbx as measured into PCR 7
    authorities: tuple[Authority, ...]
    boot_applications: tuple[BootApplication, ...]
    grub_commands: tuple[Text, ...]
    kernel_cmdlines: tuple[Text, ...]
    separators: tuple[Event, ...]
    unverified: tuple[Event, ...]  # data that does not hash to the digest: contributes nothing
    uncovered: tuple[Event, ...] = field(default=())  # in PCRs the quote does not cover
    other: tuple[Event, ...] = field(default=())  # kept and shown, not interpreted, data unproven
    proven: tuple[Event, ...] = field(default=())  # data shown to hash to the digest, not interpreted

    def unproven(self, pcr: int) -> tuple[Event, ...]:
        """Events in ``pcr`` whose meaning the log does not prove: unverified data, or a type this
        module does not interpret (it may be a retyped event hiding its real meaning)."""
        return tuple(e for e in (*self.unverified, *self.other) if e.pcr == pcr)

    def dbx_digests(self) -> frozenset[str]:
        return frozenset(s.data.hex() for s in self.keys.get("dbx", ()) if s.type == efi.CERT_SHA256)


def _hash(bank: str, data: bytes) -> bytes:
    return bytes(hasher(bank)(data).digest())


def data_matches(ev: Event, bank: str, data: bytes) -> bool:
    digest = ev.digests.get(bank)
    return digest is not None and _hash(bank, data) == digest


def _grub_text(ev: Event, bank: str) -> tuple[bytes, str] | None:
    """grub measures ``grub_cmd: CMD`` / ``kernel_cmdline: LINE`` as text (NUL-terminated in the
    log) and extends the digest of CMD or LINE alone."""
    data = ev.data[:-1] if ev.data.endswith(b"\x00") else ev.data
    for prefix in _GRUB_PREFIXES:
        if data.startswith(prefix):
            body = data[len(prefix) :]
            if data_matches(ev, bank, body) or data_matches(ev, bank, ev.data):
                return prefix, body.decode("utf-8", errors="replace")
            return None
    return None


def _authority_bytes(ev: Event, bank: str) -> bytes | None:
    """The bytes of an EV_EFI_VARIABLE_AUTHORITY event that its digest covers. shim before
    rhboot/shim commit 8a27a48 logged one byte more than it measured (and variable sizes that
    miss the signature owner), so its events verify over all but the last byte: only those
    bytes are used, so the extra byte can never carry a fact (go-attestation issue 157)."""
    if data_matches(ev, bank, ev.data):
        return ev.data
    if ev.data and data_matches(ev, bank, ev.data[:-1]):
        return ev.data[:-1]
    return None


def _authority(ev: Event, var: efi.Variable) -> Authority:
    sig = efi.signature_data(var.value)
    der = sig.data if sig is not None else var.value
    subject: str | None = None
    try:
        subject = x509.load_der_x509_certificate(der).subject.rfc4514_string()
    except ValueError:
        subject = None
    return Authority(ev, var.name, hashlib.sha256(der).hexdigest(), subject)


def _secure_boot_value(value: bytes) -> bool | None:
    if value in (b"\x01",):
        return True
    if value in (b"", b"\x00"):
        return False
    return None


@dataclass
class _Collector:
    """Sorts events into facts, one handler per event type; see :func:`facts`."""

    bank: str
    secure_boot: bool | None = None
    secure_boot_event: Event | None = None
    keys: dict[str, list[efi.Signature]] = field(default_factory=dict)
    authorities: list[Authority] = field(default_factory=list)
    apps: list[BootApplication] = field(default_factory=list)
    grub: list[Text] = field(default_factory=list)
    cmdlines: list[Text] = field(default_factory=list)
    separators: list[Event] = field(default_factory=list)
    unverified: list[Event] = field(default_factory=list)
    other: list[Event] = field(default_factory=list)
    proven: list[Event] = field(default_factory=list)

    def add(self, ev: Event) -> None:
        if self.bank not in ev.digests or (
            ev.type in _DATA_DIGESTS and not data_matches(ev, self.bank, ev.data)
        ):
            self.unverified.append(ev)
            return
        handler = self._HANDLERS.get(ev.type)
        try:
            if handler is not None:
                handler(self, ev)
            elif ev.type == EV_IPL and ev.data.startswith(_GRUB_PREFIXES):
                self._grub(ev)
            elif ev.type in _DATA_DIGESTS:
                self.proven.append(ev)  # e.g. EFI actions: data shown, nothing to interpret
            else:
                self.other.append(ev)
        except ValueError:
            self.unverified.append(ev)

    def _separator(self, ev: Event) -> None:
        self.separators.append(ev)

    def _variable(self, ev: Event) -> None:
        var = efi.variable(ev.data)
        if ev.pcr == SECURE_BOOT_PCR and var.guid == efi.GLOBAL_VARIABLE and var.name == "SecureBoot":
            self.secure_boot, self.secure_boot_event = _secure_boot_value(var.value), ev
        elif ev.pcr == SECURE_BOOT_PCR and var.name in _SECURE_BOOT_KEYS:
            self.keys[var.name] = efi.signature_lists(var.value)
        else:
            self.proven.append(ev)  # another variable: its data is shown to be what was measured

    def _authority(self, ev: Event) -> None:
        covered = _authority_bytes(ev, self.bank)
        if covered is None:
            raise ValueError("data does not hash to the digest")
        self.authorities.append(_authority(ev, efi.variable(covered, value_to_end=covered != ev.data)))

    def _application(self, ev: Event) -> None:
        try:
            path = efi.device_path_text(efi.image_load(ev.data).device_path)
        except ValueError:
            path = ""
        self.apps.append(BootApplication(ev, ev.digests[self.bank].hex(), path))

    def _grub(self, ev: Event) -> None:
        found = _grub_text(ev, self.bank)
        if found is None:
            raise ValueError("grub text does not hash to the digest")
        (self.cmdlines if found[0] == b"kernel_cmdline: " else self.grub).append(Text(ev, found[1]))

    _HANDLERS: ClassVar[dict[int, Callable[[_Collector, Event], None]]] = {
        EV_SEPARATOR: _separator,
        EV_EFI_VARIABLE_DRIVER_CONFIG: _variable,
        EV_EFI_VARIABLE_AUTHORITY: _authority,
        EV_EFI_BOOT_SERVICES_APPLICATION: _application,
    }


def facts(events: Sequence[Event], *, bank: str, pcrs: Collection[int] | None = None) -> BootFacts:
    """The facts of ``events`` as proven in ``bank``; with ``pcrs``, only events in those PCRs
    (the ones the quote covers) count, the rest are listed as ``uncovered``."""
    c = _Collector(bank)
    uncovered: list[Event] = []
    for ev in events:
        if ev.type == EV_NO_ACTION:
            continue
        if pcrs is not None and ev.pcr not in pcrs:
            uncovered.append(ev)
        else:
            c.add(ev)
    return BootFacts(
        bank=bank,
        secure_boot=c.secure_boot,
        secure_boot_event=c.secure_boot_event,
        keys={k: tuple(v) for k, v in c.keys.items()},
        authorities=tuple(c.authorities),
        boot_applications=tuple(c.apps),
        grub_commands=tuple(c.grub),
        kernel_cmdlines=tuple(c.cmdlines),
        separators=tuple(c.separators),
        unverified=tuple(c.unverified),
        uncovered=tuple(uncovered),
        other=tuple(c.other),
        proven=tuple(c.proven),
    )


def preferred_bank(banks: Sequence[str]) -> str | None:
    for bank in ("sha256", "sha384", "sha512", "sha1"):
        if bank in banks:
            return bank
    return banks[0] if banks else None


def secure_boot(events: Sequence[Event], bank: str | None = None) -> bool | None:
    """The SecureBoot variable as measured into PCR 7 (None: not measured, or its data does not
    hash to its digest)."""
    if bank is None:
        present = {b for ev in events for b in ev.digests}
        bank = preferred_bank(sorted(present))
    if bank is None:
        return None
    return facts(events, bank=bank, pcrs=(SECURE_BOOT_PCR,)).secure_boot
