"""Who the TPM is: the EK (a standard endorsement key vouched for by its maker's chain or an
allowlist), the AK (a restricted signing key in that TPM), and MakeCredential binding the two.

Parsed keys are cached, keyed by their exact bytes: the same AK is checked at join start and
finish, and key objects are the costly part of a check. Exceptions are not cached, so bad input is
re-judged every time.
"""

from __future__ import annotations

import functools
import hashlib
import struct
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from typing import NamedTuple

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from attest import certparse, cloudek, credential, ekcert, wire
from attest.certparse import Cert
from attest.errors import AkInvalid, EkMismatch, EkUntrusted, MalformedInput
from attest.keys import CURVE_BYTES, PublicKey, hashlib_name, object_name, public_key, spki_der
from attest.templates import EkTemplate, match_ek_template
from attest.wire import Alg, ObjectAttr, Public

_CACHE_SIZE = 4096
TPM_RH_ENDORSEMENT = 0x4000000B


@dataclass(frozen=True, slots=True)
class EkIdentity:
    sha256: str  # hex SHA-256 of the EK SubjectPublicKeyInfo DER; the TPM's stable identity
    template: str  # TCG template the EK follows, e.g. "L-1 RSA-2048"
    trusted_by: str  # "allowlist" or "chain:<root subject>"
    # The EK certificate's decoded fields (None without a usable certificate). For a certificate
    # with a tolerated encoding quirk they are decoded from a canonical copy: ``links[0].der``
    # holds the bytes the vendor signed.
    certificate: x509.Certificate | None
    chain: tuple[x509.Certificate, ...]  # leaf first, anchor last; empty when allowlisted
    public: Public = field(repr=False)
    key: PublicKey = field(repr=False)
    links: tuple[Cert, ...] = ()  # the chain as verified (original bytes, quirks); like ``chain``
    binding: str = ""  # for a cloud vTPM chain, what bound it (attest.cloudek), e.g. "gce project p ..."

    @property
    def quirks(self) -> tuple[str, ...]:
        """Encoding quirks tolerated anywhere on the chain (keys of ``attest.certparse.QUIRKS``)."""
        return tuple(dict.fromkeys(q for link in self.links for q in link.quirks))


@dataclass(frozen=True, slots=True)
class AkIdentity:
    name: bytes  # TPM name: nameAlg || H(TPMT_PUBLIC), the buffer of a TPM2B_NAME; what
    # MakeCredential binds to (34 bytes for SHA-256)
    scheme: int  # Alg.RSASSA or Alg.ECDSA
    hash_alg: int  # Alg.SHA256
    public: Public = field(repr=False)
    key: PublicKey = field(repr=False)

    @property
    def tpm2b_name(self) -> bytes:
        """The name marshalled as a TPM2B_NAME (with its 2-byte size)."""
        return wire.tpm2b(self.name)


@lru_cache(maxsize=_CACHE_SIZE)
def _load(buf: bytes, what: str) -> tuple[Public, PublicKey]:
    pub = wire.parse_public(buf, what)
    return pub, public_key(pub)


class AkVerifier(NamedTuple):
    """A checked AK with everything a signature check needs, prepared once."""

    identity: AkIdentity
    header: bytes  # TPMT_SIGNATURE sigAlg || hashAlg this AK must produce
    rsa: rsa.RSAPublicKey | None
    ecc: ec.EllipticCurvePublicKey | None
    size: int  # RSA signature bytes, or ECC coordinate bytes
    endorsement_qn: bytes  # qualified name as a primary of the endorsement hierarchy


