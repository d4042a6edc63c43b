"""``nodegate config validate FILE`` (every problem, one line each; exit 0 or 2) and ``nodegate
config defaults`` (the full config, one comment per key; the output validates)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from bootstrap.cli.configdoc import COMMENTS
from bootstrap.config import ConfigError, Settings, load_settings
from bootstrap.service import preflight
from bootstrap.service.pki.startup import StartupError

_EXIT_PROBLEMS = 2


def run(args: argparse.Namespace) -> int:
    if args.config_command == "defaults":
        sys.stdout.write(defaults_yaml())
        return 0
    given = {p for p in (args.config, args.config_option) if p is not None}
    if len(given) != 1:
        what = "give one config file" if given else "give the config file"
        print(f"nodegate config validate: {what}: nodegate config validate FILE", file=sys.stderr)
        return _EXIT_PROBLEMS
    return validate(given.pop())


def validate(path: Path) -> int:
    problems, warnings = check(path)
    for text in warnings:
        print(f"{path}: warning: {text}")
    for text in problems:
        print(f"{path}: {text}", file=sys.stderr)
    if problems:
        print(f"{path}: {len(problems)} problem{'s' if len(problems) > 1 else ''}", file=sys.stderr)
        return _EXIT_PROBLEMS
    print(f"{path}: ok")
    return 0


def check(path: Path) -> tuple[list[str], list[str]]:
    """(problems, warnings): the config's own mistakes, then what ``nodegate serve`` would refuse
    in the files and folders it names (the port is not tried: the service may be running)."""
    try:
        settings = load_settings(path)
    except ConfigError as exc:
        return list(exc.problems), []
    problems: list[str] = []
    checks: list[Callable[[], object]] = [
        lambda: preflight.check_state_dir(settings.state_dir),
        lambda: preflight.check_tls_files(settings),
        lambda: preflight.check_ek_roots(settings),
        lambda: preflight.check_files(settings),
    ]
    for one in checks:
        try:
            one()
        except StartupError as exc:
            problems.append(str(exc))
    return problems, preflight.warnings(settings, insecure_plaintext=False)


# -- defaults ----------------------------------------------------------------------------------


def defaults_yaml() -> str:
    lines = ["# nodegate serve --config FILE: every key with its default (nodegate config defaults)"]
    _model(Settings(), "", 0, lines)
    return "\n".join(lines) + "\n"


def _model(model: BaseModel, prefix: str, indent: int, lines: list[str]) -> None:
    pad = "  " * indent
    for name in type(model).model_fields:
        key = prefix + name
        value = getattr(model, name)
        comment = COMMENTS.get(key)
        if comment:
            lines.append(f"{pad}# {comment}")
        if isinstance(value, BaseModel) and value.__module__ == Settings.__module__:
            lines.append(f"{pad}{name}:")
            _model(value, key + ".", indent + 1, lines)
        else:
            lines.append(f"{pad}{name}: {_scalar(_plain(value))}")


def _plain(value: object) -> Any:
    if isinstance(value, timedelta):
        return duration_text(value)
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, Path):
        return str(value)
    return value


def _scalar(value: object) -> str:
    """One line of YAML: JSON is YAML, and flow style keeps each key on its line."""
    return (
        json.dumps(value)
        if not isinstance(value, str)
        else yaml.safe_dump(value).removesuffix("\n...\n").strip()
    )


def duration_text(d: timedelta) -> str:
    """``1h``, ``30s``, ``1h30m``, ``500ms``: what the config's duration parser reads back."""
    ms = round(d.total_seconds() * 1000)
    if ms == 0:
        return "0s"
    out = ""
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        n, ms = divmod(ms, size)
        if n:
            out += f"{n}{unit}"
    return out
