"""What a measured-boot policy reads from a replayed event log, and only what the TPM vouches for.

Facts come from the typed events of ``events`` in PCRs the quote covers, in the quoted bank, plus
the order the profile prescribes inside a PCR (the order of one PCR's extends is vouched for by
the replay; the order between PCRs is not):

- PCR 7: the Secure Boot configuration (SecureBoot, PK, KEK, db, dbx, ...) counts only before
  PCR 7's separator, each variable once, and all five must be there (the profile measures them
  even when empty). A variable after the separator, a second one, or a second separator is
  uninterpreted (root can extend PCR 7 after boot and append a matching event; the profile
  never measures configuration there). Without a separator nothing of the configuration counts.
  Authorities may appear on either side (drivers, then boot applications).
- PCR 8: grub measures ``linux ARGS`` (its command) and then the kernel command line; a command
  line is read only directly after a kernel command of the same grub, and a kernel command must
  be followed by its command line. The prefix that says "command" or "kernel command line" is
  outside the digest, so this pairing is what stops a relabelled command line from hiding.

- PCR 4 and 7: an EV_EFI_ACTION string the profile does not define is kept by name
  (``vendor_actions``) when its digest is the string's; a class allows it or its rules fail.

Everything that is not interpreted is kept in ``uninterpreted`` with its reason; a rule that
depends on its PCR fails (``policy``). Pure.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field

from attest.measuredboot import efi
from attest.measuredboot.events import (
    BOOT_APPLICATION_PCR,
    GRUB_KERNEL_COMMANDS,
    GRUB_MODULE_COMMANDS,
    GRUB_STRING_PCR,
    JUDGED_PCRS,
    SECURE_BOOT_PCR,
    UEFI_DEBUG_MODE,
    Action,
    Application,
    Authority,
    GrubText,
    LoaderCmdline,
    Separator,
    ShimState,
    Typed,
    Uninterpreted,
    Variable,
    VendorAction,
    interpret,
)
from attest.measuredboot.tcglog import EV_NO_ACTION, Event, hasher

__all__ = [
    "Application",
    "Authority",
    "BootFacts",
    "KeyVariable",
    "Text",
    "facts",
    "preferred_bank",
    "secure_boot",
]


@dataclass(frozen=True, slots=True)
class Text:
    event: Event
    text: str


class KeyVariable:
    """PK, KEK, db or dbx as measured; the signature lists are parsed on first use."""

    __slots__ = ("__dict__", "event", "name", "value")

    def __init__(self, event: Event, name: str, value: bytes) -> None:
        self.event, self.name, self.value = event, name, value

    @functools.cached_property
    def sha256_entries(self) -> frozenset[bytes]:
        """The image digests of its EFI_CERT_SHA256 lists (empty when the value does not parse)."""
        try:
            return efi.sha256_entries(self.value)
        except ValueError:
            return frozenset()

    @functools.cached_property
    def signatures(self) -> tuple[efi.Signature, ...] | None:
        """None when the value is not a sequence of EFI_SIGNATURE_LISTs."""
        try:
            return tuple(efi.signature_lists(self.value))
        except ValueError:
            return None


@dataclass(frozen=True, slots=True)
class BootFacts:
    bank: str
    secure_boot: bool | None
    secure_boot_event: Event | None
    keys: dict[str, KeyVariable]  # PK, KEK, db, dbx (dbt, dbr) before PCR 7's separator
    authorities: tuple[Authority, ...]
    boot_applications: tuple[Application, ...]
    grub_commands: tuple[GrubText, ...]  # .event, .text
    kernel_cmdlines: tuple[Text, ...]
    separators: tuple[Event, ...]  # in the judged PCRs
    uninterpreted: tuple[Uninterpreted, ...]
    uncovered: tuple[Event, ...] = field(default=())  # in PCRs the quote does not cover
    debug_mode: Event | None = None  # "UEFI Debug Mode" measured into PCR 7
    shim_state: tuple[ShimState, ...] = field(default=())
    typed: tuple[Typed, ...] = field(default=())  # every covered event of a judged PCR, in log order
    vendor_actions: tuple[VendorAction, ...] = field(default=())  # PCR 4 and 7, by name
    # The first event in PCR 8 that starts a kernel with a measured command line (grub's linux
    # command, systemd-boot's load options); ``learn`` reads the loaders logged before it.
    cmdline_anchor: Event | None = None

    def vendor_problems(self, pcr: int, allowed: Collection[str]) -> tuple[VendorAction, ...]:
        """The vendor action strings in ``pcr`` that ``allowed`` does not name."""
        return tuple(a for a in self.vendor_actions if a.event.pcr == pcr and a.text not in allowed)

    def pcr4(self) -> tuple[Typed, ...]:
        """PCR 4's interpreted events in extend order (the replay vouches for it)."""
        return tuple(t for t in self.typed if t[0] is not None and t[0].pcr == BOOT_APPLICATION_PCR)

    def problems(self, pcr: int) -> tuple[Uninterpreted, ...]:
        """What in ``pcr`` has no vouched-for meaning: a rule about ``pcr`` cannot hold with it."""
        return tuple(u for u in self.uninterpreted if u.pcr == pcr)

    def dbx_hashes(self) -> frozenset[bytes]:
        dbx = self.keys.get("dbx")
        return dbx.sha256_entries if dbx is not None else frozenset()

    def dbx_digests(self) -> frozenset[str]:
        return frozenset(h.hex() for h in self.dbx_hashes())


