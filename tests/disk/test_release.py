"""Disk-key releases end to end on a swtpm: the real service, the real node client."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from attest import diskkey
from bootstrap.store.diskkeys import FileVault
from tests.disk import support as ds
from tests.support.service import Running, running
from tests.support.swtpms import TpmInfo

pytestmark = pytest.mark.swtpm


@pytest.fixture
async def svc(tmp_path: Path, swtpm: TpmInfo) -> AsyncIterator[Running]:
    async with running(ds.settings(tmp_path, swtpm)) as r:
        yield r


async def test_an_attested_node_gets_the_key_derived_for_its_tpm_and_volume(
    svc: Running, swtpm: TpmInfo, tmp_path: Path
) -> None:
    await ds.joined(svc, swtpm, tmp_path)
    out = await ds.released(svc, swtpm, tmp_path)
    assert (out.epoch, out.key_version, out.current_version) == (0, 1, 1)
    doc = FileVault(tmp_path / "state").read_now()
    assert doc is not None
    record = await svc.service.store.get("disk-node")
    assert record is not None
    secret = doc.secret(1)
    assert secret is not None
    expected = diskkey.derive_key(
        secret, ek_sha256=record.ek_sha256, volume=uuid.UUID(ds.VOLUME), epoch=0, version=1
    )
    assert out.key == expected
