"""X.509-SVIDs: issuing one for a node's key, and verifying a peer's against its trust domain's roots.

Everything here is pure: callers pass ``now`` (timezone-aware) and the signing authority.
Verification is two layers: the SPIFFE leaf rules (X509-SVID §5), checked here with precise
messages (OpenSSL alone accepts a ``CA:TRUE`` client leaf), then RFC 5280 path validation by
``cryptography``'s verifier.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, ObjectIdentifier
from cryptography.x509.verification import (
    Criticality,
    ExtensionPolicy,
    Policy,
    PolicyBuilder,
    Store,
    VerificationError,
)

from attest.errors import AttestationError
from attest.spiffeid import SpiffeId, SpiffeIdError, parse_spiffe_id, validate_trust_domain

CLOCK_SKEW = timedelta(seconds=60)
# A leaf that signs (TLS handshakes, x509pop's proof of possession) and does nothing else.
LEAF_KEY_USAGE = x509.KeyUsage(
    digital_signature=True,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=False,
    crl_sign=False,
    encipher_only=False,
    decipher_only=False,
)
# The EC curves an SVID (and a bundle key) may use: (JWK "crv", coordinate size in bytes).
EC_CURVES: dict[str, tuple[str, int]] = {"secp256r1": ("P-256", 32), "secp384r1": ("P-384", 48)}

_DNS_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_USAGE_OIDS: dict[str, ObjectIdentifier] = {
    "client": ExtendedKeyUsageOID.CLIENT_AUTH,
    "server": ExtendedKeyUsageOID.SERVER_AUTH,
}
_CERT_DECODE_ERRORS = (ValueError, x509.DuplicateExtension, x509.UnsupportedGeneralNameType)

SvidPublicKey = ec.EllipticCurvePublicKey | rsa.RSAPublicKey


class SvidInvalid(AttestationError):
    """A peer's X.509-SVID fails the SPIFFE leaf rules or does not chain to the bundle."""

    code = "svid_invalid"


class Signer(Protocol):
    """What signs SVIDs: a CA certificate of the trust domain and its private key
    (:class:`attest.ca.Authority` is one)."""

    @property
    def certificate(self) -> x509.Certificate: ...

    @property
    def key(self) -> CertificateIssuerPrivateKeyTypes: ...


# -- issuing -----------------------------------------------------------------------------------


def _require_aware(now: datetime) -> None:
    if not isinstance(now, datetime) or now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("now must be a timezone-aware datetime")


def _check_subject_key(key: object) -> SvidPublicKey:
    if isinstance(key, ec.EllipticCurvePublicKey):
        if key.curve.name not in EC_CURVES:
            raise ValueError(f"SVID key curve {key.curve.name} is not P-256 or P-384")
        return key
    if isinstance(key, rsa.RSAPublicKey):
        if key.key_size < 2048:
            raise ValueError(f"SVID RSA key of {key.key_size} bits is below 2048")
        return key
    raise ValueError("SVID key must be an EC P-256/P-384 or RSA >= 2048 public key")


def _dns_name(name: str) -> str:
    if not isinstance(name, str):
        raise TypeError("DNS names must be strings")
    canonical = name.lower()
    labels = canonical.split(".")
    if len(canonical) > 253 or not all(_DNS_LABEL.fullmatch(label) for label in labels):
        raise ValueError(f"{name!r} is not a valid DNS name")
    return canonical


def _trust_domain_of_ca(cert: x509.Certificate) -> str | None:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None
    uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    if len(uris) != 1:
        return None
    try:
        return parse_spiffe_id(uris[0]).trust_domain
    except SpiffeIdError:
        return None


def issue_svid(
    signer: Signer,
    *,
    spiffe_id: SpiffeId,
    public_key: SvidPublicKey,
    now: datetime,
    ttl: timedelta,
    dns_names: Sequence[str] = (),
    ip_addresses: Sequence[ipaddress.IPv4Address | ipaddress.IPv6Address] = (),
) -> x509.Certificate:
    """Sign an X.509-SVID for ``public_key``. Raises ValueError for arguments that cannot make a
    valid SVID (root ID, other trust domain, weak key, expired signer, non-positive ttl)."""
    _require_aware(now)
    if not isinstance(spiffe_id, SpiffeId):
        raise TypeError("spiffe_id must be a SpiffeId")
    if spiffe_id.is_trust_domain_id:
        raise ValueError("an X.509-SVID must not carry the trust-domain ID (path is empty)")
    if ttl <= timedelta(0):
        raise ValueError("SVID ttl must be positive")
    key = _check_subject_key(public_key)
    ca_cert = signer.certificate
    ca_td = _trust_domain_of_ca(ca_cert)
    if ca_td != spiffe_id.trust_domain:
        raise ValueError(f"signing authority is for trust domain {ca_td}, not {spiffe_id.trust_domain}")
    not_after = min(now + ttl, ca_cert.not_valid_after_utc)
    if not_after <= now:
        raise ValueError("signing authority has expired")
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(str(spiffe_id))]
    sans += [x509.DNSName(_dns_name(name)) for name in dns_names]
    for ip in ip_addresses:
        if not isinstance(ip, ipaddress.IPv4Address | ipaddress.IPv6Address):
            raise TypeError(f"{ip!r} is not an IP address")
        sans.append(x509.IPAddress(ip))
    # Empty subject: RFC 5280 4.1.2.6 makes the SAN extension critical.
    return sign_leaf(
        signer,
        key,
        x509.Name([]),
        sans,
        san_critical=True,
        not_before=now - CLOCK_SKEW,
        not_after=not_after,
        usages=[ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
    )


def sign_leaf(
    signer: Signer,
    key: SvidPublicKey,
    subject: x509.Name,
    sans: Sequence[x509.GeneralName],
    *,
    san_critical: bool,
    not_before: datetime,
    not_after: datetime,
    usages: Sequence[ObjectIdentifier],
) -> x509.Certificate:
    """A leaf certificate of ``signer``'s CA (the SVID, the x509pop certificate): not a CA,
    LEAF_KEY_USAGE, the extended key usages ``usages``, key identifiers of both keys."""
    ca_cert = signer.certificate
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key)
        .serial_number(x509.random_serial_number())  # 159 random bits, positive
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName(sans), critical=san_critical)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(LEAF_KEY_USAGE, critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
    )
    return builder.sign(signer.key, hashes.SHA256())


