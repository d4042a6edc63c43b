"""Verify TPM evidence: EK, AK, credential challenge and quote. The stable library API.

    ek = verify_ek(ek_public, ek_certificate, roots=roots)        # who made this TPM
    ak = verify_ak(ak_public)                                     # a restricted key in a TPM
    blob, secret_enc = make_credential(ek_public, ak.name, secret) # bind the AK to the EK
    q  = verify_quote(ak_public, quote, signature, selection=..., pcrs=..., qualifying_data=...)

Inputs are marshalled TPM structures as ``bytes``. Every failure raises an
:class:`AttestationError` subclass whose ``.code`` is a machine code from DESIGN.md. Nothing here
does I/O; the only state is a bounded cache of parsed public keys, keyed by their exact bytes.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import Prehashed, encode_dss_signature

from attest import credential, ekcert, wire
from attest.errors import (
    AkInvalid,
    AttestationError,
    ClockUnsafe,
    CounterRegressed,
    EkMismatch,
    EkUntrusted,
    MalformedInput,
    NonceMismatch,
    PcrDigestMismatch,
    PcrSelectionMismatch,
    ProofInvalid,
    QuoteInvalid,
    QuoteSignatureInvalid,
)
from attest.keys import CRYPTO_HASHES, CURVE_BYTES, PublicKey, object_name, public_key, spki_der
from attest.templates import EkTemplate, match_ek_template
from attest.wire import Alg, ObjectAttr, Public

__all__ = [
    "AkIdentity",
    "AkInvalid",
    "EkMismatch",
    "EkUntrusted",
    "ProofInvalid",
    "QuoteInvalid",
    "AttestationError",
    "Counters",
    "EkIdentity",
    "QuoteResult",
    "clear_caches",
    "credential_proof",
    "make_credential",
    "verify_ak",
    "verify_credential_proof",
    "verify_ek",
    "verify_quote",
]

credential_proof = credential.credential_proof
verify_credential_proof = credential.verify_credential_proof

_CACHE_SIZE = 4096


@dataclass(frozen=True, slots=True)
class EkIdentity:
    sha256: str  # hex SHA-256 of the EK SubjectPublicKeyInfo DER; the TPM's stable identity
    template: str  # TCG template the EK follows, e.g. "L-1 RSA-2048"
    trusted_by: str  # "allowlist" or "chain:<root subject>"
    certificate: x509.Certificate | None
    chain: tuple[x509.Certificate, ...]  # leaf first, anchor last; empty when allowlisted
    public: Public = field(repr=False)
    key: PublicKey = field(repr=False)


@dataclass(frozen=True, slots=True)
class AkIdentity:
    name: bytes  # TPM name: nameAlg || H(TPMT_PUBLIC); what MakeCredential binds to
    scheme: int  # Alg.RSASSA or Alg.ECDSA
    hash_alg: int  # Alg.SHA256
    public: Public = field(repr=False)
    key: PublicKey = field(repr=False)


@dataclass(frozen=True, slots=True, order=True)
class Counters:
    reset_count: int
    restart_count: int
    clock: int


@dataclass(frozen=True, slots=True)
class QuoteResult:
    counters: Counters
    pcrs: dict[str, dict[int, bytes]]
    firmware_version: int
    qualified_signer: bytes

    @property
    def firmware_version_str(self) -> str:
        """The TPM vendor's firmware version as the four 16-bit parts it is usually shown as."""
        v = self.firmware_version
        return ".".join(str((v >> s) & 0xFFFF) for s in (48, 32, 16, 0))


# ------------------------------------------------------------------------------------------
# Parsing with a cache: the same AK is checked at join start and finish, and key objects are the
# costly part of a quote check. Exceptions are not cached, so bad input is re-judged every time.


@lru_cache(maxsize=_CACHE_SIZE)
def _load(buf: bytes, what: str) -> tuple[Public, PublicKey]:
    pub = wire.parse_public(buf, what)
    return pub, public_key(pub)


@lru_cache(maxsize=_CACHE_SIZE)
def _ak(buf: bytes) -> AkIdentity:
    pub, key = _load(buf, "ak_public")
    _check_ak(pub, key)
    return AkIdentity(object_name(pub), pub.scheme, pub.scheme_hash, pub, key)


@lru_cache(maxsize=256)
def _selection(text: str) -> wire.Selection:
    return wire.parse_selection_string(text)


def clear_caches() -> None:
    """Drop cached parsed keys (benchmarks use this to measure cold verification)."""
    _load.cache_clear()
    _ak.cache_clear()
    _selection.cache_clear()


# ------------------------------------------------------------------------------------------
# EK


