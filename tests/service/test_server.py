"""The join service over real TLS with soft TPMs: the happy path and each refusal with its code."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from attest import svid
from tests.support import certs
from tests.support.service import EkCa, Running, running, settings_for
from tests.support.softnode import SoftNode, join, post

NOW = dt.datetime.now(dt.UTC)


@pytest.fixture(scope="module")
def ek_ca() -> EkCa:
    return EkCa.create()


@pytest.fixture
async def svc(tmp_path: Path, ek_ca: EkCa) -> AsyncIterator[Running]:
    async with running(settings_for(tmp_path, ek_ca)) as r:
        yield r


def _leaf(pem: str) -> x509.Certificate:
    return x509.load_pem_x509_certificates(pem.encode())[0]


async def test_join_issues_an_svid_that_verifies(svc: Running, ek_ca: EkCa, tmp_path: Path) -> None:
    node = ek_ca.node("gpu-001")
    async with svc.http() as http:
        status, out = await join(http, svc.base, node)
    assert status == 200, out
    assert out["node_name"] == "gpu-001"
    assert out["spiffe_id"] == "spiffe://fleet.test/node/gpu-001"
    assert out["kubeconfig"] is None  # no cluster configured
    leaf = _leaf(out["svid"])
    roots = x509.load_pem_x509_certificates(out["bundle"].encode())
    assert leaf.public_key() == node.key.public_key()
    sid = svid.verify_svid(leaf, roots=roots, trust_domain="fleet.test", now=dt.datetime.now(dt.UTC))
    assert str(sid) == out["spiffe_id"]
    (tmp_path / "leaf.pem").write_text(out["svid"])
    (tmp_path / "roots.pem").write_text(out["bundle"])
    for purpose in ("sslclient", "sslserver"):
        proc = subprocess.run(
            ["openssl", "verify", "-x509_strict", "-purpose", purpose, "-CAfile", "roots.pem", "leaf.pem"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
    record = await svc.service.store.get("gpu-001")
    assert record is not None
    assert record.ek_sha256 == node.tpm.ek_sha256
    assert f"{leaf.serial_number:x}" in record.svid_serials


async def _start(svc: Running, http: Any, node: SoftNode) -> dict[str, Any]:
    status, start = await post(http, f"{svc.base}/v1/join/start", node.start_body())
    assert status == 200, start
    return start


def _expect(status: int, body: dict[str, Any], want_status: int, want_code: str) -> None:
    assert (status, body.get("code")) == (want_status, want_code), body
    assert body["status"] == want_status
    assert body["title"]
    assert body["detail"]


async def test_finish_is_single_use(svc: Running, ek_ca: EkCa) -> None:
    node = ek_ca.node("gpu-002")
    async with svc.http() as http:
        start = await _start(svc, http, node)
        body = node.finish_body(start)
        status, out = await post(http, f"{svc.base}/v1/join/finish", body)
        assert status == 200, out
        status, out = await post(http, f"{svc.base}/v1/join/finish", body)
    _expect(status, out, 403, "session_reused")


@pytest.mark.parametrize(
    ("tamper", "code"),
    [
        ("proof", "proof_invalid"),
        ("pcr_value", "pcr_digest_mismatch"),
        ("signature", "quote_signature_invalid"),
        ("session", "session_unknown"),
    ],
)
async def test_finish_refusals(svc: Running, ek_ca: EkCa, tamper: str, code: str) -> None:
    node = ek_ca.node("gpu-003")
    async with svc.http() as http:
        start = await _start(svc, http, node)
        body = node.finish_body(start)
        if tamper == "proof":
            body["proof"] = base64.b64encode(bytes(32)).decode()
        elif tamper == "pcr_value":
            body["pcrs"]["sha256"]["7"] = "11" * 32
        elif tamper == "signature":
            sig = bytearray(base64.b64decode(body["signature"]))
            sig[-1] ^= 1
            body["signature"] = base64.b64encode(bytes(sig)).decode()
        else:
            token = body["session"]
            body["session"] = token[:-2] + ("A" if token[-2] != "A" else "B") + token[-1]
        status, out = await post(http, f"{svc.base}/v1/join/finish", body)
    _expect(status, out, 403, code)
    if tamper != "session":
        audit = await svc.service.store.audit("gpu-003")
        assert [(a.action, a.code) for a in audit][:1] == [("refused", code)]


async def test_second_ek_for_a_bound_name_conflicts(svc: Running, ek_ca: EkCa) -> None:
    async with svc.http() as http:
        status, out = await join(http, svc.base, ek_ca.node("gpu-004"))
        assert status == 200, out
        status, out = await post(http, f"{svc.base}/v1/join/start", ek_ca.node("gpu-004").start_body())
    _expect(status, out, 409, "node_name_conflict")


async def test_untrusted_ek_and_bad_csr(svc: Running, ek_ca: EkCa) -> None:
    stranger = EkCa.create().node("gpu-005")
    async with svc.http() as http:
        status, out = await post(http, f"{svc.base}/v1/join/start", stranger.start_body())
        _expect(status, out, 403, "ek_untrusted")
        node = ek_ca.node("gpu-005")
        body = node.start_body()
        body["node_name"] = "gpu-006"  # the CSR names gpu-005
        status, out = await post(http, f"{svc.base}/v1/join/start", body)
        _expect(status, out, 403, "csr_invalid")


async def test_bundle_jwks_and_pem(svc: Running) -> None:
    async with svc.http() as http:
        async with http.get(f"{svc.base}/v1/bundle") as resp:
            assert resp.status == 200
            raw = await resp.read()
        async with http.get(f"{svc.base}/v1/bundle?format=pem") as resp:
            pem = await resp.read()
    roots, sequence = svid.parse_bundle_document(raw)
    doc = json.loads(raw)
    assert sequence == doc["spiffe_sequence"] == 1
    assert doc["spiffe_refresh_hint"] > 0
    assert [r.public_bytes(serialization.Encoding.DER) for r in x509.load_pem_x509_certificates(pem)] == [
        r.public_bytes(serialization.Encoding.DER) for r in roots
    ]


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{", 400, "malformed_request"),
        (b"[]", 400, "malformed_request"),
        (b'{"node_name": "a", "node_name": "b"}', 400, "malformed_request"),
        (b"{}", 400, "malformed_request"),
    ],
)
async def test_bad_bodies(svc: Running, body: bytes, status: int, code: str) -> None:
    async with svc.http() as http:
        for path in ("/v1/join/start", "/v1/join/finish"):
            headers = {"Content-Type": "application/json"}
            async with http.post(f"{svc.base}{path}", data=body, headers=headers) as resp:
                out = await resp.json(content_type=None)
                assert resp.content_type == "application/problem+json"
            _expect(resp.status, out, status, code)


@pytest.mark.parametrize(
    ("path", "size", "status", "code"),
    [
        # 64 KiB everywhere but the finish steps, which may carry an event log: 1.5 MiB
        ("/v1/join/start", 64 * 1024 + 1, 413, "payload_too_large"),
        ("/v1/join/finish", 64 * 1024 + 1, 400, "malformed_request"),
        ("/v1/join/finish", 1536 * 1024, 400, "malformed_request"),
        ("/v1/join/finish", 1536 * 1024 + 1, 413, "payload_too_large"),
        ("/v1/nodes/self/renew", 1536 * 1024 + 1, 413, "payload_too_large"),
        ("/v1/admin/nodes/gpu-1/revoke", 64 * 1024 + 1, 413, "payload_too_large"),
    ],
)
async def test_body_limits_per_route(svc: Running, path: str, size: int, status: int, code: str) -> None:
    body = b"{" + b" " * (size - 2) + b"x"  # not JSON: within the limit it is a 400
    async with svc.http() as http:
        headers = {"Content-Type": "application/json"}
        async with http.post(f"{svc.base}{path}", data=body, headers=headers) as resp:
            out = await resp.json(content_type=None)
    _expect(resp.status, out, status, code)  # the size is judged before authentication


async def test_a_renewal_start_keeps_the_64_kib_limit(svc: Running, tmp_path: Path) -> None:
    """The renewal's two steps share a route: only the finish step (with "session") is large."""
    csr = "x" * (70 * 1024)
    async with svc.http() as http:
        status, out = await post(http, f"{svc.base}/v1/nodes/self/renew", {"csr": csr})
    _expect(status, out, 413, "payload_too_large")


