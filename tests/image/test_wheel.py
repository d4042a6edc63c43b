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

from tests.image.runtime import ROOT, lockfile

WHEEL_DIR = "/opt/nodegate/wheels"


def test_make_wheel_builds_the_node_install(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "scripts/image/build.py", "--wheel-only", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    (wheel,) = tmp_path.glob("nodegate-*-py3-none-any.whl")
    assert done.stdout.strip() == str(wheel)
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
    # ... and beside it what a node installs it with: the wheel by hash, then the locked runtime set
    requirements = tmp_path / f"nodegate-{version}-requirements.txt"
    lines = [line for line in requirements.read_text().splitlines() if not line.startswith("#")]
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert lines[0] == f"./{wheel.name} --hash=sha256:{digest}"
    assert "\n".join(lines[1:]) + "\n" == lockfile.export("runtime")


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
