"""The service's side of SPIRE (docs/spire.md), without SPIRE: the x509pop certificate in join and
renewal answers, and which agents nodegate bans, un-bans and forgets through a stand-in of SPIRE's
Agent API (tests/support/spire_api.py: its messages read and written by protobuf itself), after a
join, a renewal, a refusal, a revoke, a forget, and in the periodic pass; and the bundle files
SPIRE reads."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import os
import signal
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from attest import ca, x509pop
from bootstrap.config import ConfigError, settings_from_obj
from bootstrap.node.credentials import X509POP_FILE, checked_credentials
from bootstrap.node.errors import JoinFailed
from bootstrap.protocol import FinishResponse
from bootstrap.service.join.spirelink import Outcome, SpireLink
from bootstrap.spire import plugin_data, write_plugin_files
from bootstrap.spire.admin import agent_request
from bootstrap.store import StoreUnavailable
from tests.service.test_renew_admin import ADMIN, _admin_svid, _files, _renew
from tests.support.service import EkCa, Running, running, settings_for
from tests.support.softnode import SoftNode, join, post
from tests.support.spire_api import FakeSpire, messages

SPIRE_TD = "spire.test"
TEMPLATE = "spiffe://{trust_domain}/spire/agent/x509pop/{node_name}/{attestation}"


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
    fake = FakeSpire(short_dir / "api.sock")
    await fake.start()
    yield fake
    await fake.stop()


def spire_settings(tmp_path: Path, ek_ca: EkCa, spire: FakeSpire, **overrides: Any) -> Any:
    node = ek_ca.node("s-1")
    return settings_for(
        tmp_path,
        ek_ca,
        admin={"spiffe_ids": {ADMIN: ["list", "revoke", "forget"]}},
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
        **overrides,
    ), node


@pytest.fixture
async def svc(tmp_path: Path, ek_ca: EkCa, spire: FakeSpire) -> AsyncIterator[Running]:
    settings, node = spire_settings(tmp_path, ek_ca, spire)
    async with running(settings) as r:
        r.service.__dict__["test_node"] = node
        yield r


def link(svc: Running) -> SpireLink:
    found = svc.service.spire
    assert found is not None
    return found


async def joined(svc: Running, node: SoftNode, **evidence: Any) -> dict[str, Any]:
    async with svc.http() as http:
        status, start = await post(http, f"{svc.base}/v1/join/start", node.start_body())
        assert status == 200, start
        status, out = await post(http, f"{svc.base}/v1/join/finish", node.finish_body(start, **evidence))
    assert status == 200, out
    return out


async def with_agent(
    svc: Running, ek_ca: EkCa, spire: FakeSpire, name: str
) -> tuple[SoftNode, dict[str, Any], str]:
    """A node joined, and its agent attested in SPIRE with the join's x509pop certificate."""
    node = ek_ca.node(name)
    out = await joined(svc, node)
    return node, out, spire.attest(SPIRE_TD, out["x509pop_certificate"])


async def renewed(
    svc: Running, node: SoftNode, creds: tuple[Path, Path], **evidence: Any
) -> tuple[int, dict[str, Any], SoftNode]:
    """A renewal with a fresh key (``evidence``: boot_id, pcrs, ...); the node with its new key."""
    fresh = SoftNode(node.tpm, node.name, node.ek_certificate)
    async with svc.http(creds) as http:
        status, start = await post(http, f"{svc.base}/v1/nodes/self/renew", {"csr": fresh.csr_pem.decode()})
        assert status == 200, start
        body = fresh.evidence(
            start["session"], base64.b64decode(start["nonce"]), start["pcr_selection"], **evidence
        )
        status, out = await post(http, f"{svc.base}/v1/nodes/self/renew", body)
    return status, out, fresh


async def test_join_hands_out_the_x509pop_certificate(svc: Running) -> None:
    node = svc.service.__dict__["test_node"]
    async with svc.http() as http:
        status, out = await join(http, svc.base, node)
    assert status == 200, out
    cert = x509.load_pem_x509_certificate(out["x509pop_certificate"].encode())
    assert cert.public_key() == node.key.public_key()
    facts = x509pop.selectors(cert, SPIRE_TD)
    attestation = facts.pop(x509pop.ATTESTATION)
    assert facts == {"node": "s-1", "ek-sha256": node.tpm.ek_sha256, "pool": "h100-a"}
    assert attestation == x509pop.attestation_id(facts)  # the digest of the other facts
    record = await svc.service.store.get("s-1")
    assert record is not None
    assert record.x509pop_attestation == attestation
    svid = x509.load_pem_x509_certificate(out["svid"].encode())
    assert cert.not_valid_after_utc == svid.not_valid_after_utc  # renewed exactly while the SVID is
    # the node keeps it with its key, in one 0600 file
    files = checked_credentials(FinishResponse.model_validate(out), node.key, "s-1", "test")
    assert files[X509POP_FILE].startswith(out["x509pop_certificate"].encode())
    assert b"PRIVATE KEY" in files[X509POP_FILE]