REQUIRED_VARIABLES_ORDER = ("SecureBoot", "PK", "KEK", "db", "dbx")
REQUIRED_VARIABLES = frozenset(REQUIRED_VARIABLES_ORDER)


@dataclass
class _Pcr7:
    """PCR 7 in extend order: configuration, one separator, authorities."""

    secure_boot: bool | None = None
    secure_boot_event: Event | None = None
    keys: dict[str, KeyVariable] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)
    separator: Event | None = None
    debug_mode: Event | None = None

    def add(self, ev: Event, t: Typed, out: list[Uninterpreted]) -> None:
        if isinstance(t, Separator):
            if self.separator is not None:
                out.append(Uninterpreted(ev, ev.pcr, "a second separator in PCR 7"))
            else:
                self.separator = ev
        elif isinstance(t, Variable):
            name = t.variable.name
            if self.separator is not None:
                out.append(Uninterpreted(ev, ev.pcr, f"variable {name} after PCR 7's separator"))
            elif name in self.seen:
                out.append(Uninterpreted(ev, ev.pcr, f"a second {name} variable in PCR 7"))
            else:
                self.seen.add(name)
                if name == "SecureBoot":
                    self.secure_boot, self.secure_boot_event = _secure_boot_value(t.variable.value), ev
                elif name in ("PK", "KEK", "db", "dbx", "dbt", "dbr"):
                    self.keys[name] = KeyVariable(ev, name, t.variable.value)
        elif isinstance(t, Action) and t.text == UEFI_DEBUG_MODE:
            self.debug_mode = ev


def _secure_boot_value(value: bytes) -> bool | None:
    if value == b"\x01":
        return True
    if value in (b"", b"\x00"):
        return False
    return None


def _grub(
    typed: Sequence[Typed], out: list[Uninterpreted]
) -> tuple[list[GrubText], list[Text], Event | None]:
    """grub's commands and kernel command lines from PCR 8, in extend order, paired (see above),
    and the first event that started a kernel with a measured line."""
    commands: list[GrubText] = []
    cmdlines: list[Text] = []
    anchor: Event | None = None
    previous: Typed | None = None
    pending: GrubText | None = None  # a kernel command still waiting for its command line
    for t in typed:
        if pending is not None and not (isinstance(t, GrubText) and t.role == "kernel"):
            out.append(_unpaired(pending))
            pending = None
        if isinstance(t, GrubText):
            if t.role == "command":
                commands.append(t)
                if t.word in GRUB_KERNEL_COMMANDS:
                    pending = t
            elif t.role == "kernel":
                if pending is None or not _same_grub(pending, t):
                    out.append(_stray(t, "kernel command line", "linux"))
                else:
                    cmdlines.append(Text(t.event, t.text))
                    anchor = anchor or pending.event
                pending = None
            elif not (isinstance(previous, GrubText) and previous.word in GRUB_MODULE_COMMANDS):
                out.append(_stray(t, "module command line", "module"))
        elif isinstance(t, LoaderCmdline):
            cmdlines.append(Text(t.event, t.text))
            anchor = anchor or t.event
        previous = t
    if pending is not None:
        out.append(_unpaired(pending))
    return commands, cmdlines, anchor


def _same_grub(command: GrubText, line: GrubText) -> bool:
    return (command.prefix == b"grub_cmd ") == (line.prefix == b"grub_kernel_cmdline ")


def _unpaired(t: GrubText) -> Uninterpreted:
    return Uninterpreted(
        t.event,
        t.event.pcr,
        f"grub's {t.command} command is not followed by the kernel command line it measures",
    )


def _stray(t: GrubText, what: str, command: str) -> Uninterpreted:
    return Uninterpreted(
        t.event, t.event.pcr, f"a {what} that does not directly follow grub's {command} command"
    )


