"""The service's side of SPIRE (docs/spire.md), without SPIRE: the x509pop certificate in join and
renewal answers, the bans a revocation sends to a stand-in of SPIRE's Agent API (its requests
decoded with protobuf from the API's own message shapes), and the bundle files SPIRE reads."""

from __future__ import annotations

import datetime as dt
import functools
import os
import signal
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from attest import ca, x509pop
from bootstrap.config import ConfigError, settings_from_obj
from bootstrap.node.credentials import X509POP_FILE, checked_credentials
from bootstrap.node.errors import JoinFailed
from bootstrap.protocol import FinishResponse
from bootstrap.spire import plugin_data, write_plugin_files
from bootstrap.spire.admin import agent_request
from tests.service.test_renew_admin import ADMIN, _admin_svid, _files, _renew
from tests.support.service import EkCa, Running, running, settings_for
from tests.support.softnode import join, post

SPIRE_TD = "spire.test"


@functools.cache
def ban_agent_request() -> Any:
    """spire.api.server.agent.v1.BanAgentRequest as the API defines it (spire-api-sdk protos), built by
    the installed protobuf when a test first asks, not at import."""
    fd = descriptor_pb2.FileDescriptorProto(name="t.proto", package="t", syntax="proto3")
    sid = fd.message_type.add(name="SPIFFEID")
    sid.field.add(name="trust_domain", number=1, type=9, label=1)
    sid.field.add(name="path", number=2, type=9, label=1)
    req = fd.message_type.add(name="BanAgentRequest")
    req.field.add(name="id", number=1, type=11, label=1, type_name=".t.SPIFFEID")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("t.BanAgentRequest"))


class FakeSpire:
    """SPIRE's Agent API on a unix socket: records BanAgent / DeleteAgent, knows ``agents``."""

    def __init__(self, socket: Path, agents: set[str]) -> None:
        self.socket = socket
        self.agents = agents
        self.calls: list[tuple[str, str]] = []
        self.server: Any = None

    def _handler(self, method: str) -> Any:
        async def handle(request: bytes, context: Any) -> bytes:
            msg = ban_agent_request().FromString(request)
            agent = f"spiffe://{msg.id.trust_domain}{msg.id.path}"
            self.calls.append((method, agent))
            if agent not in self.agents:
                await context.abort(grpc.StatusCode.NOT_FOUND, "agent not found")
            return b""  # google.protobuf.Empty

        return grpc.unary_unary_rpc_method_handler(handle)

    async def start(self) -> None:
        self.server = grpc.aio.server()
        handlers = {m: self._handler(m) for m in ("BanAgent", "DeleteAgent")}
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("spire.api.server.agent.v1.Agent", handlers),)
        )
        self.server.add_insecure_port(f"unix:{self.socket}")
        await self.server.start()

    async def stop(self) -> None:
        await self.server.stop(None)


@pytest.fixture(scope="module")
def ek_ca() -> EkCa:
    return EkCa.create()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="ngsp-", dir="/tmp"))  # unix socket paths are short
    yield folder
    for p in folder.iterdir():
        p.unlink()
    folder.rmdir()


@pytest.fixture
async def spire(short_dir: Path) -> AsyncIterator[FakeSpire]:
    fake = FakeSpire(short_dir / "api.sock", {f"spiffe://{SPIRE_TD}/spire/agent/x509pop/s-2"})
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def svc(tmp_path: Path, ek_ca: EkCa, spire: FakeSpire) -> AsyncIterator[Running]:
    node = ek_ca.node("s-1")
    settings = settings_for(
        tmp_path,
        ek_ca,
        admin={"spiffe_ids": {ADMIN: ["list", "revoke"]}},
        spire={
            "x509pop": True,
            "trust_domain": SPIRE_TD,
            "server_socket": str(spire.socket),
            "bundle_file": str(tmp_path / "x509pop-bundle.pem"),
            "plugin_data_file": str(tmp_path / "x509pop.hcl"),
        },
        inventory=[
            {"ek_sha256": node.tpm.ek_sha256, "node_name": "s-1", "labels": {"nodegate.io/pool": "h100-a"}}
        ],
    )
    async with running(settings) as r:
        r.service.__dict__["test_node"] = node
        yield r


async def test_join_hands_out_the_x509pop_certificate(svc: Running) -> None:
    node = svc.service.__dict__["test_node"]
    async with svc.http() as http:
        status, out = await join(http, svc.base, node)
    assert status == 200, out
    cert = x509.load_pem_x509_certificate(out["x509pop_certificate"].encode())
    assert cert.public_key() == node.key.public_key()
    assert x509pop.selectors(cert, SPIRE_TD) == {
        "node": "s-1",
        "ek-sha256": node.tpm.ek_sha256,
        "pool": "h100-a",
    }
    svid = x509.load_pem_x509_certificate(out["svid"].encode())
    assert cert.not_valid_after_utc == svid.not_valid_after_utc  # renewed exactly while the SVID is
    # the node keeps it with its key, in one 0600 file
    files = checked_credentials(FinishResponse.model_validate(out), node.key, "s-1", "test")
    assert files[X509POP_FILE].startswith(out["x509pop_certificate"].encode())
    assert b"PRIVATE KEY" in files[X509POP_FILE]