async def test_without_x509pop_the_answer_is_the_contracts(tmp_path: Path, ek_ca: EkCa) -> None:
    async with running(settings_for(tmp_path, ek_ca)) as r:
        async with r.http() as http:
            status, out = await join(http, r.base, ek_ca.node("plain-1"))
        assert status == 200, out
        assert set(out) == {"node_name", "spiffe_id", "svid", "bundle", "svid_expires_at", "kubeconfig"}
        record = await r.service.store.get("plain-1")
        assert record is not None
        assert record.x509pop_attestation is None


async def test_a_renewal_keeps_the_agent_and_a_revocation_bans_it(
    svc: Running, ek_ca: EkCa, spire: FakeSpire, tmp_path: Path
) -> None:
    node, out, agent = await with_agent(svc, ek_ca, spire, "s-2")
    assert agent.endswith(
        "/spire/agent/x509pop/s-2/" + x509pop.selectors(_cert(out), SPIRE_TD)["attestation"]
    )
    creds = _files(tmp_path, "s-2", node.key, out["svid"].encode())
    calls = len(spire.calls)
    status, renewal = await _renew(svc, node, creds)
    assert status == 200, renewal
    assert renewal["x509pop_certificate"] != out["x509pop_certificate"]
    # the same facts: the same attestation, the same agent, and SPIRE is not even asked
    assert _attestation(renewal) == _attestation(out)
    assert spire.calls[calls:] == []

    admin = _admin_svid(svc, tmp_path, ADMIN)
    async with svc.http(admin) as http:
        status, _ = await post(http, f"{svc.base}/v1/admin/nodes/s-2/revoke", {"reason": "stolen"})
        assert status == 200
        assert spire.mutations()[-1:] == [("BanAgent", agent)]
        assert spire.banned() == {agent}
        with pytest.raises(AssertionError, match="banned"):  # its certificates cannot bring it back
            spire.attest(SPIRE_TD, renewal["x509pop_certificate"])
        status, _ = await post(
            http, f"{svc.base}/v1/admin/nodes/s-2/revoke", {"reason": "found", "revoked": False}
        )
        assert status == 200
    assert spire.mutations()[-1] == ("DeleteAgent", agent)  # the ban lifted: it may attest again
    assert spire.attest(SPIRE_TD, renewal["x509pop_certificate"]) == agent


async def test_revoked_before_its_agent_attested_is_banned_by_the_periodic_pass(
    svc: Running, ek_ca: EkCa, spire: FakeSpire, tmp_path: Path
) -> None:
    node = ek_ca.node("s-3")
    out = await joined(svc, node)
    admin = _admin_svid(svc, tmp_path, ADMIN)
    async with svc.http(admin) as http:
        status, _ = await post(http, f"{svc.base}/v1/admin/nodes/s-3/revoke", {"reason": "stolen"})
    assert status == 200  # SPIRE knew no agent: nothing to ban yet
    assert spire.mutations() == []
    now = dt.datetime.now(dt.UTC)
    assert await link(svc).reconcile(svc.service.store, now) == _outcome()
    # the node attests with its still-valid certificate; the next pass bans it
    agent = spire.attest(SPIRE_TD, out["x509pop_certificate"], expires_at=int(now.timestamp()) + 3600)
    assert await link(svc).reconcile(svc.service.store, now) == _outcome(banned=1)
    assert spire.banned() == {agent}
    assert await link(svc).reconcile(svc.service.store, now) == _outcome()  # idempotent
    # once every certificate that could bring it back has expired, SPIRE forgets it
    later = now + dt.timedelta(hours=2, minutes=6)
    assert await link(svc).reconcile(svc.service.store, later) == _outcome(forgotten=1)
    assert spire.agents == {}


