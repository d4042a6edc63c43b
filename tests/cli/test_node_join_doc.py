"""docs/node-join.md's units and its one cloud-init example are what nodegate accepts: the
cloud-init YAML parses, writes every unit it enables, installs the binary the units run, and
every ``ExecStart`` (there and in the unit blocks) parses as a nodegate command."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from bootstrap.cli.arguments import parser

DOC = Path(__file__).resolve().parents[2] / "docs" / "node-join.md"
ENV = {"NODEGATE_SERVER": "https://nodegate.example.org:8443", "NODE_NAME": "gpu-0042"}


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), re.DOTALL)


def _exec_starts(unit: str) -> list[str]:
    joined = unit.replace("\\\n", " ")
    return [line.split("=", 1)[1] for line in joined.splitlines() if line.strip().startswith("ExecStart=")]


def _parses(command: str) -> Any:
    for name, value in ENV.items():
        command = command.replace("${" + name + "}", value)
    argv = shlex.split(command)
    assert argv[0] == "/usr/local/bin/nodegate", argv
    return parser().parse_args(argv[1:])


def test_every_unit_block_parses() -> None:
    units = [b for b in _blocks("ini") if "[Service]" in b]
    assert len(units) >= 3
    for unit in units:
        for command in _exec_starts(unit):
            _parses(command)


def test_the_cloud_init_example_is_complete() -> None:
    (block,) = [b for b in _blocks("yaml") if b.startswith("#cloud-config")]  # one example only
    doc = yaml.safe_load(block)
    files = {f["path"]: f.get("content", "") for f in doc["write_files"]}
    runcmd = [c if isinstance(c, str) else " ".join(c) for c in doc["runcmd"]]
    # the wheel the project builds (make wheel, or the image's; nodegate is not on PyPI), installed
    # with its requirements file: the wheel and the locked dependencies, hashes checked (issue 40)
    fetched = {c.split()[-1].rsplit("/", 1)[-1] for c in runcmd if c.startswith("curl ")}
    (install,) = [c for c in runcmd if "pip install" in c]
    wanted = re.search(
        r"^cd (\S+) && \S+ install --require-hashes -r (nodegate-[0-9.]+-requirements\.txt)$", install
    )
    assert wanted is not None, install
    version = wanted.group(2).split("-")[1]
    assert {wanted.group(2), f"nodegate-{version}-py3-none-any.whl"} <= fetched
    assert all(f" {wanted.group(1)}/nodegate-{version}-" in c for c in runcmd if c.startswith("curl "))
    assert any(c.endswith("/usr/local/bin/nodegate") for c in runcmd if c.startswith("ln "))
    enabled = {u for c in runcmd if c.startswith("systemctl enable") for u in c.split()[2:]}
    assert {"nodegate-join.service", "nodegate-attest.service"} <= enabled
    for unit in enabled:
        assert f"/etc/systemd/system/{unit}" in files, unit
    commands = {}
    for path, content in files.items():
        for command in _exec_starts(content):
            commands[Path(path).name] = _parses(command)
    assert {"nodegate-join.service", "nodegate-attest.service", "nodegate-renew.service"} <= set(commands)
    assert commands["nodegate-join.service"].command == "join"
    assert commands["nodegate-attest.service"].command == "attest"
    # with measured boot the log is named, so a machine that cannot read it fails at once
    assert all(c.event_log is not None for c in commands.values())
    assert (
        "ConditionPathExists=!/var/lib/nodegate-node/join.json"
        in files["/etc/systemd/system/nodegate-join.service"]
    )
    assert "/etc/nodegate/bundle.pem" in files
