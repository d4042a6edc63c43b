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

import functools
import hashlib
import hmac
import struct
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from typing import NamedTuple

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

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
from attest.keys import CURVE_BYTES, PublicKey, hashlib_name, object_name, public_key, spki_der
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
    "TPM_RH_ENDORSEMENT",
    "clear_caches",
    "credential_proof",
    "make_credential",
    "qualified_name",
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


class Counters(NamedTuple):
    """TPM counters from a quote; tuples order them (reset_count, restart_count, clock)."""

    reset_count: int
    restart_count: int
    clock: int


class QuoteResult(NamedTuple):
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


class _AkVerifier(NamedTuple):
    """A checked AK with everything a signature check needs, prepared once."""

    identity: AkIdentity
    header: bytes  # TPMT_SIGNATURE sigAlg || hashAlg this AK must produce
    rsa: rsa.RSAPublicKey | None
    ecc: ec.EllipticCurvePublicKey | None
    size: int  # RSA signature bytes, or ECC coordinate bytes
    endorsement_qn: bytes  # qualified name as a primary of the endorsement hierarchy


@lru_cache(maxsize=_CACHE_SIZE)
def _ak(buf: bytes) -> _AkVerifier:
    pub, key = _load(buf, "ak_public")
    _check_ak(pub, key)
    name = object_name(pub)
    ident = AkIdentity(name, pub.scheme, pub.scheme_hash, pub, key)
    header = struct.pack(">HH", pub.scheme, pub.scheme_hash)
    qn = qualified_name(TPM_RH_ENDORSEMENT.to_bytes(4, "big"), name)
    if isinstance(key, rsa.RSAPublicKey):
        return _AkVerifier(ident, header, key, None, key.key_size // 8, qn)
    return _AkVerifier(ident, header, None, key, CURVE_BYTES[pub.curve], qn)


TPM_RH_ENDORSEMENT = 0x4000000B


def qualified_name(parent_qualified_name: bytes, name: bytes) -> bytes:
    """TPM qualified name: nameAlg || H(parent QN || name). A hierarchy's QN is its 4-byte handle,
    so an AK under the EK has ``qualified_name(qualified_name(RH_ENDORSEMENT, ek_name), ak_name)``
    with ``RH_ENDORSEMENT = TPM_RH_ENDORSEMENT.to_bytes(4, "big")``."""
    alg = int.from_bytes(name[:2], "big")
    return name[:2] + hashlib.new(hashlib_name(alg), parent_qualified_name + name).digest()


class _Selection(NamedTuple):
    banks: wire.Selection
    raw: tuple[bytes, wire.Selection]  # marshalled as a TPM echoes it, for the fast compare
    layout: tuple[tuple[str, tuple[int, ...], frozenset[int], int], ...]  # name, order, set, size


@lru_cache(maxsize=256)
def _selection(text: str) -> _Selection:
    banks = wire.parse_selection_string(text)
    layout = tuple(
        (wire.BANK_BY_ALG[alg], tuple(sorted(idx)), idx, wire.DIGEST_SIZES[alg]) for alg, idx in banks
    )
    return _Selection(banks, (wire.marshal_selection(banks), banks), layout)


def clear_caches() -> None:
    """Drop cached parsed keys (benchmarks use this to measure cold verification)."""
    _load.cache_clear()
    _ak.cache_clear()
    _sealer.cache_clear()


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
    _require_bytes(ek_public, "ek_public")
    if ek_certificate is not None:
        _require_bytes(ek_certificate, "ek_certificate")
    pub, key = _load(ek_public, "ek_public")
    template: EkTemplate = match_ek_template(pub)
    spki = spki_der(key)
    digest = hashlib.sha256(spki).hexdigest()
    if digest in _hex_set(denylist, "denylist"):
        raise EkUntrusted(f"EK {digest} is on the denylist")
    cert = None
    if ek_certificate is not None:
        cert = ekcert.parse_certificate_der(ek_certificate)
        if spki_der(_cert_key(cert)) != spki:
            raise EkMismatch("EK certificate certifies a different key than ek_public")
    if digest in _hex_set(allowlist, "allowlist"):
        return EkIdentity(digest, template.name, "allowlist", cert, (), pub, key)
    if cert is None:
        raise EkUntrusted("no EK certificate, and the EK is not on the allowlist")
    if now is not None and now.tzinfo is None:
        raise TypeError("now must be timezone-aware")  # a caller bug, not bad evidence
    when = now if now is not None else datetime.now(UTC)
    chain = ekcert.verify_chain(cert, roots, intermediates, when)
    trusted_by = "chain:" + (chain[-1].subject.rfc4514_string() or "<empty subject>")
    return EkIdentity(digest, template.name, trusted_by, cert, tuple(chain), pub, key)


def _require_bytes(value: object, what: str) -> None:
    """Checked before any cache lookup: the caches hash their argument."""
    if type(value) is not bytes:
        raise MalformedInput(f"{what} must be bytes, not {type(value).__name__}")


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


def verify_ak(ak_public: bytes) -> AkIdentity:
    """Check that ``ak_public`` is a restricted, TPM-bound SHA-256 signing key; return its name."""
    _require_bytes(ak_public, "ak_public")
    return _ak(ak_public).identity


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
    _require_bytes(ek_public, "ek_public")
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
    qualified_signer: bytes | None = None,
) -> QuoteResult:
    """Verify a TPM2_Quote by ``ak_public`` over ``qualifying_data`` and the PCR ``selection``.

    The signature is checked first (scheme and hash from the AK, never from the signature), so
    no unauthenticated byte of the quote is interpreted. Then: magic and type, the AK's place in
    the TPM (qualifiedSigner), extraData, the signed selection against the requested one, the
    digest of the supplied PCR values, the clock safe flag and, against ``previous``, that the
    TPM's counters and clock did not go back.

    ``qualified_signer`` defaults to the qualified name of the AK as a primary key of the
    endorsement hierarchy (how `bootstrap.node.tpm` creates it). Keys elsewhere get their counters
    and firmware version obfuscated by the TPM, which would defeat the regression check; pass
    the expected value explicitly to accept another construction, e.g. an AK under the EK.
    """
    _require_bytes(ak_public, "ak_public")
    if type(selection) is not str:
        raise MalformedInput("selection must be a string such as 'sha256:0,1,2'")
    if type(qualifying_data) is not bytes or not qualifying_data:
        raise MalformedInput("qualifying_data must be non-empty bytes (an empty value disables freshness)")
    if previous is not None:
        previous = _counters(previous)
    ak = _ak(ak_public)
    sel = _selection(selection)
    _verify_signature(ak, signature, quote)
    try:
        att = wire.parse_quote(quote, "quote", sel.raw)
    except MalformedInput as exc:
        raise QuoteInvalid(exc.detail) from None
    expected_signer = ak.endorsement_qn if qualified_signer is None else qualified_signer
    if att.qualified_signer != expected_signer:
        raise AkInvalid(
            "the quote's qualifiedSigner shows the AK is not where it must be: a primary key of the "
            "endorsement hierarchy, whose quotes carry unobfuscated counters and firmware version"
            if qualified_signer is None
            else "the quote's qualifiedSigner is not the expected one"
        )
    if not hmac.compare_digest(att.extra_data, qualifying_data):
        raise NonceMismatch("quote extraData is not the expected qualifying data (stale or replayed quote)")
    if att.selection is not sel.banks and att.selection != sel.banks:
        raise PcrSelectionMismatch(
            f"signed PCR selection {wire.format_selection(att.selection)!r} "
            f"is not the requested {selection!r}"
        )
    values, concatenated = _pcr_values(sel, pcrs)
    # pcrDigest uses the signing scheme's hash, which verify_ak fixed to SHA-256.
    if hashlib.sha256(concatenated).digest() != att.pcr_digest:
        raise PcrDigestMismatch("supplied PCR values do not hash to the signed pcrDigest")
    if not att.safe:
        raise ClockUnsafe("TPM clock is not safe: it may have been set back since last reported")
    counters = Counters(att.reset_count, att.restart_count, att.clock)
    if previous is not None:
        _check_counters(previous, counters)
    return QuoteResult(counters, values, att.firmware_version, att.qualified_signer)