def facts(events: Iterable[Event], *, bank: str, pcrs: Collection[int] | None = None) -> BootFacts:
    """The facts of ``events`` as vouched for in ``bank``; with ``pcrs``, only events in those
    PCRs (the ones the quote covers) count, the rest are listed as ``uncovered``."""
    uninterpreted: list[Uninterpreted] = []
    uncovered: list[Event] = []
    typed: list[Typed] = []
    pcr7 = _Pcr7()
    pcr8: list[Typed] = []
    authorities: list[Authority] = []
    apps: list[Application] = []
    separators: list[Event] = []
    shim: list[ShimState] = []
    vendor: list[VendorAction] = []
    seen7 = False
    h = hasher(bank)
    for ev in events:
        pcr = ev[1]  # Event's pcr and type, by index: cheaper than attributes, every event
        if ev[2] == EV_NO_ACTION:
            continue
        if pcrs is not None and pcr not in pcrs:
            uncovered.append(ev)
            continue
        if pcr not in JUDGED_PCRS:
            continue
        t = interpret(ev, bank, h)
        typed.append(t)
        kind = type(t)
        # PCR 8 types as grub/systemd-boot text or not at all (events.py gives separators,
        # actions, variables, authorities and applications other PCRs), so the rest is skipped.
        if pcr == GRUB_STRING_PCR:
            if kind is Uninterpreted:
                uninterpreted.append(t)  # type: ignore[arg-type]
            pcr8.append(t)
            continue
        if kind is Uninterpreted:
            uninterpreted.append(t)  # type: ignore[arg-type]
            if pcr == SECURE_BOOT_PCR:
                seen7 = True
                continue
        elif kind is Application:
            apps.append(t)  # type: ignore[arg-type]
        elif kind is Authority:
            authorities.append(t)  # type: ignore[arg-type]
        elif kind is ShimState:
            shim.append(t)  # type: ignore[arg-type]
        elif kind is VendorAction:
            vendor.append(t)  # type: ignore[arg-type]
        elif kind is Separator:
            separators.append(ev)
        if pcr == SECURE_BOOT_PCR:
            seen7 = True
            pcr7.add(ev, t, uninterpreted)
    commands, cmdlines, anchor = _grub(pcr8, uninterpreted)
    pcr7 = _closed(pcr7, seen7 or (pcrs is not None and SECURE_BOOT_PCR in pcrs), uninterpreted)
    return BootFacts(
        bank=bank,
        secure_boot=pcr7.secure_boot,
        secure_boot_event=pcr7.secure_boot_event,
        keys=pcr7.keys,
        authorities=tuple(authorities),
        boot_applications=tuple(apps),
        grub_commands=tuple(commands),
        kernel_cmdlines=tuple(cmdlines),
        separators=tuple(separators),
        uninterpreted=tuple(uninterpreted),
        uncovered=tuple(uncovered),
        debug_mode=pcr7.debug_mode,
        shim_state=tuple(shim),
        typed=tuple(typed),
        vendor_actions=tuple(vendor),
        cmdline_anchor=anchor,
    )


def _closed(pcr7: _Pcr7, judged: bool, uninterpreted: list[Uninterpreted]) -> _Pcr7:
    """PCR 7's configuration counts only when its separator closed it and all five required
    variables are there (``judged``: PCR 7 is quoted or has events)."""
    if pcr7.separator is None and judged:
        uninterpreted.append(
            Uninterpreted(None, SECURE_BOOT_PCR, "PCR 7 has no separator, so its configuration is not closed")
        )
        return _Pcr7()
    if pcr7.separator is not None and not pcr7.seen >= REQUIRED_VARIABLES:
        # The profile measures all five (empty ones too): one missing could be an event relabelled
        # into another type, or one moved in from elsewhere under that name.
        missing = ", ".join(v for v in REQUIRED_VARIABLES_ORDER if v not in pcr7.seen)
        uninterpreted.append(
            Uninterpreted(
                None, SECURE_BOOT_PCR, f"PCR 7 lacks {missing}, which the firmware profile measures"
            )
        )
    return pcr7


def preferred_bank(banks: Sequence[str]) -> str | None:
    for bank in ("sha256", "sha384", "sha512", "sha1"):
        if bank in banks:
            return bank
    return banks[0] if banks else None


def secure_boot(events: Sequence[Event], bank: str | None = None) -> bool | None:
    """The SecureBoot variable as measured into PCR 7 before its separator (None: not shown)."""
    if bank is None:
        present = {b for ev in events for b in ev.digests}
        bank = preferred_bank(sorted(present))
    if bank is None:
        return None
    return facts(events, bank=bank, pcrs=(SECURE_BOOT_PCR,)).secure_boot