# -- verifying ---------------------------------------------------------------------------------


def _leaf_ext(leaf: x509.Certificate, cls: type[x509.ExtensionType]) -> x509.Extension[Any] | None:
    try:
        return leaf.extensions.get_extension_for_class(cls)
    except x509.ExtensionNotFound:
        return None


def _check_leaf(
    leaf: x509.Certificate, trust_domain: str, now: datetime, usage_oid: ObjectIdentifier
) -> SpiffeId:
    """The X509-SVID §5 leaf rules; returns the leaf's SPIFFE ID."""
    bc = _leaf_ext(leaf, x509.BasicConstraints)
    if bc is None:
        raise SvidInvalid("SVID has no basicConstraints extension")
    if bc.value.ca:
        raise SvidInvalid("SVID is a CA certificate (basicConstraints cA=true)")
    ku = _leaf_ext(leaf, x509.KeyUsage)
    if ku is None:
        raise SvidInvalid("SVID has no keyUsage extension")
    if not ku.critical:
        raise SvidInvalid("SVID keyUsage extension is not critical")
    if not ku.value.digital_signature:
        raise SvidInvalid("SVID keyUsage lacks digitalSignature")
    if ku.value.key_cert_sign or ku.value.crl_sign:
        raise SvidInvalid("SVID keyUsage allows keyCertSign or cRLSign")
    san = _leaf_ext(leaf, x509.SubjectAlternativeName)
    if san is None:
        raise SvidInvalid("SVID has no subjectAltName extension")
    if len(leaf.subject) == 0 and not san.critical:
        raise SvidInvalid("SVID has an empty subject but a non-critical subjectAltName")
    uris = san.value.get_values_for_type(x509.UniformResourceIdentifier)
    if len(uris) != 1:
        raise SvidInvalid(f"SVID must have exactly one URI SAN, has {len(uris)}")
    try:
        sid = parse_spiffe_id(uris[0])
    except SpiffeIdError as exc:
        raise SvidInvalid(f"SVID URI SAN is not a valid SPIFFE ID: {exc}") from None
    if sid.is_trust_domain_id:
        raise SvidInvalid(f"SVID carries the trust-domain ID {sid} (no path)")
    if sid.trust_domain != trust_domain:
        raise SvidInvalid(f"SVID {sid} is not in trust domain {trust_domain}")
    eku = _leaf_ext(leaf, x509.ExtendedKeyUsage)
    if eku is not None and usage_oid not in eku.value:
        raise SvidInvalid(f"SVID extendedKeyUsage lacks {usage_oid._name}")
    if now < leaf.not_valid_before_utc:
        raise SvidInvalid(f"SVID is not valid before {leaf.not_valid_before_utc.isoformat()}")
    if now > leaf.not_valid_after_utc:
        raise SvidInvalid(f"SVID expired at {leaf.not_valid_after_utc.isoformat()}")
    return sid


def _eku_validator(usage_oid: ObjectIdentifier) -> Any:
    def validate(policy: Policy, cert: x509.Certificate, eku: x509.ExtendedKeyUsage | None) -> None:
        if eku is not None and usage_oid not in eku:
            raise ValueError(f"extendedKeyUsage lacks {usage_oid._name}")

    return validate


def verify_svid(
    leaf: x509.Certificate,
    *,
    roots: Sequence[x509.Certificate],
    trust_domain: str,
    now: datetime,
    usage: Literal["client", "server"] = "client",
) -> SpiffeId:
    """Check a peer's SVID against the roots of ``trust_domain`` (only that trust domain's roots:
    never a merged pool). Returns its SPIFFE ID; raises SvidInvalid on every failure."""
    _require_aware(now)
    validate_trust_domain(trust_domain)
    usage_oid = _USAGE_OIDS.get(usage)
    if usage_oid is None:
        raise ValueError(f"usage must be 'client' or 'server', not {usage!r}")
    if not roots:
        raise SvidInvalid(f"no trusted roots for trust domain {trust_domain}")
    try:
        sid = _check_leaf(leaf, trust_domain, now, usage_oid)
    except _CERT_DECODE_ERRORS as exc:
        raise SvidInvalid(f"SVID has undecodable extensions ({exc})") from None
    # The client verifier checks clientAuth itself; replacing its EKU rule lets one verifier serve
    # both usages (the server verifier would insist on a DNS/IP subject, which SVIDs need not have).
    ee_policy = ExtensionPolicy.webpki_defaults_ee().may_be_present(
        x509.ExtendedKeyUsage, Criticality.AGNOSTIC, _eku_validator(usage_oid)
    )
    verifier = (
        PolicyBuilder()
        .store(Store(list(roots)))
        .time(now)
        .max_chain_depth(1)  # roots sign SVIDs directly
        .extension_policies(ca_policy=ExtensionPolicy.webpki_defaults_ca(), ee_policy=ee_policy)
        .build_client_verifier()
    )
    try:
        verifier.verify(leaf, [])
    except VerificationError as exc:
        raise SvidInvalid(f"SVID does not chain to a trusted root of {trust_domain}: {exc}") from None
    return sid
