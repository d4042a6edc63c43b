"""Builders of EK certificates with the encoding quirks real vendors ship (docs/ek-roots.md).

No vendor certificate is copied: each quirk is reproduced on test keys by editing the DER of a
certificate ``cryptography`` made and signing the *edited* tbsCertificate with the test CA's key,
exactly as the vendor's CA signed its own bytes. Where the vendor bytes were seen:

- unsorted multi-valued RDN: Nuvoton TPM Root CA 2110/2111/2112 and their EK certificates
  (keylime/keylime@9b1f6e6a917f86c792bac680ea7d36312d5914a5 test/test_certificate_modeltype.py
  ``malformed_cert_b64``; NVIDIA/bare-metal-manager-core@7778162cf43764001b131a939fdea586d04b4eeb
  crates/api/src/tests/common/api_fixtures/tpm_attestation.rs ``EK_CERT_SERIALIZED``): issuer
  ``SET { CN, O, C }`` in that order, SAN directoryName ``SET { id:4E544300, NPCT6xx, id:13 }``.
- ecdsa-with-SHA384 + NULL: Intel "OnDie CA Root Cert Signing" (loicsikidi/tpm-ca-certificates
  @366e970a144e48057e56a833e2aa846c8d25676b src/INTC), in tbsCertificate.signature and
  signatureAlgorithm alike.
- 0xFF NV padding: STMicro ST33 RSA EK certificate, 1169-byte DER + 431 x 0xFF (keylime
  @9b1f6e6a… test/test_cert_utils.py ``st_sha256_with_rsa_der``).
- serial 02 04 00 00 00 01: STMicro "STM TPM EK Intermediate CA 01..05", first issue (carl-wallace/
  tpm_roots@04900ccc6ac60d033b528e552618139837a4143c tests/examples/TrustedTPM, Microsoft's cab).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.x509.oid import NameOID

from attest.templates import POLICY_A_SHA256
from attest.wire import Alg
from tests.support import fakes

NOW = datetime.now(UTC)
TCG_EK = x509.ObjectIdentifier("2.23.133.8.1")
TPM_MANUFACTURER, TPM_MODEL, TPM_VERSION = (x509.ObjectIdentifier(f"2.23.133.2.{i}") for i in (1, 2, 3))
ECDSA_SHA384 = bytes.fromhex("300a06082a8648ce3d040303")
ECDSA_SHA384_NULL = bytes.fromhex("300c06082a8648ce3d0403030500")
Key = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey
Edit = Callable[[bytes], bytes]


def sha256(der: bytes) -> str:
    return hashlib.sha256(der).hexdigest()


def tlv(tag: int, content: bytes) -> bytes:
    n = len(content)
    if n < 0x80:
        return bytes((tag, n)) + content
    size = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes((tag, 0x80 | len(size))) + size + content


def split(der: bytes) -> tuple[int, int]:
    """(content start, content end) of the DER TLV at the start of ``der``."""
    first = der[1]
    if first < 0x80:
        return 2, 2 + first
    n = first & 0x7F
    return 2 + n, 2 + n + int.from_bytes(der[2 : 2 + n], "big")


def children(der: bytes) -> list[bytes]:
    """The TLVs inside the constructed TLV ``der``."""
    start, end = split(der)
    out, pos = [], start
    while pos < end:
        _s, e = split(der[pos:])
        out.append(der[pos : pos + e])
        pos += e
    return out


def sign(key: Key, data: bytes, hash_alg: hashes.HashAlgorithm) -> bytes:
    if isinstance(key, rsa.RSAPrivateKey):
        return key.sign(data, padding.PKCS1v15(), hash_alg)
    return key.sign(data, ec.ECDSA(hash_alg))


def assemble(tbs: bytes, sig_alg: bytes, signature: bytes) -> bytes:
    return tlv(0x30, tbs + sig_alg + tlv(0x03, b"\x00" + signature))


def resign(cert: x509.Certificate, key: Key, edit: Edit, *, outer_alg: Edit | None = None) -> bytes:
    """``cert`` with its tbsCertificate edited by ``edit`` and signed again by ``key``."""
    hash_alg = cert.signature_hash_algorithm
    assert hash_alg is not None
    tbs = edit(cert.tbs_certificate_bytes)
    sig_alg = children(cert.public_bytes(serialization.Encoding.DER))[1]
    if outer_alg is not None:
        sig_alg = outer_alg(sig_alg)
    return assemble(tbs, sig_alg, sign(key, tbs, hash_alg))


def replace_in_tbs(old: bytes, new: bytes) -> Edit:
    """Replace ``old`` by ``new`` inside the TBS content (re-encoding the TBS length)."""

    def edit(tbs: bytes) -> bytes:
        start, end = split(tbs)
        content = tbs[start:end]
        assert old in content, "the bytes to edit are not in the TBS"
        return tlv(0x30, content.replace(old, new))

    return edit


def chain_edits(*edits: Edit) -> Edit:
    def edit(tbs: bytes) -> bytes:
        for e in edits:
            tbs = e(tbs)
        return tbs

    return edit


# -- names --------------------------------------------------------------------------------------


def atv(oid: x509.ObjectIdentifier, value: str) -> bytes:
    """One AttributeTypeAndValue, as cryptography encodes it."""
    (rdn,) = children(x509.Name([x509.NameAttribute(oid, value)]).public_bytes())
    (one,) = children(rdn)
    return one


@dataclass(frozen=True)
class MultiName:
    """One multi-valued RDN (Nuvoton style): the Name, its DER as cryptography writes it (members
    sorted) and the same members in the vendor's order."""

    name: x509.Name
    sorted_der: bytes
    vendor_der: bytes


