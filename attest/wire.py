"""Strict parsers for the TPM 2.0 structures that cross the wire.

Each parser takes the marshalled bytes, enforces an overall size limit and a limit on every
TPM2B inside, accepts only the algorithms it knows, and requires that the structure consumes the
input exactly (no trailing bytes). Bad input raises :class:`attest.errors.MalformedInput` and
nothing else. Parsing is plain :mod:`struct` over ``bytes``: no cffi objects on the hot path.
"""

from __future__ import annotations

import struct
from enum import IntEnum, IntFlag
from typing import NamedTuple

from attest.errors import MalformedInput

# Upper bounds on whole inputs. The largest legitimate TPM2B_PUBLIC (RSA-4096 with a SHA-512
# policy) is about 600 bytes; a quote with every bank selected is under 500.
MAX_PUBLIC = 1024
MAX_ATTEST = 1024
MAX_SIGNATURE = 1024
MAX_PCR_BANKS = 16  # HASH_COUNT upper bound in the reference implementation
MAX_SELECT_BYTES = 4  # PCR_SELECT_MAX for 32 PCRs; real TPMs use 3 (24 PCRs)
MAX_DIGEST = 64
MAX_NAME = 2 + MAX_DIGEST
MAX_RSA_BYTES = 512  # RSA-4096
MAX_ECC_BYTES = 66  # P-521

TPM_GENERATED_VALUE = 0xFF544347
TPM_ST_ATTEST_QUOTE = 0x8018


class Alg(IntEnum):
    """TPM_ALG_ID values this code knows (TPM 2.0 Part 2, 6.3)."""

    RSA = 0x0001
    SHA1 = 0x0004
    HMAC = 0x0005
    AES = 0x0006
    MGF1 = 0x0007
    KEYEDHASH = 0x0008
    SHA256 = 0x000B
    SHA384 = 0x000C
    SHA512 = 0x000D
    NULL = 0x0010
    SM3_256 = 0x0012
    SM4 = 0x0013
    RSASSA = 0x0014
    RSAES = 0x0015
    RSAPSS = 0x0016
    OAEP = 0x0017
    ECDSA = 0x0018
    ECDH = 0x0019
    ECDAA = 0x001A
    SM2 = 0x001B
    ECSCHNORR = 0x001C
    ECMQV = 0x001D
    KDF1_SP800_56A = 0x0020
    KDF2 = 0x0021
    KDF1_SP800_108 = 0x0022
    ECC = 0x0023
    SYMCIPHER = 0x0025
    CAMELLIA = 0x0026
    CFB = 0x0043


class Curve(IntEnum):
    NIST_P256 = 0x0003
    NIST_P384 = 0x0004
    NIST_P521 = 0x0005


class ObjectAttr(IntFlag):
    """TPMA_OBJECT bits (Part 2, 8.3)."""

    FIXED_TPM = 1 << 1
    ST_CLEAR = 1 << 2
    FIXED_PARENT = 1 << 4
    SENSITIVE_DATA_ORIGIN = 1 << 5
    USER_WITH_AUTH = 1 << 6
    ADMIN_WITH_POLICY = 1 << 7
    NO_DA = 1 << 10
    ENCRYPTED_DUPLICATION = 1 << 11
    RESTRICTED = 1 << 16
    DECRYPT = 1 << 17
    SIGN = 1 << 18
    X509_SIGN = 1 << 19


OBJECT_ATTR_RESERVED = 0xFFF0F309  # bits 0, 3, 8, 9, 12-15 and 20-31

DIGEST_SIZES: dict[int, int] = {
    Alg.SHA1: 20,
    Alg.SHA256: 32,
    Alg.SHA384: 48,
    Alg.SHA512: 64,
    Alg.SM3_256: 32,
}
BANK_NAMES: dict[str, int] = {
    "sha1": Alg.SHA1,
    "sha256": Alg.SHA256,
    "sha384": Alg.SHA384,
    "sha512": Alg.SHA512,
    "sm3_256": Alg.SM3_256,
}
BANK_BY_ALG: dict[int, str] = {v: k for k, v in BANK_NAMES.items()}

