"""`nodegate join`/`renew`/`attest` hand their options to the node agent, including the boot id
file that tests and demos use to play several machines on one host."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bootstrap import cli
from bootstrap.cli import node
from bootstrap.node.defaults import BOOT_ID
from bootstrap.node.errors import JoinUsageError

_COMMON = ("--server", "https://127.0.0.1:1", "--ca-bundle", "bundle.pem")


def _capture(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    seen: list[Any] = []

    async def fake(opts: Any) -> Any:
        seen.append(opts)
        raise JoinUsageError("stopped by the test")  # exit 2 before any network or TPM

    for name in ("join", "renew", "attest"):
        monkeypatch.setattr(node, name, fake)
    return seen


@pytest.mark.parametrize(
    "argv",
    [
        ("join", *_COMMON, "--node-name", "n1"),
        ("renew", *_COMMON),
        ("attest", *_COMMON),
    ],
)
def test_boot_id_file_defaults_to_the_kernels_and_can_be_another(
    argv: tuple[str, ...], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen = _capture(monkeypatch)
    assert cli.main(list(argv)) == 2
    assert cli.main([*argv, "--boot-id-file", str(tmp_path / "boot_id")]) == 2
    assert [opts.boot_id_file for opts in seen] == [BOOT_ID, tmp_path / "boot_id"]
    assert Path("/proc/sys/kernel/random/boot_id") == BOOT_ID
