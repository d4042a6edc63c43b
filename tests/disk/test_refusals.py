"""Every refusal of a disk-key release has its code, and no key material leaves the server: a
refusal's body is a problem document, nothing else. The real service, swtpm nodes, and the
exchange sent by hand where an attacker would send it."""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from attest import diskkey
from bootstrap.demo import swtpm as harness
from bootstrap.node.disk.release import release
from bootstrap.node.errors import JoinFailed
from bootstrap.node.tpm import Agent
from bootstrap.protocol import DISK_FINISH_PATH, DISK_START_PATH
from bootstrap.service.join.sessions import Sealer, load_keys
from bootstrap.store.diskkeys import FileVault
from tests.disk import support as ds
from tests.support import eventlogs as el
from tests.support.certs import ca_der
from tests.support.service import Running, running
from tests.support.swtpms import TpmInfo, measure

pytestmark = pytest.mark.swtpm


@pytest.fixture
async def svc(tmp_path: Path, swtpm: TpmInfo) -> AsyncIterator[Running]:
    async with running(ds.settings(tmp_path, swtpm)) as r:
        yield r


@pytest.fixture
async def http(svc: Running) -> AsyncIterator[aiohttp.ClientSession]:
    async with svc.http() as session:
        yield session


def refused(status: int, body: dict[str, Any], code: str, http_status: int = 403) -> None:
    """The refusal has its code and carries nothing but the problem document."""
    assert (status, body.get("code")) == (http_status, code), body
    assert set(body) <= {"type", "title", "status", "detail", "code"}


def released_to(body: dict[str, Any]) -> None:
    assert {"sealed_keys", "credential_blob", "encrypted_secret"} <= set(body), body


async def test_a_node_that_never_joined_gets_nothing(svc: Running, swtpm: TpmInfo, http: Any) -> None:
    refused(*await ds.exchange(http, svc, swtpm.tcti, "stranger"), "node_not_enrolled")


async def test_another_tpm_asking_for_the_nodes_volume_is_refused(
    svc: Running, swtpm: TpmInfo, other_swtpm: TpmInfo, tmp_path: Path, http: Any
) -> None:
    """A copied disk in another machine: its binding names the node; the other TPM's EK is not the
    one the node is bound to."""
    await ds.joined(svc, swtpm, tmp_path)
    refused(*await ds.exchange(http, svc, other_swtpm.tcti, "disk-node"), "ek_mismatch")


async def test_another_tpm_sending_the_nodes_ek_cannot_quote_for_its_ak(
    svc: Running, swtpm: TpmInfo, other_swtpm: TpmInfo, tmp_path: Path, http: Any
) -> None:
    """The node's EK public area is no secret, and a stolen SVID adds nothing here: the quote must
    come from the AK the node attested with, which lives in the node's TPM only."""
    await ds.joined(svc, swtpm, tmp_path)
    ek, _ = ds.tpm_keys(swtpm.tcti)
    status, start = await ds.post(http, svc, DISK_START_PATH, ds.start_body("disk-node", ek))
    assert status == 200
    body = ds.quote_body(other_swtpm.tcti, start, "disk-node")  # the wrong AK signs
    refused(*await ds.post(http, svc, DISK_FINISH_PATH, body), "quote_signature_invalid")


async def test_a_replayed_finish_is_refused_and_a_captured_quote_does_not_fit_a_new_session(
    svc: Running, swtpm: TpmInfo, tmp_path: Path, http: Any
) -> None:
    await ds.joined(svc, swtpm, tmp_path)
    ek, _ = ds.tpm_keys(swtpm.tcti)
    status, start = await ds.post(http, svc, DISK_START_PATH, ds.start_body("disk-node", ek))
    body = ds.quote_body(swtpm.tcti, start, "disk-node")
    status, first = await ds.post(http, svc, DISK_FINISH_PATH, body)
    assert status == 200
    released_to(first)
    refused(*await ds.post(http, svc, DISK_FINISH_PATH, body), "session_reused")
    # The same quote under a fresh session: its nonce is the old one.
    status, again = await ds.post(http, svc, DISK_START_PATH, ds.start_body("disk-node", ek))
    refused(
        *await ds.post(http, svc, DISK_FINISH_PATH, {**body, "session": again["session"]}), "nonce_mismatch"
    )


