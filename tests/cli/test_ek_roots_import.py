"""``nodegate ek roots import``: roots the operator chose, pinned by SHA-256, from a file, a folder
or a URL (bounded like AIA fetches), and ``nodegate ek roots`` saying where each CA came from."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import pytest

from attest import cloudek
from bootstrap import cli
from bootstrap.config import EkAia
from bootstrap.service.join import ekroots
from bootstrap.service.join.aia import AiaFetcher
from tests.service.test_ekroots import _write, intel_root, nuvoton_root, pem, vendor_root
from tests.support.ekvendors import GCE_PROJECT_ID, aia_server, collection_der, real_ek
from tests.support.shared_data import shared


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(["ek", "roots", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def sha(der: bytes) -> str:
    return hashlib.sha256(der).hexdigest()


def test_a_pinned_file_is_imported_and_listed_as_imported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    src = _write(tmp_path / "nuvoton.pem", pem(nuvoton_root().der))
    code, out, _ = _run(
        ["import", str(src), "--sha256", sha(nuvoton_root().der), "--state-dir", str(state)], capsys
    )
    assert code == 0, out
    assert "1 certificates in" in out
    store = ekroots.imported_store(state)
    assert all(p.stat().st_mode & 0o777 == 0o644 for p in store.iterdir())
    code, out, _ = _run(["--roots", "imported", "--state-dir", str(state), "-o", "json"], capsys)
    assert code == 0
    (row,) = json.loads(out)["certificates"]
    assert (row["origin"], row["source"], row["role"]) == ("imported", str(src.resolve()), "root")
    trust = ekroots.load_roots([Path("imported")], state_dir=state)
    assert [c.der for c in trust.anchors] == [nuvoton_root().der]


def test_an_unpinned_or_missing_certificate_imports_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    folder = tmp_path / "in"
    _write(folder / "a.pem", pem(nuvoton_root().der))
    _write(folder / "b.der", intel_root().der)
    code, _, err = _run(
        ["import", str(folder), "--sha256", sha(nuvoton_root().der), "--state-dir", str(state)], capsys
    )
    assert code == 1
    assert "no --sha256 names" in err
    code, _, err = _run(
        [
            "import",
            str(folder / "a.pem"),
            "--sha256",
            sha(nuvoton_root().der),
            sha(vendor_root().der),
            "--state-dir",
            str(state),
        ],
        capsys,
    )
    assert code == 1
    assert f"no certificate with SHA-256 {sha(vendor_root().der)}" in err
    assert not ekroots.imported_store(state).exists()
    assert _run(["import", str(folder), "--sha256", "xyz", "--state-dir", str(state)], capsys)[0] == 2


async def test_a_url_is_fetched_within_the_aia_limits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Google's EK/AK CA Root from a loopback stand-in of its published URL: marked as a cloud vTPM
    CA (GCE) by its fingerprint, so EKs through it need ek_cloud.gce."""
    url = "http://privateca-content.example/ca.crt"
    der = collection_der("google/EK-AK-CA-Root-594759594b9b.pem")
    state = tmp_path / "state"
    async with aia_server({url: der}) as aia:
        local = aia.mirrors["http://privateca-content.example/"] + "ca.crt"
        refused = await asyncio.to_thread(
            cli.main, ["ek", "roots", "import", local, "--sha256", sha(der), "--state-dir", str(state)]
        )
        assert refused == 1
        assert "not a public address" in capsys.readouterr().err
        args = [
            "ek",
            "roots",
            "import",
            local,
            "--sha256",
            sha(der),
            "--state-dir",
            str(state),
            "--allow-private-addresses",
        ]
        assert await asyncio.to_thread(cli.main, args) == 0
    assert "(cloud vTPM CA: gce; needs ek_cloud)" in capsys.readouterr().out
    entry = ekroots.read_manifest(ekroots.imported_store(state))[0]
    assert (entry.cloud, entry.source["url"], entry.sha256) == ("gce", local, sha(der))
    assert sha(der) in cloudek.KNOWN_CLOUD_CAS


async def test_fetched_intermediates_are_listed_with_their_url(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = "http://secure.globalsign.com/stmtpmekint05.crt"
    der = collection_der("stmicro/STM-TPM-EK-Intermediate-CA-05-870fc181411d.pem")
    state = tmp_path / "state"
    async with aia_server({url: der}) as aia:
        fetcher = AiaFetcher(
            EkAia(mirrors=aia.mirrors, allow_private_addresses=True), ekroots.fetched_cache(state)
        )
        got, why = await fetcher.fetch([url])
    assert (len(got), why) == (1, [])
    root = _write(tmp_path / "root.pem", pem(vendor_root().der))
    code, out, _ = _run(["--roots", str(root), "--state-dir", str(state)], capsys)
    assert code == 0
    line = next(x for x in out.splitlines() if "STM TPM EK Intermediate CA 05" in x)
    assert " fetched " in line
    assert line.endswith(f"<-  {url}")


def test_ek_check_judges_a_gce_ek_as_the_service_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Google's CAs configured: refused without a project binding, trusted with the one it names."""
    ek = real_ek("ek/google-ek-rsa-ekak-ca.pem")
    cert = _write(tmp_path / "ek.der", ek.der)
    roots = [str(shared("ek-roots").file(n)) for n in shared("ek-roots").names("google/EK-AK-CA-*")]
    assert cli.main(["ek", "check", "--roots", *roots, str(cert)]) == 1
    assert "configure ek_cloud.gce.projects" in capsys.readouterr().out
    args = ["ek", "check", "--roots", *roots, "--gce-project", GCE_PROJECT_ID, str(cert)]
    assert cli.main(args) == 0
    assert "verdict      trusted (chain:CN=EK/AK CA Root" in capsys.readouterr().out
