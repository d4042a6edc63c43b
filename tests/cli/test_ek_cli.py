"""``nodegate ek check``: the chain, each link, each tolerated quirk, the verdict and its code."""

from __future__ import annotations

import base64
import functools
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest

from bootstrap import cli
from tests.attest import ekbuild as b


@dataclass(frozen=True)
class Chain:
    root: b.Ca
    inter: b.Ca
    ek_public: bytes
    leaf: bytes


@functools.cache
def nuvoton_chain() -> Chain:
    """A Nuvoton-style chain (unsorted RDN sets), made when a test first asks: built by the installed
    cryptography, a refusal there fails the tests that use it, not the collection."""
    root_name, san = b.nuvoton_name(), b.tpm_san_name()
    root = b.make_ca(root_name.name, edit=b.replace_in_tbs(root_name.sorted_der, root_name.vendor_der))
    inter = b.make_ca(b.cn("NPCTxxx ECC384 LeafCA 012111"), parent=root)
    ek_key, ek_public = b.ek_pair("rsa")
    leaf = b.issue_ek(
        inter,
        b.ek_builder(inter.name, ek_key, san=san.name),
        edit=b.replace_in_tbs(san.sorted_der, san.vendor_der),
    )
    return Chain(root, inter, ek_public, leaf)


def _pem(der: bytes) -> bytes:
    return b"-----BEGIN CERTIFICATE-----\n" + base64.encodebytes(der) + b"-----END CERTIFICATE-----\n"


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    out = {
        "root": tmp_path / "roots" / "nuvoton-2111.pem",
        "inter": tmp_path / "roots" / "leafca.der",
        "junk": tmp_path / "roots" / "junk.pem",
        "leaf": tmp_path / "ek.der",
        "padded": tmp_path / "ek-nv.bin",
        "leaf_pem": tmp_path / "ek.pem",
        "ek_public": tmp_path / "ek.pub",
        "tpmt": tmp_path / "ek.tpmt",
        "other_public": tmp_path / "other.pub",
    }
    out["root"].parent.mkdir()
    chain = nuvoton_chain()
    out["root"].write_bytes(_pem(chain.root.der))
    out["inter"].write_bytes(chain.inter.der)
    out["junk"].write_bytes(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    out["leaf"].write_bytes(chain.leaf)
    out["padded"].write_bytes(chain.leaf + b"\xff" * 300)
    out["leaf_pem"].write_bytes(_pem(chain.leaf))
    out["ek_public"].write_bytes(chain.ek_public)
    out["tpmt"].write_bytes(chain.ek_public[2:])
    out["other_public"].write_bytes(b.ek_pair("rsa")[1])
    return out


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(["ek", "check", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_trusted_chain_is_explained_link_by_link(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    folder = str(files["root"].parent)
    code, out, _ = _run(["--roots", folder, str(files["padded"])], capsys)
    assert code == 0
    assert (
        "verdict      trusted (chain:C=TW+CN=Nuvoton TPM Root CA 2111+O=Nuvoton Technology Corporation)"
        in out
    )
    assert "[0] EK certificate <empty subject>" in out
    assert "[1] intermediate   CN=NPCTxxx ECC384 LeafCA 012111" in out
    assert "[2] anchor         C=TW+CN=Nuvoton TPM Root CA 2111" in out
    assert f"from {files['inter']}" in out
    assert "quirk      nv-padding" in out
    assert "quirk      unsorted-set" in out
    assert "ECDSA with sha384, signed by [2]" in out
    assert f"skipped    {files['junk']}" in out  # every root file that was not used is named
    assert "not compared with a TPM's EK" in out


@pytest.mark.parametrize(
    "order",
    [
        ["--roots", "{root}", "{inter}", "{leaf}"],
        ["{leaf}", "--roots", "{root}", "{inter}"],
        ["--roots", "{root}", "--allowlist", "00" * 32, "--roots", "{inter}", "{leaf_pem}"],
        ["--allowlist", "00" * 32, "--roots", "{root}", "--roots", "{inter}", "--", "{leaf}"],
    ],
)
def test_the_certificate_may_follow_the_options(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str], order: list[str]
) -> None:
    args = [a.format(**{k: str(v) for k, v in files.items()}) for a in order]
    code, out, err = _run(args, capsys)
    assert (code, err) == (0, "")
    assert "verdict      trusted" in out


def test_with_the_ek_public_the_service_check_runs(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    roots = ["--roots", str(files["root"]), str(files["inter"])]
    for public in ("ek_public", "tpmt"):
        code, out, _ = _run([*roots, "--ek-public", str(files[public]), str(files["leaf"])], capsys)
        assert code == 0
        assert "EK public    L-1 RSA-2048" in out
        assert "the certificate certifies this key" in out
    code, out, _ = _run([*roots, "--ek-public", str(files["other_public"]), str(files["leaf"])], capsys)
    assert code == 1
    assert "verdict      refused [ek_mismatch]" in out


def test_refusals_name_their_code_and_reason(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(["--roots", str(files["root"]), str(files["leaf"])], capsys)
    assert code == 1
    assert "verdict      refused [ek_untrusted]" in out
    assert "  - EK certificate does not chain to a trusted root" in out
    later = (b.NOW + timedelta(days=4000)).isoformat()
    code, out, _ = _run(
        ["--roots", str(files["root"]), str(files["inter"]), "--at", later, str(files["leaf"])], capsys
    )
    assert code == 1
    assert "expired" in out
    code, out, _ = _run(["--roots", str(files["root"]), str(files["junk"])], capsys)
    assert code == 1
    assert "verdict      refused [malformed_request]" in out


def test_the_allowlist_vouches_without_a_chain(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run([str(files["leaf"])], capsys)
    assert code == 1
    digest = (
        next(line for line in out.splitlines() if "EK SPKI sha256" in line).split("sha256 ")[1].split()[0]
    )
    code, out, _ = _run(["--allowlist", digest.upper(), str(files["leaf"])], capsys)
    assert code == 0
    assert "verdict      trusted (allowlist)" in out
    code, out, _ = _run(
        ["--allowlist", digest, "--ek-public", str(files["ek_public"]), str(files["junk"])], capsys
    )
    assert code == 0  # an allowlisted EK whatever its certificate looks like


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--roots", "r.pem"], "give the EK certificate"),
        ([], "give the EK certificate"),
        (["--allowlist", "abc", "{leaf}"], "not a 64-character hex"),
        (["--roots", "{root}", "{tmp}/missing.der"], "No such file"),
        (["--at", "yesterday", "{leaf}"], "not an RFC 3339 time"),
        (["--at", "2030-01-01T00:00:00", "{leaf}"], "needs a time zone"),
        (["--ek-public", "{tmp}/missing.pub", "{leaf}"], "No such file"),
    ],
)
def test_usage_errors_exit_2(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    values = {k: str(v) for k, v in files.items()} | {"tmp": str(tmp_path)}
    code, _, err = _run([a.format(**values) for a in args], capsys)
    assert code == 2
    assert message in err
