"""Client certificates judged by the service, not cut in the TLS handshake (issue 16 item 8), only
AEAD suites on TLS 1.2 (item 9), and a re-join superseding the SVIDs of the previous join
(item 2), over the real listener."""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from attest import ca, svid
from bootstrap.service.http import clientcert
from bootstrap.service.pki import tls
from bootstrap.service.serve import Serving
from tests.service.test_abuse import base, http, joined, renew, serving, write_creds
from tests.support.service import EkCa, settings_for
from tests.support.softnode import join, post

NOW = dt.datetime.now(dt.UTC)


@pytest.fixture(scope="module")
def ek_ca() -> EkCa:
    return EkCa.create()


@pytest.fixture
async def svc(tmp_path: Path, ek_ca: EkCa) -> AsyncIterator[Serving]:
    admins = {"spiffe://fleet.test/admin/alice": ["list"]}
    async with serving(settings_for(tmp_path, ek_ca, admin={"spiffe_ids": admins})) as s:
        yield s


def look_alike(real: x509.Certificate) -> ca.Authority:
    """A CA with the real root's name and extensions but its own key (the attacker's)."""
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(real.subject)
        .issuer_name(real.issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(real.not_valid_before_utc)
        .not_valid_after(real.not_valid_after_utc)
    )
    for ext in real.extensions:
        if isinstance(ext.value, x509.SubjectKeyIdentifier):
            builder = builder.add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False
            )
        else:
            builder = builder.add_extension(ext.value, ext.critical)
    return ca.Authority(key=key, certificate=builder.sign(key, hashes.SHA256()), created_at=NOW)


def svid_files(
    tmp: Path, signer: ca.Authority, spiffe_id: str, *, now: dt.datetime, ttl: dt.timedelta, name: str
) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = svid.issue_svid(
        signer, spiffe_id=svid.parse_spiffe_id(spiffe_id), public_key=key.public_key(), now=now, ttl=ttl
    )
    return write_creds(tmp, name, key, leaf.public_bytes(serialization.Encoding.PEM))


def test_the_listener_judges_client_certificates_itself() -> None:
    """The verify callback is in place on this Python (else the handshake verifies, and the
    tests below would see resets instead of 403s)."""
    ctx = tls.listener_context(ca.initial("fleet.test", now=NOW), NOW)
    assert ctx.verify_mode == ssl.CERT_OPTIONAL
    assert clientcert.request_without_verifying(ctx)


@pytest.mark.parametrize("case", ["expired", "not_yet_valid", "look_alike_ca"])
async def test_renewal_with_a_bad_svid_gets_403_svid_invalid(
    svc: Serving, ek_ca: EkCa, tmp_path: Path, case: str
) -> None:
    """Before: OpenSSL refused the certificate and cut the handshake; the node saw a reset."""
    await joined(svc, tmp_path, ek_ca, "cert-1")
    signer = svc.service.cas.signer
    sid = "spiffe://fleet.test/node/cert-1"
    hour = dt.timedelta(hours=1)
    creds = {
        "expired": lambda: svid_files(tmp_path, signer, sid, now=NOW - 2 * hour, ttl=hour, name="old"),
        "not_yet_valid": lambda: svid_files(tmp_path, signer, sid, now=NOW + hour, ttl=hour, name="early"),
        "look_alike_ca": lambda: svid_files(
            tmp_path, look_alike(signer.certificate), sid, now=NOW, ttl=hour, name="fake"
        ),
    }[case]()
    async with http(svc, creds) as h:
        status, out = await post(h, f"{base(svc)}/v1/nodes/self/renew", {"csr": "x"})
    assert (status, out["code"]) == (403, "svid_invalid"), out


async def test_admin_with_a_bad_svid_gets_401(svc: Serving, tmp_path: Path) -> None:
    fake = look_alike(svc.service.cas.signer.certificate)
    creds = svid_files(
        tmp_path, fake, "spiffe://fleet.test/admin/alice", now=NOW, ttl=dt.timedelta(hours=1), name="a"
    )
    async with http(svc, creds) as h, h.get(f"{base(svc)}/v1/admin/nodes") as resp:
        out = await resp.json(content_type=None)
    assert (resp.status, out["code"]) == (401, "unauthenticated"), out
    assert "client certificate" in out["detail"]


async def test_a_good_admin_svid_still_works(svc: Serving, tmp_path: Path) -> None:
    creds = svid_files(
        tmp_path,
        svc.service.cas.signer,
        "spiffe://fleet.test/admin/alice",
        now=NOW,
        ttl=dt.timedelta(hours=1),
        name="alice",
    )
    async with http(svc, creds) as h, h.get(f"{base(svc)}/v1/admin/nodes") as resp:
        assert resp.status == 200


@pytest.mark.parametrize(
    "suite", ["ECDHE-ECDSA-AES128-SHA", "ECDHE-ECDSA-AES256-SHA384", "ECDHE-ECDSA-AES128-SHA256"]
)
async def test_tls12_cbc_suites_are_refused(svc: Serving, suite: str) -> None:
    ctx = ssl.create_default_context(cafile=None)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(f"{suite}:@SECLEVEL=0")
    with pytest.raises((ssl.SSLError, ConnectionError)):
        await _connect(svc, ctx)


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
async def test_aead_suites_are_offered(svc: Serving, version: ssl.TLSVersion) -> None:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.minimum_version = ctx.maximum_version = version
    _reader, writer = await _connect(svc, ctx)
    cipher = writer.get_extra_info("cipher")
    writer.close()
    assert cipher is not None
    assert "GCM" in cipher[0] or "CHACHA20" in cipher[0], cipher


def test_listener_offers_only_aead_on_tls12() -> None:
    ctx = tls.listener_context(ca.initial("fleet.test", now=NOW), NOW)
    suites = ctx.get_ciphers()
    assert suites
    for suite in suites:
        assert suite["aead"], suite["name"]
        assert suite["kea"] in ("kx-ecdhe", "kx-any"), suite["name"]  # kx-any: TLS 1.3


async def _connect(svc: Serving, ctx: ssl.SSLContext) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", svc.port, ssl=ctx, server_hostname="127.0.0.1")


async def test_a_rejoin_retires_the_svids_of_the_previous_join(
    svc: Serving, ek_ca: EkCa, tmp_path: Path
) -> None:
    """Join, renew, renew, join again: the first join's SVIDs no longer renew; the new one does.
    Before: the last 32 serials were kept across joins, so the first SVID still renewed."""
    node, first = await joined(svc, tmp_path, ek_ca, "rejoin-1")
    status, out, second = await renew(svc, tmp_path, node, first)
    assert status == 200, out
    assert second is not None
    status, out, third = await renew(svc, tmp_path, node, second)
    assert status == 200, out
    assert third is not None
    again = ek_ca.node("rejoin-1", node.tpm)  # the same machine, a new key
    async with http(svc) as h:
        status, out = await join(h, base(svc), again)
    assert status == 200, out
    fresh = write_creds(tmp_path, "rejoin-1-again", again.key, out["svid"].encode())
    for old in (first, second, third):
        status, out, _ = await renew(svc, tmp_path, node, old)
        assert (status, out["code"]) == (401, "unauthenticated"), out
        assert "current attestation" in out["detail"]
    status, out, _ = await renew(svc, tmp_path, again, fresh)
    assert status == 200, out
