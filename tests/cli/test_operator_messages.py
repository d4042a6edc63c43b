"""Misuse ends in one line in nodegate's words and the right exit code (issue 34, items 8-15, 18):
a closed stdout, a missing kubeconfig, pydantic's and PyYAML's words, trust domains that serve
refuses, ``config validate --config``, plain http and a bogus TCTI, a webhook with no policy
source."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives import serialization

from bootstrap.cli.main import kubectl_main
from bootstrap.cli.main import main as cli_main
from bootstrap.cli.node import utc_text
from bootstrap.service.join.vendorroots import STORE_ENV
from bootstrap.service.webhook.policywatch import NO_POLICY_SOURCE
from tests.support.ekvendors import vendor_folder
from tests.support.service import EkCa, running, settings_for
from tests.support.shared_data import shared

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def vendor_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """`ek_roots: [vendors]` as on a Debian host with ruby-tpm-key-attestation installed."""
    monkeypatch.setenv(STORE_ENV, str(vendor_folder()))


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# -- 8: a closed stdout ------------------------------------------------------------------------


def _with_closed_stdout(*args: str) -> subprocess.CompletedProcess[str]:
    """The reader of the pipe is gone before the command writes (``| head`` after its lines):
    every write fails with EPIPE, deterministically."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [sys.executable, "-m", "bootstrap.cli", *args],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
            timeout=120,
            cwd=ROOT,
        )
    finally:
        os.close(write)


@pytest.mark.parametrize(
    "args",
    [
        ("ek", "roots"),
        ("config", "defaults"),
        ("eventlog", "inspect", "-o", "json", "EVENTLOG"),
    ],
)
def test_a_closed_stdout_ends_quietly_with_141(args: tuple[str, ...]) -> None:
    if "EVENTLOG" in args:
        logs = shared("eventlogs")
        args = tuple(str(logs.file(logs.names("*.bin")[0])) if a == "EVENTLOG" else a for a in args)
    done = _with_closed_stdout(*args)
    assert done.stderr == ""  # no traceback, no "Exception ignored" at exit
    assert done.returncode == 141  # 128 + SIGPIPE, as coreutils in the same pipe


def test_kubectl_nodegate_with_a_closed_stdout_is_quiet_too(tmp_path: Path) -> None:
    read, write = os.pipe()
    os.close(read)
    code = "import sys; from bootstrap.cli.main import kubectl_main; sys.exit(kubectl_main(['--help']))"
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
            cwd=ROOT,
        )
    finally:
        os.close(write)
    assert done.stderr == ""
    assert done.returncode in (0, 141)  # argparse's --help exits before our guard; quiet either way


# -- 9: one message for a missing kubeconfig ---------------------------------------------------


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


@pytest.mark.usefixtures("vendor_store")
def test_a_missing_kubeconfig_is_one_message_everywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nonexistent"
    config = _config(
        tmp_path, f"trust_domain: fleet.test\nek_roots: [vendors]\nkubernetes: {{kubeconfig: {missing}}}\n"
    )
    said = f"kubeconfig {missing} does not exist"
    assert cli_main(["gate", "--once", "--config", str(config)]) == 2
    assert _one_line(capsys) == f"nodegate gate: {said}"
    assert kubectl_main(["status", "--kubeconfig", str(missing)]) == 2
    assert _one_line(capsys) == f"kubectl nodegate: {said}"
    assert cli_main(["config", "validate", str(config)]) == 2
    assert capsys.readouterr().err.splitlines()[0] == f"{config}: kubernetes.kubeconfig: {said}"


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("", "is not a kubeconfig (a mapping with clusters, contexts and users)"),
        (
            "apiVersion: v1\nclusters: []\ncontexts: []\nusers: []\n",
            "names no current-context: pass --context, or set one (kubectl config use-context)",
        ),
        (
            "a: [\n",
            "is not valid YAML: line 2, column 1: expected the node content, but found '<stream end>' "
            "(in the flow node begun at line 2, column 1)",
        ),
    ],
)
def test_an_unusable_kubeconfig_is_named_in_our_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, said: str
) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(text)
    assert kubectl_main(["status", "--kubeconfig", str(path)]) == 2
    assert _one_line(capsys) == f"kubectl nodegate: kubeconfig {path} {said}"