async def test_a_replay_is_refused_by_a_restarted_service_too(tmp_path: Path, swtpm: TpmInfo) -> None:
    """Single use is the store's: a new process (or another replica) refuses the replay as well."""
    settings = ds.settings(tmp_path, swtpm)
    async with running(settings) as r, r.http() as http:
        await ds.joined(r, swtpm, tmp_path)
        ek, _ = ds.tpm_keys(swtpm.tcti)
        _, start = await ds.post(http, r, DISK_START_PATH, ds.start_body("disk-node", ek))
        body = ds.quote_body(swtpm.tcti, start, "disk-node")
        assert (await ds.post(http, r, DISK_FINISH_PATH, body))[0] == 200
    async with running(settings) as r, r.http() as http:
        refused(*await ds.post(http, r, DISK_FINISH_PATH, body), "session_reused")


async def test_reordered_steps_and_sessions_of_other_exchanges_are_refused(
    svc: Running, swtpm: TpmInfo, tmp_path: Path, http: Any
) -> None:
    await ds.joined(svc, swtpm, tmp_path)
    ek, _ = ds.tpm_keys(swtpm.tcti)
    _, start = await ds.post(http, svc, DISK_START_PATH, ds.start_body("disk-node", ek))
    body = ds.quote_body(swtpm.tcti, start, "disk-node")
    # a release's session at the join's finish, and a renewal's at the release's finish
    join_finish = {k: body[k] for k in ("session", "quote", "signature", "pcrs")} | {
        "proof": base64.b64encode(bytes(32)).decode()
    }
    refused(*await ds.post(http, svc, "/v1/join/finish", join_finish), "session_unknown")
    sealer = svc.service.disk.sealer  # type: ignore[union-attr]
    _, renewal = sealer.new(
        kind="renew",
        node_name="disk-node",
        ek_sha256="0" * 64,
        ak_public=b"",
        csr_der=b"",
        selection="",
        ttl=60,
    )
    refused(*await ds.post(http, svc, DISK_FINISH_PATH, {**body, "session": renewal}), "session_unknown")
    # a quote made for another volume (or epoch, or version) than the session's
    other = ds.quote_body(swtpm.tcti, start, "disk-node", volume=ds.new_volume())
    refused(*await ds.post(http, svc, DISK_FINISH_PATH, other), "nonce_mismatch")


async def test_a_quote_over_a_stale_session_is_refused(
    svc: Running, swtpm: TpmInfo, tmp_path: Path, http: Any
) -> None:
    await ds.joined(svc, swtpm, tmp_path)
    record = await svc.service.store.get("disk-node")
    assert record is not None
    ek, _ = ds.tpm_keys(swtpm.tcti)
    # A session the service sealed an hour ago (its own key, its lifetime long over).
    past = Sealer(load_keys(tmp_path / "state"), clock=lambda: time.time() - 3600)
    session, token = past.new(
        kind="disk", node_name="disk-node", ek_sha256=record.ek_sha256, ak_public=record.ak_public,
        csr_der=b"", selection="sha256:0,1,2,3,4,5,6,7", ttl=60, volume=ds.VOLUME, epoch=0,
        key_version=1, ek_public=ek,
    )  # fmt: skip
    start = {"session": token, "nonce": base64.b64encode(session.nonce).decode(), "epoch": 0,
             "key_version": 1, "pcr_selection": session.selection}  # fmt: skip
    refused(*await ds.post(http, svc, DISK_FINISH_PATH, ds.quote_body(swtpm.tcti, start, "disk-node")),
            "session_expired", 410)  # fmt: skip


async def test_a_revoked_node_gets_nothing(svc: Running, swtpm: TpmInfo, tmp_path: Path, http: Any) -> None:
    await ds.joined(svc, swtpm, tmp_path)
    await svc.service.store.revoke("disk-node", actor="test", reason="stolen")
    refused(*await ds.exchange(http, svc, swtpm.tcti), "node_revoked")


