"""The node CSR: exactly the kubelet shape, a good key, a valid self-signature, one canonical block."""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import AttributeOID, NameOID
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attest import csr as csr_mod
from attest.csr import NodeCsr, parse_node_csr
from attest.errors import AttestationError, CsrInvalid

NODE = "n1"
SigningKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey


def _name(*attrs: tuple[x509.ObjectIdentifier, str]) -> x509.Name:
    return x509.Name([x509.NameAttribute(oid, value) for oid, value in attrs])


def _kubelet() -> x509.Name:
    return _name((NameOID.COMMON_NAME, f"system:node:{NODE}"), (NameOID.ORGANIZATION_NAME, "system:nodes"))


def _build(
    key: SigningKey,
    subject: x509.Name | None = None,
    *,
    extensions: Sequence[x509.ExtensionType] = (),
    attributes: Sequence[tuple[x509.ObjectIdentifier, bytes]] = (),
) -> x509.CertificateSigningRequest:
    builder = x509.CertificateSigningRequestBuilder().subject_name(_kubelet() if subject is None else subject)
    for ext in extensions:
        builder = builder.add_extension(ext, critical=False)
    for oid, value in attributes:
        builder = builder.add_attribute(oid, value)
    algorithm = None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()
    return builder.sign(key, algorithm)


def _pem(req: x509.CertificateSigningRequest) -> str:
    return req.public_bytes(serialization.Encoding.PEM).decode()


def _der_to_pem(der: bytes) -> str:
    body = base64.encodebytes(der).decode()
    return f"-----BEGIN CERTIFICATE REQUEST-----\n{body}-----END CERTIFICATE REQUEST-----\n"


def _refused(pem: object, node: str = NODE) -> CsrInvalid:
    with pytest.raises(CsrInvalid) as info:
        parse_node_csr(pem, node)
    assert info.value.code == "csr_invalid"
    return info.value


# Minimal DER, to re-sign hand-edited requests: the parser must survive well-signed nonsense.
def _tlv(tag: int, body: bytes) -> bytes:
    n = len(body)
    if n < 0x80:
        return bytes([tag, n]) + body
    size = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(size)]) + size + body


ECDSA_SHA256 = bytes.fromhex("300a06082a8648ce3d040302")
OID_CN = bytes.fromhex("0603550403")
OID_O = bytes.fromhex("060355040a")
OID_EXT_REQ = bytes.fromhex("06092a864886f70d01090e")
SAN_EXT = bytes.fromhex("300e0603551d11040730058203612e62")  # SAN dNSName a.b
UTF8 = 0x0C


def _rdn(oid: bytes, value: bytes, tag: int = UTF8) -> bytes:
    return _tlv(0x31, _tlv(0x30, oid + _tlv(tag, value)))


def _subject(*rdns: bytes) -> bytes:
    return _tlv(0x30, b"".join(rdns))


GOOD_SUBJECT = _subject(_rdn(OID_CN, f"system:node:{NODE}".encode()), _rdn(OID_O, b"system:nodes"))


def _signed(key: ec.EllipticCurvePrivateKey, tbs: bytes) -> bytes:
    signature = key.sign(tbs, ec.ECDSA(hashes.SHA256()))
    return _tlv(0x30, tbs + ECDSA_SHA256 + _tlv(0x03, b"\0" + signature))


def _tbs(
    key: ec.EllipticCurvePrivateKey,
    subject: bytes = GOOD_SUBJECT,
    attrs: bytes = b"",
    version: bytes = b"\2\1\0",
) -> bytes:
    spki = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return _tlv(0x30, version + subject + spki + _tlv(0xA0, attrs))


def _attr(oid: bytes, *values: bytes) -> bytes:
    return _tlv(0x30, oid + _tlv(0x31, b"".join(values)))


@pytest.fixture(scope="module")
def p256() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


@pytest.fixture(scope="module")
def rsa2048() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(65537, 2048)


@pytest.fixture(scope="module")
def good_der(p256: ec.EllipticCurvePrivateKey) -> bytes:
    return _build(p256).public_bytes(serialization.Encoding.DER)


# -- accepted -----------------------------------------------------------------------------------


def test_good_p256_csr(p256: ec.EllipticCurvePrivateKey) -> None:
    req = _build(p256)
    node = parse_node_csr(_pem(req), NODE)
    assert isinstance(node, NodeCsr)
    assert node.der == req.public_bytes(serialization.Encoding.DER)
    assert node.public_key == p256.public_key()
    assert node.pem == _pem(req).encode()
    assert x509.load_pem_x509_csr(node.pem).public_bytes(serialization.Encoding.DER) == node.der


