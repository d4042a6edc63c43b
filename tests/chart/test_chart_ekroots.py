"""The chart's default config trusts the vendor root store shipped in the image."""

from __future__ import annotations

from pathlib import Path

import pytest

from bootstrap.config import settings_from_obj
from tests.chart.test_chart import helm_path, render, rendered_config


@pytest.fixture(scope="module")
def helm() -> str:
    return helm_path()


def test_default_config_uses_the_vendor_store(helm: str, tmp_path: Path) -> None:
    settings = settings_from_obj(rendered_config(render(helm, tmp_path)))
    assert settings.ek_roots == (Path("vendors"),)


def test_a_configmap_of_roots_is_added_to_the_vendor_store(helm: str, tmp_path: Path) -> None:
    docs = render(helm, tmp_path, {"ekRoots": {"configMap": "site-ek-roots"}})
    settings = settings_from_obj(rendered_config(docs))
    assert settings.ek_roots == (Path("vendors"), Path("/etc/nodegate/ek-roots"))


def test_replacing_the_list_drops_the_vendor_store(helm: str, tmp_path: Path) -> None:
    docs = render(helm, tmp_path, {"config": {"ek_roots": ["/etc/ssl/ek"]}})
    assert settings_from_obj(rendered_config(docs)).ek_roots == (Path("/etc/ssl/ek"),)
