"""SPIFFE IDs, X.509-SVIDs and SPIFFE trust bundles (research/spiffe-k8s.md §1).

Everything here is pure: callers pass ``now`` (timezone-aware) and the signing authority. IDs are
parsed by our own code because py-spiffe accepts a trailing newline and has no length limits.
Verification is two layers: the SPIFFE leaf rules, checked here with precise messages (OpenSSL alone
accepts a ``CA:TRUE`` client leaf), then RFC 5280 path validation by ``cryptography``'s verifier.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, ObjectIdentifier
from cryptography.x509.verification import (
    Criticality,
    ExtensionPolicy,
    Policy,
    PolicyBuilder,
    Store,
    VerificationError,
)

from attest.ekcert import parse_certificate_der
from attest.errors import AttestationError, MalformedInput

if TYPE_CHECKING:
    from attest.ca import Authority

SCHEME = "spiffe://"
MAX_ID_BYTES = 2048
MAX_TRUST_DOMAIN_BYTES = 255
CLOCK_SKEW = timedelta(seconds=60)
MAX_BUNDLE_BYTES = 256 * 1024
MAX_BUNDLE_KEYS = 256

_TD_CHARS = re.compile(r"[a-z0-9._-]+")
_SEGMENT = re.compile(r"[A-Za-z0-9._-]+")
_DNS_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_PLACEHOLDERS = frozenset({"trust_domain", "node_name", "ek_sha256"})
_USAGE_OIDS: dict[str, ObjectIdentifier] = {
    "client": ExtendedKeyUsageOID.CLIENT_AUTH,
    "server": ExtendedKeyUsageOID.SERVER_AUTH,
}
_EC_CURVES: dict[str, tuple[str, int]] = {"secp256r1": ("P-256", 32), "secp384r1": ("P-384", 48)}
_CERT_DECODE_ERRORS = (ValueError, x509.DuplicateExtension, x509.UnsupportedGeneralNameType)

SvidPublicKey = ec.EllipticCurvePublicKey | rsa.RSAPublicKey


class SpiffeIdError(ValueError):
    """A SPIFFE ID, trust domain or ID template that breaks the SPIFFE-ID rules."""


class SvidInvalid(AttestationError):
    """A peer's X.509-SVID fails the SPIFFE leaf rules or does not chain to the bundle."""

    code = "svid_invalid"


class BundleInvalid(SvidInvalid):
    """A SPIFFE bundle document that is malformed or inconsistent."""

    code = "bundle_invalid"


# -- SPIFFE IDs --------------------------------------------------------------------------------


def _check_trust_domain(td: str) -> None:
    if not td:
        raise SpiffeIdError("trust domain is empty")
    if len(td) > MAX_TRUST_DOMAIN_BYTES:
        raise SpiffeIdError(f"trust domain is longer than {MAX_TRUST_DOMAIN_BYTES} bytes")
    if "%" in td:
        raise SpiffeIdError("trust domain must not be percent-encoded")
    if "@" in td:
        raise SpiffeIdError("trust domain must not carry userinfo")
    if ":" in td:
        raise SpiffeIdError("trust domain must not carry a port")
    if _TD_CHARS.fullmatch(td) is None:
        raise SpiffeIdError(f"trust domain {td!r} may only contain lowercase a-z, 0-9, '.', '-' and '_'")


def _check_path(path: str) -> None:
    if path == "":
        return
    if not path.startswith("/"):
        raise SpiffeIdError("path must start with '/'")
    if "%" in path:
        raise SpiffeIdError("path must not be percent-encoded")
    if path.endswith("/"):
        raise SpiffeIdError("path must not end with '/'")
    for segment in path[1:].split("/"):
        if segment == "":
            raise SpiffeIdError("path must not contain empty segments")
        if segment in (".", ".."):
            raise SpiffeIdError("path must not contain '.' or '..' segments")
        if _SEGMENT.fullmatch(segment) is None:
            raise SpiffeIdError(f"path segment {segment!r} may only contain A-Z, a-z, 0-9, '.', '-' and '_'")


@dataclass(frozen=True, slots=True)
class SpiffeId:
    """A valid SPIFFE ID in canonical form (construction validates, so no invalid instance exists)."""

    trust_domain: str
    path: str  # "" for the trust-domain ID, else starts with "/"

    def __post_init__(self) -> None:
        if not isinstance(self.trust_domain, str) or not isinstance(self.path, str):
            raise SpiffeIdError("trust domain and path must be strings")
        _check_trust_domain(self.trust_domain)
        _check_path(self.path)
        if len(SCHEME) + len(self.trust_domain) + len(self.path) > MAX_ID_BYTES:
            raise SpiffeIdError(f"SPIFFE ID is longer than {MAX_ID_BYTES} bytes")

    @property
    def is_trust_domain_id(self) -> bool:
        return self.path == ""

    def __str__(self) -> str:
        return f"{SCHEME}{self.trust_domain}{self.path}"


