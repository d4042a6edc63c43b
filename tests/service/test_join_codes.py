"""Every machine code of docs/protocol.md, provoked over HTTPS against the running service, with its status.

(malformed_request, payload_too_large, csr_invalid, ek_untrusted, node_name_conflict, proof_invalid,
pcr_digest_mismatch, quote_signature_invalid, session_unknown and session_reused also have their
own tests in test_server.py; this module holds one test per remaining code and the full table.)
"""

from __future__ import annotations

import base64
import logging
import os
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from attest.errors import ALL_ERRORS
from bootstrap.problems import JOIN_FAILURES
from bootstrap.service.join.sessions import Sealer, load_keys
from tests.support.fakes import sign_ecdsa
from tests.support.service import EkCa, Running, running, settings_for
from tests.support.softnode import SoftNode, b64, join, post

PROTOCOL_CODES = {
    "malformed_request": 400,
    "payload_too_large": 413,
    "rate_limited": 429,
    "ek_untrusted": 403,
    "ek_mismatch": 403,
    "ak_invalid": 403,
    "csr_invalid": 403,
    "node_name_conflict": 409,
    "node_not_enrolled": 403,
    "session_unknown": 403,
    "session_expired": 410,
    "session_reused": 403,
    "proof_invalid": 403,
    "quote_invalid": 403,
    "quote_signature_invalid": 403,
    "nonce_mismatch": 403,
    "pcr_selection_mismatch": 403,
    "pcr_digest_mismatch": 403,
    "pcr_policy_violation": 403,
    "clock_unsafe": 403,
    "counter_regressed": 403,
}


@pytest.fixture(scope="module")
def ek_ca() -> EkCa:
    return EkCa.create()


Scenario = Callable[[Running, Any, EkCa], Awaitable[tuple[int, dict[str, Any]]]]


async def _start(r: Running, http: Any, node: SoftNode) -> dict[str, Any]:
    status, out = await post(http, f"{r.base}/v1/join/start", node.start_body())
    assert status == 200, out
    return out


async def _finish_with(r: Running, http: Any, node: SoftNode, edit: Callable[[dict[str, Any]], None]) -> Any:
    start = await _start(r, http, node)
    body = node.finish_body(start)
    edit(body)
    return await post(http, f"{r.base}/v1/join/finish", body)


def _resign(node: SoftNode, body: dict[str, Any], change: Callable[[bytearray], None]) -> None:
    """Alter the TPMS_ATTEST and sign it again with the AK: a quote only a compromised TPM makes."""
    attest = bytearray(base64.b64decode(body["quote"]))
    change(attest)
    body["quote"] = b64(bytes(attest))
    body["signature"] = b64(sign_ecdsa(node.tpm.ak_key, bytes(attest)))


def _safe_offset(attest: bytes) -> int:
    off = 6  # magic, type
    for _ in range(2):  # qualifiedSigner, extraData
        (size,) = struct.unpack_from(">H", attest, off)
        off += 2 + size
    return off + 8 + 4 + 4  # clock, resetCount, restartCount


async def ek_mismatch(r: Running, http: Any, ca: EkCa) -> Any:
    node = ca.node("c-ekm")
    other = ca.node("c-ekm")
    node.ek_certificate = other.ek_certificate  # certifies a different EK
    return await post(http, f"{r.base}/v1/join/start", node.start_body())


async def ak_invalid(r: Running, http: Any, ca: EkCa) -> Any:
    node = ca.node("c-ak")
    body = node.start_body()
    body["ak_public"] = b64(node.tpm.ek_public)  # a decrypt key, not a restricted signing key
    return await post(http, f"{r.base}/v1/join/start", body)


async def quote_invalid(r: Running, http: Any, ca: EkCa) -> Any:
    node = ca.node("c-qi")

    def edit(body: dict[str, Any]) -> None:
        _resign(node, body, lambda a: a.__setitem__(slice(4, 6), b"\x80\x17"))  # TPM_ST_ATTEST_CERTIFY

    return await _finish_with(r, http, node, edit)


async def nonce_mismatch(r: Running, http: Any, ca: EkCa) -> Any:
    node = ca.node("c-nonce")
    start = await _start(r, http, node)
    body = node.finish_body(start)
    attest, sig, _ = node.tpm.quote(start["pcr_selection"], os.urandom(32))  # over another nonce
    body["quote"], body["signature"] = b64(attest), b64(sig)
    return await post(http, f"{r.base}/v1/join/finish", body)


async def pcr_selection_mismatch(r: Running, http: Any, ca: EkCa) -> Any:
    node = ca.node("c-sel")
    start = await _start(r, http, node)
    start = {**start, "pcr_selection": "sha256:0,1,2"}  # the node quotes less than asked
    return await post(http, f"{r.base}/v1/join/finish", node.finish_body(start))


async def clock_unsafe(r: Running, http: Any, ca: EkCa) -> Any:
    node = ca.node("c-clock")

    def edit(body: dict[str, Any]) -> None:
        def unsafe(a: bytearray) -> None:
            a[_safe_offset(bytes(a))] = 0

        _resign(node, body, unsafe)

    return await _finish_with(r, http, node, edit)


async def counter_regressed(r: Running, http: Any, ca: EkCa) -> Any:
    node = ca.node("c-ctr")
    node.tpm.reset_count = 5
    status, out = await join(http, r.base, node)
    assert status == 200, out
    node.tpm.reset_count = 4  # a replayed or rolled-back TPM state
    return await join(http, r.base, node)


