"""``nodegate ek hash``: the EK's SHA-256 that allowlists take, from a certificate file, a
TPM2B_PUBLIC, or this machine's TPM (a real swtpm), equal to what the service computes."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from attest import tpm
from bootstrap import cli
from bootstrap.node.tpm import Agent
from tests.cli.test_ek_cli import _pem, nuvoton_chain
from tests.support.swtpms import TpmInfo


def _hash(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["ek", "hash", *argv])
    out = capsys.readouterr()
    return code, out.out.strip(), out.err.strip()


def test_certificate_and_public_area_give_the_services_digest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    der, pem, pub = tmp_path / "ek.der", tmp_path / "ek.pem", tmp_path / "ek.pub"
    chain = nuvoton_chain()
    der.write_bytes(chain.leaf)
    pem.write_bytes(_pem(chain.leaf))
    pub.write_bytes(chain.ek_public)
    outs = {_hash(capsys, str(p))[1] for p in (der, pem, pub)}
    assert len(outs) == 1
    digest = outs.pop()
    # the service's own digest of that EK: allowlisting it admits the EK without a certificate
    assert tpm.verify_ek(chain.ek_public, None, roots=[], allowlist={digest}).sha256 == digest
    code, out, _ = _hash(capsys, str(der), "-o", "json")
    assert code == 0
    assert json.loads(out) == {"ek_sha256": digest, "source": "certificate", "file": str(der)}


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (lambda: b"not an ek", "neither an EK certificate nor a TPM2B_PUBLIC"),
        (lambda: _pem(nuvoton_chain().leaf) * 2, "expected one CERTIFICATE block, found 2"),
        (lambda: b"x" * 70_000, "is larger than"),
    ],
    ids=["not-an-ek", "two-certificates", "too-large"],
)
def test_bad_files_are_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: Callable[[], bytes], needle: str
) -> None:
    path = tmp_path / "f"
    path.write_bytes(content())
    code, _, err = _hash(capsys, str(path))
    assert code == 2
    assert needle in err
    assert len(err.splitlines()) == 1


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _hash(capsys, str(tmp_path / "nope.der"))
    assert code == 2
    assert "cannot read" in err


def test_from_the_tpm(swtpm: TpmInfo, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _hash(capsys, "--tcti", swtpm.tcti, "-o", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["source"] == "tpm"
    assert doc["has_certificate"] is True
    # the same digest as the key in the TPM's own EK certificate
    with Agent(swtpm.tcti) as agent:
        _, cert = agent.read_ek_certificate("rsa")
    assert cert is not None
    (tmp_path / "ek.der").write_bytes(cert)
    assert _hash(capsys, str(tmp_path / "ek.der"))[1] == doc["ek_sha256"]
    assert _hash(capsys, "--tcti", swtpm.tcti)[1] == doc["ek_sha256"]