def parse_spiffe_id(text: str) -> SpiffeId:
    """Parse ``spiffe://<td>[/<path>]``. Scheme and trust domain are case-insensitive (SPIFFE-ID
    §2.4) and come back lowercase; the path is kept as is."""
    if not isinstance(text, str):
        raise SpiffeIdError("SPIFFE ID must be a string")
    if len(text) > MAX_ID_BYTES:  # every accepted character is one byte, so this bounds bytes too
        raise SpiffeIdError(f"SPIFFE ID is longer than {MAX_ID_BYTES} bytes")
    if text[: len(SCHEME)].lower() != SCHEME:
        raise SpiffeIdError("SPIFFE ID must start with 'spiffe://'")
    rest = text[len(SCHEME) :]
    if "?" in rest:
        raise SpiffeIdError("SPIFFE ID must not contain a query")
    if "#" in rest:
        raise SpiffeIdError("SPIFFE ID must not contain a fragment")
    slash = rest.find("/")
    td, path = (rest, "") if slash < 0 else (rest[:slash], rest[slash:])
    # Lowercase only ASCII: str.lower() would map e.g. the Kelvin sign to "k" and sneak it in.
    td = "".join(c.lower() if "A" <= c <= "Z" else c for c in td)
    return SpiffeId(td, path)


def validate_trust_domain(td: str) -> str:
    """A configured trust-domain name (not a URI): must already be canonical (lowercase)."""
    if not isinstance(td, str):
        raise SpiffeIdError("trust domain must be a string")
    _check_trust_domain(td)
    return td


def render_spiffe_id(template: str, *, trust_domain: str, node_name: str, ek_sha256: str) -> SpiffeId:
    """Fill ``{trust_domain}``, ``{node_name}``, ``{ek_sha256}`` into an ID template.

    Values are substituted by hand, not with ``str.format``, so a template cannot reach attributes
    or indexes; node name and EK hash must each be one path segment, so they cannot add path levels.
    """
    if not isinstance(template, str):
        raise SpiffeIdError("SPIFFE ID template must be a string")
    validate_trust_domain(trust_domain)
    values = {"trust_domain": trust_domain, "node_name": node_name, "ek_sha256": ek_sha256}
    for key in ("node_name", "ek_sha256"):
        value = values[key]
        if not isinstance(value, str) or _SEGMENT.fullmatch(value) is None or value in (".", ".."):
            raise SpiffeIdError(f"{key} {value!r} is not usable as a SPIFFE ID path segment")
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise SpiffeIdError(f"SPIFFE ID template {template!r}: {exc}") from None
    out: list[str] = []
    for literal, field, format_spec, conversion in parts:
        out.append(literal)
        if field is None:
            continue
        if field not in _PLACEHOLDERS:
            raise SpiffeIdError(f"SPIFFE ID template has unknown placeholder {{{field}}}")
        if format_spec or conversion:
            raise SpiffeIdError(
                f"SPIFFE ID template placeholder {{{field}}} must not have a format or conversion"
            )
        out.append(values[field])
    sid = parse_spiffe_id("".join(out))
    if sid.trust_domain != trust_domain:
        raise SpiffeIdError(f"SPIFFE ID {sid} is not in trust domain {trust_domain}")
    if sid.is_trust_domain_id:
        raise SpiffeIdError(f"SPIFFE ID {sid} has no path (a node ID must not be the trust-domain ID)")
    return sid


# -- issuing -----------------------------------------------------------------------------------


def _require_aware(now: datetime) -> None:
    if not isinstance(now, datetime) or now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("now must be a timezone-aware datetime")


def _check_subject_key(key: object) -> SvidPublicKey:
    if isinstance(key, ec.EllipticCurvePublicKey):
        if key.curve.name not in _EC_CURVES:
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
    signer: Authority,
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
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([]))
        .issuer_name(ca_cert.subject)
        .public_key(key)
        .serial_number(x509.random_serial_number())  # 159 random bits, positive
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(not_after)
        # Empty subject: RFC 5280 4.1.2.6 makes the SAN extension critical.
        .add_extension(x509.SubjectAlternativeName(sans), critical=True)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
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


# -- bundles -----------------------------------------------------------------------------------


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _uint_bytes(value: int) -> bytes:
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


def _jwk_params(cert: x509.Certificate) -> dict[str, str]:
    key = cert.public_key()
    if isinstance(key, ec.EllipticCurvePublicKey):
        curve = _EC_CURVES.get(key.curve.name)
        if curve is None:
            raise ValueError(f"bundle key curve {key.curve.name} is not supported")
        crv, size = curve
        nums = key.public_numbers()
        return {
            "kty": "EC",
            "crv": crv,
            "x": _b64url(nums.x.to_bytes(size, "big")),
            "y": _b64url(nums.y.to_bytes(size, "big")),
        }
    if isinstance(key, rsa.RSAPublicKey):
        rnums = key.public_numbers()
        return {"kty": "RSA", "n": _b64url(_uint_bytes(rnums.n)), "e": _b64url(_uint_bytes(rnums.e))}
    raise ValueError("bundle keys must be EC or RSA")


