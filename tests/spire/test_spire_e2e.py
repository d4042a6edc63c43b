"""SPIRE on nodegate-attested nodes, with the real binaries (`make spire`), everything on loopback.

`nodegate serve` (x509pop on, SPIRE's admin socket for bans, the x509pop bundle kept for SPIRE)
and `spire-server` (sqlite, x509pop external_pki on nodegate's bundle) run for the module; each
test boots its own swtpm node with measured firmware, joins it with `nodegate join`, and runs a
`spire-agent` that attests with the x509pop certificate the join wrote. A workload (this test
process, unix workload attestor) gets its X.509-SVID from the agent's Workload API through
py-spiffe.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from spiffe import WorkloadApiClient
from spiffe.errors import PySpiffeError

from attest import x509pop
from bootstrap.demo import firmware
from bootstrap.demo import swtpm as harness
from tests.spire.harness import Agent, Server, binaries, free_port, wait_for

pytestmark = pytest.mark.swtpm
BINS = binaries()  # absent: the module is skipped in one line (a failure under NODEGATE_REQUIRE_SPIRE=1)

NG_TD = "nodegate.test"
SPIRE_TD = "spire.test"
MB_CLASS = "fleet-linux"
KERNEL = "vmlinuz-6.8.0-fleet"
ADMIN_ID = f"spiffe://{NG_TD}/admin/ops"
BOOT_ID = "5e0c6f1a-3b7d-4c2e-9f10-2a4b6c8d0e1f"
# Agents sync with the server every 5 s (SPIRE's defaultSyncInterval); a banned agent stops at its
# next sync. docs/spire.md promises "within ban_interval + 5 s"; the test allows generous slack
# for a loaded machine but polls, so it ends as soon as the agent is gone.
BAN_DEADLINE_S = 60.0


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "bootstrap.cli", *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    if check:
        assert proc.returncode == 0, f"nodegate {args[0]}: {proc.stdout}{proc.stderr}"
    return proc


@dataclass
class World:
    dir: Path
    config: Path
    url: str
    server: Server
    bins: Path
    local_ca: harness.LocalCa
    db_der: bytes
    ng_bundle: Path
    admin: Path
    serve: subprocess.Popen[bytes]


@pytest.fixture(scope="module")
def world(local_ca: harness.LocalCa, _swtpm_a: harness.Swtpm) -> Iterator[World]:
    # _swtpm_a: the session's first swtpm, whose manufacture creates local_ca's files
    bins = BINS
    harness.require_tools()
    # unix socket paths must stay short (108 bytes): not under pytest's long tmp paths
    top = Path(tempfile.mkdtemp(prefix="ngspire-", dir="/tmp"))
    spire_dir = top / "spire"
    spire_dir.mkdir()
    _, db_der = firmware.db_certificate()
    (top / "ek-roots.pem").write_bytes(
        local_ca.root.public_bytes(serialization.Encoding.PEM)
        + local_ca.intermediate.public_bytes(serialization.Encoding.PEM)
    )
    apps = [firmware.image_digest(a).hex() for a in ("shimx64.efi", "grubx64.efi", KERNEL)]
    port = free_port()
    server = Server(bins, spire_dir, SPIRE_TD, free_port(), spire_dir / "x509pop.hcl")
    doc: dict[str, Any] = {
        "trust_domain": NG_TD,
        "listen": f"127.0.0.1:{port}",
        "admission": {"listen": "127.0.0.1:0"},
        "state_dir": "state",
        "ek_roots": ["ek-roots.pem"],
        "server_names": ["127.0.0.1"],
        "measured_boot": {
            "secure_boot": "required",
            "classes": [
                {
                    "name": MB_CLASS,
                    "authorities": ["sha256:" + hashlib.sha256(db_der).hexdigest()],
                    "boot_applications": apps,
                }
            ],
        },
        "admin": {"spiffe_ids": {ADMIN_ID: ["list", "revoke", "rotate"]}},
        "spire": {
            "x509pop": True,
            "trust_domain": SPIRE_TD,
            "server_socket": str(server.socket),
            "ban_interval": "2s",
            "bundle_file": str(spire_dir / "nodegate-bundle.pem"),
            "plugin_data_file": str(server.plugin_data_file),
            "server_pid_file": str(server.pid_file),
        },
    }
    config = top / "config.yaml"
    config.write_text(yaml.safe_dump(doc))
    port_file = top / "port"
    serve = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bootstrap.cli",
            "serve",
            "--config",
            str(config),
            "--port-file",
            str(port_file),
        ],
        stdout=subprocess.DEVNULL,
        stderr=(top / "serve.log").open("ab"),
    )
    try:
        wait_for("nodegate serve", lambda: True if port_file.exists() else _alive(serve, top), 60)
        # what SPIRE's x509pop reads was written by nodegate before SPIRE starts
        assert server.plugin_data_file.exists()
        server.start()
        ng_bundle = top / "nodegate-ca.pem"
        ng_bundle.write_bytes(
            b"".join(p.read_bytes() for p in sorted((top / "state" / "ca").glob("ca-*.pem")))
        )
        _run(
            "ca", "issue-admin", "--config", str(config), "--spiffe-id", ADMIN_ID, "--out", str(top / "admin")
        )
        yield World(
            top,
            config,
            f"https://127.0.0.1:{port}",
            server,
            bins,
            local_ca,
            db_der,
            ng_bundle,
            top / "admin",
            serve,
        )
    finally:
        server.stop()
        serve.terminate()
        try:
            serve.wait(15)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait(10)
        shutil.rmtree(top, ignore_errors=True)


def _alive(proc: subprocess.Popen[bytes], top: Path) -> None:
    assert proc.poll() is None, (top / "serve.log").read_text()


@dataclass
class Node:
    name: str
    dir: Path
    tpm: harness.Swtpm
    event_log: Path
    boot_id_file: Path

    @property
    def out(self) -> Path:
        return self.dir / "nodegate-node"

    @property
    def x509pop_file(self) -> Path:
        return self.out / "x509pop.pem"

    def node_args(self) -> list[str]:
        return [
            *("--tcti", self.tpm.tcti, "--attempts", "3"),
            *("--event-log", str(self.event_log), "--boot-id-file", str(self.boot_id_file)),
        ]


@pytest.fixture
def boot(world: World) -> Iterator[Any]:
    """``boot(name, secure_boot)``: a fresh swtpm that measured a Linux boot, as a node."""
    started: list[harness.Swtpm] = []

    def make(name: str, *, secure_boot: bool = True) -> Node:
        folder = world.dir / name
        (folder / "tpm").mkdir(parents=True)
        harness.manufacture(world.local_ca, folder / "tpm")
        tpm = harness.start(world.local_ca, folder / "tpm")
        started.append(tpm)
        events = firmware.linux_boot(secure_boot=secure_boot, db_cert_der=world.db_der, kernel=KERNEL)
        log = firmware.boot(tpm.tcti, events, folder / "binary_bios_measurements")
        boot_id = folder / "boot_id"
        boot_id.write_text(BOOT_ID + "\n")
        return Node(name, folder, tpm, log, boot_id)

    yield make
    for tpm in started:
        tpm.stop()


@pytest.fixture
def agents(world: World) -> Iterator[Any]:
    """``agents(node)``: a spire-agent for the node's x509pop certificate (stopped afterwards)."""
    made: list[Agent] = []

    def make(node: Node, x509pop_file: Path | None = None, name: str = "agent") -> Agent:
        agent = Agent(world.bins, node.dir / name, world.server, x509pop_file or node.x509pop_file)
        made.append(agent)
        return agent

    yield make
    for agent in made:
        agent.stop()


