"""Throwaway certificates for tests and benchmarks: one self-signed P-256 builder for them all."""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

LOOPBACK = ipaddress.IPv4Address("127.0.0.1")
FLEET_CA = "Fleet Secure Boot CA"  # the measured-boot tests' Secure Boot signer


def name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def self_signed(
    cn: str,
    *,
    ca: bool = True,
    path_length: int | None = None,
    key_usage: bool = False,
    ski: bool = False,
    ips: tuple[ipaddress.IPv4Address, ...] = (),
    dns: tuple[str, ...] = (),
    lifetime: dt.timedelta = dt.timedelta(days=1),
    backdate: dt.timedelta = dt.timedelta(minutes=5),
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A fresh P-256 key and a self-signed certificate for it (a CA unless ``ca=False``)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = name(cn)
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - backdate)
        .not_valid_after(now + lifetime)
    )
    if ips or dns:
        sans: list[x509.GeneralName] = [x509.IPAddress(ip) for ip in ips]
        sans += [x509.DNSName(d) for d in dns]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    if ca:
        builder = builder.add_extension(
            x509.BasicConstraints(ca=True, path_length=path_length), critical=True
        )
    if key_usage:
        builder = builder.add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )
    if ski:
        builder = builder.add_extension(
            x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
        )
    return key, builder.sign(key, hashes.SHA256())


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def write_pair(folder: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> tuple[Path, Path]:
    """``tls.crt`` and ``tls.key`` in ``folder``, each replaced in one rename (as a Secret update is)."""
    cert_file, key_file = folder / "tls.crt", folder / "tls.key"
    for path, data in ((cert_file, cert_pem(cert)), (key_file, key_pem(key))):
        tmp = path.with_suffix(".new")
        tmp.write_bytes(data)
        tmp.replace(path)
    return cert_file, key_file


def loopback_tls(
    folder: Path, cn: str, *, ca: bool = True, dns: tuple[str, ...] = ()
) -> tuple[Path, Path, x509.Certificate]:
    """A self-signed serving certificate for 127.0.0.1, written to ``folder``."""
    key, cert = self_signed(cn, ca=ca, ips=(LOOPBACK,), dns=dns, lifetime=dt.timedelta(hours=2))
    cert_file, key_file = write_pair(folder, key, cert)
    return cert_file, key_file, cert


@functools.cache
def ca_der(cn: str = FLEET_CA, twin: int = 0) -> bytes:
    """A self-signed CA's certificate (DER), made when a test first asks and then shared, never at
    import (a refusal by the installed cryptography fails those tests, not the collection).
    ``twin`` gives another CA of the same subject with a key of its own (a forger's copy)."""
    _, cert = self_signed(cn)
    return cert.public_bytes(serialization.Encoding.DER)


def sha256_of(der: bytes) -> str:
    """How a measured-boot policy names an authority: ``sha256:`` and the certificate's digest."""
    return "sha256:" + hashlib.sha256(der).hexdigest()
