"""The vendor root store without committed certificates (issue 31): ``ek_roots: [vendors]`` reads
Debian's ruby-tpm-key-attestation, each file checked against the committed table of names and
SHA-256 (bootstrap/service/join/vendorroots.py); scripts/refresh-ek-roots.py checks that table against
a package. The joins through it are tests/service/test_ek_aia.py."""

from __future__ import annotations

import functools
import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

from bootstrap.config import settings_from_obj
from bootstrap.service.join import ekroots, vendorroots
from tests.support.ekvendors import vendor_folder

MAKERS = {"amd", "atmel", "infineon", "intel", "nationz", "nuvoton", "stmicro"}


@functools.cache
def check_script() -> ModuleType:
    """scripts/refresh-ek-roots.py, imported when a test first asks (functools.cache), not at import
    of this module: a script that fails to load fails those tests, not the collection."""
    path = Path(__file__).resolve().parents[2] / "scripts" / "refresh-ek-roots.py"
    spec = importlib.util.spec_from_file_location("refresh_ek_roots", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["refresh_ek_roots"] = module
    spec.loader.exec_module(module)
    return module


def test_the_table_lists_facts_only_and_every_maker() -> None:
    assert len(vendorroots.FILES) == 25
    assert {f.vendor for f in vendorroots.FILES} == MAKERS | {"microsoft"}
    assert all(len(f.sha256) == 64 and int(f.sha256, 16) >= 0 for f in vendorroots.FILES)
    assert [f.file for f in vendorroots.FILES if f.left_out] == [
        "Microsoft/RootCA/Microsoft TPM Root Certificate Authority 2014.cer"
    ]
    tracked = Path(__file__).resolve().parents[2] / "bootstrap"
    assert not list(tracked.rglob("*.pem"))
    assert not list(tracked.rglob("*.cer"))


def test_vendors_out_of_the_box_reads_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(vendorroots.STORE_ENV, str(vendor_folder()))
    trust = ekroots.load_ek_trust(settings_from_obj({"trust_domain": "example.org", "ek_roots": ["vendors"]}))
    assert trust.skipped == ()
    assert len(trust.roots) == 21  # 24 used files: three are intermediates (IFX, STM RSA, STM ECC)
    assert len(trust.intermediates) == 3
    assert set(trust.provenance.values()) == {ekroots.PACKAGE}


def test_the_checker_finds_the_package_as_the_table_says(capsys: pytest.CaptureFixture[str]) -> None:
    assert check_script().main([str(vendor_folder())]) == 0
    out = capsys.readouterr().out
    assert "25 files in the package, 25 in the table, 0 differences" in out
    assert "(left out of vendors)" in out


def test_the_checker_reports_a_changed_and_a_new_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = tmp_path / "certificates"
    shutil.copytree(vendor_folder(), copy)
    victim = copy / "Intel/RootCA/EKRootPublicKey.cer"
    victim.write_bytes(victim.read_bytes()[:-1] + bytes([victim.read_bytes()[-1] ^ 1]))
    shutil.copy(copy / "AMD/RootCA/AMD-fTPM-RSA-RootCA.crt", copy / "AMD/RootCA/copy.crt")
    assert check_script().main([str(copy)]) == 1
    out = capsys.readouterr().out
    assert "differs  Intel/RootCA/EKRootPublicKey.cer" in out
    assert "new      AMD/RootCA/copy.crt" in out
    assert check_script().main(["--table", str(copy)]) == 0
    assert 'VendorFile("AMD/RootCA/copy.crt", "amd", "' in capsys.readouterr().out
    assert check_script().main([str(tmp_path / "missing")]) == 2