async def test_without_x509pop_the_answer_is_the_contracts(tmp_path: Path, ek_ca: EkCa) -> None:
    async with running(settings_for(tmp_path, ek_ca)) as r, r.http() as http:
        status, out = await join(http, r.base, ek_ca.node("plain-1"))
    assert status == 200, out
    assert set(out) == {"node_name", "spiffe_id", "svid", "bundle", "svid_expires_at", "kubeconfig"}


async def test_renewal_renews_it_and_revocation_bans_the_agent(
    svc: Running, ek_ca: EkCa, spire: FakeSpire, tmp_path: Path
) -> None:
    node = ek_ca.node("s-2")
    async with svc.http() as http:
        status, out = await join(http, svc.base, node)
    assert status == 200, out
    creds = _files(tmp_path, "s-2", node.key, out["svid"].encode())
    status, renewed = await _renew(svc, node, creds)
    assert status == 200, renewed
    assert renewed["x509pop_certificate"] != out["x509pop_certificate"]

    admin = _admin_svid(svc, tmp_path, ADMIN)
    async with svc.http(admin) as http:
        status, _ = await post(http, f"{svc.base}/v1/admin/nodes/s-2/revoke", {"reason": "stolen"})
        assert status == 200
        agent = f"spiffe://{SPIRE_TD}/spire/agent/x509pop/s-2"
        assert spire.calls == [("BanAgent", agent)]
        status, _ = await post(
            http, f"{svc.base}/v1/admin/nodes/s-2/revoke", {"reason": "found", "revoked": False}
        )
        assert status == 200
        assert spire.calls[-1] == ("DeleteAgent", agent)


async def test_revoked_before_its_agent_attested_is_banned_by_the_periodic_pass(
    svc: Running, ek_ca: EkCa, spire: FakeSpire, tmp_path: Path
) -> None:
    node = ek_ca.node("s-3")
    async with svc.http() as http:
        status, out = await join(http, svc.base, node)
    assert status == 200, out
    admin = _admin_svid(svc, tmp_path, ADMIN)
    async with svc.http(admin) as http:
        status, _ = await post(http, f"{svc.base}/v1/admin/nodes/s-3/revoke", {"reason": "stolen"})
    assert status == 200  # SPIRE knew no agent: NotFound is not an error
    agent = f"spiffe://{SPIRE_TD}/spire/agent/x509pop/s-3"
    assert spire.calls == [("BanAgent", agent)]
    link = svc.service.spire
    assert link is not None
    now = dt.datetime.now(dt.UTC)
    assert await link.ban_revoked(svc.service.store, now) == 0
    spire.agents.add(agent)  # the node attested with its still-valid certificate
    assert await link.ban_revoked(svc.service.store, now) == 1
    # once its certificate has expired there is nothing left to ban
    later = now + dt.timedelta(hours=2)
    calls = len(spire.calls)
    assert await link.ban_revoked(svc.service.store, later) == 0
    assert len(spire.calls) == calls


async def test_spire_down_does_not_fail_the_revocation(
    svc: Running, ek_ca: EkCa, spire: FakeSpire, tmp_path: Path
) -> None:
    node = ek_ca.node("s-4")
    async with svc.http() as http:
        status, _ = await join(http, svc.base, node)
    assert status == 200
    await spire.stop()
    admin = _admin_svid(svc, tmp_path, ADMIN)
    async with svc.http(admin) as http:
        status, out = await post(http, f"{svc.base}/v1/admin/nodes/s-4/revoke", {"reason": "stolen"})
    assert (status, out["revoked"]) == (200, True)  # stored; the periodic pass bans it later
    await spire.start()


async def test_bundle_and_plugin_data_follow_rotation(svc: Running, tmp_path: Path) -> None:
    bundle, data = tmp_path / "x509pop-bundle.pem", tmp_path / "x509pop.hcl"
    assert len(x509.load_pem_x509_certificates(bundle.read_bytes())) == 1
    first = data.read_text()
    assert 'mode = "external_pki"' in first
    assert f"ca_bundle_path = {str(bundle)!r}".replace("'", '"') in first
    assert 'agent_path_template = "/x509pop/{{ index .URISanSelectors \\"node\\" }}"' in first
    svc.service.cas_store.rotate(dt.datetime.now(dt.UTC), dt.timedelta(hours=1))
    svc.service.reload_ca()
    link = svc.service.spire
    assert link is not None
    assert link.sync_bundle(svc.service.cas, dt.datetime.now(dt.UTC)) is True
    assert len(x509.load_pem_x509_certificates(bundle.read_bytes())) == 2
    assert data.read_text() != first  # a changed text: SPIRE reconfigures on SIGUSR1
    assert link.sync_bundle(svc.service.cas, dt.datetime.now(dt.UTC)) is False


