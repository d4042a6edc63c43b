"""ek_roots: PEM and DER files and folders, unusable files skipped by name (never fatal, never
wider trust), the vendor root store with its verified manifest, and scripts/refresh-ek-roots.py."""

from __future__ import annotations

import base64
import importlib.util
import json
import logging
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from types import ModuleType

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import NameOID

from attest import tpm
from attest.errors import EkUntrusted
from bootstrap.config import load_settings, settings_from_obj
from bootstrap.service import ekroots
from bootstrap.service.ekroots import MANIFEST, load_ek_trust, load_roots
from tests.attest import ekbuild as b
from tests.support.service import EkCa, running, settings_for

ROOT_NAME = b.nuvoton_name()
NUVOTON_ROOT = b.make_ca(ROOT_NAME.name, edit=b.replace_in_tbs(ROOT_NAME.sorted_der, ROOT_NAME.vendor_der))
INTEL_ROOT = b.make_ca(
    b.cn("OnDie CA Root Cert Signing"),
    edit=b.replace_in_tbs(b.ECDSA_SHA384, b.ECDSA_SHA384_NULL),
    outer_alg=lambda alg: alg.replace(b.ECDSA_SHA384, b.ECDSA_SHA384_NULL),
)
VENDOR_ROOT = b.make_ca(
    x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Infineon Technologies AG")])
)
VENDOR_INTER = b.make_ca(b.cn("Infineon OPTIGA(TM) RSA Manufacturing CA 035"), parent=VENDOR_ROOT)
EK_KEY, EK_PUBLIC = b.ek_pair("rsa")
EK_CERT = b.issue_ek(VENDOR_INTER, b.ek_builder(VENDOR_INTER.name, EK_KEY, san=b.cn("tpm")))


def pem(der: bytes) -> bytes:
    body = base64.encodebytes(der)
    return b"-----BEGIN CERTIFICATE-----\n" + body + b"-----END CERTIFICATE-----\n"


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_pem_der_bundles_and_folders_load(tmp_path: Path) -> None:
    folder = tmp_path / "roots"
    _write(folder / "root.pem", pem(VENDOR_ROOT.der))
    _write(folder / "inter.der", VENDOR_INTER.der)
    bundle = _write(tmp_path / "bundle.pem", b"# comment\n" + pem(NUVOTON_ROOT.der) + pem(INTEL_ROOT.der))
    amd_like = _write(tmp_path / "ica.der", VENDOR_INTER.der + b"\n")  # a trailing newline, as published
    roots = load_roots([folder, bundle, amd_like])
    assert roots.skipped == ()
    assert {c.sha256 for c in roots.anchors} == {
        b.sha256(d) for d in (VENDOR_ROOT.der, NUVOTON_ROOT.der, INTEL_ROOT.der)
    }
    assert [c.der for c in roots.intermediates] == [VENDOR_INTER.der]  # the same CA once
    assert roots.origins[roots.intermediates[0].sha256] == folder / "inter.der"
    ident = tpm.verify_ek(EK_PUBLIC, EK_CERT, roots=roots.anchors, intermediates=roots.intermediates)
    assert ident.trusted_by == "chain:O=Infineon Technologies AG"


def test_unusable_files_are_skipped_by_name_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "roots"
    good = _write(folder / "root.pem", pem(VENDOR_ROOT.der))
    readme = _write(folder / "README.md", b"vendor roots, see the wiki\n")
    broken = _write(folder / "broken.der", VENDOR_INTER.der[:-10])
    leaf = _write(folder / "leaf.der", EK_CERT)
    _write(folder / "old" / "retired.pem", pem(INTEL_ROOT.der))
    _write(folder / "..data" / "hidden.pem", pem(INTEL_ROOT.der))  # a ConfigMap's real files
    mixed = _write(tmp_path / "mixed.pem", pem(VENDOR_INTER.der) + pem(b"\x30\x03\x02\x01\x01"))
    missing = tmp_path / "nowhere.pem"
    settings = settings_from_obj({"ek_roots": [str(folder), str(mixed), str(missing)]})
    with caplog.at_level(logging.WARNING, logger="nodegate.ekroots"):
        trust = load_ek_trust(settings)
    reasons = dict(trust.skipped)
    assert set(reasons) == {readme, broken, leaf, folder / "old", mixed, missing}
    assert "not DER" in reasons[readme]
    assert "not DER" in reasons[broken]
    assert "not a CA certificate" in reasons[leaf]
    assert "subfolder" in reasons[folder / "old"]
    assert reasons[mixed].startswith("certificate 2 of 2: ")
    assert "No such file" in reasons[missing]
    assert [c.sha256 for c in trust.roots] == [b.sha256(VENDOR_ROOT.der)]
    assert [c.der for c in trust.intermediates] == [VENDOR_INTER.der]  # the good block of the bundle
    assert trust.origins[trust.roots[0].sha256] == good
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert all(any(str(p) in line for line in logged) for p in reasons)
    assert trust.skipped_lines()[0].startswith(str(next(iter(reasons))))


