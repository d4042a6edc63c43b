"""Typed events: what one event means, trusted only where the TPM vouches for it. Pure.

The TPM signs each event's digest (through the replay), never its type or data. So an event is
given a meaning here only when its PCR, type and data are exactly what the TCG PC Client Platform
Firmware Profile (or the named boot loader) writes, and the data is what the digest is defined
over wherever the profile defines it so:

=================================  =====  =================================================
type                               PCR    data must be
=================================  =====  =================================================
EV_SEPARATOR                       0-7    4 bytes, 00000000 or FFFFFFFF (error); digest of it
EV_EFI_ACTION / EV_ACTION          4,5,7  a string from the profile's list for that PCR
EV_EFI_ACTION                      4, 7   any other printable string hashing to the digest: a
                                          vendor's action (a class must allow it by name)
EV_EFI_VARIABLE_DRIVER_CONFIG      7      UEFI_VARIABLE_DATA naming SecureBoot, PK, KEK, db,
                                          dbx, dbt, dbr, DeployedMode or AuditMode
EV_EFI_VARIABLE_AUTHORITY          7      UEFI_VARIABLE_DATA naming db/vendor_db (image
                                          security database) or shim's Shim, MokList,
                                          MokListX, SbatLevel, MokListTrusted
EV_EFI_BOOT_SERVICES_APPLICATION   4      a UEFI_IMAGE_LOAD_EVENT (digest: the image's)
EV_IPL                             8      grub's ``grub_cmd: ``/``kernel_cmdline: ``/
                                          ``module_cmdline: `` (digest of the text after the
                                          prefix) or RHEL's ``grub_cmd ``/``grub_kernel_cmdline ``
                                          (digest of the text, with its NUL for commands);
                                          systemd-boot's UTF-16 load options (digest of the data)
EV_IPL                             9      grub's loaded files (a path; digest: the file's)
=================================  =====  =================================================

Everything else is :class:`Uninterpreted`, with the reason. Whether an uninterpreted event matters
is the policy's business: it fails every rule that depends on its PCR (``policy``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, Final, NamedTuple

from cryptography import x509

from attest.measuredboot import efi
from attest.measuredboot.tcglog import (
    EV_ACTION,
    EV_EFI_ACTION,
    EV_EFI_BOOT_SERVICES_APPLICATION,
    EV_EFI_VARIABLE_AUTHORITY,
    EV_EFI_VARIABLE_DRIVER_CONFIG,
    EV_IPL,
    EV_SEPARATOR,
    Event,
    hasher,
)

SEPARATOR_OK: Final = b"\x00\x00\x00\x00"
SEPARATOR_ERROR: Final = b"\xff\xff\xff\xff"

# EV_EFI_ACTION strings of the profile (10.4.4) and the PCRs it puts them in.
EFI_ACTIONS: Final[dict[bytes, frozenset[int]]] = {
    b"Calling EFI Application from Boot Option": frozenset({4}),
    b"Returning from EFI Application from Boot Option": frozenset({4}),
    b"Exit Boot Services Invocation": frozenset({5}),
    b"Exit Boot Services Returned with Failure": frozenset({5}),
    b"Exit Boot Services Returned with Success": frozenset({5}),
    b"UEFI Debug Mode": frozenset({7}),
    b"DMA Protection Disabled": frozenset({7}),
}
UEFI_DEBUG_MODE: Final = "UEFI Debug Mode"
DMA_PROTECTION_DISABLED: Final = "DMA Protection Disabled"
# The firmware's boot manager around each boot option it starts (PCR 4): a second attempt or a
# return means the loader that measured a command line may not be what started the kernel.
BOOT_OPTION_RETURNS: Final = frozenset(
    {"Returning from EFI Application from Boot Option", "Returned INT 19h", "Return via INT 18h"}
)
# The PCRs where a vendor's own EV_EFI_ACTION string is read (and judged by name): the ones a
# rule reads that the profile puts action strings in.
VENDOR_ACTION_PCRS: Final = frozenset({4, 7})
MAX_ACTION_CHARS: Final = 256
# EV_ACTION strings of legacy (BIOS) boot paths that the profile puts in PCR 4.
ACTIONS: Final[dict[bytes, frozenset[int]]] = {
    b"Calling INT 19h": frozenset({4}),
    b"Returned INT 19h": frozenset({4}),
    b"Return via INT 18h": frozenset({4}),
}

SECURE_BOOT_PCR: Final = 7
BOOT_APPLICATION_PCR: Final = 4
GRUB_STRING_PCR: Final = 8
GRUB_FILE_PCR: Final = 9
# The PCRs some rule reads; events elsewhere are never interpreted (nothing depends on them).
JUDGED_PCRS: Final = frozenset({BOOT_APPLICATION_PCR, SECURE_BOOT_PCR, GRUB_STRING_PCR})

# The variables the profile measures into PCR 7 before its separator (10.4.4, 3.3.4.8).
_GLOBAL = efi.GLOBAL_VARIABLE.bytes_le
_DB = efi.IMAGE_SECURITY_DATABASE.bytes_le
_SHIM = efi.SHIM_LOCK.bytes_le
CONFIG_VARIABLES: Final[frozenset[tuple[bytes, str]]] = frozenset(
    {
        (_GLOBAL, "SecureBoot"),
        (_GLOBAL, "PK"),
        (_GLOBAL, "KEK"),
        (_DB, "db"),
        (_DB, "dbx"),
        (_DB, "dbt"),
        (_DB, "dbr"),
        (_GLOBAL, "DeployedMode"),
        (_GLOBAL, "AuditMode"),
    }
)
# Who may log an authority, under which name: firmware from db, shim from its own variables.
AUTHORITY_VARIABLES: Final[frozenset[tuple[bytes, str]]] = frozenset(
    {(_DB, "db"), (_DB, "vendor_db"), (_SHIM, "Shim"), (_SHIM, "MokList"), (_SHIM, "MokListX")}
)
# shim's state in PCR 7, logged as authorities but naming no certificate.
SHIM_STATE_VARIABLES: Final[frozenset[tuple[bytes, str]]] = frozenset(
    {(_SHIM, "SbatLevel"), (_SHIM, "MokListTrusted")}
)

# grub's text measurements: (prefix, role, whether the digest covers the terminating NUL).
GRUB_PREFIXES: Final = (
    (b"grub_cmd: ", "command", False),  # upstream grub 2.04+
    (b"kernel_cmdline: ", "kernel", False),
    (b"module_cmdline: ", "module", False),
    (b"grub_kernel_cmdline ", "kernel", False),  # RHEL/Fedora grub before the upstream code
    (b"grub_cmd ", "command", True),
)
# The word before the prefix's space -> (prefix, role, whether the digest covers the NUL).
_GRUB_HEADS: Final = {
    prefix[: prefix.index(b" ")]: (prefix, role, nul) for prefix, role, nul in GRUB_PREFIXES
}
GRUB_KERNEL_COMMANDS: Final = frozenset({b"linux", b"linux16", b"linuxefi", b"multiboot", b"multiboot2"})
GRUB_MODULE_COMMANDS: Final = frozenset({b"module", b"module2"})
# grub commands that start (or return to something that starts) an image whose command line grub
# does not measure as ``kernel_cmdline:``: with one of these in PCR 8 the kernel's line is unproven.
GRUB_IMAGE_COMMANDS: Final = frozenset(
    {
        b"chainloader",
        b"appleloader",
        b"exit",
        b"freedos",
        b"kfreebsd",
        b"knetbsd",
        b"kopenbsd",
        b"legacy_kernel",
        b"ntldr",
        b"plan9",
        b"pxechain",
        b"truecrypt",
        b"xnu_kernel",
        b"xnu_kernel64",
    }
)


class Separator(NamedTuple):
    event: Event
    error: bool  # FFFFFFFF: the firmware reports an error before the hand-off


class Action(NamedTuple):
    event: Event
    text: str


class VendorAction(NamedTuple):
    """An EV_EFI_ACTION string the profile does not define (e.g. HP's "Security Level is
    Downgraded to 0"): the digest is the string's, so the TPM vouches for the text, but not for
    what it means; a class allows it by name (``efi_actions``) or every rule of its PCR fails."""

    event: Event
    text: str


class Variable(NamedTuple):
    """A UEFI variable as measured (PCR 7 configuration)."""

    event: Event
    variable: efi.Variable


class Authority(NamedTuple):
    """The certificate (or hash) that verified a boot application."""

    event: Event
    variable: str  # "db", "vendor_db", "Shim", "MokList"...
    value: bytes  # the measured value: EFI_SIGNATURE_DATA, or a bare certificate from shim

    @property
    def certificate(self) -> bytes:
        """The DER certificate, or the raw value when it carries none (a hash entry)."""
        sig = efi.signature_data(self.value)
        return sig.data if sig is not None else self.value

    @property
    def sha256(self) -> str:
        return _sha256_hex(self.certificate)

    @property
    def subject(self) -> str | None:
        """RFC 4514 subject when the value is a certificate that parses (parsed on first use)."""
        return _subject(self.certificate)


class ShimState(NamedTuple):
    event: Event
    variable: str  # SbatLevel, MokListTrusted
    value: bytes


class Application(NamedTuple):
    event: Event
    digest: str  # hex, in the judged bank: the image's Authenticode digest
    image: efi.ImageLoad

    @property
    def path(self) -> str:
        """From the device path, for people; not vouched for."""
        return efi.device_path_text(self.image.device_path)


class GrubText(NamedTuple):
    event: Event
    role: str  # command, kernel, module
    prefix: bytes  # which flavour of grub wrote it
    body: bytes  # the text after the prefix, without the NUL
    word: bytes  # the first word of body (``linux``, ``set``...): the command, for commands

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    @property
    def command(self) -> str:
        return self.word.decode("utf-8", errors="replace")


class LoaderCmdline(NamedTuple):
    """systemd-boot's kernel command line (UTF-16 load options, digest of the logged bytes)."""

    event: Event
    text: str


class LoadedFile(NamedTuple):
    """grub's file measurements in PCR 9: the digest is the file's, the path is not vouched for."""

    event: Event
    path: str


class Uninterpreted(NamedTuple):
    event: Event | None  # None: something the log lacks (e.g. PCR 7's separator)
    pcr: int
    reason: str

    def where(self) -> str | None:
        return self.event.where() if self.event is not None else None


Typed = (
    Separator
    | Action
    | VendorAction
    | Variable
    | Authority
    | ShimState
    | Application
    | GrubText
    | LoaderCmdline
    | LoadedFile
    | Uninterpreted
)


def _subject(der: bytes) -> str | None:
    try:
        return x509.load_der_x509_certificate(der).subject.rfc4514_string()
    except ValueError:
        return None


def _sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# Named tuples built without their Python-level constructor: one per judged event.
_new: Final = tuple.__new__


def _no(ev: Event, reason: str) -> Uninterpreted:
    return _new(Uninterpreted, (ev, ev[1], reason))


Hasher = Callable[[bytes], Any]  # a hashlib constructor: one per bank, looked up once per log


def interpret(ev: Event, bank: str, h: Hasher | None = None) -> Typed:
    """The meaning of ``ev`` as vouched for in ``bank``, or why it has none (``h``: the bank's
    hashlib constructor, when the caller already has it)."""
    # Event fields by index (number, pcr, type, digests, data): cheaper than attributes here.
    digest = ev[3].get(bank)
    if digest is None:
        return _no(ev, f"no {bank} digest, so the quoted bank does not vouch for it")
    etype = ev[2]
    if etype == EV_IPL and ev[1] == GRUB_STRING_PCR:  # most judged events: grub's, straight on
        return _grub_or_loader(ev, hasher(bank) if h is None else h, digest)
    handler = _HANDLERS.get(etype)
    if handler is None:
        return _no(ev, "an event type the firmware profile does not define for this PCR")
    return handler(ev, hasher(bank) if h is None else h, digest)


def _hash_is(h: Hasher, data: bytes, digest: bytes) -> bool:
    return bool(h(data).digest() == digest)


def _separator(ev: Event, h: Hasher, digest: bytes) -> Typed:
    if ev.pcr > 7:
        return _no(ev, "a separator outside PCRs 0-7")
    if ev.data not in (SEPARATOR_OK, SEPARATOR_ERROR):
        return _no(ev, "separator data is not 00000000 or FFFFFFFF")
    if h(ev.data).digest() != digest:
        return _no(ev, "separator data does not hash to its digest")
    return _new(Separator, (ev, ev.data == SEPARATOR_ERROR))


def _action_in(table: dict[bytes, frozenset[int]]) -> Callable[[Event, Hasher, bytes], Typed]:
    def handler(ev: Event, h: Hasher, digest: bytes) -> Typed:
        text = _action_text(ev.data, h, digest)  # None: the digest is not the string's
        pcrs = table.get(text) if text is not None else table.get(ev.data)
        if pcrs is None:
            vendor = table is EFI_ACTIONS and ev.pcr in VENDOR_ACTION_PCRS
            if vendor and text is not None and _printable(text):
                return VendorAction(ev, text.decode("ascii"))
            return _no(ev, "not an action string of the firmware profile")
        if ev.pcr not in pcrs:
            return _no(
                ev, f"the firmware profile puts this action in PCR {', '.join(map(str, sorted(pcrs)))}"
            )
        if text is None:
            return _no(ev, "action string does not hash to its digest")
        return Action(ev, text.decode("ascii"))

    return handler


def _action_text(data: bytes, h: Hasher, digest: bytes) -> bytes | None:
    """The string an action event's digest vouches for: the data, or the data without the NUL
    some firmware logs after it (and measures with or without: the text is the same)."""
    if _hash_is(h, data, digest):
        return data[:-1] if data.endswith(b"\x00") else data
    if data.endswith(b"\x00") and _hash_is(h, data[:-1], digest):
        return data[:-1]
    return None


def _printable(text: bytes) -> bool:
    return 0 < len(text) <= MAX_ACTION_CHARS and all(0x20 <= c < 0x7F for c in text)


def _variable(ev: Event, h: Hasher, digest: bytes) -> Typed:
    if ev.pcr != SECURE_BOOT_PCR:
        return _no(ev, "a configuration variable outside PCR 7 (not judged)")
    try:
        var = efi.variable(ev.data)
    except ValueError as exc:
        return _no(ev, f"not a UEFI_VARIABLE_DATA: {exc}")
    if (var.guid_le, var.name) not in CONFIG_VARIABLES:
        return _no(ev, f"variable {var.name!r} ({var.guid}) is not one the profile measures into PCR 7")
    if h(ev.data).digest() != digest:
        return _no(ev, "variable data does not hash to its digest")
    return _new(Variable, (ev, var))


def _authority(ev: Event, h: Hasher, digest: bytes) -> Typed:
    if ev.pcr != SECURE_BOOT_PCR:
        return _no(ev, "an authority outside PCR 7")
    covered, quirk = ev.data, False
    if not _hash_is(h, covered, digest):
        # shim before rhboot/shim 8a27a48 logged one byte more than it measured (and a variable
        # size that leaves out the signature owner): only the measured bytes are read.
        covered, quirk = ev.data[:-1], True
        if not ev.data or not _hash_is(h, covered, digest):
            return _no(ev, "authority data does not hash to its digest")
    try:
        var = efi.variable(covered, value_to_end=quirk)
    except ValueError as exc:
        return _no(ev, f"not a UEFI_VARIABLE_DATA: {exc}")
    key = (var.guid_le, var.name)
    if key in SHIM_STATE_VARIABLES:
        return ShimState(ev, var.name, var.value)
    if key not in AUTHORITY_VARIABLES:
        return _no(ev, f"authority variable {var.name!r} ({var.guid}) is not db or shim's")
    value = var.value
    if quirk:  # that shim logged a bare certificate followed by bytes that are not part of it
        size = efi.der_length(value)
        value = value[:size] if size is not None else value
    if not _authority_value(value):
        return _no(ev, "authority value is neither a signature entry nor a certificate")
    return Authority(ev, var.name, value)


def _authority_value(value: bytes) -> bool:
    """An EFI_SIGNATURE_DATA (owner + certificate, or owner + image hash), or a bare certificate
    (shim's built-in vendor certificate), each filling the value exactly."""
    if efi.der_length(value) == len(value):
        return True
    if len(value) > 16 and efi.der_length(value[16:]) == len(value) - 16:
        return True
    return len(value) in (16 + 20, 16 + 32, 16 + 48, 16 + 64)


def _application(ev: Event, h: Hasher, digest: bytes) -> Typed:
    if ev.pcr != BOOT_APPLICATION_PCR:
        return _no(ev, "a boot application outside PCR 4")
    try:
        image = efi.image_load(ev.data)
    except ValueError as exc:
        return _no(ev, f"not a UEFI_IMAGE_LOAD_EVENT: {exc}")
    return Application(ev, digest.hex(), image)


def _ipl(ev: Event, h: Hasher, digest: bytes) -> Typed:
    if ev.pcr == GRUB_STRING_PCR:
        return _grub_or_loader(ev, h, digest)
    if ev.pcr == GRUB_FILE_PCR:
        data = ev.data
        if not data.endswith(b"\x00") or b"\x00" in data[:-1]:
            return _no(ev, "not a NUL-terminated path")
        return LoadedFile(ev, data[:-1].decode("utf-8", errors="replace"))
    return _no(ev, "an EV_IPL event outside the boot loader's PCRs 8 and 9")


def _grub_or_loader(ev: Event, h: Hasher, digest: bytes) -> Typed:
    data = ev[4]
    last = len(data) - 1
    if last > 0 and data.find(b"\x00") == last:
        space = data.find(b" ")
        found = _GRUB_HEADS.get(data[:space]) if space > 0 else None
        if found is None:
            return _no(ev, "not a grub measurement (unknown prefix)")
        prefix, role, with_nul = found
        if h(data[space + 1 : last + 1 if with_nul else last]).digest() != digest:
            return _no(ev, f"grub text does not hash to its digest as {prefix.decode().strip()} defines")
        body = data[space + 1 : last]
        cut = body.find(b" ")
        word = body if cut < 0 else body[:cut]
        return _new(GrubText, (ev, role, prefix, body, word))
    return _systemd_boot(ev, h, digest)


def _systemd_boot(ev: Event, h: Hasher, digest: bytes) -> Typed:
    """systemd-boot logs the load options as UTF-16 with their NUL and measures the same bytes;
    releases before v246 logged one byte less than they measured (the second NUL byte)."""
    data = ev.data
    if len(data) % 2 == 0 and data.endswith(b"\x00\x00") and _hash_is(h, data, digest):
        measured = data
    elif len(data) % 2 == 1 and data.endswith(b"\x00") and _hash_is(h, data + b"\x00", digest):
        measured = data + b"\x00"
    else:
        return _no(ev, "neither a grub nor a systemd-boot measurement")
    try:
        text = measured[:-2].decode("utf-16-le")
    except UnicodeDecodeError:
        return _no(ev, "systemd-boot load options that are not UTF-16")
    if "\x00" in text:
        return _no(ev, "systemd-boot load options with a NUL inside")
    return LoaderCmdline(ev, text)


_HANDLERS: Final[dict[int, Callable[[Event, Hasher, bytes], Typed]]] = {
    EV_SEPARATOR: _separator,
    EV_EFI_ACTION: _action_in(EFI_ACTIONS),
    EV_ACTION: _action_in(ACTIONS),
    EV_EFI_VARIABLE_DRIVER_CONFIG: _variable,
    EV_EFI_VARIABLE_AUTHORITY: _authority,
    EV_EFI_BOOT_SERVICES_APPLICATION: _application,
    EV_IPL: _ipl,
}
