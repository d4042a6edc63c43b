"""The chart's default config trusts the vendor root store in the image (TPM makers only)."""

from __future__ import annotations

from pathlib import Path

import pytest

from attest import cloudek
from bootstrap.config import settings_from_obj
from bootstrap.service import preflight
from bootstrap.service.join import ekroots, vendorroots
from tests.chart.test_chart import helm_path, render, rendered_config
from tests.support.ekvendors import vendor_folder


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


def test_the_default_pairs_tofu_with_tpm_makers_only(
    helm: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 33, finding 1: the chart's `vendors` + `enrollment: tofu` holds no cloud vTPM CA, so
    no stranger's cloud VM joins through it, and the start-time check passes."""
    monkeypatch.setenv(vendorroots.STORE_ENV, str(vendor_folder()))
    settings = settings_from_obj({**rendered_config(render(helm, tmp_path)), "state_dir": str(tmp_path)})
    assert settings.enrollment == "tofu"
    roots = ekroots.load_roots(settings.ek_roots, state_dir=settings.state_dir)
    assert roots.anchors
    assert ekroots.unbound_cloud_cas(settings, roots) == []
    assert not {c.sha256 for c in (*roots.anchors, *roots.intermediates)} & set(cloudek.KNOWN_CLOUD_CAS)
    preflight.check_ek_roots(settings)
