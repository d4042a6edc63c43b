"""Nodes install nodegate from its wheel (issue 34, item 2): `make wheel` (scripts/image/build.py
--wheel-only) builds it from the tracked files, with both commands and the Python floor; the
Dockerfile installs the same pins as `make image` and keeps the wheel for nodes, as the image does."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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


def test_the_dockerfile_installs_the_image_pins_and_keeps_the_wheel() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert "COPY scripts/image/requirements.txt" in text
    assert "pip install --no-cache-dir -r requirements.txt" in text
    installs = re.findall(r"pip install [^\n\\]*", text)
    # nodegate itself without its (open-ranged) dependencies: they all came from the pins
    assert all("-r requirements.txt" in i or "--no-deps" in i or "pip==" in i for i in installs), installs
    assert f"-w {WHEEL_DIR}" in text


def test_make_image_keeps_the_wheel_for_nodes() -> None:
    build = (ROOT / "scripts" / "image" / "build.py").read_text()
    assert f'WHEEL_DIR = "{WHEEL_DIR}"' in build
    doc = (ROOT / "docs" / "node-join.md").read_text()
    assert WHEEL_DIR in doc