def test_p384_and_rsa2048_pass(rsa2048: rsa.RSAPrivateKey) -> None:
    p384 = ec.generate_private_key(ec.SECP384R1())
    for key in (p384, rsa2048):
        node = parse_node_csr(_pem(_build(key)), NODE)
        assert node.public_key == key.public_key()


def test_rdn_order_and_pem_layout_do_not_matter(p256: ec.EllipticCurvePrivateKey) -> None:
    swapped = _name((NameOID.ORGANIZATION_NAME, "system:nodes"), (NameOID.COMMON_NAME, "system:node:n1"))
    req = _build(p256, swapped)
    pem = _pem(req)
    assert parse_node_csr(pem, NODE).der == req.public_bytes(serialization.Encoding.DER)
    crlf = pem.replace("\n", "\r\n")
    assert parse_node_csr(crlf, NODE).der == req.public_bytes(serialization.Encoding.DER)
    assert parse_node_csr("\n\n  " + pem + "\n\n", NODE).pem == pem.encode()
    one_line = _der_to_pem(req.public_bytes(serialization.Encoding.DER)).replace("\n", "")
    one_line = one_line.replace(
        "-----BEGIN CERTIFICATE REQUEST-----", "-----BEGIN CERTIFICATE REQUEST-----\n"
    )
    assert parse_node_csr(one_line, NODE).pem == pem.encode()  # canonical PEM back


def test_dotted_node_name(p256: ec.EllipticCurvePrivateKey) -> None:
    name = "gpu-7.rack-2.dc1"
    subject = _name((NameOID.COMMON_NAME, f"system:node:{name}"), (NameOID.ORGANIZATION_NAME, "system:nodes"))
    assert parse_node_csr(_pem(_build(p256, subject)), name).public_key == p256.public_key()


# -- keys ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda: rsa.generate_private_key(65537, 1024), "at least 2048"),  # noqa: S505
        (lambda: ec.generate_private_key(ec.SECP521R1()), "secp521r1"),
        (lambda: ec.generate_private_key(ec.SECP256K1()), "secp256k1"),
        (lambda: ec.generate_private_key(ec.SECP224R1()), "secp224r1"),
        (ed25519.Ed25519PrivateKey.generate, "ECDSA"),
    ],
)
def test_weak_or_foreign_keys_are_refused(make: Any, why: str) -> None:
    assert why in str(_refused(_pem(_build(make()))))


def test_huge_rsa_key_is_refused(p256: ec.EllipticCurvePrivateKey) -> None:
    # No need for a real 9000-bit key: the size check comes before the signature check.
    modulus = (1 << 8999) | 1
    public = rsa.RSAPublicNumbers(65537, modulus).public_key()
    spki = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    tbs = _tlv(0x30, b"\2\1\0" + GOOD_SUBJECT + spki + _tlv(0xA0, b""))
    rsa_sha256 = bytes.fromhex("300d06092a864886f70d01010b0500")
    der = _tlv(0x30, tbs + rsa_sha256 + _tlv(0x03, b"\0" + b"\1" * 1125))
    assert "at most 8192" in str(_refused(_der_to_pem(der)))


def test_unknown_key_algorithm_is_refused(good_der: bytes) -> None:
    id_ec_public_key = bytes.fromhex("06072a8648ce3d0201")
    assert good_der.count(id_ec_public_key) == 1
    _refused(_der_to_pem(good_der.replace(id_ec_public_key, bytes.fromhex("06072a8648ce3d0209"))))
    p256_oid = bytes.fromhex("06082a8648ce3d030107")
    _refused(_der_to_pem(good_der.replace(p256_oid, bytes.fromhex("06082a8648ce3d030199"))))


# -- subject ------------------------------------------------------------------------------------


