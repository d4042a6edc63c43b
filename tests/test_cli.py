"""The command line: the README's demo runs and shows its refusals; stubs say what is missing."""

from __future__ import annotations

import pytest

from bootstrap import cli


def test_demo_attests_and_refuses(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["demo"]) == 0
    out = capsys.readouterr().out
    assert out.count("quote verified; PCR class demo-fleet") == 2
    assert "tampered boot (PCR 7 extended): pcr_policy_violation" in out
    assert "fresh nonce: nonce_mismatch" in out


def test_unbuilt_commands_say_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["backup"]) == 2
    assert "not built yet" in capsys.readouterr().err
    assert cli.main([]) == 0
    assert cli.kubectl_main([]) == 0