def _check_uint64(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
        raise ValueError(f"{what} must be an integer in [0, 2^64)")
    return value


def bundle_document(roots: Sequence[x509.Certificate], *, sequence: int, refresh_hint: int) -> dict[str, Any]:
    """The SPIFFE bundle (a JWK Set) for X.509 roots; serialise it with ``json.dumps``."""
    keys: list[dict[str, Any]] = []
    for cert in roots:
        entry: dict[str, Any] = _jwk_params(cert)
        entry["use"] = "x509-svid"
        entry["x5c"] = [base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode("ascii")]
        keys.append(entry)
    return {
        "keys": keys,
        "spiffe_sequence": _check_uint64(sequence, "spiffe_sequence"),
        "spiffe_refresh_hint": _check_uint64(refresh_hint, "spiffe_refresh_hint"),
    }


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise BundleInvalid(f"bundle has duplicate key {key!r}")
        out[key] = value
    return out


def _reject_constant(name: str) -> Any:
    raise BundleInvalid(f"bundle contains {name}, which is not JSON")


def _parse_x509_entry(index: int, entry: dict[str, Any]) -> x509.Certificate:
    where = f"bundle key {index}"
    if "kid" in entry:
        raise BundleInvalid(f"{where}: x509-svid entries must not have a kid")
    x5c = entry.get("x5c")
    if not isinstance(x5c, list) or len(x5c) != 1 or not isinstance(x5c[0], str):
        raise BundleInvalid(f"{where}: x5c must be a list of exactly one base64 certificate")
    try:
        der = base64.b64decode(x5c[0], validate=True)
    except (binascii.Error, ValueError):
        raise BundleInvalid(f"{where}: x5c[0] is not standard base64") from None
    if base64.b64encode(der).decode("ascii") != x5c[0]:
        raise BundleInvalid(f"{where}: x5c[0] is not canonical standard base64")
    try:
        cert = parse_certificate_der(der, f"{where} certificate")
        expected = _jwk_params(cert)
    except MalformedInput as exc:
        raise BundleInvalid(exc.detail) from None
    except ValueError as exc:
        raise BundleInvalid(f"{where}: {exc}") from None
    for name, value in expected.items():
        if entry.get(name) != value:
            raise BundleInvalid(f"{where}: JWK parameter {name!r} does not match the certificate's key")
    return cert


def parse_bundle_document(
    data: bytes, *, max_bytes: int = MAX_BUNDLE_BYTES
) -> tuple[list[x509.Certificate], int]:
    """Strictly parse a SPIFFE bundle: returns its X.509 roots and ``spiffe_sequence`` (0 when the
    producer left it out, which the spec permits). Entries of other ``use`` or ``kty`` are skipped."""
    if not isinstance(data, bytes | bytearray):
        raise BundleInvalid("bundle must be bytes")
    if len(data) > max_bytes:
        raise BundleInvalid(f"bundle of {len(data)} bytes exceeds the limit of {max_bytes}")
    try:
        text = bytes(data).decode("utf-8")
        doc = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise BundleInvalid(f"bundle is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BundleInvalid("bundle must be a JSON object")
    keys = doc.get("keys")
    if not isinstance(keys, list):
        raise BundleInvalid("bundle must have a 'keys' list")
    if len(keys) > MAX_BUNDLE_KEYS:
        raise BundleInvalid(f"bundle has more than {MAX_BUNDLE_KEYS} keys")
    try:
        sequence = _check_uint64(doc.get("spiffe_sequence", 0), "spiffe_sequence")
        if "spiffe_refresh_hint" in doc:
            _check_uint64(doc["spiffe_refresh_hint"], "spiffe_refresh_hint")
    except ValueError as exc:
        raise BundleInvalid(f"bundle {exc}") from None
    certs: list[x509.Certificate] = []
    for index, entry in enumerate(keys):
        if not isinstance(entry, dict):
            raise BundleInvalid(f"bundle key {index} is not a JSON object")
        # Spec: unknown or missing use / kty means "ignore this entry", not "reject the bundle".
        if entry.get("use") != "x509-svid" or entry.get("kty") not in ("EC", "RSA"):
            continue
        cert = _parse_x509_entry(index, entry)
        if cert not in certs:
            certs.append(cert)
    return certs, sequence


def bundle_pem(roots: Sequence[x509.Certificate]) -> bytes:
    return b"".join(cert.public_bytes(serialization.Encoding.PEM) for cert in roots)