_SYM_OBJECT_ALGS = frozenset({Alg.AES, Alg.SM4, Alg.CAMELLIA})
_RSA_SCHEMES_WITH_HASH = frozenset({Alg.RSASSA, Alg.RSAPSS, Alg.OAEP})
_RSA_SCHEMES_BARE = frozenset({Alg.NULL, Alg.RSAES})
_ECC_SCHEMES_WITH_HASH = frozenset({Alg.ECDSA, Alg.ECDH, Alg.SM2, Alg.ECSCHNORR, Alg.ECMQV, Alg.ECDAA})
_ECC_SCHEMES_BARE = frozenset({Alg.NULL})
_KDF_SCHEMES = frozenset({Alg.MGF1, Alg.KDF1_SP800_56A, Alg.KDF2, Alg.KDF1_SP800_108})
_ECC_SIG_ALGS = frozenset({Alg.ECDSA, Alg.ECDAA, Alg.SM2, Alg.ECSCHNORR})

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U16U16 = struct.Struct(">HH")
_ATTEST_HEAD = struct.Struct(">IH")
_CLOCK_FW = struct.Struct(">QIIBQ")


def _fail(what: str, why: str, off: int) -> MalformedInput:
    return MalformedInput(f"{what}: {why} at byte {off}")


def _u16(buf: bytes, off: int, what: str) -> int:
    if off + 2 > len(buf):
        raise _fail(what, "truncated", off)
    return int(_U16.unpack_from(buf, off)[0])


def _u32(buf: bytes, off: int, what: str) -> int:
    if off + 4 > len(buf):
        raise _fail(what, "truncated", off)
    return int(_U32.unpack_from(buf, off)[0])


def _tpm2b(buf: bytes, off: int, limit: int, what: str) -> tuple[bytes, int]:
    """Read a size-prefixed buffer of at most ``limit`` bytes; return it and the next offset."""
    if off + 2 > len(buf):
        raise _fail(what, "truncated size", off)
    (size,) = _U16.unpack_from(buf, off)
    if size > limit:
        raise _fail(what, f"size {size} exceeds {limit}", off)
    end = off + 2 + size
    if end > len(buf):
        raise _fail(what, f"size {size} runs past the end", off)
    return buf[off + 2 : end], end


def _hash_alg(value: int, what: str, off: int) -> int:
    if value not in DIGEST_SIZES:
        raise _fail(what, f"unknown hash algorithm 0x{value:04x}", off)
    return value


def _check_size(buf: bytes, limit: int, what: str) -> None:
    if not isinstance(buf, bytes):
        raise MalformedInput(f"{what}: expected bytes, got {type(buf).__name__}")
    if len(buf) > limit:
        raise MalformedInput(f"{what}: {len(buf)} bytes exceeds the limit of {limit}")


# --------------------------------------------------------------------------------------------
# TPM2B_PUBLIC / TPMT_PUBLIC


class Public(NamedTuple):
    """A parsed TPMT_PUBLIC (RSA or ECC only). ``area`` is the marshalled TPMT_PUBLIC, which is
    what the object name hashes. (NamedTuples throughout: immutable and cheap to build.)"""

    type: int
    name_alg: int
    attributes: int
    auth_policy: bytes
    sym_alg: int
    sym_bits: int
    sym_mode: int
    scheme: int
    scheme_hash: int  # Alg.NULL when the scheme carries no hash
    # RSA
    rsa_bits: int
    rsa_exponent: int
    rsa_modulus: bytes
    # ECC
    curve: int
    kdf: int
    kdf_hash: int
    ecc_x: bytes
    ecc_y: bytes
    area: bytes

    def has(self, attr: int) -> bool:
        return (self.attributes & attr) == attr


