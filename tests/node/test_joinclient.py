"""The node join client against a scripted fake server over real TLS, with a real software TPM.

The fake server does the real protocol checks (EK chain, AK, MakeCredential, proof, quote over the
specified qualifying data, SVID for the CSR key), so a passing join shows the client speaks the
wire format; per-test scripts replace single answers with errors to drive retries and refusals.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import ipaddress
import json
import logging
import os
import random
import secrets
import socket
import ssl
import stat
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from attest import ca as calib
from attest import svid as svidlib
from attest import tpm
from attest.csr import NodeCsr, parse_node_csr
from attest.errors import AttestationError
from bootstrap import protocol
from bootstrap.cli import arguments
from bootstrap.cli import node as node_cli
from bootstrap.files import write_atomic
from bootstrap.node import join as joinclient
from bootstrap.node.join import JoinFailed, JoinOptions, join
from tests.support import certs
from tests.support.swtpms import TpmInfo

pytestmark = pytest.mark.swtpm

SELECTION = "sha256:0,1,2,3,4,5,6,7"
NODE = "gpu-1"
TRUST_DOMAIN = "example.org"
ALL_FILES = {"node.key", "svid.pem", "bundle.pem", "kubelet.kubeconfig", "join.json"}


# -- TLS material for the fake server ------------------------------------------------------------


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _make_ca(cn: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    return certs.self_signed(cn, path_length=0, key_usage=True, ski=True)


def _issue(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    subject: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    *,
    sans: list[x509.GeneralName] | None = None,
    usage: x509.ObjectIdentifier = ExtendedKeyUsageOID.SERVER_AUTH,
) -> x509.Certificate:
    now = datetime.now(UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@dataclass(frozen=True)
class Tls:
    ca_pem: Path  # what the client trusts
    other_ca_pem: Path  # a CA that did not issue the server certificate
    server: ssl.SSLContext  # certificate for 127.0.0.1 and localhost
    wrong_host: ssl.SSLContext  # trusted CA, but the certificate names another host


def _server_ctx(
    folder: Path, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> ssl.SSLContext:
    (folder / f"{name}.pem").write_bytes(_pem(cert))
    (folder / f"{name}.key").write_bytes(_key_pem(key))
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(folder / f"{name}.pem", folder / f"{name}.key")
    return ctx


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    folder = tmp_path_factory.mktemp("tls")
    ca_key, ca_cert = _make_ca("join test CA")
    _, other_cert = _make_ca("someone else's CA")
    (folder / "ca.pem").write_bytes(_pem(ca_cert))
    (folder / "other.pem").write_bytes(_pem(other_cert))
    key = ec.generate_private_key(ec.SECP256R1())
    good = _issue(
        ca_key,
        ca_cert,
        _name("join server"),
        key.public_key(),
        sans=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
    )
    wrong = _issue(
        ca_key, ca_cert, _name("elsewhere"), key.public_key(), sans=[x509.DNSName("other.example")]
    )
    return Tls(
        folder / "ca.pem",
        folder / "other.pem",
        _server_ctx(folder, "server", good, key),
        _server_ctx(folder, "wrong", wrong, key),
    )


# -- the scripted fake server ----------------------------------------------------------------------

Step = Callable[[], web.Response]


def problem(status: int, code: str, detail: str = "refused", headers: dict[str, str] | None = None) -> Step:
    body = {"type": "about:blank", "title": code, "status": status, "detail": detail, "code": code}
    return lambda: web.json_response(
        body, status=status, content_type="application/problem+json", headers=headers
    )


def plain(status: int, text: str = "upstream unavailable", headers: dict[str, str] | None = None) -> Step:
    return lambda: web.Response(status=status, text=text, headers=headers)


@dataclass
class Session:
    secret: bytes
    nonce: bytes
    ak_public: bytes
    csr: NodeCsr
    node_name: str


@dataclass
class Fake:
    swtpm: TpmInfo
    start_script: list[Step] = field(default_factory=list)
    finish_script: list[Step] = field(default_factory=list)
    start_default: Step | None = None  # answer once the script is used up (None: the real protocol)
    kubeconfig: bool = True
    svid_key: ec.EllipticCurvePublicKey | None = None  # issue the SVID for this key instead
    log: list[str] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    proofs: list[str] = field(default_factory=list)
    quotes: list[tpm.QuoteResult] = field(default_factory=list)
    boot_ids: list[str | None] = field(default_factory=list)
    csr_subjects: list[str] = field(default_factory=list)
    sessions: dict[str, Session] = field(default_factory=dict)
    cas: calib.CaSet = field(default_factory=lambda: calib.initial(TRUST_DOMAIN, now=datetime.now(UTC)))
    kube_ca: tuple[ec.EllipticCurvePrivateKey, x509.Certificate] = field(
        default_factory=lambda: _make_ca("kubernetes")
    )
    url: str = ""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/join/start", self._start)
        app.router.add_post("/v1/join/finish", self._finish)
        return app

    async def _start(self, request: web.Request) -> web.Response:
        self.log.append("start")
        body = await request.json()
        self.bodies.append(body)
        if self.start_script:
            return self.start_script.pop(0)()
        if self.start_default is not None:
            return self.start_default()
        try:
            return self._real_start(body)
        except AttestationError as exc:
            return problem(403, exc.code, exc.detail)()

    def _real_start(self, body: dict[str, Any]) -> web.Response:
        assert set(body) == {"node_name", "ek_public", "ek_certificate", "ak_public", "csr"}
        ek_public = base64.b64decode(body["ek_public"], validate=True)
        ek_cert = None if body["ek_certificate"] is None else base64.b64decode(body["ek_certificate"])
        ak_public = base64.b64decode(body["ak_public"], validate=True)
        tpm.verify_ek(ek_public, ek_cert, roots=[self.swtpm.root], intermediates=[self.swtpm.intermediate])
        ak = tpm.verify_ak(ak_public)
        csr = parse_node_csr(body["csr"], body["node_name"])
        self.csr_subjects.append(x509.load_der_x509_csr(csr.der).subject.rfc4514_string())
        secret = os.urandom(32)
        blob, encrypted = tpm.make_credential(ek_public, ak.name, secret)
        session = secrets.token_urlsafe(24)
        nonce = os.urandom(32)
        self.sessions[session] = Session(secret, nonce, ak_public, csr, body["node_name"])
        return web.json_response(
            {
                "session": session,
                "credential_blob": base64.b64encode(blob).decode(),
                "encrypted_secret": base64.b64encode(encrypted).decode(),
                "nonce": base64.b64encode(nonce).decode(),
                "pcr_selection": SELECTION,
                "expires_at": (datetime.now(UTC) + timedelta(seconds=60)).isoformat(),
                "something_new": "ignored by old clients",
            }
        )

    async def _finish(self, request: web.Request) -> web.Response:
        self.log.append("finish")
        body = await request.json()
        self.bodies.append(body)
        self.proofs.append(body["proof"])
        if self.finish_script:
            return self.finish_script.pop(0)()
        try:
            return self._real_finish(body)
        except AttestationError as exc:
            return problem(403, exc.code, exc.detail)()

    def _real_finish(self, body: dict[str, Any]) -> web.Response:
        assert set(body) == {"session", "proof", "quote", "signature", "pcrs", "event_log", "boot_id"}
        assert body["event_log"] is None  # swtpm is not the platform TPM: no firmware log
        self.boot_ids.append(body["boot_id"])
        s = self.sessions.pop(body["session"], None)
        if s is None:
            return problem(403, "session_unknown")()
        tpm.verify_credential_proof(s.secret, body["session"], base64.b64decode(body["proof"], validate=True))
        pcrs = {
            bank: {int(i): bytes.fromhex(v) for i, v in values.items()}
            for bank, values in body["pcrs"].items()
        }
        qualifying = protocol.qualifying_data(s.nonce, s.csr.der, body["boot_id"])
        self.quotes.append(
            tpm.verify_quote(
                s.ak_public,
                base64.b64decode(body["quote"]),
                base64.b64decode(body["signature"]),
                selection=SELECTION,
                pcrs=pcrs,
                qualifying_data=qualifying,
            )
        )
        key = self.svid_key or s.csr.public_key
        assert isinstance(key, ec.EllipticCurvePublicKey)
        now = datetime.now(UTC)
        sid = svidlib.SpiffeId(TRUST_DOMAIN, f"/node/{s.node_name}")
        leaf = svidlib.issue_svid(
            self.cas.signer, spiffe_id=sid, public_key=key, now=now, ttl=timedelta(hours=1)
        )
        kubeconfig = None
        if self.kubeconfig:
            kca_key, kca_cert = self.kube_ca
            subject = x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
                    x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{s.node_name}"),
                ]
            )
            kcert = _issue(kca_key, kca_cert, subject, key, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
            kubeconfig = yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "default",
                            "cluster": {
                                "server": "https://kube.example:6443",
                                "certificate-authority-data": base64.b64encode(_pem(kca_cert)).decode(),
                            },
                        }
                    ],
                    "users": [
                        {
                            "name": "kubelet",
                            "user": {"client-certificate-data": base64.b64encode(_pem(kcert)).decode()},
                        }
                    ],
                    "contexts": [{"name": "default", "context": {"cluster": "default", "user": "kubelet"}}],
                    "current-context": "default",
                }
            )
        return web.json_response(
            {
                "node_name": s.node_name,
                "spiffe_id": str(sid),
                "svid": _pem(leaf).decode(),
                "bundle": svidlib.bundle_pem(self.cas.roots(now)).decode(),
                "svid_expires_at": leaf.not_valid_after_utc.isoformat(),
                "kubeconfig": kubeconfig,
            }
        )


async def serve(fake: Fake, ctx: ssl.SSLContext, port: int = 0) -> web.AppRunner:
    runner = web.AppRunner(fake.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, ssl_context=ctx)
    await site.start()
    fake.url = f"https://127.0.0.1:{runner.addresses[0][1]}"
    return runner


@pytest.fixture
async def fake(swtpm: TpmInfo, tls: Tls) -> AsyncIterator[Fake]:
    f = Fake(swtpm)
    runner = await serve(f, tls.server)
    try:
        yield f
    finally:
        await runner.cleanup()


class Sleeps:
    """The injected sleep: records the delays, never waits."""

    def __init__(self, hook: Callable[[], Any] | None = None) -> None:
        self.delays: list[float] = []
        self.hook = hook

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        if self.hook is not None:
            await self.hook()


class MaxRng(random.Random):
    """Always the top of the jitter range, to show the ceilings."""

    def uniform(self, a: float, b: float) -> float:
        return b


def opts(fake: Fake, tls: Tls, tmp_path: Path, **kw: Any) -> JoinOptions:
    base: dict[str, Any] = {
        "server": fake.url,
        "ca_bundle": tls.ca_pem,
        "node_name": NODE,
        "tcti": fake.swtpm.tcti,
        "out": tmp_path / "node",
    }
    return JoinOptions(**(base | kw))


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def spki(key: Any) -> bytes:
    der: bytes = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return der


def files_in(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


# -- success ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("ek_kind", ["rsa", "ecc"])
async def test_join_writes_checked_files_0600(fake: Fake, tls: Tls, tmp_path: Path, ek_kind: str) -> None:
    sleeps = Sleeps()
    result = await join(opts(fake, tls, tmp_path, ek_kind=ek_kind), sleep=sleeps)
    out = tmp_path / "node"
    assert fake.log == ["start", "finish"]
    assert sleeps.delays == []
    assert len(fake.quotes) == 1  # the fake verified the real quote over the specified nonce
    assert fake.csr_subjects == [f"CN=system:node:{NODE},O=system:nodes"]
    assert result.node_name == NODE
    assert result.spiffe_id == f"spiffe://{TRUST_DOMAIN}/node/{NODE}"
    assert result.files == {name: out / name for name in ALL_FILES}
    assert files_in(out) == ALL_FILES  # no temporary files left behind
    for name in ALL_FILES:
        assert mode(out / name) == 0o600, name

    key = serialization.load_pem_private_key((out / "node.key").read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert isinstance(key.curve, ec.SECP256R1)
    leaf = x509.load_pem_x509_certificates((out / "svid.pem").read_bytes())[0]
    assert spki(leaf.public_key()) == spki(key.public_key())
    assert (out / "bundle.pem").read_bytes() == _pem(fake.cas.signer.certificate)
    assert json.loads((out / "join.json").read_text()) == {
        "node_name": NODE,
        "spiffe_id": result.spiffe_id,
        "svid_expires_at": result.svid_expires_at,
    }
    assert datetime.fromisoformat(result.svid_expires_at) == leaf.not_valid_after_utc
    kc = yaml.safe_load((out / "kubelet.kubeconfig").read_text())
    user = kc["users"][0]["user"]
    assert base64.b64decode(user["client-key-data"]) == (out / "node.key").read_bytes()
    kcert = x509.load_pem_x509_certificate(base64.b64decode(user["client-certificate-data"]))
    assert spki(kcert.public_key()) == spki(key.public_key())
    assert kc["clusters"][0]["cluster"]["server"] == "https://kube.example:6443"
    assert kc["current-context"] == "default"


async def test_no_kubeconfig_means_no_kubeconfig_file(fake: Fake, tls: Tls, tmp_path: Path) -> None:
    fake.kubeconfig = False
    result = await join(opts(fake, tls, tmp_path), sleep=Sleeps())
    assert set(result.files) == ALL_FILES - {"kubelet.kubeconfig"}
    assert files_in(tmp_path / "node") == ALL_FILES - {"kubelet.kubeconfig"}


async def test_rejoin_reuses_the_node_key(fake: Fake, tls: Tls, tmp_path: Path) -> None:
    out = tmp_path / "node"
    out.mkdir()
    key = ec.generate_private_key(ec.SECP256R1())
    (out / "node.key").write_bytes(_key_pem(key))
    (out / "node.key").chmod(0o644)  # too wide: tightened, not replaced
    await join(opts(fake, tls, tmp_path), sleep=Sleeps())
    assert (out / "node.key").read_bytes() == _key_pem(key)
    assert mode(out / "node.key") == 0o600
    leaf = x509.load_pem_x509_certificates((out / "svid.pem").read_bytes())[0]
    assert spki(leaf.public_key()) == spki(key.public_key())
    first = (out / "svid.pem").read_bytes()

    await join(opts(fake, tls, tmp_path), sleep=Sleeps())  # again: same key, new SVID
    assert (out / "node.key").read_bytes() == _key_pem(key)
    assert (out / "svid.pem").read_bytes() != first


async def test_unusable_node_key_is_replaced(fake: Fake, tls: Tls, tmp_path: Path) -> None:
    out = tmp_path / "node"
    out.mkdir()
    write_atomic(out / "node.key", b"-----BEGIN PRIVATE KEY-----\ngarbage\n-----END PRIVATE KEY-----\n")
    await join(opts(fake, tls, tmp_path), sleep=Sleeps())
    key = serialization.load_pem_private_key((out / "node.key").read_bytes(), password=None)
    leaf = x509.load_pem_x509_certificates((out / "svid.pem").read_bytes())[0]
    assert spki(leaf.public_key()) == spki(key.public_key())


# -- transient failures ----------------------------------------------------------------------------


async def test_503_backoff_grows_to_the_cap(fake: Fake, tls: Tls, tmp_path: Path) -> None:
    fake.start_script = [plain(503)] * 5
    sleeps = Sleeps()
    await join(opts(fake, tls, tmp_path, backoff=4.0), sleep=sleeps, rng=MaxRng())
    assert sleeps.delays == [4.0, 8.0, 16.0, 30.0, 30.0]
    assert fake.log == ["start"] * 6 + ["finish"]


async def test_503_backoff_is_full_jitter_within_bounds(fake: Fake, tls: Tls, tmp_path: Path) -> None:
    fake.start_script = [plain(503), problem(503, "unavailable", "shutting down"), plain(502), plain(504)]
    sleeps = Sleeps()
    result = await join(opts(fake, tls, tmp_path), sleep=sleeps, rng=random.Random(7))
    ceilings = [1.0, 2.0, 4.0, 8.0]
    assert len(sleeps.delays) == 4
    assert all(0.0 <= d <= c for d, c in zip(sleeps.delays, ceilings, strict=True))
    same = random.Random(7)
    assert sleeps.delays == [same.uniform(0.0, c) for c in ceilings]  # drawn from the injected rng
    assert sleeps.delays != ceilings
    assert result.spiffe_id.endswith(f"/node/{NODE}")


async def test_429_retry_after_is_honoured_up_to_the_cap(fake: Fake, tls: Tls, tmp_path: Path) -> None:
    fake.start_script = [
        problem(429, "rate_limited", "slow down", headers={"Retry-After": "7"}),
        plain(503, headers={"Retry-After": "120"}),
    ]
    sleeps = Sleeps()
    await join(opts(fake, tls, tmp_path), sleep=sleeps, rng=MaxRng())
    assert sleeps.delays == [7.0, 30.0]
    assert fake.log == ["start", "start", "start", "finish"]


async def test_connection_refused_then_success(swtpm: TpmInfo, tls: Tls, tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on (yet)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fake = Fake(swtpm)
    runners: list[web.AppRunner] = []

    async def bring_up() -> None:
        if not runners:
            runners.append(await serve(fake, tls.server, port))

    sleeps = Sleeps(bring_up)
    try:
        fake.url = f"https://127.0.0.1:{port}"
        result = await join(opts(fake, tls, tmp_path), sleep=sleeps, rng=MaxRng())
    finally:
        for r in runners:
            await r.cleanup()
    assert sleeps.delays == [1.0]
    assert fake.log == ["start", "finish"]
    assert result.node_name == NODE


async def test_finish_503_restarts_from_start(
    fake: Fake, tls: Tls, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake.finish_script = [plain(503)]
    sleeps = Sleeps()
    with caplog.at_level("DEBUG"):
        await join(opts(fake, tls, tmp_path), sleep=sleeps, rng=MaxRng())
    assert fake.log == ["start", "finish", "start", "finish"]
    assert sleeps.delays == [1.0]
    sessions = [b["session"] for b in fake.bodies if "session" in b]
    assert len(set(sessions)) == 2  # a new session, not a replay of the old one
    assert "503" in caplog.text
    key_pem = (tmp_path / "node" / "node.key").read_text()
    for secret in [*fake.proofs, key_pem.splitlines()[1]]:
        assert secret not in caplog.text


@pytest.mark.parametrize(("status", "code"), [(410, "session_expired"), (403, "session_unknown")])
async def test_dead_session_restarts_from_start_at_once(
    fake: Fake, tls: Tls, tmp_path: Path, status: int, code: str
) -> None:
    fake.finish_script = [problem(status, code)]
    sleeps = Sleeps()
    await join(opts(fake, tls, tmp_path), sleep=sleeps)
    assert fake.log == ["start", "finish", "start", "finish"]
    assert sleeps.delays == []


async def test_garbled_answer_is_retried(fake: Fake, tls: Tls, tmp_path: Path) -> None:
    fake.start_script = [
        lambda: web.Response(status=200, text="<html>proxy</html>", content_type="text/html")
    ]
    fake.finish_script = [lambda: web.json_response({"node_name": NODE})]  # fields missing
    sleeps = Sleeps()
    await join(opts(fake, tls, tmp_path), sleep=sleeps, rng=MaxRng())
    assert fake.log == ["start", "start", "finish", "start", "finish"]
    assert sleeps.delays == [1.0, 2.0]


async def test_attempts_exhausted(fake: Fake, tls: Tls, tmp_path: Path) -> None:
    fake.start_default = plain(503)
    sleeps = Sleeps()
    with pytest.raises(JoinFailed) as exc:
        await join(opts(fake, tls, tmp_path, attempts=3), sleep=sleeps)
    assert (exc.value.code, exc.value.status) == ("server_unavailable", 503)
    assert isinstance(exc.value, joinclient.JoinGaveUp)
    assert joinclient.exit_status(exc.value) == 75
    assert "3 attempts" in str(exc.value)
    assert fake.log == ["start"] * 3
    assert len(sleeps.delays) == 2
    assert files_in(tmp_path / "node") == {"node.key"}


async def test_garbage_forever_is_bad_response(fake: Fake, tls: Tls, tmp_path: Path) -> None:
    fake.start_default = lambda: web.json_response({"session": "s"})
    with pytest.raises(JoinFailed) as exc:
        await join(opts(fake, tls, tmp_path, attempts=2), sleep=Sleeps())
    assert exc.value.code == "bad_response"
    assert "\n" not in str(exc.value)


# -- permanent failures ----------------------------------------------------------------------------


async def test_permanent_refusal_is_not_retried(fake: Fake, tls: Tls, tmp_path: Path) -> None:
    fake.finish_script = [problem(403, "quote_invalid", "not a quote\nsecond line")]
    sleeps = Sleeps()
    with pytest.raises(JoinFailed) as exc:
        await join(opts(fake, tls, tmp_path), sleep=sleeps)
    assert (exc.value.code, exc.value.status) == ("quote_invalid", 403)
    assert str(exc.value) == "not a quote second line"
    assert fake.log == ["start", "finish"]  # exactly one finish, no retry
    assert sleeps.delays == []
    assert files_in(tmp_path / "node") == {"node.key"}


async def test_refused_start_is_one_request(fake: Fake, tls: Tls, tmp_path: Path) -> None:
    fake.start_script = [problem(409, "node_name_conflict", "gpu-1 belongs to another TPM")]
    with pytest.raises(JoinFailed) as exc:
        await join(opts(fake, tls, tmp_path), sleep=Sleeps())
    assert (exc.value.code, exc.value.status) == ("node_name_conflict", 409)
    assert fake.log == ["start"]


async def test_real_refusal_from_the_fake_server(fake: Fake, tls: Tls, tmp_path: Path) -> None:
    # The fake trusts another EK CA, so the real verify_ek refuses this TPM.
    fake.swtpm = TpmInfo(
        fake.swtpm.tcti, _make_ca("not the EK CA")[1], fake.swtpm.intermediate, fake.swtpm.server
    )
    with pytest.raises(JoinFailed) as exc:
        await join(opts(fake, tls, tmp_path), sleep=Sleeps())
    assert (exc.value.code, exc.value.status) == ("ek_untrusted", 403)
    assert fake.log == ["start"]


@pytest.mark.parametrize("which", ["other_ca", "wrong_host"])
async def test_untrusted_server_certificate(swtpm: TpmInfo, tls: Tls, tmp_path: Path, which: str) -> None:
    fake = Fake(swtpm)
    runner = await serve(fake, tls.wrong_host if which == "wrong_host" else tls.server)
    bundle = tls.other_ca_pem if which == "other_ca" else tls.ca_pem
    sleeps = Sleeps()
    try:
        with pytest.raises(JoinFailed) as exc:
            await join(opts(fake, tls, tmp_path, ca_bundle=bundle), sleep=sleeps)
    finally:
        await runner.cleanup()
    assert (exc.value.code, exc.value.status) == ("tls_untrusted", None)
    assert fake.log == []
    assert sleeps.delays == []


async def test_svid_for_another_key_is_refused(fake: Fake, tls: Tls, tmp_path: Path) -> None:
    fake.svid_key = ec.generate_private_key(ec.SECP256R1()).public_key()
    with pytest.raises(JoinFailed) as exc:
        await join(opts(fake, tls, tmp_path), sleep=Sleeps())
    assert exc.value.code == "bad_response"
    assert "another key" in str(exc.value)
    assert fake.log == ["start", "finish"]
    assert files_in(tmp_path / "node") == {"node.key"}


async def test_answer_for_another_node_is_refused(fake: Fake, tls: Tls, tmp_path: Path) -> None:
    real = fake._real_finish

    def renamed(body: dict[str, Any]) -> web.Response:
        resp = real(body)
        assert isinstance(resp.body, bytes)
        doc = json.loads(resp.body)
        return web.json_response(doc | {"node_name": "gpu-2"})

    fake._real_finish = renamed  # type: ignore[method-assign]
    with pytest.raises(JoinFailed) as exc:
        await join(opts(fake, tls, tmp_path), sleep=Sleeps())
    assert exc.value.code == "bad_response"
    assert files_in(tmp_path / "node") == {"node.key"}


async def test_no_tpm(tls: Tls, tmp_path: Path, swtpm: TpmInfo) -> None:
    fake = Fake(swtpm)
    runner = await serve(fake, tls.server)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    try:
        with pytest.raises(JoinFailed) as exc:
            await join(opts(fake, tls, tmp_path, tcti=f"swtpm:host=127.0.0.1,port={dead}"), sleep=Sleeps())
    finally:
        await runner.cleanup()
    assert (exc.value.code, exc.value.status) == ("tpm_unavailable", None)
    assert fake.log == []


# -- options and main ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"server": "http://join.example:8080"}, "loopback"),
        ({"server": "ftp://127.0.0.1"}, "https://"),
        ({"server": "https://u:p@join.example"}, "credentials"),
        ({"node_name": "GPU_1"}, "RFC 1123"),
        ({"ek_kind": "dsa"}, "EK kind"),
        ({"attempts": 0}, "attempts"),
    ],
)
def test_bad_options(tmp_path: Path, changes: dict[str, Any], match: str) -> None:
    base: dict[str, Any] = {
        "server": "https://127.0.0.1:1",
        "ca_bundle": tmp_path / "ca.pem",
        "node_name": NODE,
    }
    with pytest.raises(joinclient.JoinUsageError, match=match):
        JoinOptions(**(base | changes))


def test_default_tcti_is_the_agents() -> None:
    from bootstrap.node import tpm as agent

    assert joinclient.DEFAULT_TCTI == agent.DEFAULT_TCTI
    assert JoinOptions("https://127.0.0.1", Path("ca.pem"), NODE).tcti == agent.DEFAULT_TCTI


def _args(argv: list[str]) -> argparse.Namespace:
    return arguments.parser().parse_args(["join", *argv])


def _argv(fake: Fake, tls: Tls, tmp_path: Path) -> list[str]:
    return [
        "--server",
        fake.url,
        "--ca-bundle",
        str(tls.ca_pem),
        "--node-name",
        NODE,
        "--tcti",
        fake.swtpm.tcti,
        "--out",
        str(tmp_path / "node"),
        "--ek",
        "ecc",
        "--attempts",
        "1",
    ]


async def test_main_prints_one_line_on_refusal(
    fake: Fake, tls: Tls, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.start_script = [problem(403, "ek_untrusted", "EK certificate does not chain\nto a trusted root")]
    rc = await asyncio.to_thread(node_cli.join_main, _args(_argv(fake, tls, tmp_path)))
    captured = capsys.readouterr()
    assert rc == 1
    assert captured.err.splitlines() == [
        "nodegate join: refused (ek_untrusted, HTTP 403): EK certificate does not chain to a trusted root"
    ]
    assert captured.out == ""


async def test_main_success_prints_id_and_files(
    fake: Fake, tls: Tls, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = await asyncio.to_thread(node_cli.join_main, _args(_argv(fake, tls, tmp_path)))
    out = capsys.readouterr().out
    assert rc == 0
    assert f"spiffe://{TRUST_DOMAIN}/node/{NODE}" in out.splitlines()[0]
    for name in ALL_FILES:
        assert str(tmp_path / "node" / name) in out


def test_main_local_failure_and_usage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], swtpm: TpmInfo
) -> None:
    argv = [
        "--server",
        "https://127.0.0.1:1",
        "--node-name",
        NODE,
        "--out",
        str(tmp_path / "n"),
        "--attempts",
        "1",
    ]
    rc = node_cli.join_main(
        _args([*argv, "--ca-bundle", str(tmp_path / "missing.pem"), "--tcti", swtpm.tcti])
    )
    assert rc == 2
    assert capsys.readouterr().err.splitlines() == [
        f"nodegate join: CA bundle {tmp_path / 'missing.pem'} does not exist"
    ]
    rc = node_cli.join_main(_args([*argv, "--ca-bundle", str(tmp_path / "x.pem"), "--node-name", "Bad_Name"]))
    assert rc == 2
    (tmp_path / "ca.pem").write_bytes(_pem(_make_ca("x")[1]))
    rc = node_cli.join_main(_args([*argv, "--ca-bundle", str(tmp_path / "ca.pem"), "--tcti", swtpm.tcti]))
    err = capsys.readouterr().err.splitlines()
    assert rc == 75  # EX_TEMPFAIL: nothing answered, so systemd's Restart=on-failure tries again
    assert err[-1].startswith("nodegate join: gave up (server_unreachable): ")
    assert err[-1].endswith("(after 1 attempts)")


async def test_main_exit_75_when_the_service_stays_down(
    fake: Fake, tls: Tls, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.start_default = problem(503, "unavailable", "store: database is locked")
    rc = await asyncio.to_thread(node_cli.join_main, _args(_argv(fake, tls, tmp_path)))
    assert rc == 75
    assert capsys.readouterr().err.splitlines() == [
        "nodegate join: gave up (unavailable, HTTP 503): /v1/join/start: HTTP 503: "
        "store: database is locked (after 1 attempts)"
    ]


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (JoinFailed("node_revoked", "revoked", 403), 1),
        (JoinFailed("bad_response", "the SVID certifies another key"), 1),
        (joinclient.JoinGaveUp("server_unavailable", "down", 503), 75),
        (joinclient.JoinGaveUp("timeout", "no answer"), 75),
        (JoinFailed("tpm_unavailable", "no TPM"), 2),
        (JoinFailed("tls_untrusted", "wrong bundle"), 2),
        (JoinFailed("file_error", "read-only"), 2),
        (joinclient.JoinUsageError("bad URL"), 2),
    ],
)
def test_exit_status(exc: JoinFailed | joinclient.JoinUsageError, status: int) -> None:
    assert joinclient.exit_status(exc) == status


async def test_a_second_join_on_the_folder_waits_for_the_first(fake: Fake, tls: Tls, tmp_path: Path) -> None:
    """The node key and the SVID are one pair: two writers on one folder take turns."""
    second_blocked = asyncio.Event()

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "waiting for another nodegate join or renew" in record.getMessage():
                second_blocked.set()

    async def first_sleep(_delay: float) -> None:
        # The first holds the folder (it is between two tries); start the second and wait until
        # it says it is blocked on the lock.
        tasks.append(asyncio.create_task(join(opts(fake, tls, tmp_path), sleep=Sleeps())))
        await second_blocked.wait()

    handler = Seen()
    logging.getLogger("nodegate.join").addHandler(handler)
    tasks: list[asyncio.Task[joinclient.JoinResult]] = []
    try:
        fake.start_script = [plain(503)]
        await join(opts(fake, tls, tmp_path), sleep=first_sleep)
        assert fake.log == ["start", "start", "finish"]  # the second has not sent anything yet
        await tasks[0]
    finally:
        logging.getLogger("nodegate.join").removeHandler(handler)
    assert fake.log == ["start", "start", "finish", "start", "finish"]
    leaf = x509.load_pem_x509_certificates((tmp_path / "node" / "svid.pem").read_bytes())[0]
    key = serialization.load_pem_private_key((tmp_path / "node" / "node.key").read_bytes(), None)
    assert spki(leaf.public_key()) == spki(key.public_key())
