"""Quote verification: a TPM2_Quote signed by a checked AK over the expected nonce and PCR values,
with the TPM's counters and clock never going back."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from functools import lru_cache
from typing import NamedTuple

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding

from attest import wire
from attest.errors import (
    AkInvalid,
    ClockUnsafe,
    CounterRegressed,
    MalformedInput,
    NonceMismatch,
    PcrDigestMismatch,
    PcrSelectionMismatch,
    QuoteInvalid,
    QuoteSignatureInvalid,
)
from attest.identity import AkVerifier, ak_verifier, require_bytes


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
    require_bytes(ak_public, "ak_public")
    if type(selection) is not str:
        raise MalformedInput("selection must be a string such as 'sha256:0,1,2'")
    if type(qualifying_data) is not bytes or not qualifying_data:
        raise MalformedInput("qualifying_data must be non-empty bytes (an empty value disables freshness)")
    if previous is not None:
        previous = _counters(previous)
    ak = ak_verifier(ak_public)
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


def _verify_signature(ak: AkVerifier, signature: bytes, quote: bytes) -> None:
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