_PKCS1 = padding.PKCS1v15()
_SHA256 = hashes.SHA256()
_ECDSA_SHA256 = ec.ECDSA(_SHA256)


def _verify_signature(ak: _AkVerifier, signature: bytes, quote: bytes) -> None:
    """Check the TPMT_SIGNATURE over the exact quote bytes with the AK's own scheme and hash."""
    if type(signature) is not bytes or type(quote) is not bytes:
        raise MalformedInput("quote and signature must be bytes")
    if len(quote) > wire.MAX_ATTEST:
        raise MalformedInput(f"quote: {len(quote)} bytes exceeds the limit of {wire.MAX_ATTEST}")
    if not signature.startswith(ak.header):
        sig = wire.parse_signature(signature, "signature")  # malformed input says so first
        raise QuoteSignatureInvalid(
            f"signature scheme 0x{sig.alg:04x}/hash 0x{sig.hash_alg:04x} is not the AK's "
            f"0x{ak.identity.scheme:04x}/0x{ak.identity.hash_alg:04x}"
        )
    try:
        if ak.rsa is not None:
            # TPMT_SIGNATURE = header || TPM2B(sig): exactly one modulus-sized signature.
            if len(signature) != 6 + ak.size or int.from_bytes(signature[4:6], "big") != ak.size:
                wire.parse_signature(signature, "signature")  # malformed input says so first
                raise QuoteSignatureInvalid("RSA signature length does not match the AK modulus")
            ak.rsa.verify(signature[6:], quote, _PKCS1, _SHA256)
        elif ak.ecc is not None:
            sig = wire.parse_signature(signature, "signature")
            if not (0 < len(sig.r) <= ak.size and 0 < len(sig.s) <= ak.size):
                raise QuoteSignatureInvalid("ECDSA signature r/s size does not match the AK curve")
            ak.ecc.verify(_der_signature(sig.r, sig.s), quote, _ECDSA_SHA256)
    except InvalidSignature:
        raise QuoteSignatureInvalid("quote signature does not verify with the AK") from None