@pytest.mark.parametrize(  # built when a case runs: cryptography validates names
    "subject",
    [
        lambda: _name((NameOID.COMMON_NAME, "system:node:n2"), (NameOID.ORGANIZATION_NAME, "system:nodes")),
        lambda: _name((NameOID.COMMON_NAME, "system:node:N1"), (NameOID.ORGANIZATION_NAME, "system:nodes")),
        lambda: _name((NameOID.COMMON_NAME, "n1"), (NameOID.ORGANIZATION_NAME, "system:nodes")),
        lambda: _name((NameOID.COMMON_NAME, "system:node:n1 "), (NameOID.ORGANIZATION_NAME, "system:nodes")),
        lambda: _name((NameOID.COMMON_NAME, "system:node:n1")),
        lambda: _name((NameOID.ORGANIZATION_NAME, "system:nodes")),
        lambda: _name((NameOID.COMMON_NAME, "system:node:n1"), (NameOID.ORGANIZATION_NAME, "system:masters")),
        lambda: _name(
            (NameOID.COMMON_NAME, "system:node:n1"),
            (NameOID.ORGANIZATION_NAME, "system:nodes"),
            (NameOID.ORGANIZATION_NAME, "system:masters"),
        ),
        lambda: _name(
            (NameOID.COMMON_NAME, "system:node:n1"),
            (NameOID.ORGANIZATION_NAME, "system:nodes"),
            (NameOID.ORGANIZATIONAL_UNIT_NAME, "extra"),
        ),
        lambda: _name(
            (NameOID.COMMON_NAME, "system:node:n1"),
            (NameOID.COMMON_NAME, "system:node:n1"),
            (NameOID.ORGANIZATION_NAME, "system:nodes"),
        ),
        lambda: _name((NameOID.COMMON_NAME, "system:node:n1"), (NameOID.COMMON_NAME, "system:node:n1")),
        lambda: _name((NameOID.ORGANIZATION_NAME, "system:node:n1"), (NameOID.COMMON_NAME, "system:nodes")),
        lambda: x509.Name([]),
    ],
    ids=[
        "other-node",
        "uppercase-node",
        "no-prefix",
        "trailing-space",
        "no-organization",
        "no-common-name",
        "masters",
        "nodes-and-masters",
        "extra-ou",
        "two-common-names",
        "two-common-names-no-organization",
        "values-swapped",
        "empty",
    ],
)
def test_wrong_subjects_are_refused(
    p256: ec.EllipticCurvePrivateKey, subject: Callable[[], x509.Name]
) -> None:
    assert "subject" in str(_refused(_pem(_build(p256, subject()))))


def test_csr_for_another_node_is_refused(p256: ec.EllipticCurvePrivateKey) -> None:
    pem = _pem(_build(p256))
    assert parse_node_csr(pem, NODE)
    for other in ("n2", "n", "n1.example", ""):
        _refused(pem, other)


# -- extensions and attributes ------------------------------------------------------------------


@pytest.mark.parametrize(
    "ext",
    [
        lambda: x509.SubjectAlternativeName([x509.DNSName("n1")]),
        lambda: x509.SubjectAlternativeName([x509.UniformResourceIdentifier("spiffe://example.org/node/n1")]),
        lambda: x509.BasicConstraints(ca=True, path_length=None),
        lambda: x509.KeyUsage(True, False, False, False, False, False, False, False, False),
        lambda: x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]),
    ],
    ids=["san-dns", "san-uri", "basic-constraints", "key-usage", "extended-key-usage"],
)
def test_any_extension_is_refused(
    p256: ec.EllipticCurvePrivateKey, ext: Callable[[], x509.ExtensionType]
) -> None:
    assert "extensions" in str(_refused(_pem(_build(p256, extensions=[ext()]))))


@pytest.mark.parametrize(
    "attr",
    [(AttributeOID.CHALLENGE_PASSWORD, b"hunter2"), (AttributeOID.UNSTRUCTURED_NAME, b"n1")],
)
def test_any_attribute_is_refused(
    p256: ec.EllipticCurvePrivateKey, attr: tuple[x509.ObjectIdentifier, bytes]
) -> None:
    assert "attributes" in str(_refused(_pem(_build(p256, attributes=[attr]))))


@pytest.mark.parametrize(
    "attrs",
    [
        _attr(OID_EXT_REQ, _tlv(0x30, SAN_EXT + SAN_EXT)),  # duplicate extension
        _attr(OID_EXT_REQ, _tlv(0x30, bytes.fromhex("30090603551d110402ffff"))),  # SAN body not DER
        _attr(OID_EXT_REQ, _tlv(0x02, b"\1")),  # extension request that is an INTEGER
        _attr(OID_EXT_REQ, _tlv(UTF8, b"junk")),
        _attr(bytes.fromhex("06092a864886f70d010907"), _tlv(UTF8, b"a"), _tlv(UTF8, b"b")),  # two values
        _attr(bytes.fromhex("06092a864886f70d010907")),  # no value
    ],
    ids=["duplicate-ext", "san-not-der", "extreq-integer", "extreq-utf8", "two-values", "no-value"],
)
def test_well_signed_malformed_attributes_are_refused(p256: ec.EllipticCurvePrivateKey, attrs: bytes) -> None:
    _refused(_der_to_pem(_signed(p256, _tbs(p256, attrs=attrs))))


