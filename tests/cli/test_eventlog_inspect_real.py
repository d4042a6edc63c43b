"""``nodegate eventlog inspect`` on real firmware logs: the H-CRTM log with its SM3-256 bank, and a
forged log whose uninterpreted event is listed with its reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bootstrap import cli
from tests.support import eventlogs as el
from tests.support.shared_data import shared

LOGS = shared("eventlogs")


def test_inspect_shows_the_hcrtm_and_every_bank(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["eventlog", "inspect", "-o", "json", str(LOGS.file("tss-hcrtm.bin"))]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["hcrtm"] is True
    assert doc["banks"] == ["sha1", "sha256", "sm3_256"]
    assert doc["pcrs"]["sha1"]["0"] == "15f4e6ca457d1af6bc49511a93ba3500ad69acc5"  # tpm2-tss's value
    assert doc["uninterpreted"] == []


def test_inspect_lists_what_has_no_vouched_for_meaning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = [*el.boot(), el.secure_boot(True)]  # a SecureBoot variable after PCR 7's separator
    (tmp_path / "log").write_bytes(el.build(events))
    assert cli.main(["eventlog", "inspect", "-o", "json", str(tmp_path / "log")]) == 0
    (item,) = json.loads(capsys.readouterr().out)["uninterpreted"]
    assert item["event"] == len(events)
    assert item["reason"] == "variable SecureBoot after PCR 7's separator"
    assert cli.main(["eventlog", "inspect", str(tmp_path / "log")]) == 0
    assert "variable SecureBoot after PCR 7's separator" in capsys.readouterr().out
