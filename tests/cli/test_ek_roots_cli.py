"""``nodegate ek roots``: what ek_roots trusts (vendor, subject, fingerprint, expiry, source) and
warnings about expiry and skipped files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bootstrap import cli
from bootstrap.service import ekroots
from tests.service.test_ekroots import NUVOTON_ROOT, VENDOR_INTER, VENDOR_ROOT, _write, pem

GOOGLE_ROOT = "CN=EK/AK CA Root,OU=Google Cloud,O=Google LLC"


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(["ek", "roots", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(autouse=True)
def _packaged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ekroots.STORE_ENV, raising=False)


def test_lists_the_shipped_store_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run([], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"ek_roots     {ekroots.PACKAGED_STORE} (vendors)"
    google = next(line for line in lines if GOOGLE_ROOT in line)
    assert google.split()[:3] == ["google", "root", "2122-07-08"]
    assert "google/go-tpm-tools@" in google
    assert "server/ca-certs/gcp_ek_ak_ca_root.crt" in google
    infineon = [line for line in lines if line.startswith("infineon ")]
    assert len(infineon) >= 100
    assert any("https://pki.infineon.com/" in line for line in infineon)
    summary = lines[-1]
    assert "0 files skipped" in summary
    for vendor in ("infineon", "stmicro", "nuvoton", "intel", "amd", "google"):
        assert f" {vendor} " in summary


def test_warns_about_cas_that_expire_within_a_year_or_have(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(["--at", "2026-01-01T00:00:00Z"], capsys)
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
    _, _, wider = _run(["--at", "2026-01-01T00:00:00Z", "--expiring", "500"], capsys)
    assert any("expires 2027-04-13" in w for w in wider.splitlines())


def test_files_of_a_folder_with_their_path_as_source_and_skipped_ones_warned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "roots"
    _write(folder / "nuvoton.pem", pem(NUVOTON_ROOT.der))
    _write(folder / "bundle.pem", pem(VENDOR_ROOT.der) + pem(VENDOR_INTER.der))
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


def test_a_bad_time_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["--at", "tomorrow"], capsys)[0] == 2
    assert _run(["--at", "2030-01-01T00:00:00"], capsys)[0] == 2
