"""LUKS2 volumes on regular files and the real Clevis around them: what the pin tests run.

Device mapping does not work in these containers, so nothing is opened: ``cryptsetup open
--test-passphrase`` says whether a passphrase opens a volume, and ``clevis luks pass`` is the
unlock path up to the mapping (the same ``clevis decrypt`` as ``clevis luks unlock`` and the
initramfs and dracut hooks)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

BOOTSTRAP = b"the image's bootstrap passphrase"  # what every copy of an image shares
TOOLS = ("cryptsetup", "clevis", "jose", "clevis-luks-bind", "clevis-encrypt-tpm2")


def require_tools() -> None:
    missing = [t for t in TOOLS if shutil.which(t) is None and not Path(f"/usr/sbin/{t}").exists()]
    if missing:
        debs = "clevis, clevis-luks, clevis-tpm2, cryptsetup-bin, jose"
        pytest.fail(f"{missing} missing: make deps installs {debs}")


def cryptsetup(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    exe = shutil.which("cryptsetup") or "/usr/sbin/cryptsetup"
    return subprocess.run([exe, *args], input=stdin, capture_output=True, timeout=120, check=False)


def make_volume(path: Path, passphrase: bytes = BOOTSTRAP) -> Path:
    """A LUKS2 volume the way an image ships one: one keyslot, the shared passphrase. pbkdf2 with
    few iterations keeps the tests fast (keyslots cryptsetup adds later inherit it)."""
    with path.open("wb") as f:
        f.truncate(20 * 1024 * 1024)
    done = cryptsetup(
        "luksFormat", "--type", "luks2", "--batch-mode", "--pbkdf", "pbkdf2",
        "--pbkdf-force-iterations", "1000", "--key-file", "-", str(path), stdin=passphrase,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return path


def opens(path: Path, passphrase: bytes) -> bool:
    return (
        cryptsetup("open", "--test-passphrase", "--key-file", "-", str(path), stdin=passphrase).returncode
        == 0
    )


def volume_key(path: Path, passphrase: bytes) -> bytes:
    done = cryptsetup(
        "luksDump", "--dump-volume-key", "--batch-mode", "--key-file", "-", str(path), stdin=passphrase
    )
    assert done.returncode == 0, done.stderr
    text = done.stdout.decode()
    block = text[text.index("MK dump:") + len("MK dump:") :]
    return bytes.fromhex("".join(w for w in block.split() if len(w) == 2))


def volume_key_opens(path: Path, key: bytes, tmp: Path) -> bool:
    """Whether ``key`` is this volume's key (cryptsetup checks it against the header's digest)."""
    key_file = tmp / "vk.bin"
    key_file.write_bytes(key)
    key_file.chmod(0o600)
    done = cryptsetup("open", "--test-passphrase", "--volume-key-file", str(key_file), str(path))
    key_file.unlink()
    return done.returncode == 0


def uuid_of(path: Path) -> str:
    return cryptsetup("luksUUID", str(path)).stdout.decode().strip()


@dataclass(frozen=True)
class Machine:
    """What a pin process on one emulated machine sees: its TPM, its boot id, its event log."""

    tcti: str
    boot_id_file: Path
    event_log: Path | None = None


def pin_path(tmp: Path) -> Path:
    """clevis-encrypt-nodegate and clevis-decrypt-nodegate as the wheel's console scripts make
    them: this interpreter running the entry points of pyproject.toml's [project.scripts]."""
    folder = tmp / "pins"
    folder.mkdir(exist_ok=True)
    for name, entry in (
        ("clevis-encrypt-nodegate", "encrypt_main"),
        ("clevis-decrypt-nodegate", "decrypt_main"),
    ):
        script = folder / name
        lines = [f"#!{sys.executable}", "import sys", f"from bootstrap.cli.clevispin import {entry}"]
        script.write_text("\n".join([*lines, f"sys.exit({entry}())", ""]))
        script.chmod(0o755)
    return folder


def environment(tmp: Path, machine: Machine) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{pin_path(tmp)}:{env.get('PATH', '/usr/bin:/bin')}:/usr/sbin:/sbin"
    env["NODEGATE_TCTI"] = machine.tcti
    env["NODEGATE_BOOT_ID_FILE"] = str(machine.boot_id_file)
    if machine.event_log is not None:
        env["NODEGATE_EVENT_LOG"] = str(machine.event_log)
    env["TSS2_LOG"] = "all+none"
    env.setdefault("TMPDIR", str(tmp))
    return env


async def run(
    args: list[str], env: dict[str, str], stdin: bytes = b"", timeout: float = 120.0
) -> tuple[int, bytes, bytes]:
    """A command with the service still serving in this process's event loop."""
    proc = await asyncio.create_subprocess_exec(
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
    assert proc.returncode is not None
    return proc.returncode, out, err