@pytest.mark.parametrize(
    "subject",
    [
        _subject(_rdn(OID_CN, b"system:node:\xff"), _rdn(OID_O, b"system:nodes")),  # bad UTF-8
        _subject(_rdn(OID_CN, b"\1", tag=0x02), _rdn(OID_O, b"system:nodes")),  # INTEGER value
        _subject(_rdn(OID_CN, b"", tag=0x30), _rdn(OID_O, b"system:nodes")),
        _subject(_tlv(0x31, b""), _rdn(OID_CN, b"system:node:n1"), _rdn(OID_O, b"system:nodes")),  # empty RDN
        _subject(_rdn(OID_CN, b"system:node:n1*", tag=0x13), _rdn(OID_O, b"system:nodes")),  # bad Printable
    ],
    ids=["bad-utf8", "integer", "sequence", "empty-rdn", "bad-printable"],
)
def test_well_signed_malformed_subjects_are_refused(p256: ec.EllipticCurvePrivateKey, subject: bytes) -> None:
    _refused(_der_to_pem(_signed(p256, _tbs(p256, subject=subject))))


def test_hand_built_request_matches_the_library(p256: ec.EllipticCurvePrivateKey) -> None:
    # Guards the helpers above: an unmodified hand-built request must pass.
    assert parse_node_csr(_der_to_pem(_signed(p256, _tbs(p256))), NODE).public_key == p256.public_key()


@pytest.mark.parametrize(
    "version", [b"\2\1\1", b"\2\1\2", b"\2\1\xff", b"\2\2\0\0"], ids=["v2", "v3", "v-1", "v0-long"]
)
def test_other_versions_are_refused(p256: ec.EllipticCurvePrivateKey, version: bytes) -> None:
    _refused(_der_to_pem(_signed(p256, _tbs(p256, version=version))))


# -- signature ----------------------------------------------------------------------------------


def test_bad_signature_is_refused(good_der: bytes) -> None:
    tampered = bytearray(good_der)
    tampered[-5] ^= 0x01  # inside the ECDSA signature's s integer
    assert "signature" in str(_refused(_der_to_pem(bytes(tampered))))


def test_signature_bit_string_with_unused_bits_is_refused(p256: ec.EllipticCurvePrivateKey) -> None:
    # Same signature bytes, but "1 unused bit": cryptography would verify it, Go would not.
    tbs = _tbs(p256)
    while True:
        signature = p256.sign(tbs, ec.ECDSA(hashes.SHA256()))
        if signature[-1] % 2 == 0:  # DER wants the unused bit to be zero
            break
    der = _tlv(0x30, tbs + ECDSA_SHA256 + _tlv(0x03, b"\1" + signature))
    assert "octet-aligned" in str(_refused(_der_to_pem(der)))
    parse_node_csr(_der_to_pem(_tlv(0x30, tbs + ECDSA_SHA256 + _tlv(0x03, b"\0" + signature))), NODE)


def test_signature_by_another_key_is_refused(p256: ec.EllipticCurvePrivateKey) -> None:
    other = ec.generate_private_key(ec.SECP256R1())
    tbs = _tbs(p256)
    signature = other.sign(tbs, ec.ECDSA(hashes.SHA256()))
    der = _tlv(0x30, tbs + ECDSA_SHA256 + _tlv(0x03, b"\0" + signature))
    assert "signature" in str(_refused(_der_to_pem(der)))


def test_rsa_bad_signature_is_refused(rsa2048: rsa.RSAPrivateKey) -> None:
    der = bytearray(_build(rsa2048).public_bytes(serialization.Encoding.DER))
    der[-1] ^= 0xFF
    assert "signature" in str(_refused(_der_to_pem(bytes(der))))


# -- framing ------------------------------------------------------------------------------------


def test_two_pem_blocks_are_refused(p256: ec.EllipticCurvePrivateKey) -> None:
    pem = _pem(_build(p256))
    _refused(pem + pem)
    _refused(pem + _pem(_build(ec.generate_private_key(ec.SECP256R1()))))


