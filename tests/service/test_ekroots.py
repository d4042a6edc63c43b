"""ek_roots: PEM and DER files and folders, unusable files skipped by name (never fatal, never
wider trust), root stores with their verified manifest (the vendor store from Debian's package is
tests/service/test_packaged_store.py and test_ek_aia.py)."""

from __future__ import annotations

import base64
import functools
import json
import logging
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from attest import certparse, tpm
from attest.errors import EkUntrusted
from bootstrap.config import load_settings, settings_from_obj
from bootstrap.service.join import ekroots
from bootstrap.service.join.ekroots import MANIFEST, load_ek_trust, load_roots
from tests.attest import ekbuild as b
from tests.support.service import EkCa, running, settings_for

# The test CAs are made when a test first asks (functools.cache), not at import: built by the
# installed cryptography, a refusal there fails the tests that use them, not the collection.


@functools.cache
def nuvoton_root() -> b.Ca:
    root_name = b.nuvoton_name()
    return b.make_ca(root_name.name, edit=b.replace_in_tbs(root_name.sorted_der, root_name.vendor_der))


@functools.cache
def intel_root() -> b.Ca:
    return b.make_ca(
        b.cn("OnDie CA Root Cert Signing"),
        edit=b.replace_in_tbs(b.ECDSA_SHA384, b.ECDSA_SHA384_NULL),
        outer_alg=lambda alg: alg.replace(b.ECDSA_SHA384, b.ECDSA_SHA384_NULL),
    )


