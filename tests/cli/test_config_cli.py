"""``nodegate config validate|defaults``, ``--version`` and ``--log-level``."""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from bootstrap.cli.config import defaults_yaml, duration_text
from bootstrap.cli.configdoc import COMMENTS
from bootstrap.cli.main import main as cli_main
from bootstrap.config import Settings, load_settings, parse_duration
from bootstrap.logs import setup as logs
from bootstrap.version import version


def _keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        out.append(prefix + name)
        kind = field.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel) and kind.__module__ == Settings.__module__:
            out += _keys(kind, f"{prefix}{name}.")
    return out


def test_every_key_has_a_comment() -> None:
    assert [k for k in _keys(Settings) if k not in COMMENTS] == []


def test_defaults_parse_validate_and_equal_the_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["config", "defaults"]) == 0
    text = capsys.readouterr().out
    assert text == defaults_yaml()
    path = tmp_path / "defaults.yaml"
    path.write_text(text)
    assert load_settings(path) == Settings()
    # one comment above each key
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip() and not line.lstrip().startswith("#"):
            assert lines[i - 1].lstrip().startswith("# "), line
    assert cli_main(["config", "validate", str(path)]) == 0
    assert capsys.readouterr().out.strip().endswith(f"{path}: ok")


@pytest.mark.parametrize("seconds", [0.5, 1, 59, 60, 90, 3600, 5400, 86400, 90061.25])
def test_durations_print_as_they_parse(seconds: float) -> None:
    d = timedelta(seconds=seconds)
    assert parse_duration(duration_text(d)) == d


def test_validate_lists_every_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        yaml.safe_dump({"trust_domian": "x", "store": "postgres", "svid_ttl": "soon", "gate": {"taint": "x"}})
    )
    assert cli_main(["config", "validate", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert sorted(ln.split(": ")[1] for ln in err[:-1]) == ["gate.taint", "store", "svid_ttl", "trust_domian"]
    assert err[-1] == f"{path}: 4 problems"


def test_validate_checks_the_files_the_config_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    path = tmp_path / "c.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "state_dir": str(tmp_path / "state"),
                "ek_roots": [str(tmp_path / "nowhere.pem"), str(tmp_path / "empty")],
                "tls": {"cert_file": str(tmp_path / "tls.crt"), "key_file": str(tmp_path / "tls.key")},
                "kubernetes": {"kubeconfig": str(tmp_path / "kc")},
            }
        )
    )
    assert cli_main(["config", "validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"tls.cert_file: {tmp_path / 'tls.crt'} does not exist" in err
    assert f"ek_roots: {tmp_path / 'nowhere.pem'} does not exist" in err
    assert f"kubernetes.kubeconfig: kubeconfig {tmp_path / 'kc'} does not exist" in err
    assert err.strip().endswith("3 problems")


def test_validate_of_a_file_that_is_not_there(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["config", "validate", str(tmp_path / "x.yaml")]) == 2
    assert "cannot read config" in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli_main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith(f"nodegate {version()} (Python 3.")


def test_log_level_flag_and_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(logs.LEVEL_ENV, raising=False)
    assert logs.level_named(None) == logging.INFO
    assert logs.level_named("debug") == logging.DEBUG
    monkeypatch.setenv(logs.LEVEL_ENV, "warning")
    assert logs.level_named(None) == logging.WARNING
    assert logs.level_named("error") == logging.ERROR  # the flag wins
    monkeypatch.setenv(logs.LEVEL_ENV, "loud")
    assert cli_main(["config", "defaults"]) == 2
    assert "log level 'loud' is not one of debug, info, warning, error" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["--log-level", "loud", "config", "defaults"])


def test_serve_takes_the_level_after_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The level reaches the service's logger: with error, the ek_roots info line is not printed."""
    config = tmp_path / "c.yaml"
    config.write_text(
        f"listen: 127.0.0.1:0\nstate_dir: {tmp_path / 's'}\nadmission: {{policy_files: [{tmp_path / 'p'}]}}\n"
    )
    (tmp_path / "p").write_text("kind: PackagePolicy\nspec: 7\n")
    assert cli_main(["serve", "--config", str(config), "--log-level", "error"]) == 2
    err = capsys.readouterr().err
    assert "ek_roots:" not in err
    assert "nodegate serve:" in err
    assert cli_main(["serve", "--config", str(config), "--log-level", "debug"]) == 2
    records = [json.loads(ln) for ln in capsys.readouterr().err.splitlines() if ln.startswith("{")]
    assert any(r["msg"].startswith("ek_roots:") for r in records)
