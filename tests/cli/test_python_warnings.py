"""No Python warning reaches a user's terminal or the JSON log stream as Python prints it: those
that carry nothing are filtered where they arise, the rest become our own log records."""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Iterator

import pytest

from attest import certparse
from bootstrap import cli
from bootstrap.logs import setup as logs
from bootstrap.service.join import ekroots
from tests.support import realtpm
from tests.support.shared_data import shared


@pytest.fixture
def restore() -> Iterator[None]:
    show = warnings.showwarning
    root = logging.getLogger("nodegate")
    handlers, level, propagate = root.handlers[:], root.level, root.propagate
    yield
    warnings.showwarning = show
    root.handlers[:], root.level, root.propagate = handlers, level, propagate


@pytest.mark.usefixtures("restore")
def test_a_warning_becomes_one_json_record(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        logs.capture_warnings()
        warnings.warn("something odd", UserWarning, stacklevel=1)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert record["logger"] == "nodegate.warnings"
    assert record["level"] == "warning"
    assert record["msg"] == "UserWarning: something odd"
    assert record["error"].startswith("test_python_warnings.py:")


def test_real_certificates_with_long_names_load_silently() -> None:
    """Google's CAs and AK certificates have common names longer than X.520's 64 characters."""
    names = [*realtpm.named("ek-certificate"), *realtpm.named("ak-certificate")]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in names:
            cert = certparse.read_certificate(realtpm.certificate_bytes(name))
            cert.name(), cert.view.issuer.rfc4514_string()
        roots = ekroots.load_roots([shared("ek-roots").folder()])
        for c in (*roots.anchors, *roots.intermediates):
            c.name(), c.view.issuer.rfc4514_string()
    assert len(roots.anchors) + len(roots.intermediates) == len(
        ekroots.read_manifest(shared("ek-roots").folder())
    )


@pytest.mark.usefixtures("restore")
def test_cli_output_has_no_python_warning(capsys: pytest.CaptureFixture[str]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert cli.main(["ek", "roots", "--roots", str(shared("ek-roots").folder())]) == 0
    err = capsys.readouterr().err
    assert "Warning:" not in err
    assert all(line.startswith("warning: ") for line in err.splitlines())