async def test_chunked_oversize_body_is_refused(svc: Running) -> None:
    async def body():  # type: ignore[no-untyped-def]
        for _ in range(80):
            yield b" " * 1024

    async with svc.http() as http:
        headers = {"Content-Type": "application/json"}
        async with http.post(f"{svc.base}/v1/join/start", data=body(), headers=headers) as resp:
            out = await resp.json(content_type=None)
    _expect(resp.status, out, 413, "payload_too_large")


async def test_webhook_takes_reviews_larger_than_the_join_limit(svc: Running) -> None:
    big = {"x": "y" * (200 * 1024)}
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": "skyhook.nvidia.com", "version": "v1alpha1", "kind": "Skyhook"},
            "resource": {"group": "skyhook.nvidia.com", "version": "v1alpha1", "resource": "skyhooks"},
            "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "name": "big",
            "object": {
                "apiVersion": "skyhook.nvidia.com/v1alpha1",
                "kind": "Skyhook",
                "metadata": {"name": "big", "annotations": big},
                "spec": {},
            },
        },
    }
    async with svc.http() as http, http.post(f"{svc.admission_base}/admission/validate", json=review) as resp:
        assert resp.status == 200
        out = await resp.json()
    assert out["response"]["uid"] == "u-1"
    assert out["response"]["allowed"] is False  # no PackagePolicies here: fail closed, but answered


