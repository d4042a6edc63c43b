"""The chart's defaults keep what its README claims (issue 34, items 4-6): no install without a
trust domain (the CA is made for it once), no NetworkPolicy whose webhook port is open to every
source by default, and NOTES that say when the CA Secret can be backed up."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.test_chart import CHART, helm_path, one, render, render_error, with_required

NO_TRUST_DOMAIN = "config.trust_domain is required: your SPIFFE trust domain"
NO_SOURCES = "networkPolicy.apiServer.webhookSourceCidrs is required: the API server's source addresses"


def _one_line_error(stderr: str) -> str:
    (line,) = [x for x in stderr.splitlines() if x.startswith("Error:")]
    return line


def test_an_install_without_a_trust_domain_is_refused(tmp_path: Path) -> None:
    err = render_error(helm_path(), tmp_path, {"config": {"trust_domain": None}})
    assert NO_TRUST_DOMAIN in _one_line_error(err)


def test_the_values_carry_no_trust_domain() -> None:
    values = (CHART / "values.yaml").read_text()
    assert re.search(r'^  trust_domain: ""$', values, re.M)
    assert "example.org" not in values


@pytest.mark.parametrize(
    "network_policy",
    [{}, {"apiServer": {"cidrs": [], "webhookSourceCidrs": []}}],
)
def test_a_network_policy_without_the_api_server_sources_is_refused(
    tmp_path: Path, network_policy: dict[str, Any]
) -> None:
    values = {"networkPolicy": {"apiServer": {"cidrs": []}, **network_policy}}
    err = render_error(helm_path(), tmp_path, values)
    assert NO_SOURCES in _one_line_error(err)


def _webhook_ingress(docs: list[dict[str, Any]]) -> dict[str, Any]:
    policy = one(docs, "NetworkPolicy")
    (rule,) = [r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == "admission"]
    return rule


@pytest.mark.parametrize(
    ("api_server", "sources"),
    [
        ({"webhookSourceCidrs": ["10.0.0.0/24"]}, ["10.0.0.0/24"]),
        ({"cidrs": ["192.0.2.1/32"]}, ["192.0.2.1/32"]),
        ({"webhookSourceCidrs": ["0.0.0.0/0", "::/0"]}, ["0.0.0.0/0", "::/0"]),  # open, on purpose
    ],
)
def test_the_webhook_port_admits_only_the_named_sources(
    tmp_path: Path, api_server: dict[str, Any], sources: list[str]
) -> None:
    docs = render(helm_path(), tmp_path, {"networkPolicy": {"apiServer": api_server}})
    rule = _webhook_ingress(docs)
    assert [peer["ipBlock"]["cidr"] for peer in rule["from"]] == sources


def test_without_the_network_policy_no_sources_are_needed(tmp_path: Path) -> None:
    docs = render(helm_path(), tmp_path, {"networkPolicy": {"enabled": False, "apiServer": {"cidrs": []}}})
    assert "NetworkPolicy" not in {d["kind"] for d in docs}


def _notes(tmp_path: Path, values_args: list[str]) -> str:

    vfile = tmp_path / "values.yaml"
    vfile.write_text(yaml.safe_dump(with_required({})))
    done = subprocess.run(
        [
            helm_path(),
            "install",
            "nodegate",
            str(CHART),
            "--dry-run=client",
            "-n",
            "nodegate",
            "-f",
            str(vfile),
            *values_args,
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split("NOTES:", 1)[1]


def test_notes_say_when_the_ca_secret_can_be_backed_up(tmp_path: Path) -> None:
    notes = _notes(tmp_path, [])
    assert "Back it up now" not in notes
    index = re.search(r'^INDEX = "(.+)"$', (CHART / "files" / "ca-init.py").read_text(), re.M)
    assert index is not None
    key = index.group(1).replace(".", "\\.")
    steps = [
        "kubectl -n nodegate rollout status deployment/nodegate",
        f"kubectl -n nodegate get secret nodegate-ca -o jsonpath='{{.data.{key}}}' | base64 -d",
        "kubectl -n nodegate get secret nodegate-ca -o yaml > nodegate-ca.backup.yaml",
    ]
    positions = [notes.index(step) for step in steps]  # in this order: wait, check, back up
    assert positions == sorted(positions)
    assert "a backup taken before then saves" in notes


def test_notes_without_generation_say_the_secret_must_be_filled(tmp_path: Path) -> None:
    notes = _notes(tmp_path, ["--set", "ca.generate=false"])
    assert "ca.generate is false" in notes
    assert "rollout status" not in notes