def multi_valued(*members: tuple[x509.ObjectIdentifier, str]) -> MultiName:
    name = x509.Name([x509.RelativeDistinguishedName([x509.NameAttribute(oid, v) for oid, v in members])])
    encoded = [atv(oid, v) for oid, v in members]
    assert sorted(encoded) != encoded, "members given in DER order: nothing to reproduce"
    vendor = tlv(0x30, tlv(0x31, b"".join(encoded)))
    assert name.public_bytes() != vendor
    assert len(name.public_bytes()) == len(vendor)
    return MultiName(name, name.public_bytes(), vendor)


def nuvoton_name(common_name: str = "Nuvoton TPM Root CA 2111") -> MultiName:
    return multi_valued(
        (NameOID.COMMON_NAME, common_name),
        (NameOID.ORGANIZATION_NAME, "Nuvoton Technology Corporation"),
        (NameOID.COUNTRY_NAME, "TW"),
    )


def tpm_san_name() -> MultiName:
    return multi_valued((TPM_MANUFACTURER, "id:4E544300"), (TPM_MODEL, "NPCT6xx"), (TPM_VERSION, "id:13"))


def cn(text: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


# -- certificates -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ca:
    key: Key
    cert: x509.Certificate
    der: bytes  # the certificate as shipped (possibly with a quirk)

    @property
    def name(self) -> x509.Name:
        return self.cert.subject


def ca_builder(
    subject: x509.Name,
    issuer: x509.Name,
    public: rsa.RSAPublicKey | ec.EllipticCurvePublicKey,
    *,
    serial: int = 1,
    days: int = 3650,
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public)
        .serial_number(serial)
        .not_valid_before(NOW - timedelta(days=1))
        .not_valid_after(NOW + timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
    )


def make_ca(
    subject: x509.Name,
    *,
    parent: Ca | None = None,
    key: Key | None = None,
    edit: Edit | None = None,
    outer_alg: Edit | None = None,
    serial: int = 1,
    hash_alg: hashes.HashAlgorithm | None = None,
) -> Ca:
    key = key or ec.generate_private_key(ec.SECP384R1())
    signer, issuer = (parent.key, parent.name) if parent else (key, subject)
    hash_alg = hash_alg or hashes.SHA384()
    cert = ca_builder(subject, issuer, key.public_key(), serial=serial).sign(signer, hash_alg)
    der = cert.public_bytes(serialization.Encoding.DER)
    if edit is not None or outer_alg is not None:
        der = resign(cert, signer, edit or (lambda t: t), outer_alg=outer_alg)
    return Ca(key, cert, der)


def ek_builder(
    issuer: x509.Name,
    public: rsa.RSAPublicKey | ec.EllipticCurvePublicKey,
    *,
    san: x509.Name | None = None,
    eku: bool = True,
    subject: x509.Name | None = None,
    not_before: datetime | None = None,
    not_after: datetime | None = None,
    key_usage: x509.KeyUsage | None = None,
) -> x509.CertificateBuilder:
    b = (
        x509.CertificateBuilder()
        .subject_name(subject or x509.Name([]))
        .issuer_name(issuer)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before or NOW - timedelta(days=1))
        .not_valid_after(not_after or NOW + timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    )
    if san is not None:
        b = b.add_extension(x509.SubjectAlternativeName([x509.DirectoryName(san)]), critical=subject is None)
    if eku:
        b = b.add_extension(x509.ExtendedKeyUsage([TCG_EK]), critical=False)
    ku_enc = isinstance(public, rsa.RSAPublicKey)
    if key_usage is not None:
        return b.add_extension(key_usage, critical=True)
    return b.add_extension(
        x509.KeyUsage(False, False, ku_enc, False, not ku_enc, False, False, False, False), critical=True
    )


def issue_ek(
    issuer: Ca,
    builder: x509.CertificateBuilder,
    *,
    edit: Edit | None = None,
    hash_alg: hashes.HashAlgorithm | None = None,
) -> bytes:
    cert = builder.sign(issuer.key, hash_alg or hashes.SHA256())
    if edit is None:
        return cert.public_bytes(serialization.Encoding.DER)
    return resign(cert, issuer.key, edit)


# -- EK public areas ----------------------------------------------------------------------------

_EK_SYM = bytes.fromhex("000600800043")  # AES-128-CFB


def ek_pair(kind: str = "rsa") -> tuple[PublicKey, bytes]:
    """A software EK key and its TPM2B_PUBLIC under the TCG L-1 (RSA) or L-2 (ECC P-256) template."""
    if kind == "rsa":
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key()
        return key, fakes.rsa_ek_public(key)
    ecc = ec.generate_private_key(ec.SECP256R1()).public_key()
    return ecc, fakes.ecc_public(
        ecc, attrs=0x000300B2, scheme=Alg.NULL, policy=POLICY_A_SHA256, sym=_EK_SYM, kdf=Alg.NULL
    )
