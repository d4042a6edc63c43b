"""UEFI structures that measured-boot events carry (UEFI 2.x; TCG PC Client PFP section 10.2).

Pure and bounded: every parser takes the bytes of one event and raises ``ValueError`` for
anything that does not fit; callers turn that into "this event's data cannot be used".
"""

from __future__ import annotations

import itertools
import operator
import struct
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final, NamedTuple

GLOBAL_VARIABLE: Final = uuid.UUID("8be4df61-93ca-11d2-aa0d-00e098032b8c")
IMAGE_SECURITY_DATABASE: Final = uuid.UUID("d719b2cb-3d3a-4596-a3bc-dad00e67656f")
SHIM_LOCK: Final = uuid.UUID("605dab50-e046-4300-abb6-3dd810dd8b23")
CERT_X509: Final = uuid.UUID("a5c059a1-94e4-4aa7-87b5-ab155c2bf072")
CERT_SHA256: Final = uuid.UUID("c1c41626-504c-4092-aca9-41f936934328")

_SHA256_ENTRY: Final = struct.Struct("16x32s")  # EFI_SIGNATURE_DATA: owner GUID (skipped), digest
_first: Final = operator.itemgetter(0)
_SIZES: Final = struct.Struct("<QQ")
_new: Final = tuple.__new__  # a named tuple without its Python-level constructor (one per event)

MAX_NAME_CHARS: Final = 1024
MAX_SIGNATURES: Final = 65536


class Variable(NamedTuple):
    """UEFI_VARIABLE_DATA: which variable (its GUID as stored: 16 bytes, little-endian fields),
    and its value as measured."""

    guid_le: bytes
    name: str
    value: bytes

    @property
    def guid(self) -> uuid.UUID:
        return uuid.UUID(bytes_le=self.guid_le)


class Signature(NamedTuple):
    """One EFI_SIGNATURE_DATA of an EFI_SIGNATURE_LIST: its type, owner and data (a DER
    certificate for CERT_X509, a 32-byte image digest for CERT_SHA256, other types kept raw)."""

    type: uuid.UUID
    owner: bytes  # the owner GUID as stored (16 bytes, little-endian fields); uuid.UUID(bytes_le=...)
    data: bytes


@dataclass(frozen=True, slots=True)
class ImageLoad:
    """UEFI_IMAGE_LOAD_EVENT: where the image was, and its device path (raw)."""

    location: int
    length: int
    link_time_address: int
    device_path: bytes


def variable(data: bytes, *, value_to_end: bool = False) -> Variable:
    """Parse UEFI_VARIABLE_DATA; the name and value lengths must account for every byte, unless
    ``value_to_end``: then the value is every byte after the name (the shim quirk below)."""
    if len(data) < 32:
        raise ValueError("UEFI_VARIABLE_DATA is shorter than its header")
    guid = data[:16]
    name_chars, value_len = _SIZES.unpack_from(data, 16)
    if name_chars > MAX_NAME_CHARS:
        raise ValueError(f"variable name of {name_chars} characters")
    end = 32 + 2 * name_chars + value_len
    if value_to_end and 32 + 2 * name_chars <= len(data):
        end = len(data)
    if end != len(data):
        raise ValueError(f"UEFI_VARIABLE_DATA sizes add up to {end} bytes, the event holds {len(data)}")
    raw_name = data[32 : 32 + 2 * name_chars]
    try:
        name = raw_name.decode("utf-16-le")
    except UnicodeDecodeError:
        raise ValueError("variable name is not UTF-16") from None
    return _new(Variable, (guid, name.rstrip("\x00"), data[32 + 2 * name_chars :]))


def _list_at(value: bytes, pos: int) -> tuple[int, int, int, int]:
    """The EFI_SIGNATURE_LIST header at ``pos``, checked: (list size, signature size, offset of
    the first signature, bytes of signatures)."""
    if len(value) - pos < 28:
        raise ValueError("EFI_SIGNATURE_LIST shorter than its header")
    list_size, header_size, sig_size = struct.unpack_from("<III", value, pos + 16)
    if list_size < 28 or pos + list_size > len(value):
        raise ValueError(f"EFI_SIGNATURE_LIST of {list_size} bytes at offset {pos}")
    if sig_size < 16:
        raise ValueError(f"EFI_SIGNATURE_DATA of {sig_size} bytes")
    body = list_size - 28 - header_size
    if body < 0 or body % sig_size:
        raise ValueError("EFI_SIGNATURE_LIST size is not a whole number of signatures")
    return list_size, sig_size, pos + 28 + header_size, body


