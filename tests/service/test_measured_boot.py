"""The join service with measured boot and boot ids: the event log replayed against the quote and
judged by the measured_boot policy, the boot id bound under the quote, and a boot id change that
the TPM's resetCount does not back refused. Each refusal with its code, over real HTTPS."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from attest import eventlog
from tests.support import eventlogs as el
from tests.support.certs import ca_der, self_signed
from tests.support.service import EkCa, Running, running, settings_for
from tests.support.softnode import SoftNode, post

BOOT_A = "8c1f0b7e-2f6d-4b4f-9c1a-0e5d2a9b7c31"
BOOT_B = "0d4c2b1a-9e8f-4a7b-8c6d-5e4f3a2b1c0d"


def mb_policy() -> dict[str, Any]:
    return {
        "secure_boot": "required",
        "classes": [{"name": "fleet", "authorities": ["sha256:" + hashlib.sha256(ca_der()).hexdigest()]}],
    }


@pytest.fixture(scope="module")
def ek_ca() -> EkCa:
    return EkCa.create()


@pytest.fixture
async def svc(tmp_path: Path, ek_ca: EkCa) -> AsyncIterator[Running]:
    async with running(settings_for(tmp_path, ek_ca, measured_boot=mb_policy())) as r:
        yield r


@pytest.fixture
async def plain(tmp_path: Path, ek_ca: EkCa) -> AsyncIterator[Running]:
    async with running(settings_for(tmp_path, ek_ca)) as r:
        yield r


def booted(node: SoftNode, events: list[el.Ev]) -> bytes:
    """The node's TPM holds what the firmware extended: its PCRs are the log's replay."""
    values = el.replay(events, "sha256")
    node.tpm.pcrs = {"sha256": {i: values.get(i, bytes(32)) for i in range(24)}}
    return el.build(events)


async def join(
    r: Running, node: SoftNode, *, log: bytes | None = None, boot_id: str | None = None, **kw: Any
) -> tuple[int, dict[str, Any]]:
    async with r.http() as http:
        status, start = await post(http, f"{r.base}/v1/join/start", node.start_body())
        assert status == 200, start
        body = node.finish_body(start, event_log=log, boot_id=boot_id, **kw)
        return await post(http, f"{r.base}/v1/join/finish", body)


async def test_a_good_boot_joins_and_its_class_is_recorded(svc: Running, ek_ca: EkCa) -> None:
    node = ek_ca.node("mb-1")
    status, out = await join(svc, node, log=booted(node, el.boot(cert_der=ca_der())), boot_id=BOOT_A)
    assert status == 200, out
    record = await svc.service.store.get("mb-1")
    assert record is not None
    assert (record.measured_boot_class, record.boot_id) == ("fleet", BOOT_A)


async def test_secure_boot_off_is_refused_with_the_event_named(svc: Running, ek_ca: EkCa) -> None:
    node = ek_ca.node("mb-2")
    status, out = await join(svc, node, log=booted(node, el.boot(secure=False, cert_der=ca_der())))
    assert (status, out["code"]) == (403, "measured_boot_violation")
    assert (
        "event 3 (PCR 7, EV_EFI_VARIABLE_DRIVER_CONFIG): Secure Boot is off (rule secure_boot)"
        in out["detail"]
    )


async def test_an_unknown_authority_is_refused(svc: Running, ek_ca: EkCa) -> None:
    _, other = self_signed("Somebody Else")
    node = ek_ca.node("mb-3")
    log = booted(node, el.boot(cert_der=other.public_bytes(serialization.Encoding.DER)))
    status, out = await join(svc, node, log=log)
    assert (status, out["code"]) == (403, "measured_boot_violation")
    assert "authority CN=Somebody Else (db) is not allowed" in out["detail"]


async def test_a_log_that_does_not_replay_to_the_quote_is_refused(svc: Running, ek_ca: EkCa) -> None:
    node = ek_ca.node("mb-4")
    events = el.boot(cert_der=ca_der())
    booted(node, events)
    events[16] = el.application(b"\x44" * 32)  # the log claims another shim than was measured
    status, out = await join(svc, node, log=el.build(events))
    assert (status, out["code"]) == (403, "event_log_mismatch")
    assert "sha256:4" in out["detail"]


async def test_a_broken_log_is_a_400(svc: Running, ek_ca: EkCa) -> None:
    node = ek_ca.node("mb-5")
    status, out = await join(svc, node, log=b"\x00" * 40)
    assert (status, out["code"]) == (400, "event_log_invalid")


async def test_no_log_under_a_policy_is_refused(svc: Running, ek_ca: EkCa) -> None:
    node = ek_ca.node("mb-6")
    status, out = await join(svc, node)
    assert (status, out["code"]) == (403, "measured_boot_violation")
    assert "sent no event log" in out["detail"]


async def test_without_a_policy_the_log_is_still_checked_against_the_quote(
    plain: Running, ek_ca: EkCa
) -> None:
    node = ek_ca.node("mb-7")
    status, out = await join(plain, node, log=el.build(el.boot(secure=False)))  # PCRs still all zero
    assert (status, out["code"]) == (403, "event_log_mismatch")
    node = ek_ca.node("mb-8")
    status, out = await join(plain, node, log=booted(node, el.boot(secure=False)))
    assert status == 200, out


async def test_a_log_near_the_limit_is_accepted(plain: Running, ek_ca: EkCa) -> None:
    """Real logs are 20-200 KB; the protocol allows 1 MiB of log in a finish body."""
    node = ek_ca.node("mb-9")
    events = [*el.boot(), *(el.Ev(9, el.EV_IPL, b"x" * 4000, measured=b"file") for _ in range(200))]
    log = booted(node, events)
    assert 700_000 < len(log) < eventlog.MAX_LOG_BYTES
    status, out = await join(plain, node, log=log)
    assert status == 200, out


# -- boot ids ----------------------------------------------------------------------------------------


async def test_a_boot_id_the_quote_was_not_made_over_is_refused(plain: Running, ek_ca: EkCa) -> None:
    node = ek_ca.node("b-1")
    status, out = await join(plain, node, boot_id=BOOT_B, signed_boot_id=BOOT_A)
    assert (status, out["code"]) == (403, "nonce_mismatch")


async def renew(
    r: Running, node: SoftNode, out: dict[str, Any], tmp: Path, boot_id: str | None, **evidence: Any
) -> tuple[int, Any]:
    """A renewal with the node's SVID from ``out`` (a join's or renewal's answer) and a fresh key;
    ``evidence``: more of the finish body (``event_log``)."""
    cert, key = tmp / f"{node.name}.pem", tmp / f"{node.name}.key"
    cert.write_text(out["svid"])
    key.write_bytes(
        node.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    fresh = SoftNode(node.tpm, node.name, node.ek_certificate)
    async with r.http((cert, key)) as http:
        status, start = await post(http, f"{r.base}/v1/nodes/self/renew", {"csr": fresh.csr_pem.decode()})
        assert status == 200, start
        body = fresh.evidence(
            start["session"],
            base64.b64decode(start["nonce"]),
            start["pcr_selection"],
            boot_id=boot_id,
            **evidence,
        )
        status, renewed = await post(http, f"{r.base}/v1/nodes/self/renew", body)
    if status == 200:
        assert (
            x509.load_pem_x509_certificates(renewed["svid"].encode())[0].public_key()
            == fresh.key.public_key()
        )
        node.key = fresh.key
    return status, renewed


async def test_a_new_boot_needs_a_tpm_reset(plain: Running, ek_ca: EkCa, tmp_path: Path) -> None:
    node = ek_ca.node("b-2")
    status, out = await join(plain, node, boot_id=BOOT_A)
    assert status == 200, out
    status, renewed = await renew(plain, node, out, tmp_path, BOOT_B)  # no reboot of the TPM
    assert (status, renewed["code"]) == (403, "boot_not_reset")
    node.tpm.reset_count += 1  # the machine rebooted: TPM Reset
    status, renewed = await renew(plain, node, out, tmp_path, BOOT_B)
    assert status == 200, renewed
    record = await plain.service.store.get("b-2")
    assert record is not None
    assert record.boot_id == BOOT_B
    node.tpm.reset_count += 1  # rebooted again but claims the old boot
    status, again = await renew(plain, node, renewed, tmp_path, BOOT_B)
    assert (status, again["code"]) == (403, "boot_not_reset")
