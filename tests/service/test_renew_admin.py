"""Renewal over mTLS with a fresh quote, the admin API (SVID and its permissions), CA rotation."""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from attest import svid
from bootstrap import cli
from tests.support.service import EkCa, Running, running, settings_for
from tests.support.softnode import SoftNode, join, post

ADMIN = "spiffe://fleet.test/admin/alice"
READER = "spiffe://fleet.test/admin/bob"


@pytest.fixture(scope="module")
def ek_ca() -> EkCa:
    return EkCa.create()


@pytest.fixture
async def svc(tmp_path: Path, ek_ca: EkCa) -> AsyncIterator[Running]:
    admins = {ADMIN: ["list", "revoke", "rotate", "metrics"], READER: ["list"]}
    async with running(settings_for(tmp_path, ek_ca, admin={"spiffe_ids": admins})) as r:
        yield r


def _files(tmp: Path, name: str, key: ec.EllipticCurvePrivateKey, cert_pem: bytes) -> tuple[Path, Path]:
    key_file, cert_file = tmp / f"{name}.key", tmp / f"{name}.pem"
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    cert_file.write_bytes(cert_pem)
    return cert_file, key_file


def _admin_svid(r: Running, tmp: Path, spiffe_id: str) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = svid.issue_svid(
        r.service.cas.signer,
        spiffe_id=svid.parse_spiffe_id(spiffe_id),
        public_key=key.public_key(),
        now=dt.datetime.now(dt.UTC),
        ttl=dt.timedelta(minutes=10),
    )
    return _files(tmp, spiffe_id.rsplit("/", 1)[-1], key, leaf.public_bytes(serialization.Encoding.PEM))


async def _joined(
    r: Running, tmp: Path, ca: EkCa, name: str
) -> tuple[SoftNode, dict[str, Any], tuple[Path, Path]]:
    node = ca.node(name)
    async with r.http() as http:
        status, out = await join(http, r.base, node)
    assert status == 200, out
    return node, out, _files(tmp, name, node.key, out["svid"].encode())


async def _renew(r: Running, node: SoftNode, creds: tuple[Path, Path] | None) -> tuple[int, dict[str, Any]]:
    fresh = SoftNode(node.tpm, node.name, node.ek_certificate)  # a new key for the new SVID
    async with r.http(creds) as http:
        status, start = await post(http, f"{r.base}/v1/nodes/self/renew", {"csr": fresh.csr_pem.decode()})
        if status != 200:
            return status, start
        assert set(start) == {"session", "nonce", "pcr_selection", "expires_at"}
        body = fresh.evidence(start["session"], base64.b64decode(start["nonce"]), start["pcr_selection"])
        status, out = await post(http, f"{r.base}/v1/nodes/self/renew", body)
    if status == 200:
        leaf = x509.load_pem_x509_certificates(out["svid"].encode())[0]
        assert leaf.public_key() == fresh.key.public_key()
    return status, out


async def test_renewal_gives_a_new_svid(svc: Running, ek_ca: EkCa, tmp_path: Path) -> None:
    node, first, creds = await _joined(svc, tmp_path, ek_ca, "r-1")
    status, out = await _renew(svc, node, creds)
    assert status == 200, out
    assert out["spiffe_id"] == first["spiffe_id"]
    assert out["kubeconfig"] is None
    record = await svc.service.store.get("r-1")
    assert record is not None
    assert len(record.svid_serials) == 2
    assert [a.action for a in await svc.service.store.audit("r-1")][:2] == ["renew", "join"]


async def test_renewal_needs_the_svid(svc: Running, ek_ca: EkCa, tmp_path: Path) -> None:
    node, _, _ = await _joined(svc, tmp_path, ek_ca, "r-2")
    status, out = await _renew(svc, node, None)
    assert (status, out["code"]) == (401, "unauthenticated")


