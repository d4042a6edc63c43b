"""``nodegate eventlog inspect`` and ``nodegate policy learn`` on real logs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from attest import bootevents, eventlog, measuredboot
from bootstrap import cli

DATA = Path(__file__).resolve().parents[1] / "attest" / "data" / "eventlogs"


def test_inspect_json_has_the_documented_fields(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        cli.main(["eventlog", "inspect", "-o", "json", "--events", str(DATA / "event-moklisttrusted.bin")])
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["events"] == 97
    assert doc["banks"] == ["sha256"]
    assert doc["secure_boot"] is True
    assert doc["pcrs"]["sha256"]["7"] == "56c7ba6010e0a8a20c92e3d08baebcf2a7e6544fed33c3ea9523eaa6cd74537a"
    assert len(doc["event_list"]) == 97
    assert doc["unverified"] == []


def test_inspect_text_names_secure_boot(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        cli.main(["eventlog", "inspect", str(DATA / "ubuntu_2104_shielded_vm_no_secure_boot_eventlog")]) == 0
    )
    assert "secure boot: off" in capsys.readouterr().out


def test_an_invalid_log_exits_1_with_its_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["eventlog", "inspect", str(DATA / "specid-vendordata.bin")]) == 1
    assert "[event_log_invalid]" in capsys.readouterr().err


def test_an_unreadable_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["eventlog", "inspect", str(tmp_path / "missing")]) == 2
    assert "No such file" in capsys.readouterr().err


def test_learned_policy_loads_and_admits_its_own_log(capsys: pytest.CaptureFixture[str]) -> None:
    log_file = DATA / "rhel8-uefi.bin"
    assert cli.main(["policy", "learn", "--event-log", str(log_file), "--name", "rhel8"]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    policy = measuredboot.policy_from_obj(doc["measured_boot"])
    log = eventlog.parse(log_file.read_bytes())
    facts = bootevents.facts(log.events, bank="sha256", pcrs=range(8))
    assert measuredboot.enforce(policy, facts).matched_class == "rhel8"
