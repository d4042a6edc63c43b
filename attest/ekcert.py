"""EK certificates: the chain walk that accepts TCG EK certificate shapes.

Web-PKI verifiers refuse EK certificates (their SAN is a critical directoryName, they have no
subject name, their EKU is a TCG OID), so the chain is walked here, hop by hop, with the checks
of RFC 5280 that matter for an EK: issuer signatures, CA basic constraints and path length,
keyCertSign, validity dates of every certificate, and no unknown critical extension.

Certificates are :class:`attest.certparse.Cert`: each signature is verified over the original
tbsCertificate bytes with the issuer's key, so the encodings ``certparse`` tolerates never change
what is verified.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, ExtensionOID, ObjectIdentifier

from attest.certparse import MAX_CERT_DER, Cert
from attest.errors import EkUntrusted, MalformedInput

MAX_CHAIN_DEPTH = 6
TCG_KP_EK_CERTIFICATE = ObjectIdentifier("2.23.133.8.1")
__all__ = [
    "MAX_CERT_DER",
    "MAX_CHAIN_DEPTH",
    "TCG_KP_EK_CERTIFICATE",
    "check_leaf",
    "issuer_urls",
    "missing_issuer_urls",
    "verify_chain",
]
MAX_AIA_URL = 2048

_DECODE_ERRORS = (
    ValueError,  # includes cryptography's ASN.1 parse errors
    x509.InvalidVersion,
    x509.DuplicateExtension,
    x509.UnsupportedGeneralNameType,
    UnsupportedAlgorithm,
)

# Critical extensions whose meaning this walk honours (or that carry no constraint for us).
_UNDERSTOOD_CRITICAL = frozenset(
    {
        ExtensionOID.BASIC_CONSTRAINTS,
        ExtensionOID.KEY_USAGE,
        ExtensionOID.EXTENDED_KEY_USAGE,
        ExtensionOID.SUBJECT_ALTERNATIVE_NAME,  # TCG: critical directoryName with TPM model
        ExtensionOID.SUBJECT_DIRECTORY_ATTRIBUTES,
        ExtensionOID.CERTIFICATE_POLICIES,
    }
)


def parse_certificate_der(der: bytes, what: str = "EK certificate") -> x509.Certificate:
    """Exactly one strict DER certificate (no tolerated quirk, no trailing bytes), decoded."""
    if not isinstance(der, bytes):
        raise MalformedInput(f"{what}: expected bytes")
    if len(der) > MAX_CERT_DER:
        raise MalformedInput(f"{what}: {len(der)} bytes exceeds the limit of {MAX_CERT_DER}")
    if _der_length(der) != len(der):
        raise MalformedInput(f"{what}: DER length does not cover the input exactly")
    try:
        cert = x509.load_der_x509_certificate(der)
        _ = (cert.extensions, cert.issuer, cert.subject, cert.not_valid_before_utc, cert.not_valid_after_utc)
        cert.issuer.rfc4514_string()
        cert.public_key()
    except _DECODE_ERRORS as exc:
        raise MalformedInput(f"{what}: not a valid X.509 certificate ({exc})") from None
    return cert


def _der_length(der: bytes) -> int:
    """Total length of the leading SEQUENCE TLV, or -1 if it is not one."""
    if len(der) < 2 or der[0] != 0x30:
        return -1
    first = der[1]
    if first < 0x80:
        return 2 + first
    n = first & 0x7F
    if n == 0 or n > 3 or len(der) < 2 + n:  # indefinite length or absurd size
        return -1
    return 2 + n + int.from_bytes(der[2 : 2 + n], "big")


def _check_validity(cert: Cert, now: datetime, role: str) -> None:
    view = cert.view
    if now < view.not_valid_before_utc:
        raise EkUntrusted(f"{role} {cert.name()} is not valid before {view.not_valid_before_utc}")
    if now > view.not_valid_after_utc:
        raise EkUntrusted(f"{role} {cert.name()} expired on {view.not_valid_after_utc}")


def _check_critical(cert: Cert, role: str) -> None:
    try:
        extensions = list(cert.view.extensions)
    except _DECODE_ERRORS as exc:
        raise EkUntrusted(f"{role} {cert.name()} has undecodable extensions ({exc})") from None
    for ext in extensions:
        if ext.critical and ext.oid not in _UNDERSTOOD_CRITICAL:
            raise EkUntrusted(f"{role} {cert.name()} has unknown critical extension {ext.oid.dotted_string}")


def _ext(cert: Cert, cls: type[x509.ExtensionType]) -> x509.ExtensionType | None:
    try:
        return cert.view.extensions.get_extension_for_class(cls).value
    except x509.ExtensionNotFound:
        return None
    except _DECODE_ERRORS as exc:  # a configured root or intermediate with bad extensions
        raise EkUntrusted(f"{cert.name()} has undecodable extensions ({exc})") from None


def check_leaf(cert: Cert, now: datetime) -> None:
    """Checks on the EK certificate itself, independent of who issued it.

    The TCG EK EKU is required only when an EKU is present: Google Cloud's current EK
    certificates have none (docs/ek-roots.md). What makes the key an EK is its TPM public area
    (the EK template) and credential activation, not this extension.
    """
    role = "EK certificate"
    _check_validity(cert, now, role)
    _check_critical(cert, role)
    bc = _ext(cert, x509.BasicConstraints)
    if isinstance(bc, x509.BasicConstraints) and bc.ca:
        raise EkUntrusted("EK certificate is a CA certificate")
    eku = _ext(cert, x509.ExtendedKeyUsage)
    if isinstance(eku, x509.ExtendedKeyUsage):
        usages = set(eku)
        if TCG_KP_EK_CERTIFICATE not in usages and ExtendedKeyUsageOID.ANY_EXTENDED_KEY_USAGE not in usages:
            raise EkUntrusted("EK certificate's extended key usage lacks tcg-kp-EKCertificate")
    ku = _ext(cert, x509.KeyUsage)
    if isinstance(ku, x509.KeyUsage) and not (ku.key_encipherment or ku.key_agreement):
        raise EkUntrusted("EK certificate's key usage allows neither keyEncipherment nor keyAgreement")


def _check_issuer(issuer: Cert, below: int, now: datetime, role: str) -> None:
    """``below`` is the number of CA certificates between ``issuer`` and the leaf."""
    _check_validity(issuer, now, role)
    _check_critical(issuer, role)
    bc = _ext(issuer, x509.BasicConstraints)
    if not isinstance(bc, x509.BasicConstraints) or not bc.ca:
        raise EkUntrusted(f"{role} {issuer.name()} is not a CA (basicConstraints)")
    if bc.path_length is not None and below > bc.path_length:
        raise EkUntrusted(f"{role} {issuer.name()} path length {bc.path_length} exceeded")
    ku = _ext(issuer, x509.KeyUsage)
    if isinstance(ku, x509.KeyUsage) and not ku.key_cert_sign:
        raise EkUntrusted(f"{role} {issuer.name()} may not sign certificates (keyUsage)")


def signed_by(child: Cert, issuer: Cert) -> str | None:
    """None when ``issuer``'s key signed ``child``'s original TBS bytes, else why not.

    The algorithm comes from ``child`` (RSA PKCS#1 v1.5 or PSS, or ECDSA, with SHA-1/2); the key
    must be of the matching type. Names are matched by the caller, not here.
    """
    try:
        algorithm = child.view.signature_hash_algorithm
        params = child.view.signature_algorithm_parameters
    except (UnsupportedAlgorithm, ValueError) as exc:
        return f"signature algorithm of {child.name()} is not supported ({exc})"
    key = issuer.key
    try:
        if isinstance(key, rsa.RSAPublicKey) and isinstance(params, padding.PKCS1v15 | padding.PSS):
            if algorithm is None:
                return f"signature algorithm of {child.name()} has no hash"
            key.verify(child.signature, child.tbs, params, algorithm)
        elif isinstance(key, ec.EllipticCurvePublicKey) and isinstance(params, ec.ECDSA):
            key.verify(child.signature, child.tbs, params)
        else:
            return f"{issuer.name()} has a key that cannot make {child.name()}'s signature"
    except InvalidSignature:
        return f"signature by {issuer.name()} does not verify"
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        return f"{issuer.name()} cannot have issued it ({exc})"
    return None


@lru_cache(maxsize=4096)
def _link(child: Cert, issuer: Cert) -> str | None:
    """``signed_by`` for a link between two CA certificates. Those come from the configuration and
    recur on every join of a vendor's TPMs: each link is verified once. Certs are immutable and
    hash by identity (the cache holds them), so a result always belongs to these exact bytes."""
    return signed_by(child, issuer)


def verify_chain(
    leaf: Cert,
    anchors: Sequence[Cert],
    intermediates: Sequence[Cert],
    now: datetime,
) -> list[Cert]:
    """Find a path leaf -> (intermediates) -> anchor; return it (anchor last) or raise.

    Every configured anchor is trusted as is (the operator chose it); intermediates only help to
    reach one. Each hop's signature, CA constraints and validity are checked.
    """
    check_leaf(leaf, now)
    failures: list[str] = []
    path = _extend([leaf], _by_subject(tuple(anchors)), _by_subject(tuple(intermediates)), now, failures)
    if path is not None:
        return path
    detail = (
        "; ".join(dict.fromkeys(failures))
        if failures
        else f"no configured EK root or intermediate is named {leaf.issuer.rfc4514_string()!r}"
    )
    raise EkUntrusted(f"EK certificate does not chain to a trusted root: {detail}")


Index = dict[x509.Name, tuple[Cert, ...]]


@lru_cache(maxsize=32)
def _by_subject(certs: tuple[Cert, ...]) -> Index:
    """Configured certificates by subject (names compare decoded), built once per configuration:
    a vendor store holds hundreds of CAs and each hop looks up one name."""
    index: dict[x509.Name, list[Cert]] = {}
    for cert in certs:
        index.setdefault(cert.subject, []).append(cert)
    return {name: tuple(found) for name, found in index.items()}


def _extend(
    path: list[Cert], anchors: Index, intermediates: Index, now: datetime, failures: list[str]
) -> list[Cert] | None:
    current = path[-1]
    below = len(path) - 1
    check = signed_by if below == 0 else _link  # the leaf is evidence: never cached
    for anchor in anchors.get(current.issuer, ()):
        why = check(current, anchor)
        if why is not None:
            failures.append(why)
            continue
        try:
            _check_issuer(anchor, below, now, "EK root")
        except EkUntrusted as exc:
            failures.append(exc.detail)
            continue
        return [*path, anchor]
    if len(path) >= MAX_CHAIN_DEPTH:
        failures.append(f"chain longer than {MAX_CHAIN_DEPTH}")
        return None
    for inter in intermediates.get(current.issuer, ()):
        if any(inter.sha256 == c.sha256 for c in path):
            continue
        why = check(current, inter)
        if why is not None:
            failures.append(why)
            continue
        try:
            _check_issuer(inter, below, now, "EK intermediate")
        except EkUntrusted as exc:
            failures.append(exc.detail)
            continue
        found = _extend([*path, inter], anchors, intermediates, now, failures)
        if found is not None:
            return found
    return None


def issuer_urls(cert: Cert) -> tuple[str, ...]:
    """The http(s) caIssuers URLs of a certificate's Authority Information Access extension."""
    try:
        aia = cert.view.extensions.get_extension_for_class(x509.AuthorityInformationAccess).value
    except x509.ExtensionNotFound:
        return ()
    except _DECODE_ERRORS:
        return ()
    out = []
    for desc in aia:
        loc = desc.access_location
        if desc.access_method != x509.oid.AuthorityInformationAccessOID.CA_ISSUERS:
            continue
        if (
            isinstance(loc, x509.UniformResourceIdentifier)
            and len(loc.value) <= MAX_AIA_URL
            and loc.value.lower().startswith(("http://", "https://"))
        ):
            out.append(loc.value)
    return tuple(out)


def missing_issuer_urls(
    leaf: Cert, anchors: Sequence[Cert], intermediates: Sequence[Cert]
) -> tuple[str, ...]:
    """Where to look for the issuers no configured certificate provides: the caIssuers URLs of the
    leaf and of every intermediate reachable from it (by name) whose issuer is neither an anchor
    nor an intermediate. Empty when every name on the way is known (a fetch would add nothing)."""
    known = set(_by_subject(tuple(anchors))) | set(_by_subject(tuple(intermediates)))
    by_subject = _by_subject(tuple(intermediates))
    seen: set[str] = set()
    todo = [leaf]
    urls: list[str] = []
    while todo and len(seen) <= 4 * MAX_CHAIN_DEPTH:
        cert = todo.pop()
        if cert.sha256 in seen:
            continue
        seen.add(cert.sha256)
        if cert.issuer not in known:
            urls.extend(issuer_urls(cert))
        elif not (cert.self_issued and cert is not leaf):
            todo.extend(by_subject.get(cert.issuer, ()))
    return tuple(dict.fromkeys(urls))