async def banned_by_a_pass(svc: Running, spire: FakeSpire, agent: str) -> None:
    """The first pass that reaches the restarted SPIRE bans ``agent``: this test's passes, or the
    service's own periodic one (whichever comes first); a pass made while the client's channel
    is still reconnecting reaches nothing and is followed by another (polled, with a deadline)."""
    deadline = asyncio.get_running_loop().time() + 20
    while spire.banned() != {agent}:
        assert asyncio.get_running_loop().time() < deadline, f"not banned: {spire.banned()}"
        await link(svc).reconcile(svc.service.store, dt.datetime.now(dt.UTC))
        if spire.banned() != {agent}:
            await asyncio.sleep(0.05)


async def test_spire_down_does_not_fail_the_revocation(
    svc: Running, ek_ca: EkCa, spire: FakeSpire, tmp_path: Path
) -> None:
    _, _, agent = await with_agent(svc, ek_ca, spire, "s-4")
    await spire.stop()
    admin = _admin_svid(svc, tmp_path, ADMIN)
    async with svc.http(admin) as http:
        status, answer = await post(http, f"{svc.base}/v1/admin/nodes/s-4/revoke", {"reason": "stolen"})
    assert (status, answer["revoked"]) == (200, True)  # stored; the periodic pass bans it later
    await spire.start()
    await banned_by_a_pass(svc, spire, agent)


async def test_a_refused_renewal_bans_the_agent_before_the_answer_and_an_accepted_one_lifts_it(
    svc: Running, ek_ca: EkCa, spire: FakeSpire, tmp_path: Path
) -> None:
    """Issue 44: a boot nodegate refuses keeps no working agent, whatever certificate it kept."""
    node, out, agent = await with_agent(svc, ek_ca, spire, "s-7")
    creds = _files(tmp_path, "s-7", node.key, out["svid"].encode())
    node.tpm.reset_count -= 1  # a quote SPIRE's selectors no longer describe: counter_regressed
    status, refusal, _ = await renewed(svc, node, creds)
    assert (status, refusal["code"]) == (403, "counter_regressed")
    # by the time the node heard of it, SPIRE had banned the agent
    assert spire.banned() == {agent}
    with pytest.raises(AssertionError, match="banned"):
        spire.attest(SPIRE_TD, out["x509pop_certificate"])
    record = await svc.service.store.get("s-7")
    assert record is not None
    assert record.refused_at is not None
    assert await link(svc).reconcile(svc.service.store, dt.datetime.now(dt.UTC)) == _outcome()  # stays

    node.tpm.reset_count += 1  # the node attests again, accepted: same facts, same attestation
    status, accepted, _ = await renewed(svc, node, creds)
    assert status == 200, accepted
    assert _attestation(accepted) == _attestation(out)
    assert ("DeleteAgent", agent) in spire.mutations()  # lifted before the answer
    assert spire.attest(SPIRE_TD, accepted["x509pop_certificate"]) == agent


async def test_a_refusal_that_is_not_the_nodes_evidence_bans_nothing(
    svc: Running, ek_ca: EkCa, spire: FakeSpire
) -> None:
    """Anyone who knows a node's EK can start a join for it and fail the proof: that must not take
    the node's agent away (only its TPM, or its SVID, reaches the evidence checks)."""
    node, _, agent = await with_agent(svc, ek_ca, spire, "s-8")
    async with svc.http() as http:
        status, start = await post(http, f"{svc.base}/v1/join/start", node.start_body())
        body = node.finish_body(start)
        body["proof"] = "A" * 44  # not the TPM's
        status, refusal = await post(http, f"{svc.base}/v1/join/finish", body)
    assert (status, refusal["code"]) == (403, "proof_invalid")
    record = await svc.service.store.get("s-8")
    assert record is not None
    assert record.refused_at is None
    assert spire.mutations() == []
    assert not spire.agents[agent].banned


