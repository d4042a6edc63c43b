"""The demo's disk-key line (docs/disk-keys.md): an attested node's LUKS volume opens with the key
nodegate releases to its boot; the refused node gets none. The node side is the real release
client; the volume is a LUKS2 file (cryptsetup), its passphrase sealed as the Clevis pin seals it."""

from __future__ import annotations

import asyncio
import secrets
import shutil
import subprocess
from pathlib import Path

from bootstrap.demo.processes import Machine
from bootstrap.kube import Kube
from bootstrap.node.disk import jwe, luks
from bootstrap.node.disk.release import ReleaseOptions, release
from bootstrap.node.errors import JoinFailed


def _options(
    machine: Machine,
    url: str,
    bundle: Path,
    volume: str,
    version: int | None = None,
    epoch: int | None = None,
) -> ReleaseOptions:
    return ReleaseOptions(
        server=url,
        ca_bundle=bundle,
        node_name=machine.name,
        volume=volume,
        tcti=machine.tpm.tcti,
        attempts=1,
        event_log=machine.event_log,
        boot_id_file=machine.boot_id_file,
        key_version=version,
        epoch=epoch,
    )


async def empty_secret(
    kubeconfig: Path, namespace: str = "nodegate", name: str = "nodegate-disk-keys"
) -> None:
    """What the chart makes: the disk-key Secret, empty; nodegate fills it on its first start."""
    kube = await Kube.from_config(str(kubeconfig))
    if kube is None:
        return
    try:
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {"name": name, "namespace": namespace},
        }
        await kube.create_secret(namespace, body)
    finally:
        await kube.close()


def _format(path: Path, passphrase: bytes) -> str | None:
    """A small LUKS2 volume with ``passphrase``; its UUID (None: no cryptsetup here)."""
    exe = shutil.which("cryptsetup") or (
        "/usr/sbin/cryptsetup" if Path("/usr/sbin/cryptsetup").exists() else None
    )
    if exe is None:
        return None
    with path.open("wb") as f:
        f.truncate(20 * 1024 * 1024)
    subprocess.run(
        [exe, "luksFormat", "--type", "luks2", "--batch-mode", "--pbkdf", "pbkdf2",
         "--pbkdf-force-iterations", "1000", "--key-file", "-", str(path)],
        input=passphrase, check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return luks.volume_uuid(path)


async def disk_line(good: Machine, refused: Machine, url: str, bundle: Path, root: Path) -> str:
    passphrase = secrets.token_urlsafe(32).encode()
    volume = await asyncio.to_thread(_format, root / "disk.img", passphrase)
    where = "LUKS volume" if volume is not None else "volume (no cryptsetup here: the sealed passphrase only)"
    volume = volume or "6f1d2a3b-4c5d-4e6f-8a9b-0c1d2e3f4a5b"
    bound = await release(_options(good, url, bundle, volume))  # clevis luks bind
    binding = jwe.Binding(
        url=url, ca=bundle.read_text(), node=good.name, volume=volume, ek_sha256=bound.ek_sha256,
        epoch=bound.epoch, version=bound.key_version,
    )  # fmt: skip
    sealed = jwe.seal(binding, bound.key, passphrase)
    # The next boot: a fresh quote, the key again, the passphrase out of the header's JWE.
    again = await release(_options(good, url, bundle, volume, bound.key_version, bound.epoch))
    opened = jwe.unseal(sealed, again.key) == passphrase
    if where == "LUKS volume":
        opened = opened and await asyncio.to_thread(luks.opens, root / "disk.img", passphrase) is not None
    try:
        await release(_options(refused, url, bundle, volume))
        code = "released (unexpected)"
    except JoinFailed as exc:
        code = f"refused: {exc.code}"
    state = "opens" if opened else "does NOT open"
    return (
        f"disk keys: {good.name}'s {where} {state} with the key nodegate released to its attested boot; "
        f"{refused.name} asks for the same volume's key and gets none ({code})"
    )