def signature_lists(value: bytes) -> list[Signature]:
    """Every signature of a sequence of EFI_SIGNATURE_LISTs (the value of PK, KEK, db, dbx)."""
    out: list[Signature] = []
    pos = 0
    while pos < len(value):
        list_size, sig_size, start, body = _list_at(value, pos)
        stype = uuid.UUID(bytes_le=value[pos : pos + 16])
        for at in range(start, start + body, sig_size):
            if len(out) >= MAX_SIGNATURES:
                raise ValueError(f"more than {MAX_SIGNATURES} signatures")
            out.append(Signature(stype, value[at : at + 16], value[at + 16 : at + sig_size]))
        pos += list_size
    return out


def sha256_entries(value: bytes) -> frozenset[bytes]:
    """The 32-byte image digests of the EFI_CERT_SHA256 lists in ``value`` (a dbx), without
    building a record per signature; the lists are checked as :func:`signature_lists` does."""
    found: list[Iterator[bytes]] = []
    pos = 0
    sha256 = CERT_SHA256.bytes_le
    view = memoryview(value)
    while pos < len(value):
        list_size, sig_size, start, body = _list_at(value, pos)
        if value[pos : pos + 16] == sha256 and sig_size == 48:
            # iter_unpack walks the entries in C (a dbx holds hundreds); body is a multiple of 48.
            found.append(map(_first, _SHA256_ENTRY.iter_unpack(view[start : start + body])))
        pos += list_size
    return frozenset(itertools.chain.from_iterable(found))


def der_length(data: bytes) -> int | None:
    """The length of the DER SEQUENCE at the start of ``data`` (header included), or None."""
    if len(data) < 2 or data[0] != 0x30:
        return None
    first = data[1]
    if first < 0x80:
        total = 2 + first
    elif 0x81 <= first <= 0x83 and len(data) >= 2 + (first & 0x7F):
        n = first & 0x7F
        total = 2 + n + int.from_bytes(data[2 : 2 + n], "big")
    else:
        return None
    return total if total <= len(data) else None


def signature_data(value: bytes) -> Signature | None:
    """The certificate an EV_EFI_VARIABLE_AUTHORITY value carries: one EFI_SIGNATURE_DATA (owner +
    certificate) when it comes from db, a bare certificate from shim (vendor certificate,
    MokList); bytes after the certificate (old shim) are not part of it. None otherwise."""
    for start in (16, 0):
        size = der_length(value[start:])
        if size is not None:
            owner = value[:16] if start else bytes(16)
            return Signature(CERT_X509, owner, value[start : start + size])
    return None


def image_load(data: bytes) -> ImageLoad:
    """Parse UEFI_IMAGE_LOAD_EVENT. shim before 15 logged the C structure's size (its one-element
    device path array: 8 more bytes, uninitialised) and often one byte more still, like its
    authorities; those padding bytes are accepted and never read."""
    if len(data) < 32:
        raise ValueError("UEFI_IMAGE_LOAD_EVENT shorter than its header")
    location, length, link, path_len = struct.unpack_from("<QQQQ", data, 0)
    if len(data) - 32 - path_len not in (0, 8, 9):
        raise ValueError("UEFI_IMAGE_LOAD_EVENT device path length does not match the event size")
    return ImageLoad(location, length, link, data[32 : 32 + path_len])


def device_path_text(path: bytes) -> str:
    """The file path nodes of a device path ("\\EFI\\BOOT\\BOOTX64.EFI"); other nodes are
    summarised by their type. Best effort for display; never raises."""
    parts: list[str] = []
    pos = 0
    while pos + 4 <= len(path):
        ntype, subtype, length = path[pos], path[pos + 1], int.from_bytes(path[pos + 2 : pos + 4], "little")
        if length < 4 or pos + length > len(path):
            break
        if ntype == 0x7F:  # end of the device path
            break
        if ntype == 0x04 and subtype == 0x04:  # media: file path, UTF-16
            text = path[pos + 4 : pos + length].decode("utf-16-le", errors="replace").rstrip("\x00")
            parts.append(text)
        pos += length
    return "".join(parts)
