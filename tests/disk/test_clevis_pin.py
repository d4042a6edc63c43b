"""The nodegate Clevis pin with the real clevis and cryptsetup on a LUKS2 file, a swtpm as the
node's TPM and the real service: bind, unlock (``clevis luks pass``), and what a copied disk,
another TPM or a revoked node gets."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bootstrap.node.disk import jwe
from tests.disk import luksimg
from tests.disk import support as ds
from tests.support.service import Running, running
from tests.support.swtpms import TpmInfo

pytestmark = pytest.mark.swtpm


@pytest.fixture(autouse=True)
def _tools() -> None:
    luksimg.require_tools()


@pytest.fixture
async def svc(tmp_path: Path, swtpm: TpmInfo) -> AsyncIterator[Running]:
    async with running(ds.settings(tmp_path, swtpm)) as r:
        yield r


def pin_config(r: Running, tmp: Path, **extra: object) -> str:
    return json.dumps({"url": r.base, "ca_bundle": str(ds.bundle(r, tmp)), "node": "disk-node", **extra})


async def bind(r: Running, tpm: TpmInfo, tmp: Path, disk: Path, env: dict[str, str]) -> None:
    key_file = tmp / "bootstrap.key"
    key_file.write_bytes(luksimg.BOOTSTRAP)
    code, _out, err = await luksimg.run(
        [
            "clevis",
            "luks",
            "bind",
            "-y",
            "-k",
            str(key_file),
            "-d",
            str(disk),
            "nodegate",
            pin_config(r, tmp),
        ],
        env,
    )
    assert code == 0, err.decode()


def machine(tpm: TpmInfo, tmp: Path) -> luksimg.Machine:
    return luksimg.Machine(tpm.tcti, ds.boot_id(tmp))


async def test_bind_then_clevis_luks_pass_opens_the_disk(
    svc: Running, swtpm: TpmInfo, tmp_path: Path
) -> None:
    await ds.joined(svc, swtpm, tmp_path)
    disk = luksimg.make_volume(tmp_path / "disk.img")
    env = luksimg.environment(tmp_path, machine(swtpm, tmp_path))
    await bind(svc, swtpm, tmp_path, disk, env)

    code, passphrase, err = await luksimg.run(["clevis", "luks", "pass", "-d", str(disk), "-s", "1"], env)
    assert code == 0, err.decode()
    assert luksimg.opens(disk, passphrase)
    # The JWE in the header names this volume and the key it was sealed under.
    token = json.loads(luksimg.cryptsetup("token", "export", "--token-id", "0", str(disk)).stdout)
    protected = token["jwe"]["protected"]
    binding = jwe.binding_of(
        f"{protected}..{token['jwe']['iv']}.{token['jwe']['ciphertext']}.{token['jwe']['tag']}"
    )
    assert (binding.volume, binding.node, binding.epoch, binding.version) == (
        luksimg.uuid_of(disk),
        "disk-node",
        0,
        1,
    )
