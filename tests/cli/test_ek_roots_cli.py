"""``nodegate ek roots``: what ek_roots trusts (vendor, subject, fingerprint, expiry, source) and
warnings about expiry and skipped files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bootstrap import cli
from bootstrap.service.join import ekroots
from tests.service.test_ekroots import _write, nuvoton_root, pem, vendor_inter, vendor_root
from tests.support.ekvendors import vendor_folder
from tests.support.shared_data import shared


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(["ek", "roots", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def vendors(monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = vendor_folder()
    monkeypatch.setenv(ekroots.STORE_ENV, str(folder))
    return folder


def test_lists_the_package_roots_by_default(vendors: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run([], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"ek_roots     {vendors} (vendors)"
    infineon = [line for line in lines if line.startswith("infineon ")]
    assert len(infineon) == 4
    optiga = next(line for line in infineon if "Infineon OPTIGA(TM) RSA Root CA" in line)
    assert optiga.split()[:5] == ["infineon", "root", "2043-07-25", "899e35474c9807eb", "package"]
    assert optiga.endswith(
        "<-  ruby-tpm-key-attestation 0.11.0-1:Infineon/RootCA/Infineon OPTIGA(TM) RSA Root CA.crt"
    )
    assert any(
        line.startswith("left out ") and "Microsoft TPM Root Certificate Authority 2014" in line
        for line in lines
    )
    summary = lines[-1]
    assert "24 certificates: 21 anchors, 3 intermediates, 0 files skipped" in summary
    for vendor in ("infineon", "stmicro", "nuvoton", "intel", "amd", "atmel", "nationz"):
        assert f" {vendor} " in summary
    assert "google" not in out


def test_warns_about_cas_that_expire_within_a_year_or_have(capsys: pytest.CaptureFixture[str]) -> None:
    collection = str(shared("ek-roots").folder())
    code, _, err = _run(["--roots", collection, "--at", "2026-01-01T00:00:00Z"], capsys)
    assert code == 0
    warnings = err.splitlines()
    assert any(
        w.startswith("warning: expired 2025-10-20: infineon intermediate CN=IFX TPM EK Intermediate CA 01")
        for w in warnings
    )
    assert any(
        w.startswith("warning: expires 2026-12-21: infineon intermediate CN=IFX TPM EK Intermediate CA 02")
        for w in warnings
    )
    assert not any("2027-04-13" in w for w in warnings)  # more than a year after --at
    _, _, wider = _run(["--roots", collection, "--at", "2026-01-01T00:00:00Z", "--expiring", "500"], capsys)
    assert any("expires 2027-04-13" in w for w in wider.splitlines())


def test_files_of_a_folder_with_their_path_as_source_and_skipped_ones_warned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "roots"
    _write(folder / "nuvoton.pem", pem(nuvoton_root().der))
    _write(folder / "bundle.pem", pem(vendor_root().der) + pem(vendor_inter().der))
    junk = _write(folder / "junk.pem", b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    code, out, err = _run(["--roots", str(folder), "--at", "2026-01-01T00:00:00Z", "-o", "json"], capsys)
    assert code == 0
    doc = json.loads(out)
    rows = {row["subject"]: row for row in doc["certificates"]}
    assert len(rows) == 3
    nuvoton = next(row for s, row in rows.items() if "Nuvoton" in s)
    assert nuvoton["vendor"] == "-"
    assert nuvoton["source"] == str(folder / "nuvoton.pem")
    assert nuvoton["role"] == "root"
    assert len(nuvoton["sha256"]) == 64
    assert [s["file"] for s in doc["skipped"]] == [str(junk)]
    assert f"warning: skipped {junk}:" in err


def test_no_anchor_left_is_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junk = _write(tmp_path / "junk.pem", b"not a certificate")
    code, _, err = _run(["--roots", str(junk)], capsys)
    assert code == 1
    assert "no trust anchor" in err


def test_a_bad_time_is_a_usage_error(vendors: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["--at", "tomorrow"], capsys)[0] == 2
    assert _run(["--at", "2030-01-01T00:00:00"], capsys)[0] == 2
