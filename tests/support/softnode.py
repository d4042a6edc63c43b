"""A simulated node for tests and benchmarks: a SoftTpm, a node key and CSR, and the join protocol's
request bodies built exactly as ``nodegate join`` builds them (base64, hex PCRs, HMAC proof)."""

from __future__ import annotations

import base64
import hmac
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from bootstrap.protocol import qualifying_data
from tests.support.softtpm import SoftTpm


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def node_csr(key: ec.EllipticCurvePrivateKey, node_name: str) -> bytes:
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node_name}"),
        ]
    )
    csr = x509.CertificateSigningRequestBuilder().subject_name(subject).sign(key, hashes.SHA256())
    return csr.public_bytes(serialization.Encoding.PEM)


@dataclass
class SoftNode:
    tpm: SoftTpm
    name: str
    ek_certificate: bytes | None = None
    key: ec.EllipticCurvePrivateKey = field(default_factory=lambda: ec.generate_private_key(ec.SECP256R1()))
    csr_pem: bytes = b""

    def __post_init__(self) -> None:
        if not self.csr_pem:
            self.csr_pem = node_csr(self.key, self.name)

    @property
    def csr_der(self) -> bytes:
        return x509.load_pem_x509_csr(self.csr_pem).public_bytes(serialization.Encoding.DER)

    def start_body(self) -> dict[str, Any]:
        return {
            "node_name": self.name,
            "ek_public": b64(self.tpm.ek_public),
            "ek_certificate": b64(self.ek_certificate) if self.ek_certificate else None,
            "ak_public": b64(self.tpm.ak_public),
            "csr": self.csr_pem.decode(),
        }

    def evidence(
        self,
        session: str,
        nonce: bytes,
        selection: str,
        pcrs: dict[str, dict[int, bytes]] | None = None,
        *,
        boot_id: str | None = None,
        event_log: bytes | None = None,
        signed_boot_id: str | None = None,
    ) -> dict[str, Any]:
        """The quote part of a finish body. ``signed_boot_id`` (default: ``boot_id``) is the boot
        id the quote is made over, to act out a node that claims another boot than it quoted."""
        quoted_boot = boot_id if signed_boot_id is None else signed_boot_id
        qualifying = qualifying_data(nonce, self.csr_der, quoted_boot)
        attest, signature, values = self.tpm.quote(selection, qualifying)
        shown = values if pcrs is None else pcrs
        return {
            "session": session,
            "quote": b64(attest),
            "signature": b64(signature),
            "pcrs": {bank: {str(i): v.hex() for i, v in e.items()} for bank, e in shown.items()},
            "event_log": b64(event_log) if event_log is not None else None,
            "boot_id": boot_id,
        }

    def finish_body(self, start: dict[str, Any], **kw: Any) -> dict[str, Any]:
        secret = self.tpm.activate_credential(
            base64.b64decode(start["credential_blob"]), base64.b64decode(start["encrypted_secret"])
        )
        body = self.evidence(start["session"], base64.b64decode(start["nonce"]), start["pcr_selection"], **kw)
        body["proof"] = b64(hmac.digest(secret, start["session"].encode(), "sha256"))
        return body


async def post(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, dict[str, Any]]:
    async with http.post(url, json=body) as resp:
        return resp.status, await resp.json(content_type=None)


async def join(http: aiohttp.ClientSession, base: str, node: SoftNode) -> tuple[int, dict[str, Any]]:
    status, start = await post(http, f"{base}/v1/join/start", node.start_body())
    if status != 200:
        return status, start
    return await post(http, f"{base}/v1/join/finish", node.finish_body(start))