def parse_public(buf: bytes, what: str = "TPM2B_PUBLIC") -> Public:
    """Parse a marshalled TPM2B_PUBLIC that must hold an RSA or ECC key."""
    _check_size(buf, MAX_PUBLIC, what)
    area, end = _tpm2b(buf, 0, MAX_PUBLIC, what)
    if end != len(buf):
        raise _fail(what, f"{len(buf) - end} trailing bytes", end)
    if not area:
        raise _fail(what, "empty public area", 0)
    return parse_public_area(area, what)


def parse_public_area(area: bytes, what: str = "TPMT_PUBLIC") -> Public:
    """Parse a marshalled TPMT_PUBLIC (no size prefix); offsets in errors are within ``area``."""
    obj_type = _u16(area, 0, what)
    name_alg = _u16(area, 2, what)
    attrs = _u32(area, 4, what)
    if obj_type not in (Alg.RSA, Alg.ECC):
        raise _fail(what, f"unsupported object type 0x{obj_type:04x}", 0)
    _hash_alg(name_alg, what, 2)
    if attrs & OBJECT_ATTR_RESERVED:
        raise _fail(what, f"reserved attribute bits set (0x{attrs:08x})", 4)
    policy, off = _tpm2b(area, 8, MAX_DIGEST, what)

    sym_alg = _u16(area, off, what)
    sym_bits = sym_mode = 0
    off += 2
    if sym_alg != Alg.NULL:
        if sym_alg not in _SYM_OBJECT_ALGS:
            raise _fail(what, f"unknown symmetric algorithm 0x{sym_alg:04x}", off - 2)
        sym_bits = _u16(area, off, what)
        sym_mode = _u16(area, off + 2, what)
        off += 4
    if obj_type == Alg.RSA:
        scheme, scheme_hash, off = _scheme(area, off, what, _RSA_SCHEMES_WITH_HASH, _RSA_SCHEMES_BARE)
        bits = _u16(area, off, what)
        exponent = _u32(area, off + 2, what)
        modulus, off = _tpm2b(area, off + 6, MAX_RSA_BYTES, what)
        curve, kdf, kdf_hash, x, y = 0, int(Alg.NULL), int(Alg.NULL), b"", b""
    else:
        scheme, scheme_hash, off = _scheme(area, off, what, _ECC_SCHEMES_WITH_HASH, _ECC_SCHEMES_BARE)
        bits = exponent = 0
        modulus = b""
        curve = _u16(area, off, what)
        kdf = _u16(area, off + 2, what)
        kdf_hash = int(Alg.NULL)
        off += 4
        if kdf in _KDF_SCHEMES:
            kdf_hash = _hash_alg(_u16(area, off, what), what, off)
            off += 2
        elif kdf != Alg.NULL:
            raise _fail(what, f"unknown KDF 0x{kdf:04x}", off - 2)
        x, off = _tpm2b(area, off, MAX_ECC_BYTES, what)
        y, off = _tpm2b(area, off, MAX_ECC_BYTES, what)
    if off != len(area):
        raise _fail(what, f"{len(area) - off} trailing bytes in the public area", off)
    return Public(
        obj_type, name_alg, attrs, policy, sym_alg, sym_bits, sym_mode, scheme, scheme_hash,
        bits, exponent, modulus, curve, kdf, kdf_hash, x, y, area,
    )  # fmt: skip


def _scheme(
    area: bytes, off: int, what: str, with_hash: frozenset[int], bare: frozenset[int]
) -> tuple[int, int, int]:
    """Read a TPMT_RSA_SCHEME / TPMT_ECC_SCHEME: (scheme, hash or NULL, next offset)."""
    scheme = _u16(area, off, what)
    off += 2
    if scheme in with_hash:
        extra = 4 if scheme == Alg.ECDAA else 2  # ECDAA details: hashAlg + count
        return scheme, _hash_alg(_u16(area, off, what), what, off), off + extra
    if scheme in bare:
        return scheme, int(Alg.NULL), off
    raise _fail(what, f"unknown scheme 0x{scheme:04x}", off - 2)