async def test_a_new_boot_bans_the_agents_of_the_previous_one(
    svc: Running, ek_ca: EkCa, spire: FakeSpire, tmp_path: Path
) -> None:
    """Issue 44, 2: a superseded certificate attests no new agent. Boot A's agent is banned when
    boot B is accepted (before the answer); a certificate of an attestation whose agent never ran
    attests once, and the next pass bans it; boot B's agent is never touched."""
    node = ek_ca.node("s-9")
    boot_a, boot_b, boot_c, boot_d = (f"{n}e0c6f1a-3b7d-4c2e-9f10-2a4b6c8d0e1f" for n in "abcd")
    first = await joined(svc, node, boot_id=boot_a)
    agent_a = spire.attest(SPIRE_TD, first["x509pop_certificate"])
    creds = _files(tmp_path, "s-9", node.key, first["svid"].encode())
    node.tpm.reset_count += 1
    status, second, fresh = await renewed(svc, node, creds, boot_id=boot_b)
    assert status == 200, second
    assert _attestation(second) != _attestation(first)
    assert spire.banned() == {agent_a}
    with pytest.raises(AssertionError, match="banned"):
        spire.attest(SPIRE_TD, first["x509pop_certificate"])
    agent_b = spire.attest(SPIRE_TD, second["x509pop_certificate"])
    assert agent_b != agent_a

    # boot C's certificate, never used by an agent, superseded by boot D's
    creds = _files(tmp_path, "s-9b", fresh.key, second["svid"].encode())
    node.tpm.reset_count += 1
    status, third, fresh = await renewed(svc, fresh, creds, boot_id=boot_c)
    assert status == 200, third
    assert spire.banned() == {agent_a, agent_b}  # boot B's agent went with boot C's acceptance
    creds = _files(tmp_path, "s-9c", fresh.key, third["svid"].encode())
    node.tpm.reset_count += 1
    status, fourth, _ = await renewed(svc, fresh, creds, boot_id=boot_d)
    assert status == 200, fourth
    stray = spire.attest(SPIRE_TD, third["x509pop_certificate"])  # unknown to SPIRE: it gets in
    current = spire.attest(SPIRE_TD, fourth["x509pop_certificate"])
    assert await link(svc).reconcile(svc.service.store, dt.datetime.now(dt.UTC)) == _outcome(banned=1)
    assert spire.banned() == {agent_a, agent_b, stray}
    assert not spire.agents[current].banned
    # what SPIRE shows of the node's unbanned agents is nodegate's current record
    record = await svc.service.store.get("s-9")
    assert record is not None
    live = [a for a in spire.agents.values() if not a.banned and ("x509pop", "san:node:s-9") in a.selectors]
    assert [("x509pop", f"san:boot-id:{record.boot_id}") in a.selectors for a in live] == [True]


async def test_spire_unreachable_at_a_refusal_the_refusal_stands_and_the_pass_bans(
    svc: Running, ek_ca: EkCa, spire: FakeSpire, tmp_path: Path
) -> None:
    """Fail closed: the refusal is answered as such and recorded in the store; the ban follows at
    the first pass that reaches SPIRE (or after a restart: the state is the store's)."""
    node, out, agent = await with_agent(svc, ek_ca, spire, "s-10")
    creds = _files(tmp_path, "s-10", node.key, out["svid"].encode())
    await spire.stop()
    node.tpm.reset_count -= 1
    status, refusal, _ = await renewed(svc, node, creds)
    assert (status, refusal["code"]) == (403, "counter_regressed")
    assert not spire.agents[agent].banned
    assert await link(svc).reconcile(svc.service.store, dt.datetime.now(dt.UTC)) == _outcome()  # unreachable
    await spire.start()
    await banned_by_a_pass(svc, spire, agent)


async def test_the_bans_survive_a_restart(tmp_path: Path, ek_ca: EkCa, spire: FakeSpire) -> None:
    settings, _ = spire_settings(tmp_path, ek_ca, spire)
    node = ek_ca.node("s-11")
    async with running(settings) as svc:
        out = await joined(svc, node)
        creds = _files(tmp_path, "s-11", node.key, out["svid"].encode())
        await spire.stop()  # the refusal's ban cannot be made
        node.tpm.reset_count -= 1
        status, _, _ = await renewed(svc, node, creds)
        assert status == 403
    await spire.start()
    agent = spire.attest(SPIRE_TD, out["x509pop_certificate"])  # while nodegate was down
    async with running(settings) as svc:
        assert await link(svc).reconcile(svc.service.store, dt.datetime.now(dt.UTC)) == _outcome(banned=1)
    assert spire.banned() == {agent}