@functools.cache
def vendor_root() -> b.Ca:
    return b.make_ca(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Infineon Technologies AG")]))


@functools.cache
def vendor_inter() -> b.Ca:
    return b.make_ca(b.cn("Infineon OPTIGA(TM) RSA Manufacturing CA 035"), parent=vendor_root())


@functools.cache
def _ek() -> tuple[bytes, bytes]:
    key, public = b.ek_pair("rsa")
    return public, b.issue_ek(vendor_inter(), b.ek_builder(vendor_inter().name, key, san=b.cn("tpm")))


def ek_public() -> bytes:
    return _ek()[0]


def ek_cert() -> bytes:
    return _ek()[1]


def pem(der: bytes) -> bytes:
    body = base64.encodebytes(der)
    return b"-----BEGIN CERTIFICATE-----\n" + body + b"-----END CERTIFICATE-----\n"


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_pem_der_bundles_and_folders_load(tmp_path: Path) -> None:
    folder = tmp_path / "roots"
    _write(folder / "root.pem", pem(vendor_root().der))
    _write(folder / "inter.der", vendor_inter().der)
    bundle = _write(tmp_path / "bundle.pem", b"# comment\n" + pem(nuvoton_root().der) + pem(intel_root().der))
    amd_like = _write(tmp_path / "ica.der", vendor_inter().der + b"\n")  # a trailing newline, as published
    roots = load_roots([folder, bundle, amd_like])
    assert roots.skipped == ()
    assert {c.sha256 for c in roots.anchors} == {
        b.sha256(d) for d in (vendor_root().der, nuvoton_root().der, intel_root().der)
    }
    assert [c.der for c in roots.intermediates] == [vendor_inter().der]  # the same CA once
    assert roots.origins[roots.intermediates[0].sha256] == folder / "inter.der"
    ident = tpm.verify_ek(ek_public(), ek_cert(), roots=roots.anchors, intermediates=roots.intermediates)
    assert ident.trusted_by == "chain:O=Infineon Technologies AG"


def test_unusable_files_are_skipped_by_name_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "roots"
    good = _write(folder / "root.pem", pem(vendor_root().der))
    readme = _write(folder / "README.md", b"vendor roots, see the wiki\n")
    broken = _write(folder / "broken.der", vendor_inter().der[:-10])
    leaf = _write(folder / "leaf.der", ek_cert())
    _write(folder / "old" / "retired.pem", pem(intel_root().der))
    _write(folder / "..data" / "hidden.pem", pem(intel_root().der))  # a ConfigMap's real files
    mixed = _write(tmp_path / "mixed.pem", pem(vendor_inter().der) + pem(b"\x30\x03\x02\x01\x01"))
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
    assert [c.sha256 for c in trust.roots] == [b.sha256(vendor_root().der)]
    assert [c.der for c in trust.intermediates] == [vendor_inter().der]  # the good block of the bundle
    assert trust.origins[trust.roots[0].sha256] == good
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert all(any(str(p) in line for line in logged) for p in reasons)
    assert trust.skipped_lines()[0].startswith(str(next(iter(reasons))))


def test_skipping_a_root_never_widens_trust(tmp_path: Path) -> None:
    """The root file is damaged: the service still starts, and this EK is refused, not accepted."""
    root = _write(tmp_path / "root.pem", pem(vendor_root().der)[:-40] + b"\n-----END CERTIFICATE-----\n")
    inter = _write(tmp_path / "inter.pem", pem(vendor_inter().der))
    trust = load_ek_trust(settings_from_obj({"ek_roots": [str(root), str(inter)]}))
    assert [p for p, _ in trust.skipped] == [root]
    with pytest.raises(EkUntrusted, match="does not chain"):
        tpm.verify_ek(ek_public(), ek_cert(), roots=trust.roots, intermediates=trust.intermediates)


# -- the vendor root store --------------------------------------------------------------------------


def write_store(store: Path, certs: dict[str, bytes]) -> Path:
    """A root store as an operator pins one (or `nodegate ek roots import` writes it): one PEM file
    per certificate and a manifest.json with each file's SHA-256."""
    files = []
    for name, der in certs.items():
        cert = certparse.read_certificate(der, trailing=certparse.FILE_WHITESPACE)
        _write(store / name, pem(der))
        files.append(
            ekroots.ManifestEntry(
                file=name,
                vendor=name.split("/")[0],
                sha256=b.sha256(der),
                subject=cert.name(),
                not_after=cert.view.not_valid_after_utc.isoformat(),
                role="root" if cert.self_issued else "intermediate",
                source={"path": name},
            ).to_json()
        )
    doc = {"format": ekroots.MANIFEST_FORMAT, "files": files}
    _write(store / MANIFEST, json.dumps(doc).encode())
    return store


def test_a_store_with_a_manifest_loads_as_an_ek_roots_folder(tmp_path: Path) -> None:
    store = write_store(
        tmp_path / "store",
        {
            "nuvoton/root.pem": nuvoton_root().der,
            "intel/root.pem": intel_root().der,
            "infineon/root.pem": vendor_root().der,
            "infineon/inter.pem": vendor_inter().der,
        },
    )
    config = _write(tmp_path / "conf" / "nodegate.yaml", f"ek_roots: [{store}]\n".encode())
    trust = load_ek_trust(load_settings(config))
    assert trust.skipped == ()
    assert len(trust.roots) == 3
    assert {c.der for c in trust.roots} >= {nuvoton_root().der, intel_root().der}
    assert set(trust.provenance.values()) == {ekroots.CONFIG}
    ident = tpm.verify_ek(ek_public(), ek_cert(), roots=trust.roots, intermediates=trust.intermediates)
    assert ident.trusted_by == "chain:O=Infineon Technologies AG"


def _store(tmp_path: Path) -> Path:
    return write_store(
        tmp_path / "store",
        {
            "infineon/root.pem": vendor_root().der,
            "infineon/inter.pem": vendor_inter().der,
            "nuvoton/root.pem": nuvoton_root().der,
        },
    )


def _entry(store: Path, subject_part: str) -> Path:
    rows = json.loads((store / MANIFEST).read_text())["files"]
    return store / next(r["file"] for r in rows if subject_part in r["subject"])


def test_a_store_file_whose_fingerprint_differs_is_skipped(tmp_path: Path) -> None:
    store = _store(tmp_path)
    swapped = _entry(store, "Infineon")  # the root, replaced by another CA
    swapped.write_bytes(pem(intel_root().der))
    extra = _write(store / "other" / "sneaked-in.pem", pem(intel_root().der))
    roots = load_roots([store])
    reasons = dict(roots.skipped)
    assert "does not match manifest.json" in reasons[swapped]
    assert reasons[extra] == "not listed in manifest.json"
    assert intel_root().der not in {c.der for c in roots.anchors}
    with pytest.raises(EkUntrusted):
        tpm.verify_ek(ek_public(), ek_cert(), roots=roots.anchors, intermediates=roots.intermediates)


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
    assert roots.skipped == ((Path("vendors"), roots.skipped[0][1]),)
    assert str(tmp_path / "not-installed") in roots.skipped[0][1]
    assert "docs/ek-roots.md" in roots.skipped[0][1]
    assert ekroots.vendor_store() is None


def test_a_pinned_copy_of_the_store_is_verified_the_same_way(tmp_path: Path) -> None:
    store = _store(tmp_path)
    pinned = tmp_path / "pinned"
    subprocess.run(["cp", "-r", str(store), str(pinned)], check=True)
    assert load_roots([pinned]).skipped == ()
    rows = json.loads((pinned / MANIFEST).read_text())
    rows["files"] = [r for r in rows["files"] if "Nuvoton" not in r["subject"]]  # the user drops a vendor
    (pinned / MANIFEST).write_text(json.dumps(rows))
    roots = load_roots([pinned])
    assert nuvoton_root().der not in {c.der for c in roots.anchors}
    assert [why for _, why in roots.skipped] == ["not listed in manifest.json"]


def test_store_files_are_the_vendor_bytes(tmp_path: Path) -> None:
    store = _store(tmp_path)
    text = _entry(store, "Nuvoton").read_bytes()
    assert base64.b64decode(b"".join(text.splitlines()[1:-1])) == nuvoton_root().der
    assert timedelta(0) < nuvoton_root().cert.not_valid_after_utc - b.NOW


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
