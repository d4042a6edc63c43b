"""A volume's life with nodegate, with the real commands: the first boot re-keys the image's
volume, rotation re-keys bindings at the next boot without a moment in which a volume does not
open, a revocation is for good, and a lost node's volume is recovered from a backup."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bootstrap.config import load_settings
from bootstrap.node.disk import jwe, luks
from bootstrap.node.disk import rekey as rekeying
from bootstrap.node.errors import JoinFailed
from bootstrap.service.disk import admin
from tests.disk import luksimg
from tests.disk import support as ds
from tests.support.service import Running, running
from tests.support.swtpms import TpmInfo

pytestmark = [pytest.mark.swtpm, pytest.mark.usefixtures("luks_tools")]


@pytest.fixture
async def svc(tmp_path: Path, swtpm: TpmInfo) -> AsyncIterator[Running]:
    async with running(ds.settings(tmp_path, swtpm)) as r:
        await ds.joined(r, swtpm, tmp_path)
        yield r


@pytest.fixture
def env(tmp_path: Path, swtpm: TpmInfo, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The machine's environment for the commands, and for the pin's code run in this process."""
    machine = luksimg.Machine(swtpm.tcti, ds.boot_id(tmp_path))
    monkeypatch.setenv("NODEGATE_TCTI", machine.tcti)
    monkeypatch.setenv("NODEGATE_BOOT_ID_FILE", str(machine.boot_id_file))
    return luksimg.environment(tmp_path, machine)


def bootstrap_key(tmp: Path) -> Path:
    path = tmp / "bootstrap.key"
    path.write_bytes(luksimg.BOOTSTRAP)
    path.chmod(0o600)
    return path


async def rekey(r: Running, tmp: Path, disk: Path, env: dict[str, str], *first_boot: str) -> tuple[int, str]:
    args = ["disk", "rekey", str(disk), "--offline", *first_boot]
    code, out, err = await luksimg.run(ds.cli(*args), env)
    return code, (out + err).decode()


async def rekey_here(r: Running, tmp: Path, disk: Path, *, first: bool = True) -> list[str]:
    """``nodegate disk rekey`` in this process (the command itself runs in the first-boot test)."""
    config = None
    if first:
        config = rekeying.config_json(
            url=r.base, ca_bundle=str(ds.bundle(r, tmp)), volume=luksimg.uuid_of(disk), node="disk-node"
        )
    key = bootstrap_key(tmp) if first else None
    return (await rekeying.rekey(rekeying.RekeyOptions(disk, key, config, offline=True))).steps


def first_boot(r: Running, tmp: Path) -> list[str]:
    return [
        "--bootstrap-key-file", str(bootstrap_key(tmp)), "--server", r.base,
        "--ca-bundle", str(ds.bundle(r, tmp)), "--node-name", "disk-node",
    ]  # fmt: skip


async def clevis_pass(disk: Path, env: dict[str, str]) -> tuple[int, bytes, bytes]:
    """``clevis luks pass`` of the volume's nodegate keyslot (found as ``nodegate disk status`` does)."""
    slot = rekeying.status(disk)["bindings"][0]["keyslots"][0]
    return await luksimg.run(["clevis", "luks", "pass", "-d", str(disk), "-s", slot], env)


async def opens_now(disk: Path) -> bool:
    """``nodegate disk unlock --test``, in this process: the binding's key released and the
    passphrase it seals opening the volume (cheaper than a clevis run per check)."""
    try:
        await rekeying.unlock(disk, None, test=True)
    except JoinFailed:
        return False
    return True


async def passphrase(disk: Path, env: dict[str, str]) -> bytes:
    code, out, err = await clevis_pass(disk, env)
    assert code == 0, err.decode()
    return out


def binding(disk: Path) -> jwe.Binding:
    (found,) = rekeying.bindings(luks.header(disk))
    return found.binding


