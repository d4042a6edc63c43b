"""Fixtures of the disk-key tests: a TPM of a test's own (its PCRs get extended)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bootstrap.demo import swtpm as harness
from tests.support.swtpms import TpmInfo


@pytest.fixture
def fresh_tpm(local_ca: harness.LocalCa, tmp_path: Path) -> Iterator[TpmInfo]:
    """A TPM of its own: this test extends PCRs, which the shared swtpm must keep at zero."""
    state = tmp_path / "tpm"
    state.mkdir()
    harness.manufacture(local_ca, state)
    tpm = harness.start(local_ca, state)
    try:
        yield TpmInfo(tpm.tcti, tpm.ca.root, tpm.ca.intermediate, tpm)
    finally:
        tpm.stop()