async def test_renewal_refused_after_revocation(svc: Running, ek_ca: EkCa, tmp_path: Path) -> None:
    node, _, creds = await _joined(svc, tmp_path, ek_ca, "r-3")
    admin = _admin_svid(svc, tmp_path, ADMIN)
    async with svc.http(admin) as http:
        status, out = await post(http, f"{svc.base}/v1/admin/nodes/r-3/revoke", {"reason": "RMA"})
    assert status == 200
    assert out["revoked"] is True
    status, out = await _renew(svc, node, creds)
    assert (status, out["code"]) == (403, "node_revoked")


async def test_renewal_with_a_quote_of_another_tpm_fails(svc: Running, ek_ca: EkCa, tmp_path: Path) -> None:
    node, _, creds = await _joined(svc, tmp_path, ek_ca, "r-4")
    impostor = ek_ca.node("r-4")  # holds the stolen SVID key but not the TPM
    impostor.key = node.key
    status, out = await _renew(svc, impostor, creds)
    assert (status, out["code"]) == (403, "quote_signature_invalid")


async def test_admin_permissions(svc: Running, ek_ca: EkCa, tmp_path: Path) -> None:
    await _joined(svc, tmp_path, ek_ca, "a-1")
    _, _, node_creds = await _joined(svc, tmp_path, ek_ca, "a-2")
    reader = _admin_svid(svc, tmp_path, READER)
    async with svc.http() as http, http.get(f"{svc.base}/v1/admin/nodes") as resp:
        assert resp.status == 401
        assert (await resp.json(content_type=None))["code"] == "unauthenticated"
    async with svc.http(reader) as http:
        async with http.get(f"{svc.base}/v1/admin/nodes") as resp:
            assert resp.status == 200
            names = [n["node_name"] for n in (await resp.json())["nodes"]]
        status, out = await post(http, f"{svc.base}/v1/admin/nodes/a-1/revoke", {"reason": "x"})
        assert (status, out["code"]) == (403, "forbidden")
    assert names == ["a-1", "a-2"]
    # a node SVID is not an admin identity
    async with svc.http(node_creds) as http, http.get(f"{svc.base}/v1/admin/nodes") as resp:
        assert resp.status == 403
    async with svc.http(_admin_svid(svc, tmp_path, ADMIN)) as http:
        status, out = await post(http, f"{svc.base}/v1/admin/nodes/nope/revoke", {"reason": "x"})
        assert (status, out["code"]) == (404, "not_found")
        status, out = await post(
            http, f"{svc.base}/v1/admin/nodes/a-1/revoke", {"reason": "ok", "revoked": False}
        )
        assert status == 200
        assert out["revoked"] is False


async def test_rotation_keeps_old_svids_valid(svc: Running, ek_ca: EkCa, tmp_path: Path) -> None:
    _, before, _ = await _joined(svc, tmp_path, ek_ca, "rot-1")
    async with svc.http(_admin_svid(svc, tmp_path, ADMIN)) as http:
        status, out = await post(http, f"{svc.base}/v1/admin/ca/rotate", {})
    assert status == 200
    assert out["roots"] == 2
    assert out["sequence"] == 2
    _, after, _ = await _joined(svc, tmp_path, ek_ca, "rot-2")
    roots = x509.load_pem_x509_certificates(after["bundle"].encode())
    assert len(roots) == 2
    now = dt.datetime.now(dt.UTC)
    old_leaf = x509.load_pem_x509_certificates(before["svid"].encode())[0]
    new_leaf = x509.load_pem_x509_certificates(after["svid"].encode())[0]
    for leaf in (old_leaf, new_leaf):
        svid.verify_svid(leaf, roots=roots, trust_domain="fleet.test", now=now)
    assert old_leaf.issuer != new_leaf.issuer  # the new signer has its own name and key
    assert old_leaf.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value != (
        new_leaf.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    )


