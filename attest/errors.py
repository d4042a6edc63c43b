"""Attestation failures, each carrying its machine code (docs/protocol.md).

Callers branch on ``.code`` (or the class), never on the message: messages are for people and may
change. The HTTP status for each code is the server's business, not ours.
"""

from __future__ import annotations

from typing import ClassVar


class AttestationError(Exception):
    """Base of every failure raised by :mod:`attest`."""

    code: ClassVar[str] = "attestation_failed"

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, detail={self.detail!r})"


class MalformedInput(AttestationError):
    """A TPM structure or certificate that does not parse: truncated, oversized, trailing bytes,
    unknown algorithm. Every parser raises only this on bad bytes."""

    code = "malformed_request"


class EkUntrusted(AttestationError):
    """The EK is not a standard EK, is denylisted, or no trusted chain or allowlist entry vouches
    for it (unknown CA, expired, bad signature, wrong key usage)."""

    code = "ek_untrusted"


class EkMismatch(AttestationError):
    """The EK certificate certifies a different key than the ``ek_public`` presented."""

    code = "ek_mismatch"


class AkInvalid(AttestationError):
    """The AK is not a restricted, TPM-bound SHA-256 signing key."""

    code = "ak_invalid"


class ProofInvalid(AttestationError):
    """The credential-activation proof does not match: the AK is not in the EK's TPM."""

    code = "proof_invalid"


class QuoteInvalid(AttestationError):
    """A signed TPMS_ATTEST that is not a quote (magic, type) or does not parse."""

    code = "quote_invalid"


class QuoteSignatureInvalid(AttestationError):
    """The quote's signature does not verify with the AK, or uses another scheme or hash."""

    code = "quote_signature_invalid"


class NonceMismatch(AttestationError):
    """The quote's extraData is not the expected qualifying data (replay, wrong session)."""

    code = "nonce_mismatch"


class PcrSelectionMismatch(AttestationError):
    """The signed PCR selection, or the supplied PCR values, differ from the requested selection."""

    code = "pcr_selection_mismatch"


class PcrDigestMismatch(AttestationError):
    """The supplied PCR values do not hash to the signed pcrDigest."""

    code = "pcr_digest_mismatch"


class PcrPolicyViolation(AttestationError):
    """PCR values outside every enforced class of golden values."""

    code = "pcr_policy_violation"


class ClockUnsafe(AttestationError):
    """The TPM reports that its clock may have gone backwards (clockInfo.safe is clear)."""

    code = "clock_unsafe"


class CounterRegressed(AttestationError):
    """resetCount/restartCount (or the clock, when neither moved) went backwards for this TPM."""

    code = "counter_regressed"


class EventLogInvalid(AttestationError):
    """The measured-boot event log does not parse: truncated, oversized, trailing bytes, an
    impossible PCR index, bank or digest size."""

    code = "event_log_invalid"


class EventLogMismatch(AttestationError):
    """The event log does not replay to the PCR values the TPM quoted."""

    code = "event_log_mismatch"


class MeasuredBootViolation(AttestationError):
    """The replayed event log breaks the measured-boot policy; the detail names the event (number,
    PCR, type) and the rule."""

    code = "measured_boot_violation"


class BootNotReset(AttestationError):
    """A new boot id without a TPM reset (resetCount did not grow), or a TPM reset with the old
    boot id: the boot id is lying or the quote is stale."""

    code = "boot_not_reset"


class CsrInvalid(AttestationError):
    """The PKCS#10 CSR does not parse, is not self-signed correctly, uses a weak key, or does not
    name ``CN=system:node:<node_name>, O=system:nodes`` exactly (and nothing else)."""

    code = "csr_invalid"


ALL_ERRORS: tuple[type[AttestationError], ...] = (
    MalformedInput,
    EkUntrusted,
    EkMismatch,
    AkInvalid,
    ProofInvalid,
    QuoteInvalid,
    QuoteSignatureInvalid,
    NonceMismatch,
    PcrSelectionMismatch,
    PcrDigestMismatch,
    PcrPolicyViolation,
    ClockUnsafe,
    CounterRegressed,
    EventLogInvalid,
    EventLogMismatch,
    MeasuredBootViolation,
    BootNotReset,
    CsrInvalid,
)