def join(world: World, node: Node) -> subprocess.CompletedProcess[str]:
    return _run(
        *("join", "--server", world.url, "--ca-bundle", str(world.ng_bundle), "--node-name", node.name),
        *node.node_args(),
        *("--out", str(node.out)),
        check=False,
    )


def agent_id(node: Node) -> str:
    return f"spiffe://{SPIRE_TD}/spire/agent/x509pop/{node.name}"


def selectors(agent: dict[str, Any]) -> set[str]:
    return {f"{s['type']}:{s['value']}" for s in agent.get("selectors", [])}


def attested(world: World, node: Node, agent: Agent) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        assert agent.process is not None
        if agent.process.exited() is not None:
            pytest.fail(f"spire-agent exited ({agent.process.exited()}):\n{agent.process.text()[-3000:]}")
        found = world.server.agent(agent_id(node))
        return found if found and not found.get("banned") else None

    return wait_for(f"the agent of {node.name} to attest", probe, 90)


def workload_svid(agent: Agent, deadline_s: float = 90, want: str | None = None) -> Any:
    """The X.509 context (SVIDs + bundles) this process gets from the agent's Workload API, once it
    holds an SVID (``want``: that SPIFFE ID)."""

    def probe() -> Any:
        if not agent.socket.exists():
            return None
        try:
            with WorkloadApiClient(socket_path=f"unix://{agent.socket}", default_timeout=5) as client:
                context = client.fetch_x509_context()
        except PySpiffeError:
            return None  # no identity issued yet: the agent has not synced the entry
        if want is not None and want not in {str(v.spiffe_id) for v in context.x509_svids}:
            return None
        return context

    return wait_for("an X.509-SVID from the Workload API", probe, deadline_s, every=0.5)