async def test_rotation_on_a_read_only_ca_folder_is_a_clear_503(
    svc: Running, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def read_only(*_args: object) -> None:
        raise PermissionError(30, "Read-only file system")

    monkeypatch.setattr(svc.service.cas_store, "rotate", read_only)
    async with svc.http(_admin_svid(svc, tmp_path, ADMIN)) as http:
        status, out = await post(http, f"{svc.base}/v1/admin/ca/rotate", {})
    assert (status, out["code"]) == (503, "unavailable")
    assert "cannot be written (Read-only file system)" in out["detail"]


async def test_cli_rotation_is_picked_up(svc: Running, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"trust_domain: fleet.test\nstate_dir: {svc.service.settings.state_dir}\n")
    assert cli.main(["ca", "rotate", "--config", str(config)]) == 0
    async with svc.http() as http, http.get(f"{svc.base}/v1/bundle?format=pem") as resp:
        roots = x509.load_pem_x509_certificates(await resp.read())
    assert len(roots) == 2
    assert svc.service.cas.sequence == 2


async def test_metrics_need_the_permission_and_count_codes(svc: Running, ek_ca: EkCa, tmp_path: Path) -> None:
    await _joined(svc, tmp_path, ek_ca, "m-1")
    async with svc.http() as http:
        await post(http, f"{svc.base}/v1/join/start", {"node_name": "m-2"})
        async with http.get(f"{svc.base}/metrics") as resp:
            assert resp.status == 401
    async with svc.http(_admin_svid(svc, tmp_path, READER)) as http, http.get(f"{svc.base}/metrics") as resp:
        assert resp.status == 403
    async with svc.http(_admin_svid(svc, tmp_path, ADMIN)) as http, http.get(f"{svc.base}/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    assert 'nodegate_requests_total{code="ok",endpoint="join_finish"} 1.0' in text
    assert 'nodegate_requests_total{code="malformed_request",endpoint="join_start"} 1.0' in text
    assert 'nodegate_request_seconds_count{endpoint="join_start"} 2.0' in text


async def test_cli_issues_an_admin_svid(svc: Running, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"trust_domain: fleet.test\nstate_dir: {svc.service.settings.state_dir}\n")
    out = tmp_path / "admin"
    assert (
        cli.main(["ca", "issue-admin", "--config", str(config), "--spiffe-id", READER, "--out", str(out)])
        == 0
    )
    assert (out / "admin.key").stat().st_mode & 0o777 == 0o600
    creds = (out / "admin.pem", out / "admin.key")
    async with svc.http(creds) as http, http.get(f"{svc.base}/v1/admin/nodes") as resp:
        assert resp.status == 200
    bad = [
        "ca",
        "issue-admin",
        "--config",
        str(config),
        "--spiffe-id",
        "spiffe://other.td/x",
        "--out",
        str(out),
    ]
    assert cli.main(bad) == 2


async def test_renewal_under_a_template_that_does_not_end_in_the_node_name(
    tmp_path: Path, ek_ca: EkCa
) -> None:
    # The ID cannot name the node's record: the record is found by a scan of the store, then read
    # fresh, which alone decides (a revocation after the scan's copy still refuses).
    template = "spiffe://{trust_domain}/node/{node_name}/gpu"
    admins = {ADMIN: ["revoke"]}
    settings = settings_for(tmp_path, ek_ca, admin={"spiffe_ids": admins}, spiffe_id_template=template)
    async with running(settings) as r:
        node, first, creds = await _joined(r, tmp_path, ek_ca, "t-1")
        assert first["spiffe_id"] == "spiffe://fleet.test/node/t-1/gpu"
        status, out = await _renew(r, node, creds)
        assert status == 200, out
        assert out["spiffe_id"] == first["spiffe_id"]
        async with r.http(_admin_svid(r, tmp_path, ADMIN)) as http:
            status, out = await post(http, f"{r.base}/v1/admin/nodes/t-1/revoke", {"reason": "RMA"})
        assert status == 200
        status, out = await _renew(r, node, creds)
        assert (status, out["code"]) == (403, "node_revoked")
