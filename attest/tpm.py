"""Verify TPM evidence: EK, AK, credential challenge and quote. The stable library API.

    ek = verify_ek(ek_public, ek_certificate, roots=roots)        # who made this TPM
    ak = verify_ak(ak_public)                                     # a restricted key in a TPM
    blob, secret_enc = make_credential(ek_public, ak.name, secret) # bind the AK to the EK
    q  = verify_quote(ak_public, quote, signature, selection=..., pcrs=..., qualifying_data=...)

Inputs are marshalled TPM structures as ``bytes``. Every failure raises an
:class:`AttestationError` subclass whose ``.code`` is a machine code (docs/attestation.md lists
them). Nothing here does I/O; the only state is a bounded cache of parsed public keys, keyed by
their exact bytes.

The code lives in :mod:`attest.identity` (EK, AK, MakeCredential) and :mod:`attest.quote`; this
module is the surface callers import, and it stays put when they move.
"""

from __future__ import annotations

from attest import credential

# Every error class tpm.py imported before the split stays reachable as attest.tpm.<name>.
from attest.errors import (  # noqa: F401
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
from attest.identity import (
    TPM_RH_ENDORSEMENT,
    AkIdentity,
    EkIdentity,
    clear_caches,
    make_credential,
    qualified_name,
    verify_ak,
    verify_ek,
)
from attest.quote import Counters, QuoteResult, verify_quote

# Public (the service re-checks counters) but not in __all__, as before: "as" marks the re-export.
from attest.quote import check_counters as check_counters  # noqa: PLC0414

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