def test_skipping_a_root_never_widens_trust(tmp_path: Path) -> None:
    """The root file is damaged: the service still starts, and this EK is refused, not accepted."""
    root = _write(tmp_path / "root.pem", pem(VENDOR_ROOT.der)[:-40] + b"\n-----END CERTIFICATE-----\n")
    inter = _write(tmp_path / "inter.pem", pem(VENDOR_INTER.der))
    trust = load_ek_trust(settings_from_obj({"ek_roots": [str(root), str(inter)]}))
    assert [p for p, _ in trust.skipped] == [root]
    with pytest.raises(EkUntrusted, match="does not chain"):
        tpm.verify_ek(EK_PUBLIC, EK_CERT, roots=trust.roots, intermediates=trust.intermediates)


# -- the vendor root store --------------------------------------------------------------------------


def _script() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "scripts" / "refresh-ek-roots.py"
    spec = importlib.util.spec_from_file_location("refresh_ek_roots", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["refresh_ek_roots"] = module
    spec.loader.exec_module(module)
    return module


REFRESH = _script()


def _git_source(folder: Path) -> str:
    """A git checkout holding vendor CAs (and a leaf and a README that must be left out)."""
    _write(folder / "tpm_cert_store" / "NUVO_2111.pem", pem(NUVOTON_ROOT.der))
    _write(folder / "tpm_cert_store" / "ifx_root.der", VENDOR_ROOT.der)
    _write(folder / "intel" / "OnDie_CA_RootCA.cer", INTEL_ROOT.der)
    _write(folder / "bundle.pem", pem(VENDOR_INTER.der) + pem(EK_CERT))
    _write(folder / "README.md", b"not read\n")

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(folder), *args], capture_output=True, text=True, check=True
        ).stdout

    git("init", "-q")
    git("remote", "add", "origin", "https://github.com/example/tpm-roots.git")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "-qm", "roots")
    return git("rev-parse", "HEAD").strip()


def test_refresh_builds_a_store_with_provenance_and_nodegate_loads_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    commit = _git_source(tmp_path / "src")
    store = tmp_path / "store"
    assert REFRESH.main(["--store", str(store), str(tmp_path / "src")]) == 0
    report = capsys.readouterr().out
    assert "4 CA certificates (4 added, 0 removed, 0 kept)" in report
    assert "per vendor: infineon 2, intel 1, nuvoton 1" in report
    assert "bundle.pem#2: not a CA certificate" in report
    doc = json.loads((store / MANIFEST).read_text())
    assert doc["format"] == ekroots.MANIFEST_FORMAT
    rows = {row["source"]["path"]: row for row in doc["files"]}
    nuvoton = rows["tpm_cert_store/NUVO_2111.pem"]
    assert nuvoton["source"] == {
        "repo": "example/tpm-roots",
        "commit": commit,
        "path": "tpm_cert_store/NUVO_2111.pem",
    }
    assert (nuvoton["vendor"], nuvoton["role"], nuvoton["quirks"]) == ("nuvoton", "root", ["unsorted-set"])
    assert nuvoton["sha256"] == b.sha256(NUVOTON_ROOT.der)
    assert nuvoton["not_after"] == NUVOTON_ROOT.cert.not_valid_after_utc.isoformat()
    assert rows["bundle.pem#1"]["role"] == "intermediate"
    monkeypatch.setenv(ekroots.STORE_ENV, str(store))
    config = _write(tmp_path / "conf" / "nodegate.yaml", b"ek_roots: [vendors]\n")
    settings = load_settings(config)
    assert settings.ek_roots == (Path("vendors"),)
    trust = load_ek_trust(settings)
    assert trust.skipped == ()
    assert len(trust.roots) == 3
    assert {c.der for c in trust.roots} >= {NUVOTON_ROOT.der, INTEL_ROOT.der}
    ident = tpm.verify_ek(EK_PUBLIC, EK_CERT, roots=trust.roots, intermediates=trust.intermediates)
    assert ident.trusted_by == "chain:O=Infineon Technologies AG"