async def session_expired(r: Running, http: Any, ca: EkCa) -> Any:
    node = ca.node("c-exp")
    start = await _start(r, http, node)
    later = Sealer(load_keys(r.service.settings.state_dir), clock=lambda: time.time() + 3600)
    r.service.join.sealer = later
    return await post(http, f"{r.base}/v1/join/finish", node.finish_body(start))


SCENARIOS: dict[str, Scenario] = {
    "ek_mismatch": ek_mismatch,
    "ak_invalid": ak_invalid,
    "quote_invalid": quote_invalid,
    "nonce_mismatch": nonce_mismatch,
    "pcr_selection_mismatch": pcr_selection_mismatch,
    "clock_unsafe": clock_unsafe,
    "counter_regressed": counter_regressed,
    "session_expired": session_expired,
}


@pytest.fixture
async def svc(tmp_path: Path, ek_ca: EkCa) -> AsyncIterator[Running]:
    async with running(settings_for(tmp_path, ek_ca)) as r:
        yield r


@pytest.mark.parametrize("code", sorted(SCENARIOS))
async def test_code_over_http(svc: Running, ek_ca: EkCa, code: str) -> None:
    async with svc.http() as http:
        status, out = await SCENARIOS[code](svc, http, ek_ca)
    assert (status, out.get("code")) == (PROTOCOL_CODES[code], code), out


async def test_pcr_policy_violation(tmp_path: Path, ek_ca: EkCa) -> None:
    policy = {"classes": [{"name": "golden", "mode": "enforce", "golden": {"sha256": {0: ["ab" * 32]}}}]}
    async with running(settings_for(tmp_path, ek_ca, pcr_policy=policy)) as r, r.http() as http:
        status, out = await join(http, r.base, ek_ca.node("c-pcr"))
    assert (status, out["code"]) == (403, "pcr_policy_violation")
    assert "sha256:0" in out["detail"]


async def test_warn_mode_class_logs_but_admits(
    tmp_path: Path, ek_ca: EkCa, caplog: pytest.LogCaptureFixture
) -> None:
    policy = {"classes": [{"name": "next-bios", "mode": "warn", "golden": {"sha256": {0: ["ab" * 32]}}}]}
    with caplog.at_level(logging.WARNING, logger="nodegate.join"):
        async with running(settings_for(tmp_path, ek_ca, pcr_policy=policy)) as r, r.http() as http:
            status, out = await join(http, r.base, ek_ca.node("c-warn"))
    assert status == 200, out
    (record,) = [rec for rec in caplog.records if rec.name == "nodegate.join"]
    assert record.__dict__["node"] == "c-warn"
    assert "class next-bios: sha256:0" in record.__dict__["error"]


async def test_inventory_mode(tmp_path: Path, ek_ca: EkCa) -> None:
    listed = ek_ca.node("inv-1")
    inventory = [{"ek_sha256": listed.tpm.ek_sha256, "node_name": "inv-1"}]
    settings = settings_for(tmp_path, ek_ca, enrollment="inventory", inventory=inventory)
    async with running(settings) as r, r.http() as http:
        status, out = await join(http, r.base, listed)
        assert status == 200, out
        status, out = await join(http, r.base, ek_ca.node("inv-2"))
        assert (status, out["code"]) == (403, "node_not_enrolled")
        renamed = SoftNode(listed.tpm, "inv-3", listed.ek_certificate)  # a listed EK, another name
        status, out = await join(http, r.base, renamed)
        assert (status, out["code"]) == (403, "node_not_enrolled")


async def test_rate_limited(tmp_path: Path, ek_ca: EkCa) -> None:
    settings = settings_for(tmp_path, ek_ca, limits={"join_rate": 0.01, "join_burst": 2})
    async with running(settings) as r, r.http() as http:
        node = ek_ca.node("c-rate")
        seen = []
        for _ in range(3):
            async with http.post(f"{r.base}/v1/join/start", json=node.start_body()) as resp:
                seen.append((resp.status, (await resp.json(content_type=None)).get("code")))
                retry_after = resp.headers.get("Retry-After")
    assert seen[:2] == [(200, None), (200, None)]
    assert seen[2] == (429, "rate_limited")
    assert retry_after is not None
    assert int(retry_after) >= 1


async def test_revoked_node_cannot_join_again(tmp_path: Path, ek_ca: EkCa) -> None:
    async with running(settings_for(tmp_path, ek_ca)) as r, r.http() as http:
        node = ek_ca.node("c-rev")
        assert (await join(http, r.base, node))[0] == 200
        await r.service.store.revoke("c-rev", actor="test", reason="stolen")
        status, out = await join(http, r.base, node)
    assert (status, out["code"]) == (403, "node_revoked")


def test_every_protocol_code_is_covered() -> None:
    """The table above is docs/protocol.md's list, every one is an evidence or join failure code, and each
    has a test here or in test_server.py."""
    ours = {cls.code for cls in (*ALL_ERRORS, *JOIN_FAILURES)}
    assert set(PROTOCOL_CODES) <= ours
    elsewhere = {
        "malformed_request",
        "payload_too_large",
        "csr_invalid",
        "ek_untrusted",
        "node_name_conflict",
        "proof_invalid",
        "pcr_digest_mismatch",
        "quote_signature_invalid",
        "session_unknown",
        "session_reused",
    }
    here = set(SCENARIOS) | {"pcr_policy_violation", "node_not_enrolled", "rate_limited"}
    assert set(PROTOCOL_CODES) == here | elsewhere
