"""Evidence and identity, pure and synchronous: TPM EK/AK/credential/quote checks (:mod:`attest.tpm`)
and PCR policy (:mod:`attest.pcr`). No network, no Kubernetes, no files."""

from attest.errors import AttestationError

__all__ = ["AttestationError"]
