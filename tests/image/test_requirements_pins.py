"""The image's pinned runtime requirements cover every dependency pyproject.toml declares, so a
dependency added to the project cannot silently be missing from the image (`make image`)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match is not None, requirement
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def test_every_runtime_dependency_is_pinned_for_the_image() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_name(r) for r in project["dependencies"]}
    pins = {}
    for raw in (ROOT / "scripts" / "image" / "requirements.txt").read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep, f"not pinned exactly: {line}"
            assert version, f"not pinned exactly: {line}"
            pins[_name(name)] = version
    assert wanted - pins.keys() == set()
