"""The Google Compute Engine instance identity that GCE's vTPM CA writes into each EK certificate
(extension 1.3.6.1.4.1.11129.2.1.21): which project, zone and instance the vTPM belongs to.

    GceInstanceInfo ::= SEQUENCE {
        zone               UTF8String,
        projectNumber      INTEGER,
        projectId          UTF8String,
        instanceId         INTEGER,
        instanceName       UTF8String,
        securityProperties [0] EXPLICIT SEQUENCE {
            securityVersion [0] EXPLICIT INTEGER OPTIONAL,
            isProduction    [1] EXPLICIT BOOLEAN OPTIONAL,
            ...             [n] EXPLICIT, later fields, each one element } OPTIONAL }

(the layout Google's go-tpm-tools reads). Parsed strictly: DER only (definite minimal lengths),
no trailing bytes, bounded sizes; anything else is :class:`attest.errors.EkUntrusted` because an
identity that cannot be read cannot satisfy a binding. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from cryptography import x509

from attest.certparse import Cert
from attest.errors import EkUntrusted

GCE_INSTANCE_INFO = x509.ObjectIdentifier("1.3.6.1.4.1.11129.2.1.21")
MAX_EXTENSION = 1024  # the real ones are ~112 bytes
MAX_TEXT = 256  # zone, project id and instance name are far shorter (GCE limits them to 63-ish)
_SEQUENCE, _UTF8, _INTEGER, _BOOLEAN = 0x30, 0x0C, 0x02, 0x01


@dataclass(frozen=True, slots=True)
class GceInstance:
    zone: str
    project_number: int
    project_id: str
    instance_id: int
    instance_name: str
    security_version: int | None
    is_production: bool  # absent counts as False, as go-tpm-tools reads it


def has_instance_info(cert: Cert) -> bool:
    try:
        cert.view.extensions.get_extension_for_oid(GCE_INSTANCE_INFO)
    except x509.ExtensionNotFound:
        return False
    return True


def instance_of(cert: Cert) -> GceInstance:
    """The instance identity of a GCE vTPM certificate; EkUntrusted when absent or malformed."""
    try:
        ext = cert.view.extensions.get_extension_for_oid(GCE_INSTANCE_INFO)
    except x509.ExtensionNotFound:
        raise EkUntrusted(
            "the EK certificate names no GCE instance (extension 1.3.6.1.4.1.11129.2.1.21)"
        ) from None
    value = ext.value
    raw = value.value if isinstance(value, x509.UnrecognizedExtension) else b""
    return parse(raw)


def parse(raw: bytes) -> GceInstance:
    if not raw or len(raw) > MAX_EXTENSION:
        raise _bad(f"{len(raw)} bytes")
    tag, body, rest = _tlv(raw)
    if tag != _SEQUENCE or rest:
        raise _bad("not exactly one SEQUENCE")
    fields: list[tuple[int, bytes]] = []
    while body:
        tag, content, body = _tlv(body)
        fields.append((tag, content))
    kinds = [t for t, _ in fields]
    if kinds[:5] != [_UTF8, _INTEGER, _UTF8, _INTEGER, _UTF8] or len(fields) > 6:
        raise _bad("fields are not zone, projectNumber, projectId, instanceId, instanceName")
    security_version, production = None, False
    if len(fields) == 6:
        if fields[5][0] != 0xA0:
            raise _bad("a sixth field that is not securityProperties [0]")
        security_version, production = _security(fields[5][1])
    return GceInstance(
        zone=_text(fields[0][1], "zone"),
        project_number=_unsigned(fields[1][1], "projectNumber"),
        project_id=_text(fields[2][1], "projectId"),
        instance_id=_unsigned(fields[3][1], "instanceId"),
        instance_name=_text(fields[4][1], "instanceName"),
        security_version=security_version,
        is_production=production,
    )


def _security(explicit: bytes) -> tuple[int | None, bool]:
    tag, body, rest = _tlv(explicit)
    if tag != _SEQUENCE or rest:
        raise _bad("securityProperties is not one SEQUENCE")
    version, production, last = None, False, -1
    while body:
        tag, content, body = _tlv(body)
        number = tag - 0xA0
        if not 0 <= number <= 30 or number <= last:
            raise _bad("securityProperties fields are not [n] EXPLICIT in ascending order")
        last = number
        inner_tag, inner, extra = _tlv(content)
        if extra:
            raise _bad(f"securityProperties [{number}] holds more than one element")
        if number == 0:
            if inner_tag != _INTEGER:
                raise _bad("securityVersion is not an INTEGER")
            version = _unsigned(inner, "securityVersion")
        elif number == 1:
            if inner_tag != _BOOLEAN or inner not in (b"\x00", b"\xff"):
                raise _bad("isProduction is not a DER BOOLEAN")
            production = inner == b"\xff"
    return version, production


def _tlv(buf: bytes) -> tuple[int, bytes, bytes]:
    """(tag, content, what follows) of the first DER element; low tag numbers only."""
    if len(buf) < 2 or buf[0] & 0x1F == 0x1F:
        raise _bad("truncated or high-tag-number element")
    tag, first = buf[0], buf[1]
    if first < 0x80:
        length, start = first, 2
    else:
        n = first & 0x7F
        if n == 0 or n > 2 or len(buf) < 2 + n:
            raise _bad("indefinite or oversized length")
        length, start = int.from_bytes(buf[2 : 2 + n], "big"), 2 + n
        if length < 0x80 or (n == 2 and length < 0x100):
            raise _bad("length not in its shortest form")
    if len(buf) < start + length:
        raise _bad("element runs past the end")
    return tag, buf[start : start + length], buf[start + length :]


def _text(content: bytes, what: str) -> str:
    if not content or len(content) > MAX_TEXT:
        raise _bad(f"{what} is empty or longer than {MAX_TEXT} bytes")
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        raise _bad(f"{what} is not UTF-8") from None
    if not text.isprintable():
        raise _bad(f"{what} has control characters")
    return text


def _unsigned(content: bytes, what: str) -> int:
    if not content or len(content) > 9:
        raise _bad(f"{what} is not an INTEGER of at most 64 bits")
    if len(content) > 1 and (
        (content[0] == 0 and content[1] < 0x80) or (content[0] == 0xFF and content[1] >= 0x80)
    ):
        raise _bad(f"{what} is not minimally encoded")
    value = int.from_bytes(content, "big", signed=True)
    if value < 0 or value >= 1 << 64:
        raise _bad(f"{what} is negative or too large")
    return value


def _bad(why: str) -> EkUntrusted:
    return EkUntrusted(f"the EK certificate's GCE instance identity cannot be read: {why}")
