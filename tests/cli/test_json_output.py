"""``-o json`` on join, renew and attest (a real swtpm against a real served service) and on
``gate --once``: one object on stdout with stable field names."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap import cli
from bootstrap.cli.gate import report_json
from bootstrap.gate import GateReport
from tests.cli.test_ek_cli import _pem, nuvoton_chain
from tests.cli.test_eventlog_cli import logs  # noqa: F401  (fixture)
from tests.service.test_join_e2e import TD, Served, served  # noqa: F401  (fixture)
from tests.support.swtpms import TpmInfo


def _node(s: Served, tpm: TpmInfo, tmp: Path, *argv: str) -> dict[str, object]:
    bundle = s.bundle(tmp / "bundle.pem")
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "bootstrap.cli", *argv, "--server", s.url, "--ca-bundle", str(bundle)),
            *("--tcti", tpm.tcti, "--attempts", "3", "-o", "json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, object] = json.loads(proc.stdout)
    return doc


def test_join_renew_attest_json(served: Served, swtpm: TpmInfo, tmp_path: Path) -> None:  # noqa: F811
    out = tmp_path / "node"
    joined = _node(served, swtpm, tmp_path, "join", "--node-name", "json-1", "--out", str(out))
    assert set(joined) == {"node_name", "spiffe_id", "svid_expires_at", "files"}
    assert joined["spiffe_id"] == f"spiffe://{TD}/node/json-1"
    assert str(out / "svid.pem") in joined["files"].values()  # type: ignore[attr-defined]
    renewed = _node(served, swtpm, tmp_path, "renew", "--dir", str(out))
    assert renewed["renewed"] is False
    assert set(renewed) == {"renewed", "spiffe_id", "svid_expires_at", "renew_below_seconds", "files"}
    attested = _node(served, swtpm, tmp_path, "attest", "--dir", str(out))
    assert attested == {
        "how": "renewed",
        "spiffe_id": joined["spiffe_id"],
        "svid_expires_at": attested["svid_expires_at"],
    }
    # one form of the expiry everywhere (issue 34: renew said ...Z, attest ...+00:00)
    for doc in (joined, renewed, attested):
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", str(doc["svid_expires_at"])), doc


def test_gate_once_report_json() -> None:
    report = GateReport(nodes=3, held={"unattested": 1, "packages-pending": 1}, released=1, writes=4)
    assert json.loads(report_json(report)) == {
        "nodes": 3,
        "held": {"packages-pending": 1, "unattested": 1},
        "released": 1,
        "writes": 4,
        "errors": [],
    }


def test_ek_check_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "roots"
    folder.mkdir()
    chain = nuvoton_chain()
    (folder / "root.pem").write_bytes(_pem(chain.root.der))
    (folder / "inter.der").write_bytes(chain.inter.der)
    (tmp_path / "ek.der").write_bytes(chain.leaf)
    assert (
        cli.main(["ek", "check", "--roots", str(folder), "-o", "json", "--", str(tmp_path / "ek.der")]) == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["trusted"] is True
    assert doc["code"] is None
    assert doc["trusted_by"].startswith("chain:")
    assert doc["report"][-1].startswith("verdict")
    assert cli.main(["ek", "check", "-o", "json", "--", str(tmp_path / "ek.der")]) == 1  # no roots
    doc = json.loads(capsys.readouterr().out)
    assert (doc["trusted"], doc["code"]) == (False, "ek_untrusted")


def test_policy_learn_json(logs: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    log_file = logs / "old-shim-authority"
    assert cli.main(["policy", "learn", "--event-log", str(log_file), "--name", "shim", "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["measured_boot"]["classes"][0]["name"] == "shim"
