"""``disk_keys`` in the config: off unless present, and no config that would release a key without
an enforced quote policy starts (``nodegate serve`` and ``config validate`` refuse it, naming why)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from bootstrap.cli.main import main as cli_main
from bootstrap.config import ConfigError, Settings, settings_from_obj

PCR = {"name": "fleet", "golden": {"sha256": {0: ["00" * 32]}}}
PCRS = {"classes": [PCR]}
NO_LOG = {"classes": ["fleet"], "require_measured_boot": False}
BOOT = {"name": "fleet-mb", "authorities": ["sha256:" + "ab" * 32]}


def test_off_unless_configured() -> None:
    assert Settings().disk_keys is None


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        ({"disk_keys": {"classes": ["fleet"], "require_measured_boot": False}}, "not enforced classes"),
        ({"pcr_policy": {"classes": [{**PCR, "mode": "warn"}]},
          "disk_keys": {"classes": ["fleet"], "require_measured_boot": False}}, "not enforced classes"),
        ({"pcr_policy": PCRS, "disk_keys": {"classes": ["fleet"]}}, "require_measured_boot needs"),
        ({"pcr_policy": {"classes": [PCR]}, "disk_keys": {"classes": []}}, "disk_keys.classes"),
        ({"pcr_policy": {"classes": [PCR]}, "disk_keys": {"classes": ["fleet"], "secret_name": "Bad_Name"}},
         "secret_name"),
        ({"pcr_policy": {"classes": [PCR]}, "disk_keys": {"classes": ["fleet"], "typo": 1}}, "typo"),
    ],
)  # fmt: skip
def test_a_config_that_would_release_keys_without_a_quote_policy_is_refused(
    doc: dict[str, Any], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError, match=needle):
        settings_from_obj(doc)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state"), **doc}))
    assert cli_main(["serve", "--config", str(path)]) == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "state").exists()  # refused before anything was made


@pytest.mark.parametrize(
    "doc",
    [
        {"pcr_policy": PCRS, "disk_keys": NO_LOG},
        {"pcr_policy": {"classes": [PCR]}, "measured_boot": {"classes": [BOOT]},
         "disk_keys": {"classes": ["fleet-mb", "fleet"]}},
    ],
)  # fmt: skip
def test_enforced_classes_are_accepted(doc: dict[str, Any]) -> None:
    keys = settings_from_obj(doc).disk_keys
    assert keys is not None
    assert keys.secret_name == "nodegate-disk-keys"
