"""Run the real service in-process on a real TLS listener, and make soft-TPM nodes it trusts."""

from __future__ import annotations

import contextlib
import datetime as dt
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from attest import svid
from bootstrap.config import Settings, settings_from_obj
from bootstrap.kube import Kube
from bootstrap.service.app import Service, build_service, make_app, tls_context
from bootstrap.service.compose import make_admission_app
from bootstrap.service.serve import default_admission_limits
from bootstrap.service.webhook.site import ReviewSite
from tests.support.softnode import SoftNode
from tests.support.softtpm import SoftTpm


@dataclass
class EkCa:
    """A stand-in TPM manufacturer CA for soft TPMs (swtpm tests use swtpm_setup's local CA)."""

    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @classmethod
    def create(cls) -> EkCa:
        key = ec.generate_private_key(ec.SECP384R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "soft TPM manufacturer root")])
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA384())
        )
        return cls(key, cert)

    def write(self, path: Path) -> Path:
        path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        return path

    def node(self, name: str, tpm: SoftTpm | None = None) -> SoftNode:
        tpm = tpm or SoftTpm.create()
        return SoftNode(tpm, name, tpm.ek_certificate(self.key, self.cert))


def settings_for(tmp: Path, ek_ca: EkCa, **overrides: Any) -> Settings:
    doc: dict[str, Any] = {
        "trust_domain": "fleet.test",
        "listen": "127.0.0.1:0",
        "state_dir": str(tmp / "state"),
        "ek_roots": [str(ek_ca.write(tmp / "ek-root.pem"))],
        "server_names": ["localhost", "127.0.0.1"],
    }
    doc.update(overrides)
    # The webhooks' own listener on a free loopback port too (its default is 0.0.0.0:9443).
    doc["admission"] = {"listen": "127.0.0.1:0", **doc.get("admission", {})}
    return settings_from_obj(doc)


@dataclass
class Running:
    service: Service
    base: str
    port: int
    admission_base: str = ""  # the admission listener (admission.listen)

    def client_tls(self, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
        roots = svid.bundle_pem(self.service.cas.roots(dt.datetime.now(dt.UTC))).decode()
        ctx = ssl.create_default_context(cadata=roots)
        if cert is not None:
            ctx.load_cert_chain(*cert)
        return ctx

    def http(self, cert: tuple[Path, Path] | None = None, **kw: Any) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.client_tls(cert)), **kw)


@contextlib.asynccontextmanager
async def running(settings: Settings, *, kube: Kube | None = None) -> AsyncIterator[Running]:
    service = await build_service(settings, kube=kube if kube is not None else False)
    app = make_app(service)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls_context(service))
    await site.start()
    port = runner.addresses[0][1]
    webhooks = ReviewSite(
        make_admission_app(service),
        "127.0.0.1",
        0,
        tls=service.tls,
        limits=default_admission_limits(),
        metrics=service.metrics,
    )
    await webhooks.start()
    admission = f"https://127.0.0.1:{webhooks.port}"
    try:
        yield Running(service, f"https://127.0.0.1:{port}", port, admission)
    finally:
        await webhooks.stop()
        await runner.cleanup()
        await service.close()