# -- 10, 12: pydantic's words translated; validate and serve share the checks ---------------------


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("trust_domian: x\n", "trust_domian: unknown key (did you mean trust_domain?)"),
        ("ek_roots: vendors\n", "ek_roots: expected a list, got text (write [vendors])"),
        ("admission: 5\n", "admission: expected a mapping (key: value), got a whole number"),
        (
            "session_ttl: 1h\n",
            "session_ttl: session_ttl above 10m keeps credential challenges alive too long",
        ),
        (
            "listen: 0.0.0.0:9443\n",
            "admission.listen (0.0.0.0:9443) must not be the join listener's port",
        ),
        ("store: etcd\n", "store: expected one of 'sqlite' or 'kubernetes'"),
        (
            'trust_domain: "spiffe://fleet.example.com"\n',
            "trust_domain: a trust domain is a name, not a SPIFFE ID: write 'fleet.example.com'",
        ),
        (
            'trust_domain: "Fleet.Example.com"\n',
            "trust_domain: trust domain 'Fleet.Example.com' must be lowercase: 'fleet.example.com'",
        ),
        (
            'trust_domain: "fleet example"\n',
            "trust_domain: trust domain 'fleet example' may only contain lowercase a-z, 0-9, '.', '-' "
            "and '_'",
        ),
        ("svid_ttl: 5\n", "svid_ttl: the duration 5 has no unit: write 5s (seconds), 5m or 5h"),
        ('svid_ttl: "90"\n', "svid_ttl: the duration 90 has no unit: write 90s (seconds), 90m or 90h"),
    ],
)
def test_config_mistakes_are_one_line_in_our_words_for_validate_and_serve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, said: str
) -> None:
    config = _config(tmp_path, text)
    assert cli_main(["config", "validate", str(config)]) == 2
    assert capsys.readouterr().err.splitlines() == [f"{config}: {said}", f"{config}: 1 problem"]
    assert cli_main(["serve", "--config", str(config)]) == 2
    assert _one_line(capsys) == f"nodegate serve: invalid config: {said}"


def test_no_library_words_reach_the_user(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(
        tmp_path,
        "trust_domian: x\nek_roots: vendors\nadmission: 5\ntls: {cert_fil: a}\nsession_ttl: 1h\n"
        "pcr_policy: {classes: 3}\ninventory: [{node_name: n}]\n",
    )
    assert cli_main(["config", "validate", str(config)]) == 2
    err = capsys.readouterr().err
    for words in ("Input should", "Extra inputs", "Value error", "instance of", "(top)", "pydantic", "Field"):
        assert words not in err, err
    assert f"{config}: inventory[0].ek_sha256: required, but missing" in err.splitlines()


def test_a_bad_package_policy_in_policy_test_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "nodegate.io/v1alpha1",
                "kind": "PackagePolicy",
                "metadata": {"name": "p"},
                "spec": {
                    "nodeSelector": {},
                    "images": {"registry": ["r.example/x"]},
                    "maxInterruptionBudget": 5,
                },
            }
        )
    )
    review = tmp_path / "r.json"
    review.write_text("{}")
    assert cli_main(["policy", "test", "--policy", str(policy), str(review)]) == 2
    line = _one_line(capsys)
    assert line.startswith(f"nodegate policy test: {policy}: not a PackagePolicy: "), line
    assert "spec.images.registry: unknown key (did you mean registries?)" in line
    assert "spec.maxInterruptionBudget: expected a mapping (key: value), got a whole number" in line
    assert "errors.pydantic.dev" not in line


async def test_the_join_endpoint_names_the_field_in_our_words(tmp_path: Path) -> None:
    async with (
        running(settings_for(tmp_path, EkCa.create())) as r,
        r.http() as http,
    ):
        for body, said in (
            ([1], "expected a mapping (key: value), got a list"),
            ({"node_name": "n", "ek_pub": "x"}, "ek_pub: unknown key"),
        ):
            async with http.post(f"{r.base}/v1/join/start", json=body) as resp:
                doc = json.loads(await resp.text())
            assert resp.status == 400
            assert said in doc["detail"], doc
            assert "instance of" not in doc["detail"], doc
            assert "StartRequest" not in doc["detail"], doc


# -- 11: YAML errors: the file, the line and column, one line ----------------------------------


def test_a_yaml_error_names_file_line_and_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path, "trust_domain: a.b\nek_roots: [vendors\n")
    said = (
        f"config {config} is not valid YAML: line 3, column 1: expected ',' or ']', but got "
        "'<stream end>' (in the flow sequence begun at line 2, column 11)"
    )
    assert cli_main(["serve", "--config", str(config)]) == 2
    assert _one_line(capsys) == f"nodegate serve: {said}"
    assert cli_main(["config", "validate", str(config)]) == 2
    assert capsys.readouterr().err.splitlines()[0] == f"{config}: {said}"
    policy = tmp_path / "policy.yaml"
    policy.write_text("kind: PackagePolicy\nspec: {a: b\n")
    assert cli_main(["policy", "test", "--policy", str(policy), str(config)]) == 2
    line = _one_line(capsys)
    assert line.startswith(f"nodegate policy test: {policy}: not YAML/JSON: line 3, column 1: "), line
    assert "<byte string>" not in line
    assert "<unicode string>" not in line


# -- 13: config validate takes --config too --------------------------------------------------


