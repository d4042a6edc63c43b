"""Nodes install nodegate from its wheel (issue 34, item 2): `make wheel` (scripts/image/build.py
--wheel-only) builds it from the tracked files, with both commands and the Python floor, and beside
it the requirements file that installs it with the locked dependencies, hashed (issue 40); the
Dockerfile installs from the same lock as `make image` and keeps both files for nodes, as the image
does."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.image.runtime import ROOT, lockfile

WHEEL_DIR = "/opt/nodegate/wheels"


@pytest.fixture(scope="module")
def node_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`make wheel` once for the module: the wheel's path (its requirements file lies beside it)."""
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [sys.executable, "scripts/image/build.py", "--wheel-only", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    (wheel,) = out.glob("nodegate-*-py3-none-any.whl")
    assert done.stdout.strip() == str(wheel)
    return wheel


def _node_venv(where: Path) -> Path:
    """A node's venv as docs/node-join.md makes it: the machine's Python, its own bundled pip."""
    base = Path(sys.base_prefix) / "bin" / "python3"
    subprocess.run([base, "-m", "venv", str(where)], check=True, timeout=120)
    return where / "bin" / "pip"


def test_make_wheel_builds_the_node_install(node_wheel: Path) -> None:
    wheel, tmp_path = node_wheel, node_wheel.parent
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert wheel.name == f"nodegate-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read(f"nodegate-{version}.dist-info/METADATA").decode()
        entry = z.read(f"nodegate-{version}.dist-info/entry_points.txt").decode()
    tops = {n.split("/", 1)[0] for n in names if not n.startswith("nodegate-")}
    assert tops == {"attest", "admission", "bootstrap"}  # no tests, no stale build/ copies
    assert "Requires-Python: >=3.11" in meta  # the floor docs/node-join.md states
    assert re.search(r"^nodegate = bootstrap\.cli", entry, re.M)
    assert re.search(r"^kubectl-nodegate = bootstrap\.cli", entry, re.M)
    # the Clevis pin (docs/disk-keys.md): Clevis runs clevis-{encrypt,decrypt}-<pin> from PATH
    assert re.search(r"^clevis-encrypt-nodegate = bootstrap\.cli\.clevispin:encrypt_main$", entry, re.M)
    assert re.search(r"^clevis-decrypt-nodegate = bootstrap\.cli\.clevispin:decrypt_main$", entry, re.M)
    # ... and beside it what a node installs it with: the wheel by hash, then the locked runtime set
    requirements = tmp_path / f"nodegate-{version}-requirements.txt"
    lines = [line for line in requirements.read_text().splitlines() if not line.startswith("#")]
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert lines[0] == f"./{wheel.name} --hash=sha256:{digest}"
    assert "\n".join(lines[1:]) + "\n" == lockfile.export("runtime")


def test_a_node_installs_exactly_the_locked_versions(node_wheel: Path, tmp_path: Path) -> None:
    """docs/node-join.md's install, run: in the folder of both files, one hash-checked pip install
    gives the wheel and every runtime dependency at the version uv.lock pins, and nothing else."""
    pip = _node_venv(tmp_path / "venv")
    requirements = next(node_wheel.parent.glob("nodegate-*-requirements.txt")).name
    done = subprocess.run(
        [pip, "install", "-q", "--disable-pip-version-check", "--require-hashes", "-r", requirements],
        cwd=node_wheel.parent,
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr
    listed = subprocess.run([pip, "list", "--format", "freeze"], capture_output=True, text=True, check=True)
    installed = lockfile.pins(listed.stdout)
    assert installed.pop("nodegate") == node_wheel.name.split("-")[1]
    installed.pop("pip"), installed.pop("setuptools", None)  # the venv's own, not nodegate's
    assert installed == lockfile.pins(lockfile.export("runtime", hashes=False))
    version = subprocess.run([tmp_path / "venv/bin/nodegate", "--version"], capture_output=True, check=False)
    assert version.returncode == 0, version.stderr


def test_a_swapped_wheel_is_refused(node_wheel: Path, tmp_path: Path) -> None:
    """A wheel that is not the one the requirements file hashes (a mirror's, a tampered copy) is
    refused before anything is installed."""
    folder = tmp_path / "share"
    folder.mkdir()
    requirements = next(node_wheel.parent.glob("nodegate-*-requirements.txt"))
    (folder / requirements.name).write_bytes(requirements.read_bytes())
    swapped = bytearray(node_wheel.read_bytes())
    swapped[-1] ^= 1  # the zip's last byte: still a file of that name, not the same file
    (folder / node_wheel.name).write_bytes(bytes(swapped))
    pip = _node_venv(tmp_path / "venv")
    done = subprocess.run(
        [pip, "install", "--disable-pip-version-check", "--require-hashes", "-r", requirements.name],
        cwd=folder,
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    assert done.returncode != 0
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in done.stderr
    assert node_wheel.name in done.stderr
    freeze = subprocess.run([pip, "freeze"], capture_output=True, text=True, check=True).stdout
    assert freeze == ""


def test_the_dockerfile_installs_from_the_lock_and_keeps_the_wheel() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert "COPY pyproject.toml uv.lock" in text
    installs = re.findall(r"pip install [^\n\\]*", text)
    # every dependency from the lock, hashes checked; nodegate itself then without dependencies
    assert all("--require-hashes" in i or "--no-deps" in i for i in installs), installs
    assert sum(i.endswith("--require-hashes -r /tmp/pip.txt ") for i in installs) == 1
    assert sum(i.endswith("-r /tmp/runtime.txt") for i in installs) == 1
    assert f"-w {WHEEL_DIR}" in text
    assert f"lockfile.py node-requirements {WHEEL_DIR}/" in text


def test_make_image_keeps_the_wheel_for_nodes() -> None:
    build = (ROOT / "scripts" / "image" / "build.py").read_text()
    assert f'WHEEL_DIR = "{WHEEL_DIR}"' in build
    doc = (ROOT / "docs" / "node-join.md").read_text()
    assert WHEEL_DIR in doc
