"""Every systemd unit the docs (docs/node-join.md: the unit blocks and the cloud-init example)
and the chart ship is a unit systemd reads as meant (issue 34, item 1: an inline ``# comment``
after ``EnvironmentFile=`` became part of the path).

Two checks: our own parser, strict where systemd is lenient (systemd has no inline comments, so a
`` #`` inside a value is a mistake; ``EnvironmentFile=`` is one absolute path; each ``${VAR}`` of
``ExecStart=`` is set by the environment file the docs write; known sections and keys only), and
``systemd-analyze verify`` from Debian's systemd package (``make deps``) on the same files."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "node-join.md"
CHART = ROOT / "charts" / "nodegate"
NODEGATE = "/usr/local/bin/nodegate"

# The keys these units use, per section (a key outside the list is a typo until added here).
KEYS = {
    "Unit": {
        "Description", "Wants", "After", "Before", "Requires", "BindsTo", "PartOf",
        "ConditionPathExists", "StartLimitIntervalSec", "StartLimitBurst", "Documentation",
    },
    "Service": {
        "Type", "RemainAfterExit", "EnvironmentFile", "Environment", "ExecStart", "ExecStartPre",
        "Restart", "RestartSec", "RestartPreventExitStatus", "SuccessExitStatus", "UMask",
        "ProtectSystem", "ProtectHome", "ReadWritePaths", "ReadOnlyPaths", "DeviceAllow",
        "NoNewPrivileges", "PrivateTmp", "User", "Group", "TimeoutStartSec",
    },
    "Timer": {"OnBootSec", "OnUnitActiveSec", "RandomizedDelaySec", "OnCalendar", "Persistent", "Unit"},
    "Install": {"WantedBy", "RequiredBy", "Also"},
}  # fmt: skip


@dataclass
class Unit:
    name: str
    where: str
    text: str
    values: dict[tuple[str, str], list[str]] = field(default_factory=dict)


def _doc_units() -> list[Unit]:
    text = DOC.read_text()
    units = []
    for block in re.findall(r"```ini\n(.*?)```", text, re.DOTALL):
        first = block.splitlines()[0]
        m = re.fullmatch(r"# (/etc/systemd/system/\S+)", first)
        assert m, f"a unit block in node-join.md starts with its path: {first!r}"
        units.append(Unit(m.group(1).removeprefix("/etc/systemd/system/"), "docs/node-join.md", block))
    (cloud,) = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.DOTALL) if b.startswith("#cloud-config")]
    for f in yaml.safe_load(cloud)["write_files"]:
        if f["path"].startswith("/etc/systemd/system/"):
            units.append(
                Unit(f["path"].removeprefix("/etc/systemd/system/"), "node-join.md cloud-init", f["content"])
            )
    return units


def _chart_units() -> list[Unit]:
    """Units in the chart's files (none today; any added later are checked the same way)."""
    out = []
    for path in sorted(CHART.rglob("*")):
        if path.is_file() and "[Unit]" in path.read_text(errors="replace"):
            out.append(Unit(path.name, str(path.relative_to(ROOT)), path.read_text()))
    return out


UNITS = _doc_units() + _chart_units()


def _env_file_keys() -> set[str]:
    """The variables the docs put in /etc/nodegate/join.env (cloud-init: written, then NODE_NAME
    appended by runcmd)."""
    text = DOC.read_text()
    (cloud,) = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.DOTALL) if b.startswith("#cloud-config")]
    doc = yaml.safe_load(cloud)
    (env,) = [f["content"] for f in doc["write_files"] if f["path"] == "/etc/nodegate/join.env"]
    keys = {line.split("=", 1)[0] for line in env.splitlines() if "=" in line}
    for command in doc["runcmd"]:
        m = re.search(r'echo "(\w+)=.*>> /etc/nodegate/join.env', str(command))
        if m:
            keys.add(m.group(1))
    return keys


def parse(unit: Unit) -> Unit:
    """systemd's unit syntax, strictly: the problems are raised as AssertionError naming the line."""
    section = None
    lines = unit.text.replace("\\\n", " ").splitlines()
    for number, line in enumerate(lines, 1):
        where = f"{unit.where}: {unit.name} line {number}: {line.strip()!r}"
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", ";")):
            continue
        m = re.fullmatch(r"\[(\w+)\]", stripped)
        if m:
            section = m.group(1)
            assert section in KEYS, f"{where}: unknown section"
            continue
        assert section is not None, f"{where}: a key before any section"
        key, sep, value = stripped.partition("=")
        assert sep, f"{where}: not KEY=VALUE"
        assert key in KEYS[section], f"{where}: {key} is not a key of [{section}] these units use"
        # systemd has no inline comments: "# ..." after a value is part of the value
        assert not re.search(r"\s[#;]", value), f"{where}: an inline comment becomes part of the value"
        unit.values.setdefault((section, key), []).append(value.strip())
    return unit


@pytest.mark.parametrize("unit", UNITS, ids=[f"{u.where}:{u.name}" for u in UNITS])
def test_every_unit_parses_strictly(unit: Unit) -> None:
    parsed = parse(unit)
    for value in parsed.values.get(("Service", "EnvironmentFile"), []):
        path = value.removeprefix("-")
        assert re.fullmatch(r"/[^\s]+", path), (
            f"{unit.name}: EnvironmentFile={path!r} is not one absolute path"
        )
    known = _env_file_keys()
    for command in parsed.values.get(("Service", "ExecStart"), []):
        assert command.split()[0].startswith("/"), f"{unit.name}: ExecStart needs an absolute path"
        if command.split()[0] != NODEGATE:
            continue
        used = set(re.findall(r"\$\{(\w+)\}", command))
        assert used <= known, f"{unit.name}: ExecStart uses {used - known}, join.env sets {known}"


def test_the_parser_catches_an_inline_comment() -> None:
    bad = Unit(
        "x.service", "test", "[Service]\nEnvironmentFile=/etc/nodegate/join.env   # NODEGATE_SERVER=...\n"
    )
    with pytest.raises(AssertionError, match="inline comment"):
        parse(bad)


def test_systemd_analyze_verify_accepts_every_unit(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed (make deps installs Debian's systemd)")
    stub = tmp_path / "bin" / "nodegate"  # verify checks that ExecStart's binary is executable
    stub.parent.mkdir()
    stub.write_text("#!/bin/sh\n")
    stub.chmod(0o755)
    folder = tmp_path / "units"
    folder.mkdir()
    names = []
    for i, unit in enumerate(UNITS):
        if "/" in unit.name:  # a drop-in (kubelet.service.d/...): verify takes whole units only
            continue
        sub = folder / str(i)  # the docs and the cloud-init example write the same names
        sub.mkdir()
        # verify checks that each ExecStart binary exists: every absolute one becomes the stub
        text = re.sub(r"^(Exec\w+=[-@:+!]*)/\S+", rf"\g<1>{stub}", unit.text, flags=re.M)
        (sub / unit.name).write_text(text)
        names.append(str(sub / unit.name))
    done = subprocess.run(
        [tool, "verify", "--man=no", *names], capture_output=True, text=True, check=False, timeout=120
    )
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
