"""``nodegate_webhook_decisions_total{result,rule}``: every verdict of the running service's
webhook is counted, a denial once per rule that denied it."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from tests.admission.test_webhook import RBAC, gpu_policies, no_reboot, review
from tests.support.package_crs import SAMPLE
from tests.support.service import EkCa, running, settings_for
from tests.support.softnode import post


def _value(text: str, result: str, rule: str) -> float:
    needle = f'nodegate_webhook_decisions_total{{result="{result}",rule="{rule}"}} '
    line = next((ln for ln in text.splitlines() if ln.startswith(needle)), None)
    return float(line.split()[-1]) if line else 0.0


@pytest.fixture(scope="module")
def ek_ca() -> EkCa:
    return EkCa.create()


async def test_verdicts_are_counted_by_result_and_rule(tmp_path: Path, ek_ca: EkCa) -> None:
    (tmp_path / "policies.yaml").write_text(
        yaml.safe_dump_all([p.model_dump(by_alias=True, exclude_none=True) for p in gpu_policies()])
    )
    (tmp_path / "rbac.yaml").write_text(yaml.safe_dump_all(RBAC))
    admission = {
        "policy_files": [str(tmp_path / "policies.yaml")],
        "rbac_files": [str(tmp_path / "rbac.yaml")],
    }
    bad_registry = copy.deepcopy(no_reboot(SAMPLE))
    for pkg in bad_registry["spec"]["packages"].values():
        pkg["image"] = "docker.io/evil/" + pkg["image"].rsplit("/", 1)[-1]
    async with running(settings_for(tmp_path, ek_ca, admission=admission)) as r, r.http() as http:
        for body in (review(no_reboot(SAMPLE)), review(no_reboot(SAMPLE)), review(bad_registry)):
            status, out = await post(http, f"{r.admission_base}/admission/validate", body)
            assert status == 200, out
        text = r.service.metrics.render().decode()
    assert _value(text, "allowed", "") == 2.0
    denied = [
        ln for ln in text.splitlines() if ln.startswith('nodegate_webhook_decisions_total{result="denied"')
    ]
    assert denied, text
    assert sum(float(ln.split()[-1]) for ln in denied) >= 1.0
