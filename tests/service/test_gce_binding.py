"""Issue 33, finding 1 through the service: Google's vTPM CAs are not in ``vendors``; configured
explicitly, they need ``ek_cloud.gce`` (refused at start under ``enrollment: tofu`` without it),
and a genuine GCE VM of the bound project still starts its join (docs/ek-roots.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bootstrap.config import settings_from_obj
from bootstrap.service.preflight import StartupError, check_ek_roots
from tests.support.ekvendors import GCE_PROJECT_ID, GOOGLE_EKS, real_ek
from tests.support.service import running
from tests.support.shared_data import shared
from tests.support.softnode import SoftNode, b64, post
from tests.support.softtpm import SoftTpm


def google_roots() -> list[str]:
    folder = shared("ek-roots")
    return [str(folder.file(n)) for n in folder.names("google/*")]


def config(tmp_path: Path, **over: Any) -> Any:
    doc: dict[str, Any] = {
        "trust_domain": "fleet.test",
        "listen": "127.0.0.1:0",
        "state_dir": str(tmp_path / "state"),
        "ek_roots": google_roots(),
        "server_names": ["localhost", "127.0.0.1"],
        "admission": {"listen": "127.0.0.1:0"},
        "ek_aia": {"enabled": False},  # the chain is complete; nothing to fetch
    }
    doc.update(over)
    return settings_from_obj(doc)


def test_tofu_with_googles_vtpm_ca_and_no_binding_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(StartupError, match=r"cloud vTPM CA.*ek_cloud\.gce\.projects"):
        check_ek_roots(config(tmp_path))
    check_ek_roots(config(tmp_path, ek_cloud={"gce": {"projects": [GCE_PROJECT_ID]}}))
    check_ek_roots(config(tmp_path, enrollment="inventory"))  # names are bound to EKs already


@pytest.mark.parametrize("name", GOOGLE_EKS)
async def test_a_strangers_gce_vm_is_refused_and_a_bound_projects_vm_starts(
    name: str, tmp_path: Path
) -> None:
    ek = real_ek(name)
    body = SoftNode(SoftTpm.create(), "gce-node-1").start_body()
    body.update(ek_public=b64(ek.ek_public), ek_certificate=b64(ek.der))
    stranger = config(tmp_path / "a", enrollment="inventory")  # the service would refuse tofu at start
    async with running(stranger) as svc, svc.http() as http:
        status, answer = await post(http, f"{svc.base}/v1/join/start", body)
    assert (status, answer["code"]) == (403, "ek_untrusted")
    assert "ek_cloud.gce.projects" in answer["detail"]
    bound = config(tmp_path / "b", ek_cloud={"gce": {"projects": [GCE_PROJECT_ID]}})
    async with running(bound) as svc, svc.http() as http:
        status, answer = await post(http, f"{svc.base}/v1/join/start", body)
    assert status == 200, answer
    other = config(tmp_path / "c", ek_cloud={"gce": {"projects": ["my-own-project"]}})
    async with running(other) as svc, svc.http() as http:
        status, answer = await post(http, f"{svc.base}/v1/join/start", body)
    assert (status, answer["code"]) == (403, "ek_untrusted")