@pytest.mark.usefixtures("vendor_store")
def test_config_validate_takes_file_or_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path, "trust_domain: fleet.test\nek_roots: [vendors]\n")
    assert cli_main(["config", "validate", "--config", str(config)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"{config}: ok"
    assert cli_main(["config", "validate", str(config)]) == 0
    capsys.readouterr()
    assert cli_main(["config", "validate"]) == 2
    assert (
        _one_line(capsys) == "nodegate config validate: give the config file: nodegate config validate FILE"
    )


# -- 14: plain http and a bogus TCTI stop the node commands before the TPM -----------------------


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    path = tmp_path / "bundle.pem"
    path.write_bytes(EkCa.create().cert.public_bytes(serialization.Encoding.PEM))
    return path


@pytest.mark.parametrize("server", ["http://127.0.0.1:8443", "http://join.example:8443", "HTTP://10.0.0.1"])
@pytest.mark.parametrize("command", ["join", "renew", "attest"])
def test_plain_http_stops_a_node_command_at_once(
    command: str, server: str, bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = ["--node-name", "gpu-1"] if command == "join" else []
    # a TCTI no machine has: were the TPM reached first, the line would be about the TPM
    argv = [command, "--server", server, "--ca-bundle", str(bundle), "--tcti", "bogus", *extra]
    assert cli_main(argv) == 2
    assert _one_line(capsys) == f"nodegate {command}: --server must be https://host[:port], not {server!r}"


def test_plain_http_stops_nodes_list(
    bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "nodes",
        "list",
        "--server",
        "http://127.0.0.1:1",
        "--ca-bundle",
        str(bundle),
        "--admin",
        str(tmp_path),
    ]
    assert cli_main(argv) == 2
    assert (
        _one_line(capsys)
        == "nodegate nodes list: --server must be https://host[:port], not 'http://127.0.0.1:1'"
    )


@pytest.mark.parametrize(
    ("tcti", "said"),
    [
        (
            "bogus:xyz",
            "--tcti 'bogus:xyz': no TCTI module 'bogus' on this machine (libtss2-tcti-bogus.so.0); "
            "e.g. device:/dev/tpmrm0, swtpm:host=127.0.0.1,port=2321 or tabrmd",
        ),
        (
            "Not A Tcti",
            "--tcti 'Not A Tcti' is malformed: write NAME[:CONFIG], "
            "e.g. device:/dev/tpmrm0, swtpm:host=127.0.0.1,port=2321 or tabrmd",
        ),
    ],
)
def test_a_bogus_tcti_is_named_as_such(
    tcti: str, said: str, bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["join", "--server", "https://127.0.0.1:1", "--ca-bundle", str(bundle), "--node-name", "n1"]
    assert cli_main([*argv, "--tcti", tcti]) == 2
    assert _one_line(capsys) == f"nodegate join: {said}"
    assert cli_main(["ek", "hash", "--tcti", tcti]) == 2
    assert _one_line(capsys) == f"nodegate ek hash: {said}"


# -- 15: a webhook with no policy source says so --------------------------------------------


async def test_no_policy_source_is_warned_and_shown_by_readyz(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="nodegate.server"):
        async with running(settings_for(tmp_path, EkCa.create())) as r, r.http() as http:
            async with http.get(f"{r.base}/readyz") as resp:
                text = await resp.text()
            assert resp.status == 200  # joins work; the webhook never will, and says why
            assert text.splitlines() == ["ok", f"webhook: {NO_POLICY_SOURCE}"]
    assert NO_POLICY_SOURCE in caplog.text


# -- 18: ek check and ek hash --------------------------------------------------------------


def test_ek_check_on_a_text_file_is_usage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("hello\n")
    assert cli_main(["ek", "check", str(path)]) == 2
    assert _one_line(capsys) == f"nodegate ek check: {path}: the file is neither a PEM nor a DER certificate"


@pytest.mark.usefixtures("vendor_store")
def test_ek_check_without_roots_uses_the_vendor_store(capsys: pytest.CaptureFixture[str]) -> None:
    ek = shared("tpm")
    # Nuvoton signs EK certificates with its roots: nothing to fetch (`ek check` does not use AIA)
    name = next(n for n in ek.names("ek/*.der") if "nuvoton" in n)
    assert cli_main(["ek", "check", str(ek.file(name))]) == 0
    out = capsys.readouterr().out
    roots = next(line for line in out.splitlines() if line.startswith("roots "))
    assert not roots.startswith("roots        0 anchors"), roots


def test_ek_hash_of_a_ca_certificate_warns(bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["ek", "hash", str(bundle)]) == 0  # the test EK CA's root: CA:TRUE
    captured = capsys.readouterr()
    assert len(captured.out.strip()) == 64
    assert captured.err.strip().splitlines() == [
        f"nodegate ek hash: warning: {bundle} is a CA certificate (basicConstraints CA:TRUE), "
        "not an EK certificate: no TPM's EK has this hash"
    ]


def test_every_node_command_writes_the_expiry_one_way() -> None:
    """join and attest pass the server's text on, renew a datetime: all come out as ...Z."""
    when = dt.datetime(2026, 12, 5, 11, 0, tzinfo=dt.UTC)
    assert utc_text(when) == "2026-12-05T11:00:00Z"
    assert utc_text("2026-12-05T11:00:00+00:00") == "2026-12-05T11:00:00Z"
    assert utc_text("2026-12-05T12:00:00+01:00") == "2026-12-05T11:00:00Z"
    assert utc_text("2026-12-05T11:00:00Z") == "2026-12-05T11:00:00Z"
