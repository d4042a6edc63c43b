"""``nodegate eventlog inspect`` and ``nodegate policy learn``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives import serialization

from attest import eventlog
from attest.measuredboot import facts as bootfacts
from attest.measuredboot import policy as measuredboot
from bootstrap import cli
from tests.support import eventlogs as el
from tests.support.certs import self_signed


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("eventlogs")
    _, cert = self_signed("Test Secure Boot CA")
    for name, data in el.quirky(cert.public_bytes(serialization.Encoding.DER)).items():
        (folder / name).write_bytes(data)
    (folder / "broken").write_bytes(b"\x00" * 10)
    return folder


def test_inspect_json_has_the_documented_fields(logs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = logs / "agile-sha1-sha256"
    assert cli.main(["eventlog", "inspect", "-o", "json", "--events", str(path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    log = eventlog.parse(path.read_bytes())
    assert doc["events"] == len(log.events) == len(doc["event_list"])
    assert doc["banks"] == ["sha1", "sha256"]
    assert doc["secure_boot"] is True
    assert doc["pcrs"]["sha256"]["7"] == log.replay()["sha256"][7].hex()
    assert doc["uninterpreted"] == []
    assert [a["subject"] for a in doc["authorities"]] == ["CN=Test Secure Boot CA"]


def test_inspect_text_names_secure_boot(logs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["eventlog", "inspect", str(logs / "secure-boot-off")]) == 0
    assert "secure boot: off" in capsys.readouterr().out


def test_an_invalid_log_exits_1_with_its_code(logs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["eventlog", "inspect", str(logs / "broken")]) == 1
    assert "[event_log_invalid]" in capsys.readouterr().err


def test_an_unreadable_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["eventlog", "inspect", str(tmp_path / "missing")]) == 2
    assert "No such file" in capsys.readouterr().err


def test_learned_policy_loads_and_admits_its_own_log(logs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log_file = logs / "old-shim-authority"
    assert cli.main(["policy", "learn", "--event-log", str(log_file), "--name", "shim"]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    policy = measuredboot.policy_from_obj(doc["measured_boot"])
    log = eventlog.parse(log_file.read_bytes())
    facts = bootfacts.facts(log.events, bank="sha256", pcrs=range(8))
    assert measuredboot.enforce(policy, facts).matched_class == "shim"
