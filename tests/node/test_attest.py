"""`nodegate attest` and measured boot end to end on a swtpm: the firmware's work is played by the
test (extend the TPM's PCRs with each event's digest, write the log), the real `nodegate join` /
`attest` clients send the log and the boot id, the real service replays and judges it."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from attest import svid
from bootstrap.config import settings_from_obj
from bootstrap.node.attest import AttestOptions, attest
from bootstrap.node.join import JoinFailed, JoinOptions, join
from tests.support import eventlogs as el
from tests.support.certs import ca_der, self_signed
from tests.support.service import Running, running
from tests.support.swtpms import TpmInfo, measure

pytestmark = pytest.mark.swtpm

BOOT_A = "8c1f0b7e-2f6d-4b4f-9c1a-0e5d2a9b7c31"


def mb_policy() -> dict[str, Any]:
    return {
        "secure_boot": "required",
        "classes": [{"name": "fleet", "authorities": ["sha256:" + hashlib.sha256(ca_der()).hexdigest()]}],
    }


def _settings(tmp: Path, tpm: TpmInfo, **extra: Any) -> Any:
    roots = tmp / "ek-roots.pem"
    roots.write_bytes(
        b"".join(c.public_bytes(serialization.Encoding.PEM) for c in (tpm.root, tpm.intermediate))
    )
    doc = {
        "trust_domain": "fleet.test",
        "listen": "127.0.0.1:0",
        "state_dir": str(tmp / "state"),
        "ek_roots": [str(roots)],
        "server_names": ["localhost", "127.0.0.1"],
        **extra,
    }
    return settings_from_obj(doc)


@pytest.fixture
async def mb_svc(tmp_path: Path, fresh_tpm: TpmInfo) -> AsyncIterator[Running]:
    async with running(_settings(tmp_path, fresh_tpm, measured_boot=mb_policy())) as r:
        yield r


@pytest.fixture
async def svc(tmp_path: Path, swtpm: TpmInfo) -> AsyncIterator[Running]:
    async with running(_settings(tmp_path, swtpm)) as r:
        yield r


def _bundle(r: Running, tmp: Path) -> Path:
    path = tmp / "server-ca.pem"
    path.write_bytes(svid.bundle_pem(r.service.cas.roots(datetime.now(UTC))))
    return path


def _boot_id(tmp: Path, value: str = BOOT_A) -> Path:
    path = tmp / "boot_id"
    path.write_text(value + "\n")
    return path


async def test_measured_boot_on_a_tpm_end_to_end(mb_svc: Running, fresh_tpm: TpmInfo, tmp_path: Path) -> None:
    events = el.boot(cert_der=ca_der())
    log = measure(fresh_tpm, events, tmp_path / "bios_measurements")
    opts = JoinOptions(
        server=mb_svc.base,
        ca_bundle=_bundle(mb_svc, tmp_path),
        node_name="mb-node",
        tcti=fresh_tpm.tcti,
        out=tmp_path / "node",
        event_log=log,
        boot_id_file=_boot_id(tmp_path),
    )
    await join(opts)
    record = await mb_svc.service.store.get("mb-node")
    assert record is not None
    assert (record.measured_boot_class, record.boot_id) == ("fleet", BOOT_A)

    # A log with an event dropped no longer replays to the TPM's PCRs.
    (tmp_path / "dropped").write_bytes(el.build([*events[:12], *events[13:]], banks=("sha256",)))
    with pytest.raises(JoinFailed) as info:
        await join(JoinOptions(**{**opts.__dict__, "event_log": tmp_path / "dropped", "attempts": 1}))
    assert info.value.code == "event_log_mismatch"


async def test_a_boot_under_an_unknown_authority_is_refused_and_cannot_be_disguised(
    mb_svc: Running, fresh_tpm: TpmInfo, tmp_path: Path
) -> None:
    _, unknown = self_signed("Unknown CA")
    events = el.boot(cert_der=unknown.public_bytes(serialization.Encoding.DER))
    honest = measure(fresh_tpm, events, tmp_path / "honest")
    opts = JoinOptions(
        server=mb_svc.base,
        ca_bundle=_bundle(mb_svc, tmp_path),
        node_name="mb-bad",
        tcti=fresh_tpm.tcti,
        out=tmp_path / "node",
        event_log=honest,
        boot_id_file=_boot_id(tmp_path),
        attempts=1,
    )
    with pytest.raises(JoinFailed) as info:
        await join(opts)
    assert info.value.code == "measured_boot_violation"
    assert "authority CN=Unknown CA (db) is not allowed" in info.value.detail
    # The same digests under the allowed CA's certificate: the data no longer hashes to the
    # digest, so the authority event proves nothing and the rule cannot hold.
    disguised = list(events)
    real = events[15]
    disguised[15] = el.authority(ca_der())
    disguised[15].digests = {"sha256": real.digest("sha256")}
    (tmp_path / "disguised").write_bytes(el.build(disguised, banks=("sha256",)))
    with pytest.raises(JoinFailed) as info:
        await join(JoinOptions(**{**opts.__dict__, "event_log": tmp_path / "disguised"}))
    assert info.value.code == "measured_boot_violation"
    assert (
        "(PCR 7, EV_EFI_VARIABLE_AUTHORITY): authority data does not hash to its digest" in info.value.detail
    )


async def test_attest_renews_with_a_fresh_quote_whatever_the_svid_has_left(
    svc: Running, swtpm: TpmInfo, tmp_path: Path
) -> None:
    bundle, folder, boot = _bundle(svc, tmp_path), tmp_path / "node", _boot_id(tmp_path)
    await join(
        JoinOptions(
            server=svc.base,
            ca_bundle=bundle,
            node_name="att-1",
            tcti=swtpm.tcti,
            out=folder,
            boot_id_file=boot,
        )
    )
    before = x509.load_pem_x509_certificates((folder / "svid.pem").read_bytes())[0]
    result = await attest(
        AttestOptions(server=svc.base, ca_bundle=bundle, dir=folder, tcti=swtpm.tcti, boot_id_file=boot)
    )
    after = x509.load_pem_x509_certificates((folder / "svid.pem").read_bytes())[0]
    assert result.how == "renewed"
    assert after.serial_number != before.serial_number
    record = await svc.service.store.get("att-1")
    assert record is not None
    assert record.boot_id == BOOT_A


async def test_attest_joins_again_when_the_svid_expired_while_off(
    svc: Running, swtpm: TpmInfo, tmp_path: Path
) -> None:
    bundle, folder = _bundle(svc, tmp_path), tmp_path / "node"
    await join(JoinOptions(server=svc.base, ca_bundle=bundle, node_name="att-2", tcti=swtpm.tcti, out=folder))
    key = serialization.load_pem_private_key((folder / "node.key").read_bytes(), None)
    expired = svid.issue_svid(
        svc.service.cas.signer,
        spiffe_id=svid.parse_spiffe_id("spiffe://fleet.test/node/att-2"),
        public_key=key.public_key(),  # type: ignore[arg-type]
        now=datetime.now(UTC) - timedelta(hours=3),
        ttl=timedelta(hours=1),
    )
    (folder / "svid.pem").write_bytes(expired.public_bytes(serialization.Encoding.PEM))
    result = await attest(AttestOptions(server=svc.base, ca_bundle=bundle, dir=folder, tcti=swtpm.tcti))
    assert result.how == "joined"
    leaf = x509.load_pem_x509_certificates((folder / "svid.pem").read_bytes())[0]
    assert leaf.not_valid_after_utc > datetime.now(UTC)


async def test_attest_does_not_join_around_a_revocation(svc: Running, swtpm: TpmInfo, tmp_path: Path) -> None:
    bundle, folder = _bundle(svc, tmp_path), tmp_path / "node"
    await join(JoinOptions(server=svc.base, ca_bundle=bundle, node_name="att-3", tcti=swtpm.tcti, out=folder))
    await svc.service.store.revoke("att-3", actor="test", reason="stolen")
    with pytest.raises(JoinFailed) as info:
        await attest(
            AttestOptions(server=svc.base, ca_bundle=bundle, dir=folder, tcti=swtpm.tcti, attempts=1)
        )
    assert info.value.code == "node_revoked"