def _self_signed(tmp: Path, name: str) -> tuple[Path, Path, bytes]:
    key, cert = certs.self_signed(name, ca=False, ips=(certs.LOOPBACK,), backdate=dt.timedelta(minutes=1))
    cert_file, key_file = certs.write_pair(tmp, key, cert)
    return cert_file, key_file, cert.public_bytes(serialization.Encoding.DER)


async def _served_cert(port: int) -> bytes:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # we only look at what is served
    _reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    await writer.wait_closed()
    return bytes(der)


async def test_a_renewed_tls_certificate_is_served_without_a_restart(tmp_path: Path, ek_ca: EkCa) -> None:
    cert_file, key_file, first = _self_signed(tmp_path, "first")
    tls = {"cert_file": str(cert_file), "key_file": str(key_file)}
    async with running(settings_for(tmp_path, ek_ca, tls=tls)) as r:
        assert await _served_cert(r.port) == first
        assert r.service.reload_tls_files() is False  # nothing changed
        _, _, second = _self_signed(tmp_path, "second")  # cert-manager renewed the Secret
        assert r.service.reload_tls_files() is True
        assert await _served_cert(r.port) == second
        key_file.write_bytes(b"half-written")  # caught mid-update: the current pair stays
        assert r.service.reload_tls_files() is False
        assert await _served_cert(r.port) == second


async def test_the_self_issued_certificate_is_refreshed_on_the_reload_tick(
    tmp_path: Path, ek_ca: EkCa
) -> None:
    """A service that runs longer than its own TLS certificate lives must not serve it expired."""
    async with running(settings_for(tmp_path, ek_ca)) as r:
        served = await _served_cert(r.port)
        assert r.service.server_refresh_at is not None
        assert r.service.refresh_server_certificate() is False  # not due
        (tmp_path / "state" / "tls" / "server.pem").unlink()  # so a reissue is visible
        r.service.server_refresh_at = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
        assert r.service.refresh_server_certificate() is True
        assert await _served_cert(r.port) != served
