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

pytestmark = [pytest.mark.swtpm, pytest.mark.usefixtures("luks_tools")]


@pytest.fixture
async def svc(tmp_path: Path, swtpm: TpmInfo, other_swtpm: TpmInfo) -> AsyncIterator[Running]:
    async with running(ds.settings(tmp_path, swtpm, other_swtpm)) as r:
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


async def _pass(disk: Path, env: dict[str, str], slot: str = "1") -> tuple[int, bytes, bytes]:
    return await luksimg.run(["clevis", "luks", "pass", "-d", str(disk), "-s", slot], env)


async def test_a_copied_disk_does_not_open_in_another_machine(
    svc: Running, swtpm: TpmInfo, other_swtpm: TpmInfo, tmp_path: Path
) -> None:
    """The other machine is an attested node itself; the copy's binding names the first node, whose
    TPM it does not have; and the key released to the other node for that volume is another key."""
    await ds.joined(svc, swtpm, tmp_path)
    await ds.joined(
        svc, other_swtpm, tmp_path, name="other-node", boot_id_file=ds.boot_id(tmp_path, ds.BOOT_B)
    )
    disk = luksimg.make_volume(tmp_path / "disk.img")
    mine = luksimg.environment(tmp_path, machine(swtpm, tmp_path))
    await bind(svc, swtpm, tmp_path, disk, mine)
    copy = tmp_path / "copy.img"
    copy.write_bytes(disk.read_bytes())
    theirs = luksimg.environment(tmp_path, luksimg.Machine(other_swtpm.tcti, ds.boot_id(tmp_path, ds.BOOT_B)))
    code, out, err = await _pass(copy, theirs)
    assert (code, out) != (0, b"")
    assert b"ek_mismatch" in err
    # The copy's binding edited to name the other node: the header is the JWE's associated data, so
    # the edited JWE opens with no key; and the other node's key for the volume is not this one.
    token = json.loads(luksimg.cryptsetup("token", "export", "--token-id", "0", str(copy)).stdout)
    text = jwe.compact_of(token["jwe"])
    binding = jwe.binding_of(text)
    theirs_key = await ds.released(
        svc,
        other_swtpm,
        tmp_path,
        name="other-node",
        volume=binding.volume,
        boot_id_file=ds.boot_id(tmp_path, ds.BOOT_B),
    )
    with pytest.raises(jwe.JweError, match="does not open"):
        jwe.unseal(text, theirs_key.key)


async def test_a_revoked_nodes_disk_does_not_open(svc: Running, swtpm: TpmInfo, tmp_path: Path) -> None:
    await ds.joined(svc, swtpm, tmp_path)
    disk = luksimg.make_volume(tmp_path / "disk.img")
    env = luksimg.environment(tmp_path, machine(swtpm, tmp_path))
    await bind(svc, swtpm, tmp_path, disk, env)
    await svc.service.store.revoke("disk-node", actor="test", reason="stolen")
    code, out, err = await _pass(disk, env)
    assert (code, out) == (1, b"")
    assert b"node_revoked" in err


async def test_the_pin_composes_with_sss_two_of_nodegate_and_tpm2(
    svc: Running, swtpm: TpmInfo, tmp_path: Path
) -> None:
    """sss with t=2: the volume opens only when nodegate releases its key AND the local TPM
    unseals its share; with t=1 of the same two pins, either suffices (docs/disk-keys.md)."""
    await ds.joined(svc, swtpm, tmp_path)
    env = luksimg.environment(tmp_path, machine(swtpm, tmp_path)) | {"TPM2TOOLS_TCTI": swtpm.tcti}
    key_file = tmp_path / "bootstrap.key"
    key_file.write_bytes(luksimg.BOOTSTRAP)
    nodegate = json.loads(pin_config(svc, tmp_path))
    disks = {}
    for t in (2, 1):
        disk = luksimg.make_volume(tmp_path / f"sss-{t}.img")
        config = json.dumps({"t": t, "pins": {"nodegate": nodegate, "tpm2": {}}})
        args = ["clevis", "luks", "bind", "-y", "-k", str(key_file), "-d", str(disk), "sss", config]
        code, _out, err = await luksimg.run(args, env)
        assert code == 0, err.decode()
        code, passphrase, err = await _pass(disk, env)
        assert code == 0, err.decode()
        assert luksimg.opens(disk, passphrase)
        disks[t] = disk
    await svc.service.store.revoke("disk-node", actor="test", reason="stolen")
    code, out, _err = await _pass(disks[2], env)
    assert (code, out) == (1, b"")  # two of two: nodegate's refusal keeps it shut
    code, passphrase, err = await _pass(disks[1], env)
    assert code == 0, err.decode()  # one of two: the TPM's share alone opens it
    assert luksimg.opens(disks[1], passphrase)