def verify_ek(
    ek_public: bytes,
    ek_certificate: bytes | None,
    *,
    roots: Sequence[x509.Certificate],
    allowlist: Collection[str] = frozenset(),
    denylist: Collection[str] = frozenset(),
    intermediates: Sequence[x509.Certificate] = (),
    now: datetime | None = None,
) -> EkIdentity:
    """Check that ``ek_public`` is a standard EK vouched for by a trusted chain or the allowlist.

    ``roots`` are trust anchors (each one trusted as configured; a vendor intermediate may be
    one). ``intermediates`` only help to build a path. Allow- and denylist entries are hex
    SHA-256 digests of the EK SubjectPublicKeyInfo DER; the denylist wins.
    """
    pub, key = _load(ek_public, "ek_public")
    template: EkTemplate = match_ek_template(pub)
    spki = spki_der(key)
    digest = hashlib.sha256(spki).hexdigest()
    if digest in {d.lower() for d in denylist}:
        raise EkUntrusted(f"EK {digest} is on the denylist")
    cert = None
    if ek_certificate is not None:
        cert = ekcert.parse_certificate_der(ek_certificate)
        if spki_der(_cert_key(cert)) != spki:
            raise EkMismatch("EK certificate certifies a different key than ek_public")
    if digest in {d.lower() for d in allowlist}:
        return EkIdentity(digest, template.name, "allowlist", cert, (), pub, key)
    if cert is None:
        raise EkUntrusted("no EK certificate, and the EK is not on the allowlist")
    when = now if now is not None else datetime.now(UTC)
    chain = ekcert.verify_chain(cert, roots, intermediates, when)
    trusted_by = "chain:" + (chain[-1].subject.rfc4514_string() or "<empty subject>")
    return EkIdentity(digest, template.name, trusted_by, cert, tuple(chain), pub, key)


def _cert_key(cert: x509.Certificate) -> PublicKey:
    try:
        key = cert.public_key()
    except ValueError as exc:
        raise MalformedInput(f"EK certificate: unreadable public key ({exc})") from exc
    if not isinstance(key, rsa.RSAPublicKey | ec.EllipticCurvePublicKey):
        raise EkMismatch("EK certificate holds neither an RSA nor an ECC key")
    return key


# ------------------------------------------------------------------------------------------
# AK

_AK_REQUIRED = (
    ObjectAttr.RESTRICTED
    | ObjectAttr.SIGN
    | ObjectAttr.FIXED_TPM
    | ObjectAttr.FIXED_PARENT
    | ObjectAttr.SENSITIVE_DATA_ORIGIN
    | ObjectAttr.USER_WITH_AUTH
)
_AK_ATTR_NAMES = {
    ObjectAttr.RESTRICTED: "restricted",
    ObjectAttr.SIGN: "sign",
    ObjectAttr.FIXED_TPM: "fixedTPM",
    ObjectAttr.FIXED_PARENT: "fixedParent",
    ObjectAttr.SENSITIVE_DATA_ORIGIN: "sensitiveDataOrigin",
    ObjectAttr.USER_WITH_AUTH: "userWithAuth",
}


def verify_ak(ak_public: bytes) -> AkIdentity:
    """Check that ``ak_public`` is a restricted, TPM-bound SHA-256 signing key; return its name."""
    return _ak(ak_public)


def _check_ak(pub: Public, key: PublicKey) -> None:
    missing = [n for bit, n in _AK_ATTR_NAMES.items() if not pub.has(bit)]
    if missing:
        raise AkInvalid("AK lacks required attributes: " + ", ".join(missing))
    if pub.has(ObjectAttr.DECRYPT):
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
    pub, key = _load(ek_public, "ek_public")
    match_ek_template(pub)
    if not isinstance(ak_name, bytes) or len(ak_name) < 2:
        raise MalformedInput("AK name must be bytes: nameAlg || digest")
    name_alg = int.from_bytes(ak_name[:2], "big")
    if wire.DIGEST_SIZES.get(name_alg, -1) != len(ak_name) - 2:
        raise MalformedInput("AK name is not nameAlg || digest of that algorithm")
    return credential.make_credential(pub, key, ak_name, secret)


# ------------------------------------------------------------------------------------------
# Quote