# --------------------------------------------------------------------------------------------
# TPML_PCR_SELECTION

Selection = tuple[tuple[int, frozenset[int]], ...]
"""A PCR selection: ordered (hash algorithm, PCR indices) pairs, one per bank."""


def _parse_selection(buf: bytes, off: int, what: str) -> tuple[Selection, int]:
    count = _u32(buf, off, what)
    off += 4
    if count > MAX_PCR_BANKS:
        raise _fail(what, f"{count} PCR banks exceeds {MAX_PCR_BANKS}", off - 4)
    banks: list[tuple[int, frozenset[int]]] = []
    seen: set[int] = set()
    for _ in range(count):
        alg = _hash_alg(_u16(buf, off, what), what, off)
        if alg in seen:
            raise _fail(what, f"bank 0x{alg:04x} selected twice", off)
        seen.add(alg)
        if off + 3 > len(buf):
            raise _fail(what, "truncated", off)
        size = buf[off + 2]
        off += 3
        if size > MAX_SELECT_BYTES:
            raise _fail(what, f"sizeofSelect {size} exceeds {MAX_SELECT_BYTES}", off - 1)
        if off + size > len(buf):
            raise _fail(what, "truncated pcrSelect", off)
        bits = int.from_bytes(buf[off : off + size], "little")
        off += size
        banks.append((alg, frozenset(i for i in range(size * 8) if bits >> i & 1)))
    return tuple(banks), off


def parse_selection_string(text: str) -> Selection:
    """Parse ``"sha256:0,1,2"`` (banks joined by ``+``) strictly: known banks, PCRs 0-23, no
    duplicates, nothing empty."""
    if not isinstance(text, str) or not text or len(text) > 512:
        raise MalformedInput("PCR selection: expected a string such as 'sha256:0,1,2'")
    banks: list[tuple[int, frozenset[int]]] = []
    seen: set[int] = set()
    for part in text.split("+"):
        name, sep, pcr_list = part.partition(":")
        alg = BANK_NAMES.get(name)
        if alg is None or not sep or not pcr_list:
            raise MalformedInput(f"PCR selection: bad bank entry {part!r}")
        if alg in seen:
            raise MalformedInput(f"PCR selection: bank {name} given twice")
        seen.add(alg)
        indices: set[int] = set()
        for item in pcr_list.split(","):
            if not (0 < len(item) <= 2 and item.isascii() and item.isdigit()) or int(item) > 23:
                raise MalformedInput(f"PCR selection: bad PCR index {item!r} in {name}")
            if int(item) in indices:
                raise MalformedInput(f"PCR selection: PCR {item} given twice in {name}")
            indices.add(int(item))
        banks.append((alg, frozenset(indices)))
    return tuple(banks)


def format_selection(selection: Selection) -> str:
    return "+".join(f"{BANK_BY_ALG[alg]}:{','.join(str(i) for i in sorted(pcrs))}" for alg, pcrs in selection)


# --------------------------------------------------------------------------------------------
# TPMS_ATTEST (quotes only)


class Attest(NamedTuple):
    """A parsed TPMS_ATTEST of type TPM_ST_ATTEST_QUOTE."""

    qualified_signer: bytes
    extra_data: bytes
    clock: int
    reset_count: int
    restart_count: int
    safe: int
    firmware_version: int
    selection: Selection
    pcr_digest: bytes