@lru_cache(maxsize=_CACHE_SIZE)
def ak_verifier(buf: bytes) -> AkVerifier:
    """The checked AK of ``buf`` (a marshalled TPMT_PUBLIC), cached; AkInvalid when it is not one."""
    pub, key = _load(buf, "ak_public")
    _check_ak(pub, key)
    name = object_name(pub)
    ident = AkIdentity(name, pub.scheme, pub.scheme_hash, pub, key)
    header = struct.pack(">HH", pub.scheme, pub.scheme_hash)
    qn = qualified_name(TPM_RH_ENDORSEMENT.to_bytes(4, "big"), name)
    if isinstance(key, rsa.RSAPublicKey):
        return AkVerifier(ident, header, key, None, key.key_size // 8, qn)
    return AkVerifier(ident, header, None, key, CURVE_BYTES[pub.curve], qn)


def qualified_name(parent_qualified_name: bytes, name: bytes) -> bytes:
    """TPM qualified name: nameAlg || H(parent QN || name). A hierarchy's QN is its 4-byte handle,
    so an AK under the EK has ``qualified_name(qualified_name(RH_ENDORSEMENT, ek_name), ak_name)``
    with ``RH_ENDORSEMENT = TPM_RH_ENDORSEMENT.to_bytes(4, "big")``."""
    alg = int.from_bytes(name[:2], "big")
    return name[:2] + hashlib.new(hashlib_name(alg), parent_qualified_name + name).digest()


def clear_caches() -> None:
    """Drop cached parsed keys (benchmarks use this to measure cold verification)."""
    _load.cache_clear()
    ak_verifier.cache_clear()
    _sealer.cache_clear()


def require_bytes(value: object, what: str) -> None:
    """Checked before any cache lookup: the caches hash their argument."""
    if type(value) is not bytes:
        raise MalformedInput(f"{what} must be bytes, not {type(value).__name__}")


# ------------------------------------------------------------------------------------------
# EK


def verify_ek(
    ek_public: bytes,
    ek_certificate: bytes | None,
    *,
    roots: Sequence[x509.Certificate | Cert],
    allowlist: Collection[str] = frozenset(),
    denylist: Collection[str] = frozenset(),
    intermediates: Sequence[x509.Certificate | Cert] = (),
    now: datetime | None = None,
    cloud: cloudek.CloudBindings = cloudek.NO_BINDINGS,
) -> EkIdentity:
    """Check that ``ek_public`` is a standard EK vouched for by a trusted chain or the allowlist.

    ``roots`` are trust anchors (each one trusted as configured; a vendor intermediate may be
    one). ``intermediates`` only help to build a path. Both take ``cryptography`` certificates or
    :class:`attest.certparse.Cert` (what ``certparse.read_certificate`` makes of vendor files
    ``cryptography`` refuses). Allow- and denylist entries are hex SHA-256 digests of the EK
    SubjectPublicKeyInfo DER; the denylist wins. An allowlisted EK needs no usable certificate.
    A chain through a cloud vTPM CA also needs its binding in ``cloud`` (attest.cloudek; none by
    default: such chains are refused).
    """
    require_bytes(ek_public, "ek_public")
    if ek_certificate is not None:
        require_bytes(ek_certificate, "ek_certificate")
    pub, key = _load(ek_public, "ek_public")
    template: EkTemplate = match_ek_template(pub)
    spki = spki_der(key)
    digest = hashlib.sha256(spki).hexdigest()
    if digest in _hex_set(denylist, "denylist"):
        raise EkUntrusted(f"EK {digest} is on the denylist")
    allowed = digest in _hex_set(allowlist, "allowlist")
    cert = None
    if ek_certificate is not None:
        try:
            cert = certparse.read_certificate(ek_certificate)
        except MalformedInput:
            if not allowed:
                raise
            # The allowlist vouches for the key itself: a certificate we cannot read is not used.
        if cert is not None and spki_der(_cert_key(cert)) != spki:
            raise EkMismatch("EK certificate certifies a different key than ek_public")
    if allowed:
        view = cert.view if cert is not None else None
        return EkIdentity(digest, template.name, "allowlist", view, (), pub, key)
    if cert is None:
        raise EkUntrusted("no EK certificate, and the EK is not on the allowlist")
    if now is not None and now.tzinfo is None:
        raise TypeError("now must be timezone-aware")  # a caller bug, not bad evidence
    when = now if now is not None else datetime.now(UTC)
    anchors, unusable = _certs(roots, "EK root")
    inter, unusable_inter = _certs(intermediates, "EK intermediate")
    try:
        chain = ekcert.verify_chain(cert, anchors, inter, when)
    except EkUntrusted as exc:
        if unusable or unusable_inter:  # say why a configured certificate played no part
            raise EkUntrusted("; ".join([exc.detail, *unusable, *unusable_inter])) from None
        raise
    binding = cloudek.check_binding(chain, cloud)
    trusted_by = "chain:" + chain[-1].name()
    views = tuple(c.view for c in chain)
    return EkIdentity(digest, template.name, trusted_by, cert.view, views, pub, key, tuple(chain), binding)


def _certs(given: Sequence[x509.Certificate | Cert], what: str) -> tuple[tuple[Cert, ...], tuple[str, ...]]:
    """The configured certificates as Certs, and why any of them cannot be used (skipping one
    never widens trust). A service passes the same configured tuple on every join: converted once."""
    return _convert(tuple(given), what)


@lru_cache(maxsize=32)
def _convert(
    given: tuple[x509.Certificate | Cert, ...], what: str
) -> tuple[tuple[Cert, ...], tuple[str, ...]]:
    out: list[Cert] = []
    unusable: list[str] = []
    for c in given:
        converted = c if isinstance(c, Cert) else _as_cert(c, what)
        if isinstance(converted, Cert):
            out.append(converted)
        else:
            unusable.append(converted)
    return tuple(out), tuple(unusable)


@lru_cache(maxsize=_CACHE_SIZE)
def _as_cert(cert: x509.Certificate, what: str) -> Cert | str:
    """Configured roots come as the same objects on every call: convert each once."""
    if not isinstance(cert, x509.Certificate):
        return f"{what} {type(cert).__name__} is not a certificate"
    try:
        return certparse.from_x509(cert, what)
    except MalformedInput as exc:
        return f"{what} cannot be used: {exc.detail}"


def _hex_set(entries: Collection[str], what: str) -> frozenset[str]:
    if type(entries) is frozenset:
        # A service passes the same configured frozenset on every join: normalise it once, not
        # per call (a fleet's allowlist has thousands of entries). frozenset hashes are cached.
        return _hex_frozen(entries, what)
    return _hex_normalise(entries, what)


@functools.lru_cache(maxsize=16)
def _hex_frozen(entries: frozenset[str], what: str) -> frozenset[str]:
    return _hex_normalise(entries, what)


def _hex_normalise(entries: Collection[str], what: str) -> frozenset[str]:
    out = set()
    for entry in entries:
        if not isinstance(entry, str):
            raise MalformedInput(f"{what} entries must be hex strings")
        out.add(entry.lower())
    return frozenset(out)


def _cert_key(cert: Cert) -> PublicKey:
    key = cert.key
    if not isinstance(key, rsa.RSAPublicKey | ec.EllipticCurvePublicKey):
        raise EkMismatch("EK certificate holds neither an RSA nor an ECC key")
    return key


# ------------------------------------------------------------------------------------------
# AK

_AK_REQUIRED = int(
    ObjectAttr.RESTRICTED
    | ObjectAttr.SIGN
    | ObjectAttr.FIXED_TPM
    | ObjectAttr.FIXED_PARENT
    | ObjectAttr.SENSITIVE_DATA_ORIGIN
    | ObjectAttr.USER_WITH_AUTH
)
_AK_ATTR_NAMES = (  # plain ints: IntFlag arithmetic is slow
    (int(ObjectAttr.RESTRICTED), "restricted"),
    (int(ObjectAttr.SIGN), "sign"),
    (int(ObjectAttr.FIXED_TPM), "fixedTPM"),
    (int(ObjectAttr.FIXED_PARENT), "fixedParent"),
    (int(ObjectAttr.SENSITIVE_DATA_ORIGIN), "sensitiveDataOrigin"),
    (int(ObjectAttr.USER_WITH_AUTH), "userWithAuth"),
)
_DECRYPT = int(ObjectAttr.DECRYPT)


def ek_digest(ek_public: bytes) -> str:
    """The hex SHA-256 of the SubjectPublicKeyInfo DER of ``ek_public`` (a TPM2B_PUBLIC): the
    TPM's identity as allowlists and node bindings name it. No trust check: compare it with a
    digest that ``verify_ek`` vouched for."""
    require_bytes(ek_public, "ek_public")
    _, key = _load(ek_public, "ek_public")
    return hashlib.sha256(spki_der(key)).hexdigest()


def verify_ak(ak_public: bytes) -> AkIdentity:
    """Check that ``ak_public`` is a restricted, TPM-bound SHA-256 signing key; return its name."""
    require_bytes(ak_public, "ak_public")
    return ak_verifier(ak_public).identity


def _check_ak(pub: Public, key: PublicKey) -> None:
    attrs = pub.attributes
    if attrs & _AK_REQUIRED != _AK_REQUIRED:
        missing = [n for bit, n in _AK_ATTR_NAMES if not attrs & bit]
        raise AkInvalid("AK lacks required attributes: " + ", ".join(missing))
    if attrs & _DECRYPT:
        raise AkInvalid("AK has the decrypt attribute; an AK must be a signing-only key")
    if pub.name_alg != Alg.SHA256:
        raise AkInvalid(f"AK name algorithm 0x{pub.name_alg:04x} is not SHA-256")
    if pub.sym_alg != Alg.NULL:
        raise AkInvalid("AK has a symmetric algorithm; a signing key has none")
    if pub.type == Alg.RSA:
        if pub.scheme != Alg.RSASSA:
            raise AkInvalid("RSA AK scheme must be an explicit RSASSA")
        if isinstance(key, rsa.RSAPublicKey) and key.key_size < 2048:
            raise AkInvalid(f"RSA AK of {key.key_size} bits is below 2048")
    else:
        if pub.scheme != Alg.ECDSA:
            raise AkInvalid("ECC AK scheme must be an explicit ECDSA")
        if pub.curve not in (wire.Curve.NIST_P256, wire.Curve.NIST_P384):
            raise AkInvalid(f"ECC AK curve 0x{pub.curve:04x} is not P-256 or P-384")
        if pub.kdf != Alg.NULL:
            raise AkInvalid("ECC AK has a KDF; a signing key has none")
    if pub.scheme_hash != Alg.SHA256:
        raise AkInvalid(f"AK signing hash 0x{pub.scheme_hash:04x} is not SHA-256")


# ------------------------------------------------------------------------------------------
# Credential


def make_credential(ek_public: bytes, ak_name: bytes, secret: bytes) -> tuple[bytes, bytes]:
    """TPM2_MakeCredential to a standard EK for the object ``ak_name`` (from :func:`verify_ak`).

    Returns the marshalled TPM2B_ID_OBJECT and TPM2B_ENCRYPTED_SECRET for ActivateCredential.
    """
    require_bytes(ek_public, "ek_public")
    sealer = _sealer(ek_public)
    if type(ak_name) is not bytes or len(ak_name) < 2:
        raise MalformedInput("AK name must be bytes: nameAlg || digest")
    if wire.DIGEST_SIZES.get(int.from_bytes(ak_name[:2], "big"), -1) != len(ak_name) - 2:
        raise MalformedInput("AK name is not nameAlg || digest of that algorithm")
    if type(secret) is not bytes:
        raise MalformedInput("credential secret must be bytes")
    return sealer.make(ak_name, secret)


@lru_cache(maxsize=_CACHE_SIZE)
def _sealer(buf: bytes) -> credential.EkSealer:
    pub, key = _load(buf, "ek_public")
    match_ek_template(pub)  # sealing to anything but a standard EK would prove nothing
    return credential.EkSealer(pub, key)