def test_the_ban_request_is_the_apis_message() -> None:
    from attest.spiffeid import parse_spiffe_id

    msg = ban_agent_request().FromString(
        agent_request(parse_spiffe_id("spiffe://td.test/spire/agent/x509pop/n-1"))
    )
    assert (msg.id.trust_domain, msg.id.path) == ("td.test", "/spire/agent/x509pop/n-1")
    long_path = "/spire/agent/" + "a" * 300  # lengths past one varint byte
    msg = ban_agent_request().FromString(agent_request(parse_spiffe_id(f"spiffe://td.test{long_path}")))
    assert msg.id.path == long_path


@pytest.mark.parametrize(
    ("spire", "message"),
    [
        ({"agent_id_template": "spiffe://{trust_domain}/agents/{node_name}"}, "must start with"),
        ({"agent_id_template": "spiffe://{trust_domain}/spire/agent/{nope}"}, "unknown placeholder"),
        ({"bundle_file": "b.pem"}, "go together"),
        ({"server_pid_file": "spire.pid"}, "needs plugin_data_file"),
        ({"trust_domain": "Bad.Example"}, "lowercase"),
        ({"ban_interval": "2h"}, "between"),
    ],
)
def test_bad_spire_config_is_refused_naming_the_key(spire: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        settings_from_obj({"spire": spire})


def test_a_pool_spire_could_not_read_back_is_refused() -> None:
    inventory = [{"ek_sha256": "a" * 64, "node_name": "n-1", "labels": {"nodegate.io/pool": "a/b"}}]
    with pytest.raises(ConfigError, match=r"nodegate\.io/pool"):
        settings_from_obj({"enrollment": "inventory", "inventory": inventory})


def test_plugin_data_names_the_bundle_and_changes_with_it() -> None:
    one = plugin_data(Path("/b.pem"), b"one", "spiffe://{trust_domain}/spire/agent/x509pop/{node_name}")
    two = plugin_data(Path("/b.pem"), b"two", "spiffe://{trust_domain}/spire/agent/x509pop/{node_name}")
    assert one != two
    assert b'ca_bundle_path = "/b.pem"' in one


async def test_the_node_refuses_an_x509pop_certificate_for_another_key(svc: Running, ek_ca: EkCa) -> None:
    node = ek_ca.node("s-5")
    async with svc.http() as http:
        status, out = await join(http, svc.base, node)
    assert status == 200
    other = ek_ca.node("s-6")
    async with svc.http() as http:
        status, theirs = await join(http, svc.base, other)
    assert status == 200
    forged = FinishResponse.model_validate({**out, "x509pop_certificate": theirs["x509pop_certificate"]})
    with pytest.raises(JoinFailed, match="this node's key"):
        checked_credentials(forged, node.key, "s-5", "test")
    now = dt.datetime.now(dt.UTC)
    stranger = ca.initial("fleet.test", now=now)  # right key and facts, another CA
    pem = x509pop.issue_x509pop(
        stranger.signer,
        public_key=node.key.public_key(),
        trust_domain=SPIRE_TD,
        node_name="s-5",
        facts={"node": "s-5"},
        now=now,
        not_after=now + dt.timedelta(hours=1),
    ).public_bytes(serialization.Encoding.PEM)
    forged = FinishResponse.model_validate({**out, "x509pop_certificate": pem.decode()})
    with pytest.raises(JoinFailed, match="not signed by a root"):
        checked_credentials(forged, node.key, "s-5", "test")


def test_a_pid_file_others_can_write_is_not_used(tmp_path: Path) -> None:
    pid_file = tmp_path / "spire.pid"
    pid_file.write_text(f"{os.getpid()}\n")
    pid_file.chmod(0o666)
    bundle, data = tmp_path / "b.pem", tmp_path / "x.hcl"
    template = "spiffe://{trust_domain}/spire/agent/x509pop/{node_name}"
    with pytest.raises(OSError, match="writable by its group or others"):
        write_plugin_files(bundle, data, b"roots", template, pid_file)
    assert not bundle.exists()  # nothing written: the next attempt writes and signals
    pid_file.chmod(0o644)
    received: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: received.append(signum))
    try:
        assert write_plugin_files(bundle, data, b"roots", template, pid_file) is True
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert received == [signal.SIGUSR1]
    assert write_plugin_files(bundle, data, b"roots", template, pid_file) is False  # unchanged: no signal
