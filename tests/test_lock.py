"""One lock (issue 40): uv.lock is the only source of Python package versions for the venv, CI,
the image and the node wheel (docs/development.md, "One lock"). These tests hold the lock to
pyproject.toml and every install to the lock."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import lockfile  # noqa: E402  (scripts/lockfile.py)

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _names(requirements: list[str]) -> set[str]:
    return {lockfile.normalise(re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", r).group(0)) for r in requirements}  # type: ignore[union-attr]


def test_the_lock_matches_pyproject() -> None:
    assert lockfile.check()


def test_a_dependency_added_without_make_lock_fails_in_one_line(tmp_path: Path) -> None:
    for name in ("pyproject.toml", "uv.lock", "README.md"):
        shutil.copy2(ROOT / name, tmp_path / name)
    script = [sys.executable, str(ROOT / "scripts" / "lockfile.py"), "check", str(tmp_path)]
    assert subprocess.run(script, capture_output=True, check=False).returncode == 0
    text = (tmp_path / "pyproject.toml").read_text()
    (tmp_path / "pyproject.toml").write_text(
        text.replace('"pyyaml>=6.0",', '"pyyaml>=6.0",\n    "six>=1.16",', 1)
    )
    done = subprocess.run(script, capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert "make lock" in done.stderr


def test_the_runtime_export_pins_every_runtime_dependency_with_hashes() -> None:
    exported = lockfile.export("runtime")
    pins = lockfile.pins(exported)
    assert _names(PYPROJECT["project"]["dependencies"]) <= pins.keys()
    assert not {"pytest", "kmock", "grpcio", "ruff"} & pins.keys()  # extras and tools stay out
    blocks = re.split(r"\n(?=[A-Za-z])", exported.strip())
    assert len(blocks) == len(pins)
    assert all("--hash=sha256:" in block for block in blocks)


def test_the_lock_holds_every_extra_and_the_image_pip() -> None:
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    locked = {p["name"] for p in lock["package"]}
    for extra, requirements in PYPROJECT["project"]["optional-dependencies"].items():
        assert _names(requirements) <= locked, extra
    assert lockfile.pins(lockfile.export("pip")).keys() == {"pip"}
    assert all(p.get("sdist") or p.get("wheels") for p in lock["package"] if p["name"] != "nodegate")


def test_every_install_reads_the_lock() -> None:
    make = (ROOT / "Makefile").read_text()
    # the venv: uv sync --locked, nothing installed around it
    assert "sync --locked --all-extras --all-groups" in make
    rules = {rule.split(":", 1)[0]: rule for rule in re.split(r"\n(?=[^\t#\s])", make)}
    installing = {target for target, rule in rules.items() if re.search(r"^\t.*pip install", rule, re.M)}
    assert installing == {"test-latest"}  # the one install that ignores the lock, on purpose
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [line for line in ci.splitlines() if line and not line.startswith("#")]
    check = next(i for i, line in enumerate(commands) if line.endswith("python3 scripts/lockfile.py check"))
    assert check < next(i for i, line in enumerate(commands) if line.endswith("make venv"))
    build = (ROOT / "scripts" / "image" / "build.py").read_text()
    assert 'lockfile.export("runtime")' in build
    assert "--require-hashes" in build
