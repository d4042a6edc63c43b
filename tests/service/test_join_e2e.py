"""End to end with real parts: `nodegate serve --config` as a subprocess on TLS, `nodegate join`
with a swtpm, the SVID checked by openssl, a tampered PCR refused in one line, and a service
restart in the middle of a join that the node rides out."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from bootstrap.node import join as joinclient
from bootstrap.node.tpm import Agent
from tests.support.swtpms import TpmInfo

pytestmark = pytest.mark.swtpm
TD = "e2e.test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Served:
    config: Path
    state: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> None:
        port_file = self.config.parent / "port"
        port_file.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "bootstrap.cli", "serve"),
                *("--config", str(self.config), "--port-file", str(port_file)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=(self.config.parent / "serve.log").open("ab"),
        )
        deadline = time.monotonic() + 30
        while not port_file.exists():  # readiness, not timing: the server writes it once bound
            assert self.proc.poll() is None, (self.config.parent / "serve.log").read_text()
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def bundle(self, dest: Path) -> Path:
        """What an operator distributes: the CA certificates from state_dir (not fetched over TLS)."""
        dest.write_bytes(b"".join(p.read_bytes() for p in sorted((self.state / "ca").glob("ca-*.pem"))))
        return dest


def _config(tmp: Path, tpm: TpmInfo, port: int, **extra: Any) -> Served:
    roots = tmp / "ek-roots.pem"
    roots.write_bytes(
        tpm.root.public_bytes(serialization.Encoding.PEM)
        + tpm.intermediate.public_bytes(serialization.Encoding.PEM)
    )
    doc = {
        "trust_domain": TD,
        "listen": f"127.0.0.1:{port}",
        "admission": {"listen": "127.0.0.1:0"},
        "state_dir": "state",
        "ek_roots": ["ek-roots.pem"],
        "server_names": ["127.0.0.1", "localhost"],
        **extra,
    }
    config = tmp / "config.yaml"
    config.write_text(yaml.safe_dump(doc))
    return Served(config, tmp / "state", port)


@pytest.fixture
def served(tmp_path: Path, swtpm: TpmInfo) -> Iterator[Served]:
    s = _config(tmp_path, swtpm, _free_port())
    s.start()
    yield s
    s.kill()


def _join_cli(s: Served, tpm: TpmInfo, name: str, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *(sys.executable, "-m", "bootstrap.cli", "join", "--server", s.url, "--node-name", name),
            *("--ca-bundle", str(s.bundle(out.parent / "bundle.pem")), "--tcti", tpm.tcti),
            *("--out", str(out), "--attempts", "3"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_join_cli_against_served_subprocess(served: Served, swtpm: TpmInfo, tmp_path: Path) -> None:
    out = tmp_path / "node"
    proc = _join_cli(served, swtpm, "swtpm-node-1", out)
    assert proc.returncode == 0, proc.stderr
    assert f"spiffe://{TD}/node/swtpm-node-1" in proc.stdout
    for name in ("node.key", "svid.pem", "bundle.pem", "join.json"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600, name
    assert not (out / "kubelet.kubeconfig").exists()  # no cluster configured
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temp files left
    verify = subprocess.run(
        ["openssl", "verify", "-x509_strict", "-purpose", "sslclient", "-CAfile", "bundle.pem", "svid.pem"],
        cwd=out,
        capture_output=True,
        text=True,
        check=False,
    )
    assert verify.returncode == 0, verify.stderr
    leaf = x509.load_pem_x509_certificate((out / "svid.pem").read_bytes())
    key = serialization.load_pem_private_key((out / "node.key").read_bytes(), None)
    assert leaf.public_key() == key.public_key()
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == [f"spiffe://{TD}/node/swtpm-node-1"]


def test_tampered_pcr_is_refused_in_one_line(tmp_path: Path, other_swtpm: TpmInfo) -> None:
    with Agent(other_swtpm.tcti) as agent:
        pcrs = agent.read_pcrs("sha256:0,1,2,3,4,5,6,7")
    golden = {"sha256": {i: [v.hex()] for i, v in pcrs["sha256"].items()}}
    s = _config(
        tmp_path, other_swtpm, _free_port(), pcr_policy={"classes": [{"name": "fleet", "golden": golden}]}
    )
    s.start()
    try:
        good = _join_cli(s, other_swtpm, "pcr-node", tmp_path / "good")
        assert good.returncode == 0, good.stderr
        with Agent(other_swtpm.tcti) as agent:
            agent.extend_pcr(7, hashlib.sha256(b"unsigned bootloader").digest())
        bad = _join_cli(s, other_swtpm, "pcr-node", tmp_path / "bad")
    finally:
        s.kill()
    assert bad.returncode == 1
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1, bad.stderr
    assert lines[0].startswith("nodegate join: refused (pcr_policy_violation, HTTP 403): ")
    assert "sha256:7" in lines[0]
    assert not (tmp_path / "bad" / "svid.pem").exists()


def test_service_restart_during_a_join(
    served: Served, swtpm: TpmInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service dies between /start and /finish and comes back on the same state_dir: the
    node's finish fails, it starts over, and it ends with a complete, consistent set of files."""
    original = Agent.activate_credential
    restarts: list[float] = []

    def activate_then_restart(self: Agent, *args: Any, **kwargs: Any) -> bytes:
        secret = original(self, *args, **kwargs)
        if not restarts:
            served.kill()
            restarts.append(time.monotonic())
            served.start()
        return secret

    monkeypatch.setattr(Agent, "activate_credential", activate_then_restart)
    out = tmp_path / "node"
    opts = joinclient.JoinOptions(
        server=served.url,
        ca_bundle=served.bundle(tmp_path / "bundle.pem"),
        node_name="restart-node",
        tcti=swtpm.tcti,
        out=out,
        attempts=4,
        backoff=0.01,
    )
    result = asyncio.run(joinclient.join(opts))
    assert restarts, "the restart hook did not run"
    assert result.spiffe_id == f"spiffe://{TD}/node/restart-node"
    assert sorted(p.name for p in out.iterdir()) == ["bundle.pem", "join.json", "node.key", "svid.pem"]
    leaf = x509.load_pem_x509_certificate((out / "svid.pem").read_bytes())
    key = serialization.load_pem_private_key((out / "node.key").read_bytes(), None)
    assert leaf.public_key() == key.public_key()
    assert os.stat(out).st_mode & 0o077 == 0
