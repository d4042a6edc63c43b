"""A measured_boot rule whose PCRs the quote does not cover is refused when the config loads."""

from __future__ import annotations

import pytest

from bootstrap.config import ConfigError, settings_from_obj


@pytest.mark.parametrize(
    ("rules", "pcrs", "reason"),
    [
        ({"boot_applications": ["11" * 32]}, [0, 1, 2, 3, 7], "boot_applications needs PCR 4"),
        ({"authorities": ["ab" * 32]}, [0, 4], "authorities needs PCR 7"),
        ({"dbx_required": ["11" * 32]}, [4], "dbx_required needs PCR 7"),
        (
            {"kernel_cmdlines": ["ro"], "kernel_cmdline_chains": [["11" * 32]]},
            [0, 1, 2, 3, 4, 5, 6, 7],
            "kernel_cmdlines needs PCR 8",
        ),
    ],
)
def test_rules_need_their_pcrs_quoted(rules: dict[str, object], pcrs: list[int], reason: str) -> None:
    doc = {"pcr_policy": {"pcrs": pcrs}, "measured_boot": {"classes": [{"name": "c", **rules}]}}
    with pytest.raises(ConfigError, match=reason):
        settings_from_obj(doc)


def test_top_level_secure_boot_needs_pcr7() -> None:
    with pytest.raises(ConfigError, match="secure_boot needs PCR 7"):
        settings_from_obj({"pcr_policy": {"pcrs": [0, 4]}, "measured_boot": {"secure_boot": "required"}})


def test_the_default_selection_covers_the_pcr0_to_7_rules() -> None:
    rules = {"authorities": ["ab" * 32], "boot_applications": ["11" * 32], "secure_boot": "required"}
    assert settings_from_obj({"measured_boot": {"classes": [{"name": "c", **rules}]}}).measured_boot.classes
