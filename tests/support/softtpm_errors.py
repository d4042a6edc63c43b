"""The soft TPM's refusals (``tests.support.softtpm``): the TPM 2.0 response codes swtpm answers
with, and the exceptions that carry them."""

from __future__ import annotations

from typing import ClassVar

# TPM 2.0 response codes (Part 2, 6.6.3), format 1 ones without parameter number and P bit: what
# swtpm answers, so tests can compare a refusal with the real TPM's.
TPM_RC_FAILURE = 0x101  # format 0
TPM_RC_VALUE = 0x084
TPM_RC_SIZE = 0x095
TPM_RC_INTEGRITY = 0x09F
TPM_RC_ECC_POINT = 0x0A7


class SoftTpmError(Exception):
    """A soft TPM refused a command. ``rc`` is the response code a real TPM would give."""

    code: ClassVar[str] = "soft_tpm_error"

    def __init__(self, detail: str, rc: int) -> None:
        super().__init__(detail)
        self.detail = detail
        self.rc = rc


class ChallengeMalformed(SoftTpmError):
    """The credential blob or encrypted secret does not unmarshal (a TSS would refuse to send it)."""

    code = "challenge_malformed"


class CredentialRefused(SoftTpmError):
    """ActivateCredential failed: not for this EK, not for this AK name, or tampered."""

    code = "credential_refused"


class QuoteRefused(SoftTpmError):
    """A quote request the TPM would refuse (oversized qualifying data, wrong PCR values given)."""

    code = "quote_refused"