def _der_int(value: bytes) -> bytes:
    value = value.lstrip(b"\x00") or b"\x00"
    if value[0] & 0x80:
        value = b"\x00" + value
    return b"\x02" + len(value).to_bytes(1, "big") + value


def _der_signature(r: bytes, s: bytes) -> bytes:
    """ECDSA-Sig-Value DER from TPM r and s (at most 66 bytes each, so short-form lengths)."""
    body = _der_int(r) + _der_int(s)
    if len(body) < 0x80:
        return b"\x30" + len(body).to_bytes(1, "big") + body
    return b"\x30\x81" + len(body).to_bytes(1, "big") + body


def _pcr_values(
    sel: _Selection, pcrs: Mapping[str, Mapping[int, bytes]]
) -> tuple[dict[str, dict[int, bytes]], bytes]:
    """Check the supplied values cover the selection exactly; return a plain copy and the values
    concatenated in selection order (what pcrDigest hashes)."""
    if type(pcrs) is not dict and not isinstance(pcrs, Mapping):  # type() first: ABC checks are slow
        raise MalformedInput("pcrs must map bank names to {index: value}")
    if len(pcrs) != len(sel.layout):
        raise PcrSelectionMismatch(
            f"supplied PCR banks {sorted(map(str, pcrs))} are not the selected {[b[0] for b in sel.layout]}"
        )
    out: dict[str, dict[int, bytes]] = {}
    parts: list[bytes] = []
    for bank, order, indices, size in sel.layout:
        given = pcrs.get(bank)
        if type(given) is not dict and not isinstance(given, Mapping):
            raise PcrSelectionMismatch(f"supplied {bank} PCRs are not a mapping of index to value")
        if len(given) != len(order) or given.keys() != indices:
            raise PcrSelectionMismatch(f"supplied {bank} PCRs are not exactly the selected ones")
        for i in order:
            v = given[i]
            if type(v) is not bytes or len(v) != size:
                raise MalformedInput(f"PCR {bank}:{i} must be {size} bytes")
            parts.append(v)
        out[bank] = dict(given)
    return out, b"".join(parts)


def _counters(value: object) -> Counters:
    """Accept a Counters or any 3-sequence of non-negative ints (what a store may hand back)."""
    if type(value) is Counters:
        parts: tuple[object, ...] = tuple(value)
    elif isinstance(value, tuple | list) and len(value) == 3:
        parts = tuple(value)
    else:
        raise MalformedInput("previous must be Counters(reset_count, restart_count, clock)")
    ints = [v for v in parts if type(v) is int and v >= 0]
    if len(ints) != 3:
        raise MalformedInput("previous counters must be non-negative integers")
    return Counters(*ints)


def _check_counters(previous: Counters, now: Counters) -> None:
    """resetCount only grows, restartCount only grows within one reset, and Clock never goes
    back: it survives resets and restarts, and a quote with ``safe`` set promises that no larger
    value was ever reported. TPM2_Clear resets all three: such a machine must be re-enrolled."""
    if (now.reset_count, now.restart_count) < (previous.reset_count, previous.restart_count):
        raise CounterRegressed(
            f"TPM counters went back: reset/restart {now.reset_count}/{now.restart_count} "
            f"after {previous.reset_count}/{previous.restart_count}"
        )
    if now.clock < previous.clock:
        raise CounterRegressed(f"TPM clock went back from {previous.clock} to {now.clock}")


def check_counters(previous: Counters, now: Counters) -> None:
    """The regression rule of :func:`verify_quote`, for a store that re-checks a result against
    a record written concurrently (two joins of one node on two replicas)."""
    _check_counters(_counters(previous), _counters(now))
