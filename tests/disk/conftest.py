"""Fixtures of the disk-key tests."""

from __future__ import annotations

import pytest

from tests.disk import luksimg


@pytest.fixture
def luks_tools() -> None:
    """cryptsetup, clevis (with clevis-luks and clevis-tpm2) and jose are here, or the test fails."""
    luksimg.require_tools()