async def test_a_revocation_between_start_and_finish_counts(
    svc: Running, swtpm: TpmInfo, tmp_path: Path, http: Any
) -> None:
    await ds.joined(svc, swtpm, tmp_path)
    ek, _ = ds.tpm_keys(swtpm.tcti)
    _, start = await ds.post(http, svc, DISK_START_PATH, ds.start_body("disk-node", ek))
    record = await svc.service.store.get("disk-node")
    assert record is not None
    FileVault(tmp_path / "state").update_now(lambda d: d.revoked(record.ek_sha256))
    refused(*await ds.post(http, svc, DISK_FINISH_PATH, ds.quote_body(swtpm.tcti, start, "disk-node")),
            "disk_key_revoked")  # fmt: skip


async def test_a_quarantined_node_gets_nothing(
    svc: Running, swtpm: TpmInfo, tmp_path: Path, http: Any
) -> None:
    """Quarantined by age: its last attestation is older than gate.attestation_lifetime."""
    await ds.joined(svc, swtpm, tmp_path)
    disk = svc.service.disk
    assert disk is not None
    disk.settings = disk.settings.model_copy(
        update={"gate": disk.settings.gate.model_copy(update={"attestation_lifetime": timedelta(hours=8)})}
    )
    disk._now = lambda: datetime.now(UTC) + timedelta(hours=9)
    refused(*await ds.exchange(http, svc, swtpm.tcti), "node_quarantined")
    disk._now = lambda: datetime.now(UTC) + timedelta(hours=7)
    released_to((await ds.exchange(http, svc, swtpm.tcti))[1])


async def test_an_admin_quarantine_holds_the_boot_it_was_set_in(tmp_path: Path, fresh_tpm: TpmInfo) -> None:
    """``nodegate nodes quarantine`` (issue 43): the boot it was set in gets no key; after a real
    reboot (TPM reset: resetCount grows) the release is judged like any other and the keys go
    out, or a machine with an encrypted root could never attest again to lift it."""
    async with running(ds.settings(tmp_path, fresh_tpm)) as r, r.http() as http:
        await ds.joined(r, fresh_tpm, tmp_path)
        await r.service.store.quarantine("disk-node", actor="alice", reason="shim CVE-2023-40547")
        status, body = await ds.exchange(http, r, fresh_tpm.tcti)
        refused(status, body, "node_quarantined")
        assert "shim CVE-2023-40547" in body["detail"]
        fresh_tpm.server.power_off()
        rebooted = harness.start(fresh_tpm.server.ca, fresh_tpm.server.state)
        try:
            ek, _ak = ds.tpm_keys(rebooted.tcti)
            status, start = await ds.post(http, r, DISK_START_PATH, ds.start_body("disk-node", ek))
            assert status == 200, start
            finish = ds.quote_body(rebooted.tcti, start, "disk-node", boot=ds.BOOT_B)
            status, body = await ds.post(http, r, DISK_FINISH_PATH, finish)
        finally:
            rebooted.stop()
        assert status == 200, body
        released_to(body)
        record = await r.service.store.get("disk-node")
        assert record is not None
        assert record.quarantine is not None  # only the node's next join or renewal lifts it


async def test_a_class_without_keys_gets_nothing(tmp_path: Path, swtpm: TpmInfo) -> None:
    gold = {"name": "gold", "golden": {"sha256": {0: ["11" * 32]}}}
    settings = ds.settings(
        tmp_path,
        swtpm,
        pcr_policy={"bank": "sha256", "pcrs": list(range(8)), "classes": [ds.pcr_class(swtpm), gold]},
        disk_keys={"classes": ["gold"], "require_measured_boot": False},
    )
    async with running(settings) as r, r.http() as http:
        await ds.joined(r, swtpm, tmp_path)  # it joins: its boot matches fleet
        status, body = await ds.exchange(http, r, swtpm.tcti)
    refused(status, body, "disk_keys_disabled")
    assert "matched class fleet" in body["detail"]


async def test_a_service_without_disk_keys_releases_nothing(tmp_path: Path, swtpm: TpmInfo) -> None:
    settings = ds.settings(tmp_path, swtpm, disk_keys=None)
    async with running(settings) as r, r.http() as http:
        await ds.joined(r, swtpm, tmp_path)
        refused(*await ds.exchange(http, r, swtpm.tcti), "disk_keys_disabled")
    assert not (tmp_path / "state" / "disk-keys.json").exists()