def create_entries(world: World, node_class: str, workload_id: str) -> None:
    """A node entry on the attested measured-boot class, and under it an entry for this process's
    uid: the SVID reaches only workloads on nodes of that class."""
    node_set = f"spiffe://{SPIRE_TD}/nodes/{node_class}"
    made = world.server.cli(
        "entry", "create", "-node", "-spiffeID", node_set,
        "-selector", f"x509pop:san:{x509pop.MEASURED_BOOT_CLASS}:{node_class}",
        check=False,
    )  # fmt: skip
    # one node entry serves every test of the module
    assert made.returncode == 0 or "already exists" in made.stdout + made.stderr, made.stdout + made.stderr
    world.server.cli(
        "entry", "create", "-parentID", node_set, "-spiffeID", workload_id,
        "-selector", f"unix:uid:{os.getuid()}", "-x509SVIDTTL", "600",
    )  # fmt: skip


def test_attested_node_gets_an_agent_and_its_workload_an_svid(world: World, boot: Any, agents: Any) -> None:
    node = boot("gpu-a1")
    joined = join(world, node)
    assert joined.returncode == 0, joined.stderr
    assert oct(node.x509pop_file.stat().st_mode & 0o777) == "0o600"
    cert = x509.load_pem_x509_certificate(node.x509pop_file.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    # the SVID keeps exactly one URI SAN; the facts are on the second certificate
    svid = x509.load_pem_x509_certificate((node.out / "svid.pem").read_bytes())
    svid_san = svid.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert svid_san.get_values_for_type(x509.UniformResourceIdentifier) == [f"spiffe://{NG_TD}/node/gpu-a1"]
    assert svid.public_key() == cert.public_key()
    assert all(
        u.startswith(f"x509pop://{SPIRE_TD}/")
        for u in san.get_values_for_type(x509.UniformResourceIdentifier)
    )

    agent = agents(node)
    agent.start()
    found = attested(world, node, agent)
    sel = selectors(found)
    assert found["attestation_type"] == "x509pop"
    assert {
        f"x509pop:san:node:{node.name}",
        f"x509pop:san:{x509pop.MEASURED_BOOT_CLASS}:{MB_CLASS}",
        f"x509pop:san:{x509pop.BOOT_ID}:{BOOT_ID}",
        f"x509pop:subject:cn:{node.name}",
    } <= sel, sel
    assert any(s.startswith(f"x509pop:san:{x509pop.EK_SHA256}:") for s in sel)

    workload_id = f"spiffe://{SPIRE_TD}/workload/trainer"
    create_entries(world, MB_CLASS, workload_id)
    context = workload_svid(agent, want=workload_id)
    svid = next(v for v in context.x509_svids if str(v.spiffe_id) == workload_id)
    assert svid.leaf.public_key() == svid.private_key.public_key()
    # its bundle, from the Workload API too: SPIRE's CA, which issued the SVID, not nodegate's
    with WorkloadApiClient(socket_path=f"unix://{agent.socket}", default_timeout=10) as client:
        bundles = client.fetch_x509_bundles()
    spire_bundle = bundles.get_bundle_for_trust_domain(svid.spiffe_id.trust_domain)
    assert spire_bundle is not None
    top = svid.cert_chain[-1]
    assert any(top.issuer == root.subject for root in spire_bundle.x509_authorities)
    ng_roots = x509.load_pem_x509_certificates(world.ng_bundle.read_bytes())
    assert not any(top.issuer == root.subject for root in ng_roots)


def test_a_node_that_fails_measured_boot_never_gets_an_agent(world: World, boot: Any, agents: Any) -> None:
    node = boot("gpu-bad", secure_boot=False)
    refused = join(world, node)
    assert refused.returncode == 1
    assert "measured_boot_violation" in refused.stderr
    assert not node.x509pop_file.exists()
    agent = agents(node)
    process = agent.start()
    code = wait_for("spire-agent without a certificate to give up", process.exited, 60)
    assert code != 0
    assert world.server.agent(agent_id(node)) is None

    # The same node forging the certificate nodegate refused it: same SANs, its own CA.
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "not nodegate")])
    now = datetime.now(UTC)
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(1)
        .not_valid_before(now - timedelta(minutes=1))
        .not_valid_after(now + timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    class Forger:
        certificate = ca_cert
        key = ca_key

    key = ec.generate_private_key(ec.SECP256R1())
    forged = x509pop.issue_x509pop(
        Forger(),
        public_key=key.public_key(),
        trust_domain=SPIRE_TD,
        node_name=node.name,
        facts={x509pop.NODE: node.name, x509pop.MEASURED_BOOT_CLASS: MB_CLASS},
        now=now,
        not_after=now + timedelta(hours=1),
    )
    forged_file = node.dir / "forged.pem"
    forged_file.write_bytes(
        forged.public_bytes(serialization.Encoding.PEM)
        + key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    forger = agents(node, forged_file, "forger")
    process = forger.start()
    code = wait_for("the forger's spire-agent to be refused", process.exited, 60)
    assert code != 0
    assert "certificate verification failed" in process.text()
    assert world.server.agent(agent_id(node)) is None


def test_a_revoked_node_loses_its_agent_and_cannot_bring_it_back(
    world: World, boot: Any, agents: Any
) -> None:
    node = boot("gpu-r1")
    assert join(world, node).returncode == 0
    agent = agents(node)
    process = agent.start()
    attested(world, node, agent)
    create_entries(world, MB_CLASS, f"spiffe://{SPIRE_TD}/workload/revoked-test")
    workload_svid(agent)

    _run(
        *("nodes", "revoke", node.name, "--server", world.url, "--ca-bundle", str(world.ng_bundle)),
        *("--admin", str(world.admin), "--reason", "stolen"),
    )
    revoked_at = time.monotonic()
    code = wait_for("the revoked node's agent to stop", process.exited, BAN_DEADLINE_S)
    print(f"revoked node's agent stopped {time.monotonic() - revoked_at:.1f}s after the revoke returned")
    assert code != 0
    assert "Agent is banned" in process.text()
    banned = world.server.agent(agent_id(node))
    assert banned is not None
    assert banned.get("banned") is True
    assert not agent.socket.exists() or workload_fails(agent)

    # Its x509pop certificate is still within its lifetime: SPIRE refuses it anyway (banned).
    again = agents(node, name="agent-again")
    retry = again.start()
    assert wait_for("the banned agent's restart to be refused", retry.exited, 60) != 0
    assert "banned" in retry.text()
    # and nodegate renews nothing for it
    renew = _run(
        *("renew", "--server", world.url, "--ca-bundle", str(world.ng_bundle), "--dir", str(node.out)),
        *node.node_args(),
        *("--before", "24h"),
        check=False,
    )
    assert renew.returncode == 1, renew.stderr
    assert "node_revoked" in renew.stderr


def workload_fails(agent: Agent) -> bool:
    try:
        with WorkloadApiClient(socket_path=f"unix://{agent.socket}", default_timeout=2) as client:
            client.fetch_x509_context()
    except PySpiffeError:
        return True
    return False


def test_ca_rotation_keeps_agents_attested_before_it(world: World, boot: Any, agents: Any) -> None:
    node = boot("gpu-c1")
    assert join(world, node).returncode == 0
    before = x509.load_pem_x509_certificate(node.x509pop_file.read_bytes())
    agent = agents(node)
    agent.start()
    attested(world, node, agent)
    create_entries(world, MB_CLASS, f"spiffe://{SPIRE_TD}/workload/rotation-test")
    workload_svid(agent)

    reloads = world.server.reconfigured()
    _run("ca", "rotate", "--config", str(world.config))
    # nodegate picks the rotation up (2 s), rewrites SPIRE's bundle and plugin data, signals SPIRE
    wait_for(
        "SPIRE to reload nodegate's bundle",
        lambda: True if world.server.reconfigured() > reloads else None,
        60,
    )
    bundle = x509.load_pem_x509_certificates((world.server.dir / "nodegate-bundle.pem").read_bytes())
    assert len(bundle) == 2  # the old root stays for ca_grace, beside the new signer

    # the agent attested before the rotation keeps its identity and serves workloads
    assert world.server.agent(agent_id(node)) is not None
    assert agent.process is not None
    assert agent.process.exited() is None
    workload_svid(agent, 30)

    # after a renewal the node's x509pop certificate is the new CA's, and a restarted agent
    # re-attests with it
    renewed = _run(
        *("renew", "--server", world.url, "--ca-bundle", str(world.ng_bundle), "--dir", str(node.out)),
        *node.node_args(),
        *("--before", "24h"),
        check=False,
    )
    assert renewed.returncode == 0, renewed.stderr
    after = x509.load_pem_x509_certificate(node.x509pop_file.read_bytes())
    assert after.issuer != before.issuer
    agent.stop()
    fresh = agents(node, name="agent-after-rotation")
    fresh.start()
    found = attested(world, node, fresh)
    assert f"x509pop:san:node:{node.name}" in selectors(found)
    workload_svid(fresh)


def test_an_agent_that_attests_after_the_revocation_is_banned_by_the_periodic_pass(
    world: World, boot: Any, agents: Any
) -> None:
    """Revoked before its agent ever attested: SPIRE knew no agent to ban, and the node's x509pop
    certificate is still within its lifetime, so the agent does attest; nodegate's next pass
    (spire.ban_interval, 2 s here) bans it."""
    node = boot("gpu-w1")
    assert join(world, node).returncode == 0
    _run(
        *("nodes", "revoke", node.name, "--server", world.url, "--ca-bundle", str(world.ng_bundle)),
        *("--admin", str(world.admin), "--reason", "stolen before its agent ran"),
    )
    agent = agents(node)
    process = agent.start()
    code = wait_for("the late agent to be banned and stop", process.exited, BAN_DEADLINE_S)
    assert code != 0
    assert "Node attestation was successful" in process.text()  # it did get in, then was banned
    assert "Agent is banned" in process.text()
    banned = world.server.agent(agent_id(node))
    assert banned is not None
    assert banned.get("banned") is True