def verify_quote(
    ak_public: bytes,
    quote: bytes,
    signature: bytes,
    *,
    selection: str,
    pcrs: Mapping[str, Mapping[int, bytes]],
    qualifying_data: bytes,
    previous: Counters | None = None,
) -> QuoteResult:
    """Verify a TPM2_Quote by ``ak_public`` over ``qualifying_data`` and the PCR ``selection``.

    The signature is checked first (scheme and hash from the AK, never from the signature), so
    no unauthenticated byte of the quote is interpreted. Then: magic and type, extraData, the
    signed selection against the requested one, the digest of the supplied PCR values, the clock
    safe flag and, against ``previous``, that the TPM's counters did not go back.
    """
    ak = _ak(ak_public)
    requested = _selection(selection)
    sig = wire.parse_signature(signature, "signature")
    _verify_signature(ak, sig, quote)
    try:
        att = wire.parse_quote(quote, "quote")
    except MalformedInput as exc:
        raise QuoteInvalid(exc.detail) from None
    if not isinstance(qualifying_data, bytes) or not hmac.compare_digest(att.extra_data, qualifying_data):
        raise NonceMismatch("quote extraData is not the expected qualifying data (stale or replayed quote)")
    if att.selection != requested:
        raise PcrSelectionMismatch(
            f"signed PCR selection {wire.format_selection(att.selection)!r} "
            f"is not the requested {selection!r}"
        )
    values = _pcr_values(requested, pcrs)
    h = hashlib.sha256()  # pcrDigest uses the signing scheme's hash, which verify_ak fixed
    for bank, indices in requested:
        bank_values = values[wire.BANK_BY_ALG[bank]]
        for i in sorted(indices):
            h.update(bank_values[i])
    if h.digest() != att.pcr_digest:
        raise PcrDigestMismatch("supplied PCR values do not hash to the signed pcrDigest")
    if not att.safe:
        raise ClockUnsafe("TPM clock is not safe: it may have been set back since last reported")
    counters = Counters(att.reset_count, att.restart_count, att.clock)
    if previous is not None:
        _check_counters(previous, counters)
    return QuoteResult(counters, values, att.firmware_version, att.qualified_signer)


def _verify_signature(ak: AkIdentity, sig: wire.Signature, quote: bytes) -> None:
    if sig.alg != ak.scheme or sig.hash_alg != ak.hash_alg:
        raise QuoteSignatureInvalid(
            f"signature scheme 0x{sig.alg:04x}/hash 0x{sig.hash_alg:04x} is not the AK's "
            f"0x{ak.scheme:04x}/0x{ak.hash_alg:04x}"
        )
    if not isinstance(quote, bytes) or len(quote) > wire.MAX_ATTEST:
        raise MalformedInput(f"quote: expected at most {wire.MAX_ATTEST} bytes")
    digest = hashlib.sha256(quote).digest()
    algo = Prehashed(CRYPTO_HASHES[ak.hash_alg]())
    key = ak.key
    try:
        if isinstance(key, rsa.RSAPublicKey):
            if len(sig.sig) != key.key_size // 8:
                raise QuoteSignatureInvalid("RSA signature length does not match the AK modulus")
            key.verify(sig.sig, digest, padding.PKCS1v15(), algo)
        else:
            size = CURVE_BYTES[ak.public.curve]
            if not (0 < len(sig.r) <= size and 0 < len(sig.s) <= size):
                raise QuoteSignatureInvalid("ECDSA signature r/s size does not match the AK curve")
            der = encode_dss_signature(int.from_bytes(sig.r, "big"), int.from_bytes(sig.s, "big"))
            key.verify(der, digest, ec.ECDSA(algo))
    except InvalidSignature:
        raise QuoteSignatureInvalid("quote signature does not verify with the AK") from None


def _pcr_values(
    requested: wire.Selection, pcrs: Mapping[str, Mapping[int, bytes]]
) -> dict[str, dict[int, bytes]]:
    """Check the supplied values cover the selection exactly; return a plain copy."""
    if not isinstance(pcrs, Mapping):
        raise MalformedInput("pcrs must map bank names to {index: value}")
    wanted = {wire.BANK_BY_ALG[alg]: (alg, idx) for alg, idx in requested}
    if set(pcrs) != set(wanted):
        raise PcrSelectionMismatch(
            f"supplied PCR banks {sorted(map(str, pcrs))} are not the selected {sorted(wanted)}"
        )
    out: dict[str, dict[int, bytes]] = {}
    for bank, (alg, indices) in wanted.items():
        given = pcrs[bank]
        if not isinstance(given, Mapping) or set(given) != indices:
            raise PcrSelectionMismatch(f"supplied {bank} PCRs are not exactly the selected ones")
        size = wire.DIGEST_SIZES[alg]
        for i, v in given.items():
            if not isinstance(v, bytes) or len(v) != size:
                raise MalformedInput(f"PCR {bank}:{i} must be {size} bytes")
        out[bank] = dict(given)
    return out


def _check_counters(previous: Counters, now: Counters) -> None:
    """resetCount only grows; restartCount only grows within one reset; the clock only grows
    within one (reset, restart) epoch. A TPM2_Clear legitimately resets all three: re-enrol."""
    if (now.reset_count, now.restart_count) < (previous.reset_count, previous.restart_count):
        raise CounterRegressed(
            f"TPM counters went back: reset/restart {now.reset_count}/{now.restart_count} "
            f"after {previous.reset_count}/{previous.restart_count}"
        )
    same_epoch = (now.reset_count, now.restart_count) == (previous.reset_count, previous.restart_count)
    if same_epoch and now.clock < previous.clock:
        raise CounterRegressed(f"TPM clock went back from {previous.clock} to {now.clock}")