@pytest.mark.parametrize(
    "change",
    [
        {"volume": "6F1D2A3B-4C5D-4E6F-8A9B-0C1D2E3F4A5B"},  # not canonical
        {"volume": "not-a-uuid"},
        {"key_version": 0},
        {"key_version": "1"},
        {"epoch": -1},
        {"node_name": "Not_A_Node"},
        {"extra": 1},
    ],
)
async def test_malformed_starts_are_400(
    svc: Running, swtpm: TpmInfo, tmp_path: Path, http: Any, change: dict[str, Any]
) -> None:
    await ds.joined(svc, swtpm, tmp_path)
    ek, _ = ds.tpm_keys(swtpm.tcti)
    refused(*await ds.post(http, svc, DISK_START_PATH, {**ds.start_body("disk-node", ek), **change}),
            "malformed_request", 400)  # fmt: skip


async def test_a_version_or_epoch_that_never_existed_is_400(
    svc: Running, swtpm: TpmInfo, tmp_path: Path, http: Any
) -> None:
    await ds.joined(svc, swtpm, tmp_path)
    refused(*await ds.exchange(http, svc, swtpm.tcti, key_version=7), "malformed_request", 400)
    refused(*await ds.exchange(http, svc, swtpm.tcti, epoch=3), "malformed_request", 400)


async def test_an_intercepted_answer_is_useless_without_the_nodes_tpm(
    svc: Running, swtpm: TpmInfo, other_swtpm: TpmInfo, tmp_path: Path, http: Any
) -> None:
    """What a TLS-intercepting proxy sees of a release: the keys sealed under a secret that only
    ActivateCredential on the node's TPM (its EK and attested AK) recovers."""
    await ds.joined(svc, swtpm, tmp_path)
    status, body = await ds.exchange(http, svc, swtpm.tcti)
    assert status == 200
    blob, secret = base64.b64decode(body["credential_blob"]), base64.b64decode(body["encrypted_secret"])
    sealed = base64.b64decode(body["sealed_keys"])
    with pytest.raises(diskkey.DiskKeyUnsealable):
        diskkey.open_keys(os.urandom(32), sealed, b"any context")
    with Agent(other_swtpm.tcti) as other:  # another TPM cannot activate it
        ek, ak = other.create_ek("rsa"), other.create_ak()
        with pytest.raises(Exception, match="activating the credential"):
            other.activate_credential(ak, ek, blob, secret)
    with Agent(swtpm.tcti) as mine:  # the node's own TPM can
        transport = mine.activate_credential(mine.create_ak(), mine.create_ek("rsa"), blob, secret)
    assert len(transport) == 32
    assert hashlib.sha256(sealed).digest() != hashlib.sha256(transport).digest()


async def test_every_release_and_refusal_is_an_audit_line_a_count_and_a_store_entry(
    svc: Running, swtpm: TpmInfo, tmp_path: Path, http: Any, caplog: pytest.LogCaptureFixture
) -> None:
    await ds.joined(svc, swtpm, tmp_path)
    caplog.set_level(logging.INFO, logger="nodegate.disk")
    assert (await ds.exchange(http, svc, swtpm.tcti))[0] == 200
    await svc.service.store.revoke("disk-node", actor="test", reason="stolen")
    ek, _ = ds.tpm_keys(swtpm.tcti)
    assert (await ds.post(http, svc, DISK_START_PATH, ds.start_body("disk-node", ek)))[0] == 403
    lines = [
        (r.node, r.volume, r.disk_class, r.verdict, r.code)
        for r in caplog.records
        if r.name == "nodegate.disk"
    ]  # type: ignore[attr-defined]
    assert lines == [
        ("disk-node", ds.VOLUME, "fleet", "released", "ok"),
        ("disk-node", ds.VOLUME, "none", "refused", "node_revoked"),
    ]
    metrics = svc.service.metrics.render().decode()
    assert 'nodegate_disk_releases_total{class="fleet",code="ok"} 1.0' in metrics
    assert 'nodegate_disk_releases_total{class="none",code="node_revoked"} 1.0' in metrics
    trail = [(e.action, e.actor) for e in await svc.service.store.audit("disk-node")]
    assert trail[:2] == [("revoke", "test"), ("disk-release", "node")]
    assert ds.VOLUME in (await svc.service.store.audit("disk-node"))[1].detail


