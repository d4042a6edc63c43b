"""What a test that needs a software TPM gets from the ``swtpm`` fixtures (tests/conftest.py)."""

from __future__ import annotations

from dataclasses import dataclass

from cryptography import x509

from bootstrap.demo import swtpm as harness


@dataclass(frozen=True)
class TpmInfo:
    """What a test gets: a TCTI string and the CA certificates that vouch for the EK."""

    tcti: str
    root: x509.Certificate
    intermediate: x509.Certificate
    server: harness.Swtpm
