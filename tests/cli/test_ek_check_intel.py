"""``nodegate ek check --roots <the public CA collection>`` on Intel's real PTT EK certificates: the
``encoded-default`` quirk is shown, the SPTH one is trusted, the GLK one is untrusted (its
intermediate is not public), neither is malformed."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from urllib.parse import unquote

import pytest

from bootstrap import cli
from bootstrap.service.join import ekroots
from tests.support import realtpm
from tests.support.shared_data import shared


def _der(name: str, tmp_path: Path) -> Path:
    value = unquote(json.loads(realtpm.data(name))["certificate"])
    path = tmp_path / (Path(name).stem + ".der")
    path.write_bytes(base64.b64decode(value + "=" * (-len(value) % 4), altchars=b"-_", validate=True))
    return path


def _check(
    args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, str]:
    monkeypatch.delenv(ekroots.STORE_ENV, raising=False)
    code = cli.main(["ek", "check", "--roots", str(shared("ek-roots").folder()), *args])
    return code, capsys.readouterr().out


def test_the_real_spth_certificate_is_trusted_with_its_quirk_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cert = _der("ftpm/intel-ptt-ek-rsa-answer.json", tmp_path)
    public = tmp_path / "ek.pub"
    public.write_bytes(realtpm.data("ftpm/intel-ptt-ek-rsa.pub"))
    code, out = _check(["--ek-public", str(public), str(cert)], capsys, monkeypatch)
    assert code == 0
    assert "quirk      encoded-default: an explicitly encoded DEFAULT FALSE" in out
    assert "the certificate certifies this key" in out
    assert "[1] intermediate   CN=www.intel.com,OU=TPM EK intermediate for SPTH_EPID_PROD" in out
    assert "verdict      trusted (chain:CN=www.intel.com,OU=TPM EK root cert signing," in out


def test_the_real_glk_certificate_is_untrusted_not_malformed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out = _check([str(_der("ftpm/intel-ptt-ek-ecc-glk-answer.json", tmp_path))], capsys, monkeypatch)
    assert code == 1
    assert "quirk      encoded-default" in out
    assert "verdict      refused [ek_untrusted]" in out