@pytest.mark.parametrize(
    "wrap",
    [
        lambda p: p + "trailing garbage\n",
        lambda p: "leading garbage\n" + p,
        lambda p: p.replace("CERTIFICATE REQUEST", "NEW CERTIFICATE REQUEST"),
        lambda p: p.replace("CERTIFICATE REQUEST", "CERTIFICATE"),
        lambda p: p.replace("-----END CERTIFICATE REQUEST-----\n", ""),
        lambda p: p.replace("-----BEGIN CERTIFICATE REQUEST-----\n", ""),
        lambda p: p[:60] + "!" + p[61:],
        lambda p: p[:60] + " " + p[60:],
        lambda p: p[:60] + "=" + p[60:],
        lambda p: p.lower(),
    ],
)
def test_bad_pem_framing_is_refused(p256: ec.EllipticCurvePrivateKey, wrap: Any) -> None:
    _refused(wrap(_pem(_build(p256))))


def test_trailing_bytes_after_the_der_are_refused(good_der: bytes) -> None:
    _refused(_der_to_pem(good_der + b"\0"))
    _refused(_der_to_pem(good_der + good_der))


def test_non_canonical_der_is_refused(good_der: bytes) -> None:
    assert good_der[1] == 0x81  # a P-256 request is 128..255 bytes: one length byte
    long_form = b"\x30\x82\x00" + good_der[2:]  # same length, needless two-byte form
    _refused(_der_to_pem(long_form))
    indefinite = b"\x30\x80" + good_der[3:] + b"\0\0"  # BER indefinite length
    _refused(_der_to_pem(indefinite))


def test_truncated_der_is_refused(good_der: bytes) -> None:
    for n in (0, 1, 2, 10, len(good_der) // 2, len(good_der) - 1):
        _refused(_der_to_pem(good_der[:n]))


def test_oversize_is_refused(p256: ec.EllipticCurvePrivateKey) -> None:
    pem = _pem(_build(p256))
    padded = pem + "\n" * (csr_mod.MAX_CSR_PEM - len(pem) + 1)
    assert "larger than" in str(_refused(padded))
    assert "larger than" in str(_refused("A" * (10 * csr_mod.MAX_CSR_PEM)))


@pytest.mark.parametrize("value", [None, 1, b"-----BEGIN CERTIFICATE REQUEST-----", ["pem"], {"csr": "x"}])
def test_non_str_is_refused(value: object) -> None:
    assert "string" in str(_refused(value))


def test_csr_invalid_is_an_attestation_error() -> None:
    assert issubclass(CsrInvalid, AttestationError)
    assert CsrInvalid.code == "csr_invalid"


# -- never another exception --------------------------------------------------------------------


def _only_csr_invalid(pem: object) -> None:
    with contextlib.suppress(CsrInvalid):  # acceptance is fine too; any other exception fails
        parse_node_csr(pem, NODE)


def _mutate(buf: bytes, data: st.DataObject) -> bytes:
    out = bytearray(buf)
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        out[data.draw(st.integers(0, len(out) - 1), label="pos")] = data.draw(
            st.integers(0, 255), label="byte"
        )
    return bytes(out)


@given(st.text(max_size=2000))
@settings(max_examples=400, deadline=None)
def test_arbitrary_text_is_csr_invalid(text: str) -> None:
    with pytest.raises(CsrInvalid):
        parse_node_csr(text, NODE)


@given(st.binary(max_size=600))
@settings(max_examples=400, deadline=None)
def test_arbitrary_der_in_pem_is_csr_invalid(der: bytes) -> None:
    with pytest.raises(CsrInvalid):
        parse_node_csr(_der_to_pem(der), NODE)


@given(data=st.data())
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_mutated_requests_are_csr_invalid(good_der: bytes, data: st.DataObject) -> None:
    der = _mutate(good_der, data)
    if der == good_der:
        return
    with pytest.raises(CsrInvalid):
        parse_node_csr(_der_to_pem(der), NODE)


@given(data=st.data())
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_mutated_then_resigned_requests_never_raise_other_errors(
    p256: ec.EllipticCurvePrivateKey, data: st.DataObject
) -> None:
    # Re-signing gets past the signature check, so the subject, attribute and key parsers see
    # the damage; cryptography parses some of these lazily.
    attrs = data.draw(st.sampled_from([b"", _attr(OID_EXT_REQ, _tlv(0x30, SAN_EXT))]), label="attrs")
    _only_csr_invalid(_der_to_pem(_signed(p256, _mutate(_tbs(p256, attrs=attrs), data))))
