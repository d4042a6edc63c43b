"""``nodegate policy test`` on a plain CR with ``--user``/``--group`` (the AdmissionReview built
as the API server builds it), and ``--expect FILE``: a PASS/FAIL table like ``kyverno test``."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from bootstrap import cli
from bootstrap.service.webhook.policycases import Sender, plural, review_for
from tests.admission.test_webhook import RBAC, gpu_policies, no_reboot
from tests.support.package_crs import SAMPLE


@pytest.fixture
def files(tmp_path: Path) -> list[str]:
    (tmp_path / "policies.yaml").write_text(
        yaml.safe_dump_all([p.model_dump(by_alias=True, exclude_none=True) for p in gpu_policies()])
    )
    (tmp_path / "rbac.yaml").write_text(yaml.safe_dump_all(RBAC))
    (tmp_path / "cr.yaml").write_text(yaml.safe_dump(no_reboot(SAMPLE)))
    rebooting = copy.deepcopy(SAMPLE)  # SAMPLE asks for a reboot interrupt
    (tmp_path / "reboot.yaml").write_text(yaml.safe_dump(rebooting))
    return [
        "policy",
        "test",
        "--policy",
        str(tmp_path / "policies.yaml"),
        "--rbac",
        str(tmp_path / "rbac.yaml"),
    ]


def test_a_plain_cr_with_user_and_group(
    tmp_path: Path, files: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    cr = str(tmp_path / "cr.yaml")
    assert cli.main([*files, "-o", "json", "--user", "alice", cr]) == 0
    (allowed,) = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert allowed["response"]["allowed"] is True
    assert cli.main([*files, "--user", "alice", cr]) == 0
    allowed_text = capsys.readouterr().out.splitlines()  # a readable verdict by default
    assert allowed_text[0] == f"{cr}: allowed"
    assert all(line.startswith(("  warning: ", "    - ")) for line in allowed_text[1:]), allowed_text
    assert cli.main([*files, "--user", "mallory", cr]) == 1
    denied = capsys.readouterr().out.splitlines()
    assert denied[0].startswith(f"{cr}: denied: ")
    assert any(line.startswith("  rbac ") for line in denied[1:]), denied
    assert cli.main([*files, "--user", "bob", "--group", "ml-platform", cr]) == 0  # through the group
    capsys.readouterr()
    assert cli.main([*files, cr]) == 2
    assert "a plain object needs --user" in capsys.readouterr().err


def test_the_review_is_what_the_api_server_sends() -> None:
    doc = review_for(no_reboot(SAMPLE), Sender("alice", ("team-a",)))
    req = doc["request"]
    assert req["kind"] == {"group": "skyhook.nvidia.com", "version": "v1alpha1", "kind": "Skyhook"}
    assert req["resource"]["resource"] == "skyhooks"
    assert req["namespace"] == ""  # cluster-scoped
    assert req["userInfo"] == {"username": "alice", "groups": ["team-a"]}
    assert req["oldObject"] is None
    assert (plural("NodeWright"), plural("DeploymentPolicy"), plural("Node")) == (
        "nodewrights",
        "deploymentpolicies",
        "nodes",
    )


def test_expect_prints_pass_and_fail(
    tmp_path: Path, files: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    table = {
        "cases": [
            {"name": "alice deploys", "object": "cr.yaml", "user": "alice", "expect": "allowed"},
            {"name": "mallory may not", "object": "cr.yaml", "user": "mallory", "expect": "denied"},
            {"name": "alice may not reboot", "object": "reboot.yaml", "user": "alice", "expect": "denied"},
            {
                "name": "platform reboots",
                "object": "reboot.yaml",
                "user": "bob",
                "groups": ["ml-platform"],
                "expect": "allowed",
            },
        ]
    }
    (tmp_path / "cases.yaml").write_text(yaml.safe_dump(table))
    assert cli.main([*files, "--expect", str(tmp_path / "cases.yaml")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:4] == ["RESULT", "CASE", "EXPECTED", "GOT"]
    assert [ln.split()[0] for ln in out[1:5]] == ["PASS"] * 4
    assert out[-1] == "4 passed, 0 failed"
    table["cases"][1]["expect"] = "allowed"  # a wrong expectation fails its row, and the exit
    (tmp_path / "cases.yaml").write_text(yaml.safe_dump(table))
    assert cli.main([*files, "--expect", str(tmp_path / "cases.yaml")]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[2].startswith("FAIL")
    assert "mallory may not" in out[2]
    assert out[-1] == "3 passed, 1 failed"


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ({"object": "cr.yaml", "user": "a", "expect": "maybe"}, "expect must be allowed or denied"),
        ({"object": "cr.yaml", "expect": "allowed"}, "user is required"),
        ({"user": "a", "expect": "allowed"}, "object is required"),
        ({"object": "cr.yaml", "user": "a", "expect": "allowed", "verdict": 1}, "unknown keys ['verdict']"),
    ],
)
def test_a_bad_table_is_one_line_exit_2(
    tmp_path: Path, files: list[str], capsys: pytest.CaptureFixture[str], case: dict[str, object], needle: str
) -> None:
    (tmp_path / "cases.yaml").write_text(yaml.safe_dump({"cases": [case]}))
    assert cli.main([*files, "--expect", str(tmp_path / "cases.yaml")]) == 2
    err = capsys.readouterr().err
    assert needle in err
    assert len(err.strip().splitlines()) == 1