async def test_a_store_that_cannot_record_the_refusal_answers_503(
    svc: Running, ek_ca: EkCa, spire: FakeSpire, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refusal of the evidence the store cannot keep would be undone by the next pass (the
    store still says accepted): the node is told to come back instead (503), and comes back."""
    node = ek_ca.node("s-12")
    out = await joined(svc, node)
    creds = _files(tmp_path, "s-12", node.key, out["svid"].encode())

    async def down(*args: Any, **kwargs: Any) -> None:
        raise StoreUnavailable("sqlite: disk I/O error")

    monkeypatch.setattr(svc.service.store, "record_refusal", down)
    node.tpm.reset_count -= 1
    status, answer, _ = await renewed(svc, node, creds)
    assert (status, answer["code"]) == (503, "unavailable")
    monkeypatch.undo()
    status, answer, _ = await renewed(svc, node, creds)
    assert (status, answer["code"]) == (403, "counter_regressed")


async def test_quarantine_by_expiry_bans_and_a_new_join_lifts(
    svc: Running, ek_ca: EkCa, spire: FakeSpire
) -> None:
    """An attestation that expired (the gate quarantines the node) keeps no agent; the node's next
    join (same facts: same attestation) lifts the ban."""
    node, out, agent = await with_agent(svc, ek_ca, spire, "s-13")
    record = await svc.service.store.get("s-13")
    assert record is not None
    assert record.expires_at is not None
    after = record.expires_at + dt.timedelta(seconds=1)
    assert await link(svc).reconcile(svc.service.store, after) == _outcome(banned=1)
    assert spire.banned() == {agent}
    again = await joined(svc, node)
    assert _attestation(again) == _attestation(out)
    assert agent not in spire.agents  # lifted
    assert spire.attest(SPIRE_TD, again["x509pop_certificate"]) == agent


async def test_a_forgotten_node_keeps_no_agent(
    svc: Running, ek_ca: EkCa, spire: FakeSpire, tmp_path: Path
) -> None:
    _, _, agent = await with_agent(svc, ek_ca, spire, "s-14")
    admin = _admin_svid(svc, tmp_path, ADMIN)
    async with svc.http(admin) as http:
        status, _ = await post(http, f"{svc.base}/v1/admin/nodes/s-14/forget", {"reason": "re-imaged"})
    assert status == 200
    assert spire.banned() == {agent}


def _cert(answer: dict[str, Any]) -> x509.Certificate:
    return x509.load_pem_x509_certificate(answer["x509pop_certificate"].encode())


def _attestation(answer: dict[str, Any]) -> str:
    return x509pop.selectors(_cert(answer), SPIRE_TD)["attestation"]


def _outcome(banned: int = 0, lifted: int = 0, forgotten: int = 0) -> Outcome:
    return Outcome(banned, lifted, forgotten)


async def test_bundle_and_plugin_data_follow_rotation(svc: Running, tmp_path: Path) -> None:
    bundle, data = tmp_path / "x509pop-bundle.pem", tmp_path / "x509pop.hcl"
    assert len(x509.load_pem_x509_certificates(bundle.read_bytes())) == 1
    first = data.read_text()
    assert 'mode = "external_pki"' in first
    assert f"ca_bundle_path = {str(bundle)!r}".replace("'", '"') in first
    assert (
        'agent_path_template = "/x509pop/{{ index .URISanSelectors \\"node\\" }}/'
        '{{ index .URISanSelectors \\"attestation\\" }}"'
    ) in first
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

    ban_agent_request = messages()["BanAgentRequest"]
    msg = ban_agent_request.FromString(
        agent_request(parse_spiffe_id("spiffe://td.test/spire/agent/x509pop/n-1"))
    )
    assert (msg.id.trust_domain, msg.id.path) == ("td.test", "/spire/agent/x509pop/n-1")
    long_path = "/spire/agent/" + "a" * 300  # lengths past one varint byte
    msg = ban_agent_request.FromString(agent_request(parse_spiffe_id(f"spiffe://td.test{long_path}")))
    assert msg.id.path == long_path


@pytest.mark.parametrize(
    ("spire", "message"),
    [
        ({"agent_id_template": "spiffe://{trust_domain}/agents/{node_name}"}, "must start with"),
        (
            {"agent_id_template": "spiffe://{trust_domain}/spire/agent/{nope}/{attestation}"},
            "unknown placeholder",
        ),
        # one agent ID per node: an earlier boot's certificate could not be banned apart
        ({"agent_id_template": "spiffe://{trust_domain}/spire/agent/x509pop/{node_name}"}, "attestation"),
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
    one = plugin_data(Path("/b.pem"), b"one", TEMPLATE)
    two = plugin_data(Path("/b.pem"), b"two", TEMPLATE)
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
    template = TEMPLATE
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