async def test_the_node_client_reports_the_servers_code(svc: Running, swtpm: TpmInfo, tmp_path: Path) -> None:
    await ds.joined(svc, swtpm, tmp_path)
    await svc.service.store.revoke("disk-node", actor="test", reason="stolen")
    with pytest.raises(JoinFailed) as exc:
        await release(ds.options(svc, swtpm, tmp_path))
    assert (exc.value.code, exc.value.status) == ("node_revoked", 403)


# -- measured boot: a fresh TPM, firmware played by the test -------------------------------------


def _mb(authority: bytes) -> dict[str, Any]:
    return {
        "secure_boot": "required",
        "classes": [{"name": "fleet-mb", "authorities": ["sha256:" + hashlib.sha256(authority).hexdigest()]}],
    }


async def test_measured_boot_decides_and_a_boot_its_class_refuses_gets_nothing(
    tmp_path: Path, fresh_tpm: TpmInfo
) -> None:
    log = measure(fresh_tpm, el.boot(cert_der=ca_der()), tmp_path / "bios_measurements")
    good = ds.settings(
        tmp_path, fresh_tpm, pcr_policy={}, measured_boot=_mb(ca_der()),
        disk_keys={"classes": ["fleet-mb"]},
    )  # fmt: skip
    async with running(good) as r:
        await ds.joined(r, fresh_tpm, tmp_path, event_log=log)
        out = await release(ds.options(r, fresh_tpm, tmp_path, event_log=log))
        assert out.key_version == 1
        with pytest.raises(JoinFailed) as exc:  # without the log: no measured boot, no key
            await release(ds.options(r, fresh_tpm, tmp_path))
        assert exc.value.code == "measured_boot_violation"
    # The same boot, judged by a class whose authority it does not carry: a wrong boot.
    other = b"another signing certificate"
    stricter = good.model_copy(update={"measured_boot": good.measured_boot.model_validate(_mb(other))})
    async with running(stricter) as r:
        with pytest.raises(JoinFailed) as exc:
            await release(ds.options(r, fresh_tpm, tmp_path, event_log=log))
    assert exc.value.code == "measured_boot_violation"


async def test_a_boot_whose_pcrs_changed_is_refused(tmp_path: Path, fresh_tpm: TpmInfo) -> None:
    async with running(ds.settings(tmp_path, fresh_tpm)) as r:
        await ds.joined(r, fresh_tpm, tmp_path)
        with Agent(fresh_tpm.tcti) as agent:  # something else booted: PCR 4 moved
            agent.extend_pcr(4, hashlib.sha256(b"another kernel").digest())
        with pytest.raises(JoinFailed) as exc:
            await release(ds.options(r, fresh_tpm, tmp_path))
    assert exc.value.code == "pcr_policy_violation"


async def test_a_request_with_only_a_stolen_svid_gets_nothing(
    svc: Running, swtpm: TpmInfo, other_swtpm: TpmInfo, tmp_path: Path
) -> None:
    """The thief has the node's SVID and key (its files) and sends them as the TLS client
    certificate; the release does not take it for the node: only a quote by the node's AK does."""
    await ds.joined(svc, swtpm, tmp_path)
    files = tmp_path / "node-disk-node"
    ek, _ = ds.tpm_keys(swtpm.tcti)  # public: the thief may have it too
    async with svc.http(cert=(files / "svid.pem", files / "node.key")) as http:
        status, start = await ds.post(http, svc, DISK_START_PATH, ds.start_body("disk-node", ek))
        assert status == 200  # a start gives a nonce to anyone; nothing else
        body = ds.quote_body(other_swtpm.tcti, start, "disk-node")  # the thief's TPM quotes
        refused(*await ds.post(http, svc, DISK_FINISH_PATH, body), "quote_signature_invalid")