async def test_first_boot_gives_the_volume_its_own_key_and_takes_the_images_passphrase_away(
    svc: Running, tmp_path: Path, env: dict[str, str]
) -> None:
    disk = luksimg.make_volume(tmp_path / "image.img")
    image_key = luksimg.volume_key(disk, luksimg.BOOTSTRAP)
    code, said = await rekey(svc, tmp_path, disk, env, *first_boot(svc, tmp_path))
    assert code == 0, said
    for step in ("new volume key", "bound a keyslot", "removed the bootstrap"):
        assert step in said
    assert not luksimg.opens(disk, luksimg.BOOTSTRAP)
    assert not luksimg.volume_key_opens(disk, image_key, tmp_path)
    secret = await passphrase(disk, env)
    assert luksimg.opens(disk, secret)
    assert luksimg.volume_key(disk, secret) != image_key
    # Again: nothing left to do.
    code, said = await rekey(svc, tmp_path, disk, env, *first_boot(svc, tmp_path))
    assert (code, "nothing to do" in said) == (0, True), said


async def test_an_interrupted_reencryption_is_finished_by_the_next_run(
    svc: Running, tmp_path: Path, env: dict[str, str]
) -> None:
    disk = luksimg.make_volume(tmp_path / "image.img")
    image_key = luksimg.volume_key(disk, luksimg.BOOTSTRAP)
    # What a power loss during the first boot leaves: a reencryption begun, not finished.
    done = luksimg.cryptsetup(
        "reencrypt", "--init-only", "--batch-mode", "--key-file", "-", "--key-slot", "0", str(disk),
        stdin=luksimg.BOOTSTRAP,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "reencryption resumed and finished" in await rekey_here(svc, tmp_path, disk)
    secret = await passphrase(disk, env)
    assert luksimg.volume_key(disk, secret) != image_key
    assert not luksimg.opens(disk, luksimg.BOOTSTRAP)


async def test_a_first_boot_stopped_after_the_reencryption_binds_without_reencrypting_again(
    svc: Running, tmp_path: Path, env: dict[str, str]
) -> None:
    disk = luksimg.make_volume(tmp_path / "image.img")
    image_key = luksimg.volume_key(disk, luksimg.BOOTSTRAP)
    await svc.service.store.revoke("disk-node", actor="test", reason="not yet")  # the bind is refused
    with pytest.raises(JoinFailed) as exc:
        await rekey_here(svc, tmp_path, disk)
    assert exc.value.code == "node_revoked"
    new_key = luksimg.volume_key(disk, luksimg.BOOTSTRAP)  # re-keyed, still the bootstrap slot
    assert new_key != image_key
    await svc.service.store.revoke("disk-node", actor="test", reason="ok", revoked=False)
    steps = await rekey_here(svc, tmp_path, disk)
    assert steps == ["bound a keyslot to nodegate", "removed the bootstrap passphrase's keyslot"]
    assert luksimg.volume_key(disk, await passphrase(disk, env)) == new_key


async def test_rotation_rekeys_at_the_next_boot_and_no_volume_is_ever_shut(
    svc: Running, tmp_path: Path, swtpm: TpmInfo, env: dict[str, str]
) -> None:
    config = str(ds.config_file(tmp_path, swtpm))
    disks = []
    for name in ("a", "b"):
        disk = luksimg.make_volume(tmp_path / f"{name}.img")
        await rekey_here(svc, tmp_path, disk)
        disks.append(disk)
    a, b = disks
    secret = await passphrase(a, env)
    code, out, err = await luksimg.run(ds.cli("disk", "rotate", "--config", config), env)
    assert code == 0, err.decode()
    assert "key version 2 is current" in out.decode()
    # Before any re-key, version 1 still opens both.
    assert [await opens_now(d) for d in disks] == [True, True]
    # Node a boots: its binding is re-sealed under version 2; same passphrase, same keyslot.
    (step,) = await rekey_here(svc, tmp_path, a, first=False)
    assert step.endswith("re-sealed from key version 1 to 2")
    assert (binding(a).version, binding(b).version) == (2, 1)
    assert [await opens_now(d) for d in disks] == [True, True]
    assert await passphrase(a, env) == secret  # through clevis, as at boot
    # b re-keys too; only then may version 1 go.
    (step,) = await rekey_here(svc, tmp_path, b, first=False)
    assert step.endswith("re-sealed from key version 1 to 2")
    async with admin.tools(load_settings(Path(config))) as t:
        await admin.rotate(t, retire=1)
    assert [await opens_now(d) for d in disks] == [True, True]


async def test_a_binding_left_on_a_retired_version_is_refused(
    svc: Running, tmp_path: Path, swtpm: TpmInfo, env: dict[str, str]
) -> None:
    disk = luksimg.make_volume(tmp_path / "a.img")
    await rekey_here(svc, tmp_path, disk)
    async with admin.tools(ds.settings(tmp_path, swtpm)) as t:
        await admin.rotate(t, retire=None)
        await admin.rotate(t, retire=1)
    code, out, err = await clevis_pass(disk, env)
    assert (code, out) == (1, b"")
    assert b"disk_key_revoked" in err


async def test_revoke_is_for_good(svc: Running, tmp_path: Path, swtpm: TpmInfo, env: dict[str, str]) -> None:
    """After nodegate disk revoke, the node's keys so far are refused, even once the node is trusted
    again (unrevoked, or forgotten and joined anew with the same TPM); new bindings get new keys."""
    config = str(ds.config_file(tmp_path, swtpm))
    disk = luksimg.make_volume(tmp_path / "a.img")
    assert (await rekey(svc, tmp_path, disk, env, *first_boot(svc, tmp_path)))[0] == 0
    code, out, err = await luksimg.run(
        ds.cli("disk", "revoke", "disk-node", "--config", config, "--reason", "stolen"), env
    )
    assert code == 0, err.decode()
    assert "epoch 1" in out.decode()
    await svc.service.store.forget("disk-node", actor="test", reason="re-imaged")
    await ds.joined(svc, swtpm, tmp_path)
    code, out, err = await clevis_pass(disk, env)
    assert (code, out) == (1, b"")
    assert b"disk_key_revoked" in err
    fresh = luksimg.make_volume(tmp_path / "b.img")
    await rekey_here(svc, tmp_path, fresh)
    assert binding(fresh).epoch == 1
    assert await opens_now(fresh)
    trail = [e.action for e in await svc.service.store.audit("disk-node")]
    assert "disk-revoke" in trail


async def test_a_lost_nodes_volume_is_recovered_from_a_backup_with_an_audit_entry(
    svc: Running, tmp_path: Path, swtpm: TpmInfo, env: dict[str, str]
) -> None:
    config = str(ds.config_file(tmp_path, swtpm))
    disk = luksimg.make_volume(tmp_path / "a.img")
    await rekey_here(svc, tmp_path, disk)
    secret = await passphrase(disk, env)
    pass_file = tmp_path / "ngb.pass"
    pass_file.write_text("a long backup passphrase\n")
    pass_file.chmod(0o600)
    archive = tmp_path / "backup.ngb"
    code, out, err = await luksimg.run(
        ds.cli("backup", "--config", config, "--out", str(archive), "--passphrase-file", str(pass_file)), env
    )
    assert code == 0, err.decode()
    assert "the disk-key secret" in out.decode()
    recovered = tmp_path / "recovered.key"
    args = [
        "disk", "recover", "--config", config, "--archive", str(archive), "--passphrase-file",
        str(pass_file), "--device", str(disk), "--reason", "machine died", "--out", str(recovered),
    ]  # fmt: skip
    code, _out, err = await luksimg.run(ds.cli(*args), env)
    assert code == 0, err.decode()
    assert recovered.read_bytes() == secret
    assert recovered.stat().st_mode & 0o777 == 0o600
    (entry,) = [e for e in await svc.service.store.audit("disk-node") if e.action == "disk-recover"]
    assert "machine died" in entry.detail
    assert entry.actor.startswith("cli:")
    # A wrong passphrase recovers nothing and writes nothing.
    pass_file.write_text("not the passphrase\n")
    code, _out, err = await luksimg.run(ds.cli(*args[:-1], str(tmp_path / "again.key")), env)
    assert code == 1
    assert b"backup_wrong_passphrase" in err, err.decode()
    assert not (tmp_path / "again.key").exists()