def test_refresh_reports_what_changed_and_expires(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src"
    _write(src / "a.pem", pem(VENDOR_ROOT.der))
    _write(src / "b.pem", pem(INTEL_ROOT.der))
    store = tmp_path / "store"
    assert REFRESH.main(["--store", str(store), str(src)]) == 0
    capsys.readouterr()
    (src / "b.pem").unlink()
    soon = b.make_ca(b.cn("Nationz TPM CA"), parent=VENDOR_ROOT)
    short = (
        b.ca_builder(b.cn("STM TPM EK Intermediate CA 06"), VENDOR_ROOT.name, soon.key.public_key(), days=10)
        .sign(VENDOR_ROOT.key, hashes.SHA384())
        .public_bytes(serialization.Encoding.DER)
    )
    _write(src / "c.der", short)
    assert REFRESH.main(["--store", str(store), "--dry-run", str(src)]) == 0
    dry = capsys.readouterr().out
    assert "2 CA certificates (1 added, 1 removed, 1 kept)" in dry
    assert "added   stmicro    intermediate CN=STM TPM EK Intermediate CA 06" in dry
    assert "removed intel      root         CN=OnDie CA Root Cert Signing" in dry
    assert "expires" in dry
    assert "STM TPM EK Intermediate CA 06" in dry.split("expires", 1)[1]
    assert len(json.loads((store / MANIFEST).read_text())["files"]) == 2  # a dry run writes nothing
    assert REFRESH.main(["--store", str(store), str(src)]) == 0
    files = sorted(p.name for p in store.rglob("*.pem"))
    assert len(files) == 2
    assert not any("OnDie" in f for f in files)
    assert REFRESH.main(["--store", str(store), str(tmp_path / "missing")]) == 2
    empty = _write(tmp_path / "empty" / "x.txt", b"")
    assert REFRESH.main(["--store", str(store), str(empty.parent)]) == 1


def test_refresh_takes_provenance_from_a_recorded_manifest(tmp_path: Path) -> None:
    """Collections that record each file's source (repo, commit, path) in a manifest.json."""
    src = tmp_path / "collection"
    _write(src / "nuvoton" / "NUVO_2111.pem", pem(NUVOTON_ROOT.der))
    recorded = {
        "repo": "keylime/keylime",
        "commit": "9b1f6e6a917f86c792bac680ea7d36312d5914a5",
        "path": "tpm_cert_store/NUVO_2111.pem",
    }
    _write(
        src / "manifest.json",
        json.dumps(
            {"entries": [{"file": "nuvoton/NUVO_2111.pem", "vendor": "nuvoton", "source": recorded}]}
        ).encode(),
    )
    entries, _, _ = REFRESH.collect([src])
    assert [dict(e.source) for e in entries] == [recorded]


def _store(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    _write(src / "root.pem", pem(VENDOR_ROOT.der))
    _write(src / "inter.pem", pem(VENDOR_INTER.der))
    _write(src / "nuvoton.pem", pem(NUVOTON_ROOT.der))
    store = tmp_path / "store"
    assert REFRESH.main(["--store", str(store), str(src)]) == 0
    return store


def _entry(store: Path, subject_part: str) -> Path:
    rows = json.loads((store / MANIFEST).read_text())["files"]
    return store / next(r["file"] for r in rows if subject_part in r["subject"])


def test_a_store_file_whose_fingerprint_differs_is_skipped(tmp_path: Path) -> None:
    store = _store(tmp_path)
    swapped = _entry(store, "Infineon")  # the root, replaced by another CA
    swapped.write_bytes(pem(INTEL_ROOT.der))
    extra = _write(store / "other" / "sneaked-in.pem", pem(INTEL_ROOT.der))
    roots = load_roots([store])
    reasons = dict(roots.skipped)
    assert "does not match manifest.json" in reasons[swapped]
    assert reasons[extra] == "not listed in manifest.json"
    assert INTEL_ROOT.der not in {c.der for c in roots.anchors}
    with pytest.raises(EkUntrusted):
        tpm.verify_ek(EK_PUBLIC, EK_CERT, roots=roots.anchors, intermediates=roots.intermediates)


def test_a_broken_manifest_skips_the_whole_store(tmp_path: Path) -> None:
    store = _store(tmp_path)
    doc = json.loads((store / MANIFEST).read_text())
    for bad in (
        {"format": "other", "files": []},
        {"format": ekroots.MANIFEST_FORMAT, "files": {}},
        "[",
        {"format": ekroots.MANIFEST_FORMAT, "files": [{"file": "x"}]},
    ):
        (store / MANIFEST).write_text(bad if isinstance(bad, str) else json.dumps(bad))
        roots = load_roots([store])
        assert roots.anchors == ()
        assert [p for p, _ in roots.skipped] == [store / MANIFEST]
        assert "the whole store is skipped" in roots.skipped[0][1]
    doc["files"][0]["file"] = "../../etc/root.pem"
    (store / MANIFEST).write_text(json.dumps(doc))
    assert "outside the store" in dict(load_roots([store]).skipped)[store / "../../etc/root.pem"]


def test_vendors_without_an_installed_store_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ekroots.STORE_ENV, str(tmp_path / "not-installed"))
    roots = load_roots([Path("vendors")])
    assert roots.anchors == ()
    assert roots.skipped == ((tmp_path / "not-installed", roots.skipped[0][1]),)
    assert "docs/ek-roots.md" in roots.skipped[0][1]
    monkeypatch.delenv(ekroots.STORE_ENV)
    assert ekroots.vendor_store() == ekroots.PACKAGED_STORE


def test_a_pinned_copy_of_the_store_is_verified_the_same_way(tmp_path: Path) -> None:
    store = _store(tmp_path)
    pinned = tmp_path / "pinned"
    subprocess.run(["cp", "-r", str(store), str(pinned)], check=True)
    assert load_roots([pinned]).skipped == ()
    rows = json.loads((pinned / MANIFEST).read_text())
    rows["files"] = [r for r in rows["files"] if "Nuvoton" not in r["subject"]]  # the user drops a vendor
    (pinned / MANIFEST).write_text(json.dumps(rows))
    roots = load_roots([pinned])
    assert NUVOTON_ROOT.der not in {c.der for c in roots.anchors}
    assert [why for _, why in roots.skipped] == ["not listed in manifest.json"]


def test_store_files_are_the_vendor_bytes(tmp_path: Path) -> None:
    store = _store(tmp_path)
    text = _entry(store, "Nuvoton").read_bytes()
    assert base64.b64decode(b"".join(text.splitlines()[1:-1])) == NUVOTON_ROOT.der
    assert timedelta(0) < NUVOTON_ROOT.cert.not_valid_after_utc - b.NOW


async def test_a_skipped_root_is_shown_by_readyz_and_counted(tmp_path: Path) -> None:
    """Skipping a root never widens trust, so the service stays ready; but it says which file."""
    bad = tmp_path / "vendor-root.pem"
    bad.write_text("-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n")
    ek_ca = EkCa.create()
    settings = settings_for(tmp_path, ek_ca, ek_roots=[str(ek_ca.write(tmp_path / "good.pem")), str(bad)])
    async with running(settings) as r:
        async with r.http() as http, http.get(f"{r.base}/readyz") as resp:
            text = await resp.text()
        assert resp.status == 200
        assert f"ek_roots skipped: {bad}" in text
        assert b"nodegate_ek_roots_skipped_files 1.0" in r.service.metrics.render()
