"""EK certificates for soft TPMs (``tests.support.softtpm``), shaped like the ones swtpm_setup's
local CA issues."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID, ObjectIdentifier


def ek_certificate(
    ek_key: rsa.RSAPublicKey | ec.EllipticCurvePublicKey,
    issuer_key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey,
    issuer_cert: x509.Certificate,
) -> bytes:
    """A DER EK certificate for the EK ``ek_key``, shaped like the ones swtpm_setup's local CA issues:
    subject CN=unknown, validity until 9999-12-31, extensions (in swtpm's order) EKU
    tcg-kp-EKCertificate, critical SAN directoryName with TPM manufacturer/model/version,
    critical basicConstraints CA:FALSE, subjectDirectoryAttributes with the TPM spec version,
    the issuer's key identifier, and critical keyUsage keyEncipherment (RSA) or keyAgreement (ECC)."""
    tcg = "2.23.133.2."
    san = x509.Name(
        [
            x509.NameAttribute(ObjectIdentifier(tcg + "1"), "id:00001014"),  # tpmManufacturer
            x509.NameAttribute(ObjectIdentifier(tcg + "2"), "swtpm"),  # tpmModel
            x509.NameAttribute(ObjectIdentifier(tcg + "3"), "id:20191023"),  # tpmVersion
        ]
    )
    # SEQUENCE { SEQUENCE { tcg-at-tpmSpecification, SET { SEQUENCE { "2.0", 0, 164 } } } }
    spec = bytes.fromhex("3019301706056781050210310e300c0c03322e30020100020200a4")
    rsa_ek = isinstance(ek_key, rsa.RSAPublicKey)
    now = datetime.now(UTC).replace(microsecond=0)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "unknown")]))
        .issuer_name(issuer_cert.subject)
        .public_key(ek_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=1))
        .not_valid_after(datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC))
        .add_extension(x509.ExtendedKeyUsage([ObjectIdentifier("2.23.133.8.1")]), critical=False)
        .add_extension(x509.SubjectAlternativeName([x509.DirectoryName(san)]), critical=True)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.UnrecognizedExtension(ObjectIdentifier("2.5.29.9"), spec), critical=False)
        .add_extension(_authority_key_id(issuer_cert), critical=False)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=rsa_ek,
                data_encipherment=False,
                key_agreement=not rsa_ek,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )
    return builder.sign(issuer_key, hashes.SHA256()).public_bytes(serialization.Encoding.DER)


def _authority_key_id(issuer_cert: x509.Certificate) -> x509.AuthorityKeyIdentifier:
    try:
        ski = issuer_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_cert.public_key())  # type: ignore[arg-type]
    return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)