def parse_quote(
    buf: bytes, what: str = "TPMS_ATTEST", known: tuple[bytes, Selection] | None = None
) -> Attest:
    """Parse a marshalled TPMS_ATTEST; magic and type must be those of a TPM2_Quote.

    ``known`` is an expected selection as (marshalled bytes, parsed). When the quote holds exactly
    those bytes they are not parsed again: a TPML_PCR_SELECTION is self-delimiting, so equal bytes
    parse to the equal value."""
    _check_size(buf, MAX_ATTEST, what)
    if len(buf) < 6:
        raise _fail(what, "truncated", 0)
    magic, st = _ATTEST_HEAD.unpack_from(buf, 0)
    if magic != TPM_GENERATED_VALUE:
        raise _fail(what, f"magic 0x{magic:08x} is not TPM_GENERATED_VALUE", 0)
    if st != TPM_ST_ATTEST_QUOTE:
        raise _fail(what, f"type 0x{st:04x} is not TPM_ST_ATTEST_QUOTE", 4)
    signer, off = _tpm2b(buf, 6, MAX_NAME, what)
    extra, off = _tpm2b(buf, off, MAX_DIGEST, what)
    if off + _CLOCK_FW.size > len(buf):
        raise _fail(what, "truncated clockInfo", off)
    clock, reset, restart, safe, firmware = _CLOCK_FW.unpack_from(buf, off)
    if safe > 1:
        raise _fail(what, f"clockInfo.safe is {safe}, not a TPMI_YES_NO", off + 16)
    off += _CLOCK_FW.size
    if known is not None and buf.startswith(known[0], off):
        selection = known[1]
        off += len(known[0])
    else:
        selection, off = _parse_selection(buf, off, what)
    digest, off = _tpm2b(buf, off, MAX_DIGEST, what)
    if off != len(buf):
        raise _fail(what, f"{len(buf) - off} trailing bytes", off)
    return Attest(signer, extra, clock, reset, restart, safe, firmware, selection, digest)


# --------------------------------------------------------------------------------------------
# TPMT_SIGNATURE


class Signature(NamedTuple):
    """A parsed TPMT_SIGNATURE. For RSA ``sig`` is the signature; for ECC ``r`` and ``s``."""

    alg: int
    hash_alg: int
    sig: bytes
    r: bytes
    s: bytes


def parse_signature(buf: bytes, what: str = "TPMT_SIGNATURE") -> Signature:
    _check_size(buf, MAX_SIGNATURE, what)
    if len(buf) < 4:
        raise _fail(what, "truncated", 0)
    alg, hash_alg = _U16U16.unpack_from(buf, 0)
    _hash_alg(hash_alg, what, 2)
    sig = r = s = b""
    if alg in (Alg.RSASSA, Alg.RSAPSS):
        sig, off = _tpm2b(buf, 4, MAX_RSA_BYTES, what)
    elif alg in _ECC_SIG_ALGS:
        r, off = _tpm2b(buf, 4, MAX_ECC_BYTES, what)
        s, off = _tpm2b(buf, off, MAX_ECC_BYTES, what)
    elif alg == Alg.HMAC:
        off = 4 + DIGEST_SIZES[hash_alg]
        if off > len(buf):
            raise _fail(what, "truncated HMAC digest", 4)
        sig = buf[4:off]
    else:
        raise _fail(what, f"unknown signature algorithm 0x{alg:04x}", 0)
    if off != len(buf):
        raise _fail(what, f"{len(buf) - off} trailing bytes", off)
    return Signature(alg, hash_alg, sig, r, s)


# --------------------------------------------------------------------------------------------
# Marshalling helpers used by make_credential and tests


def tpm2b(data: bytes) -> bytes:
    if len(data) > 0xFFFF:
        raise ValueError("TPM2B payload too large")
    return _U16.pack(len(data)) + data


def marshal_selection(selection: Selection, size_of_select: int = 3) -> bytes:
    out = bytearray(_U32.pack(len(selection)))
    for alg, pcrs in selection:
        bits = 0
        for i in pcrs:
            bits |= 1 << i
        out += _U16.pack(alg) + bytes([size_of_select]) + bits.to_bytes(size_of_select, "little")
    return bytes(out)
