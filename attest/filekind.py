"""What a file given as a firmware event log looks like when it is not one. Pure: bytes in.

People hand ``nodegate eventlog inspect`` and ``--event-log`` the wrong file: the kernel's IMA
runtime list (``/sys/kernel/security/ima/...``), ``tpm2_eventlog``'s YAML, a compressed copy, a
certificate. The TCG parser can only say that "event 0 claims N bytes"; :func:`describe` names the
file instead, in one line, and says which file was probably meant. It returns None for anything it
does not recognise (the parser's own error then stands), and never for a TCG log: only content a
TCG log cannot start with is named.
"""

from __future__ import annotations

import struct

__all__ = ["FIRMWARE_LOG", "describe"]

FIRMWARE_LOG = "/sys/kernel/security/tpm0/binary_bios_measurements"
_IMA_TEMPLATES = (b"ima-ng", b"ima-sig", b"ima-buf", b"ima-modsig", b"ima")
_SNIFF = 4096
_WANT = f"the firmware's TCG event log is {FIRMWARE_LOG}"


def describe(data: bytes) -> str | None:
    """One line naming what ``data`` is, when it is recognisably not a TCG firmware event log."""
    if not data:
        return f"the file is empty; {_WANT}"
    head = data[:_SNIFF]
    ima = _ima_binary(head)
    if ima is not None:
        return f"an IMA runtime measurement list (binary, template {ima}), not a firmware log; {_WANT}"
    for magic, what in (
        (b"\x1f\x8b", "a gzip-compressed file"),
        (b"\x28\xb5\x2f\xfd", "a zstd-compressed file"),
        (b"\xfd7zXZ\x00", "an xz-compressed file"),
        (b"BZh", "a bzip2-compressed file"),
        (b"\x7fELF", "an ELF executable"),
        (b"MZ", "a PE/COFF executable (an EFI binary?)"),
    ):
        if head.startswith(magic):
            return f"{what}, not a TCG event log; {_WANT} (uncompressed)"
    text = _text(head)
    if text is None:
        return None
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"{_text_kind(text, first)}, not the binary TCG event log; {_WANT}"


def _ima_binary(head: bytes) -> str | None:
    """IMA's binary list: PCR (u32, host order), SHA-1 template digest, name length, name."""
    if len(head) < 32:
        return None
    for order in ("<", ">"):
        pcr, size = struct.unpack_from(f"{order}I", head, 0)[0], struct.unpack_from(f"{order}I", head, 24)[0]
        if pcr < 24 and 0 < size <= 16 and len(head) >= 28 + size:
            name = head[28 : 28 + size]
            if name in _IMA_TEMPLATES:
                return name.decode("ascii")
    return None


def _text(head: bytes) -> str | None:
    """The start of a text file, or None for binary content."""
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 3:  # a character cut at the sniff boundary is still text
            return None
        text = head[: exc.start].decode("utf-8")
    printable = sum(1 for c in text if c.isprintable() or c in "\r\n\t")
    return text if text and printable / len(text) > 0.95 else None


def _text_kind(text: str, first: str) -> str:
    words = first.split()
    if len(words) >= 4 and words[0].isdigit() and len(words[1]) in (40, 64) and words[2].startswith("ima"):
        return f"an IMA runtime measurement list (ASCII, template {words[2]})"
    if first.startswith("-----BEGIN "):
        return f"a PEM file ({first.strip('-').removeprefix('BEGIN ').strip().lower()})"
    if first.startswith(("{", "[")):
        return "a JSON document"
    if first == "---" or "EventNum:" in text or "PCRIndex:" in text:
        return "a YAML document (tpm2_eventlog's output?)"
    shown = first if len(first) <= 60 else first[:57] + "..."
    return f"a text file (first line: {shown!r})"
