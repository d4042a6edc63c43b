"""What a test that needs a software TPM gets from the ``swtpm`` fixtures (tests/conftest.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from bootstrap.demo import swtpm as harness
from bootstrap.node.tpm import Agent
from tests.support.eventlogs import EV_NO_ACTION, Ev, build


@dataclass(frozen=True)
class TpmInfo:
    """What a test gets: a TCTI string and the CA certificates that vouch for the EK."""

    tcti: str
    root: x509.Certificate
    intermediate: x509.Certificate
    server: harness.Swtpm


def measure(tpm: TpmInfo, events: list[Ev], path: Path) -> Path:
    """What firmware does: extend each event's digest into the TPM's sha256 bank, and write the
    events to a TCG log at ``path``."""
    with Agent(tpm.tcti) as agent:
        for ev in events:
            if ev.type != EV_NO_ACTION:
                agent.extend_pcr(ev.pcr, ev.digest("sha256"), "sha256")
    path.write_bytes(build(events, banks=("sha256",)))
    return path
