"""Reading X.509 certificates the way TPM vendors ship them, without trusting a re-encoding.

``cryptography`` refuses a few encodings that real EK certificates and vendor CAs carry (the list
is ``QUIRKS``; docs/ek-roots.md has the vendors and the bytes). :func:`read_certificate` accepts
exactly those and nothing else:

1. The outer ``Certificate ::= SEQUENCE { tbsCertificate, signatureAlgorithm, signatureValue }`` is
   split by a strict DER reader (definite, minimal lengths; no high tag numbers). The *original*
   tbsCertificate bytes and the signature are kept: every signature check (``attest.ekcert``) is
   made over those bytes, never over a re-encoding, so a tolerated quirk can never make a
   certificate say something its issuer did not sign.
2. ``cryptography`` decodes the fields (names, validity, key, extensions) from the exact DER. Only
   when it refuses them is a canonical copy made that undoes the listed quirks and nothing else
   (SET OF members sorted, NULL dropped from an ECDSA AlgorithmIdentifier, leading zero octets
   dropped from the serial, an encoded DEFAULT FALSE dropped from Extension.critical and
   BasicConstraints.cA); each of those changes the encoding only, never a value. If the copy
   still does not decode, or the refusal had another cause, the certificate is malformed.
3. Bytes after the certificate are refused, except 0xFF NV padding (or whitespace after a DER file,
   for roots read from disk), which is recorded.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes
from cryptography.utils import CryptographyDeprecationWarning

from attest.errors import MalformedInput

MAX_CERT_DER = 16 * 1024
_MAX_DEPTH = 24  # real certificates nest < 12 deep; bounds the recursion on hostile input

NV_PADDING = "nv-padding"
FILE_WHITESPACE = "file-whitespace"
UNSORTED_SET = "unsorted-set"
ECDSA_NULL_PARAMS = "ecdsa-null-params"
SERIAL_LEADING_ZEROS = "serial-leading-zeros"
ENCODED_DEFAULT = "encoded-default"

# Every tolerated deviation from DER, the vendor that needs it and why tolerating it is safe.
QUIRKS: dict[str, str] = {
    NV_PADDING: "0xFF bytes after the certificate: the unused rest of the NV index (STMicro); "
    "the certificate is the leading DER element, the padding is never read",
    FILE_WHITESPACE: "whitespace after a DER file (a root published with a trailing newline, AMD "
    "fTPM ICAs in one public collection); only for files read from disk",
    UNSORTED_SET: "a SET OF whose members are not in DER order, e.g. a multi-valued RDN "
    "CN+O+C (Nuvoton roots 0100..2112, NTC and the EK certificates they issued); set order carries "
    "no meaning and names are compared decoded",
    ECDSA_NULL_PARAMS: "an ECDSA signature AlgorithmIdentifier with explicit NULL parameters "
    "(Intel OnDie CA root and CSME intermediate); NULL carries no parameter",
    SERIAL_LEADING_ZEROS: "a serial number INTEGER with redundant leading zero octets (first-issue "
    "STMicro EK intermediates); the value is unchanged and serials play no part in trust here",
    ENCODED_DEFAULT: "an explicitly encoded DEFAULT FALSE in Extension.critical or "
    "BasicConstraints.cA (Intel PTT EK certificates); absent and FALSE mean the same, as X.509 "
    "defines them, and nowhere else is an encoded default accepted",
}

_DECODE_ERRORS = (
    ValueError,  # includes cryptography's ASN.1 parse errors
    TypeError,
    x509.InvalidVersion,
    x509.DuplicateExtension,
    x509.UnsupportedGeneralNameType,
    UnsupportedAlgorithm,
)
_ECDSA_OIDS = frozenset(  # ecdsa-with-SHA224/256/384/512 (RFC 5758: parameters MUST be absent)
    bytes.fromhex("06082a8648ce3d0403" + n) for n in ("01", "02", "03", "04")
)
_NULL = b"\x05\x00"
_FALSE = b"\x01\x01\x00"  # BOOLEAN FALSE: only ever dropped where X.509 says DEFAULT FALSE
_BASIC_CONSTRAINTS = bytes.fromhex("0603551d13")  # id-ce-basicConstraints (2.5.29.19)
_SEQUENCE, _SET, _INTEGER, _BIT_STRING, _OCTET_STRING, _OID = 0x30, 0x31, 0x02, 0x03, 0x04, 0x06
_CONSTRUCTED = 0x20
_VERSION, _EXTENSIONS = 0xA0, 0xA3
_PEM = re.compile(rb"-----BEGIN CERTIFICATE-----([A-Za-z0-9+/=\s]*?)-----END CERTIFICATE-----")
_WHITESPACE = b" \t\r\n"


class DerError(ValueError):
    """Bytes that are not strict DER (the message says where)."""


@dataclass(frozen=True, slots=True, eq=False)
class Cert:
    """One certificate: its exact bytes, what its issuer signed, and its decoded fields."""

    der: bytes  # the certificate exactly as signed (padding removed)
    tbs: bytes  # the original tbsCertificate bytes: what signatures are checked over
    signature: bytes  # signatureValue without the unused-bits octet
    view: x509.Certificate = field(repr=False)  # decoded fields (from a canonical copy if quirky)
    key: CertificatePublicKeyTypes = field(repr=False)
    quirks: tuple[str, ...]  # keys of QUIRKS that were needed, in the order found
    sha256: str  # hex SHA-256 of ``der``: the usual certificate fingerprint

    @property
    def subject(self) -> x509.Name:
        return self.view.subject

    @property
    def issuer(self) -> x509.Name:
        return self.view.issuer

    def name(self) -> str:
        return self.view.subject.rfc4514_string() or "<empty subject>"

    @property
    def self_issued(self) -> bool:
        return self.view.subject == self.view.issuer


def read_certificate(data: bytes, what: str = "EK certificate", *, trailing: str = NV_PADDING) -> Cert:
    """One certificate from ``data`` (DER, optionally followed by ``trailing`` padding).

    ``trailing`` is NV_PADDING (0xFF bytes, what TPM NV indices hold) or FILE_WHITESPACE (files).
    Raises MalformedInput for anything else that is not a certificate we can decode.
    """
    if not isinstance(data, bytes):
        raise MalformedInput(f"{what}: expected bytes")
    if len(data) > MAX_CERT_DER:
        raise MalformedInput(f"{what}: {len(data)} bytes exceeds the limit of {MAX_CERT_DER}")
    try:
        der, tbs, signature, quirks = _outer(data, trailing)
    except DerError as exc:
        raise MalformedInput(f"{what}: not DER ({exc})") from None
    view, found = _decode(der, what)
    quirks.extend(found)
    try:
        key = view.public_key()
    except _DECODE_ERRORS as exc:
        raise MalformedInput(f"{what}: unreadable public key ({exc})") from None
    return Cert(der, tbs, signature, view, key, tuple(quirks), hashlib.sha256(der).hexdigest())


def from_x509(cert: x509.Certificate, what: str = "certificate") -> Cert:
    """A ``cryptography`` certificate as a Cert (it loaded, so it is DER as its issuer signed it)."""
    return read_certificate(cert.public_bytes(serialization.Encoding.DER), what)


def pem_blocks(text: bytes) -> Iterator[bytes]:
    """The DER inside each ``CERTIFICATE`` PEM block, in order (strict base64)."""
    for match in _PEM.finditer(text):
        body = b"".join(match.group(1).split())
        try:
            yield base64.b64decode(body, validate=True)
        except binascii.Error:
            yield b""  # reported by the caller as a block that is not a certificate


def is_pem(text: bytes) -> bool:
    return b"-----BEGIN " in text


# -- strict DER --------------------------------------------------------------------------------


def _outer(data: bytes, trailing: str) -> tuple[bytes, bytes, bytes, list[str]]:
    """(certificate DER, original TBS, signature, [padding quirk]) from ``data``."""
    tag, start, end = _header(data, 0, len(data))
    if tag != _SEQUENCE:
        raise DerError("a certificate is a SEQUENCE")
    tail = data[end:]
    if tail.strip(b"\xff" if trailing == NV_PADDING else _WHITESPACE):
        raise DerError("DER length does not cover the input exactly (trailing bytes)")
    der = data[:end]
    tbs, signature = _split(der, start, end)
    return der, tbs, signature, [trailing] if tail else []


def _header(buf: bytes, pos: int, end: int) -> tuple[int, int, int]:
    """(tag, content start, content end) of the TLV at ``pos``; strict DER."""
    if pos + 2 > end:
        raise DerError(f"truncated at offset {pos}")
    tag = buf[pos]
    if tag & 0x1F == 0x1F:
        raise DerError(f"high tag number at offset {pos}")
    first = buf[pos + 1]
    if first < 0x80:
        start, length = pos + 2, first
    else:
        n = first & 0x7F
        if n == 0:
            raise DerError(f"indefinite length at offset {pos}")
        if n > 3 or pos + 2 + n > end:
            raise DerError(f"bad length at offset {pos}")
        length = int.from_bytes(buf[pos + 2 : pos + 2 + n], "big")
        if buf[pos + 2] == 0 or length < 0x80:
            raise DerError(f"length not in its shortest form at offset {pos}")
        start = pos + 2 + n
    if start + length > end:
        raise DerError(f"length overruns its container at offset {pos}")
    return tag, start, start + length


def _children(buf: bytes, start: int, end: int) -> list[tuple[int, int, int, int]]:
    """(tag, TLV start, content start, content end) of every TLV in buf[start:end]."""
    out = []
    pos = start
    while pos < end:
        tag, cs, ce = _header(buf, pos, end)
        out.append((tag, pos, cs, ce))
        pos = ce
    return out


def _encode(tag: int, content: bytes) -> bytes:
    n = len(content)
    if n < 0x80:
        return bytes((tag, n)) + content
    size = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes((tag, 0x80 | len(size))) + size + content


def _split(der: bytes, start: int, end: int) -> tuple[bytes, bytes]:
    """(original tbsCertificate, signature); checks the signature algorithm is stated once."""
    parts = _children(der, start, end)
    if [p[0] for p in parts] != [_SEQUENCE, _SEQUENCE, _BIT_STRING]:
        raise DerError("not tbsCertificate, signatureAlgorithm, signatureValue")
    (_, tbs_pos, tbs_start, tbs_end), (_, alg_pos, _, alg_end), (_, _, sig_start, sig_end) = parts
    if sig_end == sig_start or der[sig_start] != 0:
        raise DerError("signatureValue has unused bits")
    inner = _children(der, tbs_start, tbs_end)
    index = 2 if inner and inner[0][0] == _VERSION else 1
    if len(inner) <= index or der[inner[index][1] : inner[index][3]] != der[alg_pos:alg_end]:
        # RFC 5280 4.1.1.2: the two must be identical; a mismatch is not a vendor quirk
        raise DerError("tbsCertificate.signature differs from signatureAlgorithm")
    return der[tbs_pos:tbs_end], der[sig_start + 1 : sig_end]


# -- decoding, with the tolerated quirks -----------------------------------------------------------


def _load(der: bytes) -> x509.Certificate:
    with warnings.catch_warnings():
        # cryptography still loads a non-positive serial with a deprecation warning; RFC 5280
        # forbids it and no vendor needs it, so it is refused now rather than in a future release.
        warnings.simplefilter("ignore", CryptographyDeprecationWarning)
        # A common name longer than X.520's 64 characters gets a UserWarning; Google Cloud's genuine
        # EK CAs have such names, and the bound carries nothing for trust (names are compared whole).
        warnings.filterwarnings("ignore", message="Attribute's length must be", category=UserWarning)
        cert = x509.load_der_x509_certificate(der)
        serial = cert.serial_number  # parsed (and warned about) on first access
        # Fields decode lazily (names once, then cached on the certificate): decode them now so
        # that every later access is safe and silent, and a bad encoding is reported here.
        _ = (
            cert.extensions,
            cert.not_valid_before_utc,
            cert.not_valid_after_utc,
            cert.signature_algorithm_oid,
        )
        cert.issuer.rfc4514_string()
        cert.subject.rfc4514_string()
    if serial <= 0:
        raise ValueError("the serial number is not positive (RFC 5280 4.1.2.2)")
    return cert


def _decode(der: bytes, what: str) -> tuple[x509.Certificate, list[str]]:
    try:
        return _load(der), []
    except _DECODE_ERRORS as exc:
        refused = exc
    found: list[str] = []
    try:
        canonical = _canonical(der, found)
    except DerError as exc:
        raise MalformedInput(f"{what}: not a valid X.509 certificate ({refused}; {exc})") from None
    if canonical == der:
        raise MalformedInput(f"{what}: not a valid X.509 certificate ({refused})") from None
    try:
        return _load(canonical), found
    except _DECODE_ERRORS as exc:
        raise MalformedInput(
            f"{what}: not a valid X.509 certificate ({exc}, with {', '.join(found)} tolerated)"
        ) from None


def _canonical(der: bytes, found: list[str]) -> bytes:
    """``der`` with the QUIRKS undone (only those; every other byte as it was)."""
    _, start, end = _header(der, 0, len(der))
    tbs_part, (_, alg_pos, _, alg_end), (_, sig_pos, _, sig_end) = _children(der, start, end)
    _, _, tbs_start, tbs_end = tbs_part
    parts: list[bytes] = []
    inner = _children(der, tbs_start, tbs_end)
    first = 1 if inner and inner[0][0] == _VERSION else 0
    for i, (tag, pos, cs, ce) in enumerate(inner):
        if i == first and tag == _INTEGER:
            parts.append(_serial(der[cs:ce], found))
        elif i == first + 1:
            parts.append(_algorithm(der[pos:ce], found))
        elif tag == _EXTENSIONS:
            parts.append(_extensions(der, pos, cs, ce, found))
        else:
            parts.append(_sorted_sets(der, pos, ce, found, 0))
    tbs = _encode(_SEQUENCE, b"".join(parts))
    alg = _algorithm(der[alg_pos:alg_end], [])  # the TBS copy was already counted
    return _encode(_SEQUENCE, tbs + alg + der[sig_pos:sig_end])


def _note(found: list[str], quirk: str) -> None:
    if quirk not in found:
        found.append(quirk)


def _serial(content: bytes, found: list[str]) -> bytes:
    trimmed = content
    while len(trimmed) > 1 and trimmed[0] == 0 and trimmed[1] < 0x80:
        trimmed = trimmed[1:]
    if trimmed != content:
        _note(found, SERIAL_LEADING_ZEROS)
    return _encode(_INTEGER, trimmed)


def _algorithm(tlv: bytes, found: list[str]) -> bytes:
    _, start, end = _header(tlv, 0, len(tlv))
    content = tlv[start:end]
    if content.endswith(_NULL) and content[: -len(_NULL)] in _ECDSA_OIDS:
        _note(found, ECDSA_NULL_PARAMS)
        return _encode(_SEQUENCE, content[: -len(_NULL)])
    return tlv


def _sorted_sets(buf: bytes, pos: int, end: int, found: list[str], depth: int) -> bytes:
    """The TLV at ``pos`` with every SET OF inside it in DER order (X.690 11.6)."""
    if depth > _MAX_DEPTH:
        raise DerError("nested too deeply")
    tag, cs, ce = _header(buf, pos, end)
    if not tag & _CONSTRUCTED:
        return buf[pos:ce]
    parts = [_sorted_sets(buf, p, ce, found, depth + 1) for _, p, _, _ in _children(buf, cs, ce)]
    if tag == _SET:
        ordered = sorted(parts)
        if ordered != parts:
            _note(found, UNSORTED_SET)
            parts = ordered
    content = b"".join(parts)
    return buf[pos:ce] if content == buf[cs:ce] else _encode(tag, content)


def _extensions(der: bytes, pos: int, cs: int, ce: int, found: list[str]) -> bytes:
    """[3] Extensions, with SETs sorted inside each extnValue too (a SAN directoryName is a Name)."""
    children = _children(der, cs, ce)
    if len(children) != 1 or children[0][0] != _SEQUENCE:
        return der[pos:ce]  # not Extensions (none, several, another type): left for cryptography
    _, _, seq_start, seq_end = children[0]
    out = []
    for _, epos, es, ee in _children(der, seq_start, seq_end):
        fields = _children(der, es, ee)
        items = [der[p:e] for _, p, _, e in fields]
        tag, _, vs, ve = fields[-1] if fields else (0, 0, 0, 0)
        if tag == _OCTET_STRING:
            try:
                inner = b"".join(_sorted_sets(der, p, ve, found, 1) for _, p, _, _ in _children(der, vs, ve))
            except DerError:
                inner = der[vs:ve]  # not DER inside: cryptography judges it as it is
            if len(items) in (2, 3) and items[0] == _BASIC_CONSTRAINTS:
                inner = _basic_constraints(inner, found)
            items[-1] = _encode(_OCTET_STRING, inner)
        if len(items) == 3 and tag == _OCTET_STRING and fields[0][0] == _OID and items[1] == _FALSE:
            # Extension ::= SEQUENCE { extnID, critical BOOLEAN DEFAULT FALSE, extnValue }
            _note(found, ENCODED_DEFAULT)
            del items[1]
        joined = b"".join(items)
        out.append(der[epos:ee] if joined == der[es:ee] else _encode(_SEQUENCE, joined))
    content = _encode(_SEQUENCE, b"".join(out))
    return der[pos:ce] if content == der[cs:ce] else _encode(_EXTENSIONS, content)


def _basic_constraints(value: bytes, found: list[str]) -> bytes:
    """BasicConstraints ::= SEQUENCE { cA BOOLEAN DEFAULT FALSE, pathLenConstraint INTEGER OPTIONAL }
    without an encoded ``cA FALSE``; anything else is returned as it is, for cryptography to judge."""
    try:
        tag, start, end = _header(value, 0, len(value))
    except DerError:
        return value
    if tag != _SEQUENCE or end != len(value) or not value[start:end].startswith(_FALSE):
        return value
    _note(found, ENCODED_DEFAULT)
    return _encode(_SEQUENCE, value[start + len(_FALSE) : end])
