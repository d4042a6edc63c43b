"""The vendor root store nodegate ships (bootstrap/data/ek-roots): `ek_roots: [vendors]` with
nothing else configured loads it, every file verified against its manifest, and the manifest says
where each certificate came from, under which licence and when it was fetched."""

from __future__ import annotations

import json
import re
import subprocess
from datetime import date
from pathlib import Path

import pytest
import yaml

from bootstrap.config import settings_from_obj
from bootstrap.service import ekroots
from tests.attest import ekbuild as b
from tests.service.test_ekroots import INTEL_ROOT, NUVOTON_ROOT, REFRESH, _write, pem

STORE = ekroots.PACKAGED_STORE
VENDORS_SHIPPED = {"infineon", "stmicro", "nuvoton", "intel", "amd", "google", "microsoft", "nationz"}


@pytest.fixture
def unset_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ekroots.STORE_ENV, raising=False)


@pytest.mark.usefixtures("unset_env")
def test_vendors_out_of_the_box_is_the_packaged_store() -> None:
    assert ekroots.vendor_store() == STORE
    trust = ekroots.load_ek_trust(settings_from_obj({"trust_domain": "example.org", "ek_roots": ["vendors"]}))
    assert trust.skipped == ()
    assert len(trust.roots) >= 20
    assert len(trust.intermediates) >= 100
    assert {e.vendor for e in ekroots.load_roots([Path("vendors")]).listed.values()} >= VENDORS_SHIPPED


def test_every_packaged_file_is_listed_with_source_licence_and_date() -> None:
    doc = json.loads((STORE / ekroots.MANIFEST).read_text())
    entries = ekroots.read_manifest(STORE)
    on_disk = {p.relative_to(STORE).as_posix() for p in STORE.rglob("*.pem")}
    assert on_disk == {e.file for e in entries}
    assert len(doc["files"]) == len(entries)
    for e in entries:
        assert e.licence in {"Apache-2.0", "BSD-3-Clause"}, e.file
        assert date.fromisoformat(e.fetched) <= date.today()
        assert re.fullmatch(r"[\w.-]+/[\w.-]+", e.source["repo"]), e.file
        assert re.fullmatch(r"[0-9a-f]{40}", e.source["commit"]), e.file
        assert e.source["path"], e.file
        assert e.file.startswith(e.vendor + "/")
        assert e.sha256[:12] in e.file


def test_vendor_download_urls_are_recorded_where_the_source_lists_them() -> None:
    urls = [e.source["url"] for e in ekroots.read_manifest(STORE) if "url" in e.source]
    assert len(urls) >= 100
    hosts = {u.split("/")[2] for u in urls}
    assert {"pki.infineon.com", "ftpm.amd.com"} <= hosts
    assert all(u.startswith(("https://", "http://")) for u in urls)


def test_the_packaged_store_is_checked_like_any_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy with one byte changed in one file loses that file only (never wider trust)."""
    copy = tmp_path / "store"
    subprocess.run(["cp", "-r", str(STORE), str(copy)], check=True)
    victim = sorted(copy.rglob("*.pem"))[0]
    text = victim.read_bytes().splitlines(keepends=True)
    line = text[3]
    text[3] = (b"A" if line[:1] != b"A" else b"B") + line[1:]
    victim.write_bytes(b"".join(text))
    monkeypatch.setenv(ekroots.STORE_ENV, str(copy))
    roots = ekroots.load_roots([Path("vendors")])
    assert [p for p, _ in roots.skipped] == [victim]
    full = ekroots.load_roots([STORE])
    assert len(roots.anchors) + len(roots.intermediates) == len(full.anchors) + len(full.intermediates) - 1


def test_refresh_records_licence_date_and_download_url(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _write(
        src / "LICENSE", b"                                 Apache License\n   Version 2.0, January 2004\n"
    )
    _write(src / "roots" / "nuvoton.pem", pem(NUVOTON_ROOT.der))
    _write(src / "roots" / "intel.cer", INTEL_ROOT.der)
    listing = {
        "vendors": [
            {
                "id": "INTC",
                "certificates": [
                    {
                        "name": "OnDie CA RootCA",
                        "url": "https://tsci.intel.com/content/OnDieCA/certs/OnDie_CA_RootCA_Certificate.cer",
                        "validation": {"fingerprint": {"sha256": _colons(b.sha256(INTEL_ROOT.der))}},
                    }
                ],
            }
        ]
    }
    _write(src / ".tpm-roots.yaml", yaml.safe_dump(listing).encode())
    for args in (
        ["init", "-q"],
        ["remote", "add", "origin", "https://github.com/example/roots"],
        ["add", "-A"],
    ):
        subprocess.run(["git", "-C", str(src), *args], check=True)
    subprocess.run(
        ["git", "-C", str(src), "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "r"], check=True
    )
    store = tmp_path / "store"
    assert REFRESH.main(["--store", str(store), "--fetched", "2026-12-01", str(src / "roots")]) == 0
    rows = {e.vendor: e for e in ekroots.read_manifest(store)}
    assert rows["intel"].source["url"].startswith("https://tsci.intel.com/")
    assert "url" not in rows["nuvoton"].source
    assert {e.licence for e in rows.values()} == {"Apache-2.0"}
    assert {e.fetched for e in rows.values()} == {"2026-12-01"}
    assert ekroots.load_roots([store]).skipped == ()


def test_a_licence_nodegate_does_not_recognise_is_pointed_at(tmp_path: Path) -> None:
    _write(tmp_path / "COPYING", b"Some other terms\n")
    assert REFRESH._licence(tmp_path) == "see COPYING"
    assert REFRESH._licence(tmp_path / "nothing") == ""


def _colons(hex_digest: str) -> str:
    return ":".join(hex_digest[i : i + 2] for i in range(0, 64, 2)).upper()
