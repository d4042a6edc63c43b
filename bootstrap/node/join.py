"""Node side of the join protocol: `nodegate join` (docs/protocol.md, "Join: two requests").

    result = await join(JoinOptions(server="https://join.example:8443", ca_bundle=Path("ca.pem"),
                                    node_name="gpu-017"))

The node key (ECDSA P-256, ``out/node.key``) stays on the node; the server only sees a CSR for
it. The TPM proves the AK lives next to the EK (credential activation) and signs a quote over a
nonce bound to that CSR. Transient failures (network, timeouts, 429/5xx, expired sessions) are
retried with capped exponential backoff and full jitter; every other refusal is final and carries
the server's machine code. Files are written only once the whole answer has been checked.

Exit statuses (``main``, and ``bootstrap.node.renew.renew_main``): 0 done, 1 refused by the server
(or its answer failed our checks), 2 usage or a local problem (options, files, TPM, TLS trust),
75 (EX_TEMPFAIL) transient failures outlasted the attempts, so a supervisor should try again later.

The pieces `nodegate renew` shares live beside this module: errors.py (errors, exit statuses),
client.py (HTTP, TLS, retries), evidence.py (the TPM steps), credentials.py (key, checks, files).
This module keeps re-exporting the names callers import from it.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import random
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bootstrap.files import ensure_dir
from bootstrap.names import is_node_name
from bootstrap.node import ekfetch
from bootstrap.node.client import (
    BACKOFF_CAP,
    JOIN_FINISH_PATH,
    JOIN_START_PATH,
    MAX_RESPONSE,
    ServiceClient,
    base_url,
    check_retry_options,
    http_session,
    post_finish,
    tls_context,
    with_retries,
)
from bootstrap.node.credentials import (
    BUNDLE_FILE,
    INDEX_FILE,
    KEY_FILE,
    KUBECONFIG_FILE,
    MAX_KEY_FILE,
    SVID_FILE,
    checked_credentials,
    folder_lock,
    index_json,
    kubeconfig_with_key,
    node_csr,
    node_key,
    write_files,
)
from bootstrap.node.defaults import ATTEMPTS, BOOT_ID, DEFAULT_TCTI, NODE_DIR
from bootstrap.node.errors import (
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_TEMPFAIL,
    EXIT_USAGE,
    JoinFailed,
    JoinGaveUp,
    JoinUsageError,
    exit_status,
    one_line,
    report_failure,
)
from bootstrap.node.evidence import (
    AsyncTpm,
    BootEvidence,
    credential_proof,
    quote_evidence,
    read_boot_evidence,
)
from bootstrap.node.tpm import EkKind
from bootstrap.protocol import FinishResponse, StartResponse

__all__ = [
    "BACKOFF_CAP",
    "BUNDLE_FILE",
    "DEFAULT_TCTI",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_TEMPFAIL",
    "EXIT_USAGE",
    "INDEX_FILE",
    "KEY_FILE",
    "KUBECONFIG_FILE",
    "MAX_KEY_FILE",
    "MAX_RESPONSE",
    "SVID_FILE",
    "JoinFailed",
    "JoinGaveUp",
    "JoinOptions",
    "JoinResult",
    "JoinUsageError",
    "check_retry_options",
    "exit_status",
    "join",
    "report_failure",
]

log = logging.getLogger("nodegate.join")


@dataclass(frozen=True)
class JoinOptions:
    server: str  # https://host:port (http:// only for loopback hosts: the --insecure-plaintext dev server)
    ca_bundle: Path  # PEM roots to trust for the server's TLS certificate (and nothing else)
    node_name: str
    tcti: str = DEFAULT_TCTI
    out: Path = NODE_DIR
    ek_kind: str = "rsa"  # "rsa" | "ecc"
    attempts: int = ATTEMPTS  # total tries for transient failures
    backoff: float = 1.0  # first delay ceiling in seconds; doubles per failure, capped at 30 s
    timeout: float = 30.0  # per request
    event_log: Path | None = None  # None: the firmware's log when tcti is the platform TPM
    boot_id_file: Path | None = BOOT_ID  # None: send no boot id
    # An EK certificate from a file, for TPMs without one in NV (air-gapped fTPM fleets); it
    # replaces what NV holds. Without it, Intel and AMD fTPMs get theirs from the vendor's service
    # (ek_cert_service: another base URL, a mirror) unless ek_cert_fetch is off (ekfetch.py).
    ek_cert_file: Path | None = None
    ek_cert_fetch: bool = True
    ek_cert_service: str | None = None

    def __post_init__(self) -> None:
        base_url(self.server)
        check_identity(self.node_name, self.ek_kind)
        check_retry_options(self.attempts, self.backoff, self.timeout)


def check_identity(node_name: str, ek_kind: str) -> None:
    """The node name and EK kind of a join (and of a disk-key release): usage errors, named."""
    if not is_node_name(node_name):
        raise JoinUsageError(
            f"node name {one_line(repr(node_name), 80)} is not a lowercase RFC 1123 DNS name"
        )
    if ek_kind not in ("rsa", "ecc"):
        raise JoinUsageError(f"EK kind must be 'rsa' or 'ecc', not {one_line(repr(ek_kind), 40)}")


@dataclass(frozen=True)
class JoinResult:
    node_name: str
    spiffe_id: str
    svid_expires_at: str
    files: dict[str, Path] = field(default_factory=dict)


def _b64e(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


async def _attempt(
    client: ServiceClient,
    device: AsyncTpm,
    opts: JoinOptions,
    csr: x509.CertificateSigningRequest,
    csr_der: bytes,
    boot: BootEvidence,
    ek_certificate: bytes | None,
) -> FinishResponse:
    """One pass /start -> TPM -> /finish."""
    _, ak = device.require()
    ek = device.require_ek()
    start_body: dict[str, Any] = {
        "node_name": opts.node_name,
        "ek_public": _b64e(ek.public),
        "ek_certificate": None if ek_certificate is None else _b64e(ek_certificate),
        "ak_public": _b64e(ak.public),
        "csr": csr.public_bytes(serialization.Encoding.PEM).decode("ascii"),
    }
    if ek.chain and ek_certificate is not None:
        # Only when there is one: a server before ek_chain refuses unknown fields (docs/protocol.md).
        start_body["ek_chain"] = [_b64e(der) for der in ek.chain]
    start = await client.post(JOIN_START_PATH, start_body, StartResponse)
    proof = await credential_proof(device, start.credential_blob, start.encrypted_secret, start.session)
    body = await quote_evidence(device, start.session, start.nonce, start.pcr_selection, csr_der, boot)
    body["proof"] = _b64e(proof)
    return await post_finish(client, JOIN_FINISH_PATH, body)


async def ek_certificate(device: AsyncTpm, opts: JoinOptions) -> bytes | None:
    """What to send as the EK certificate: --ek-cert-file, else NV's, else (Intel and AMD fTPMs)
    the vendor service's, else none (the server's allowlist may still admit the EK)."""
    ek = device.require_ek()
    if opts.ek_cert_file is not None:
        return ekfetch.read_certificate_file(opts.ek_cert_file, ek.public)
    if ek.certificate is not None or not opts.ek_cert_fetch:
        return ek.certificate
    manufacturer = await device.manufacturer()
    cert = await ekfetch.fetch_certificate(manufacturer, ek.public, service=opts.ek_cert_service)
    if cert is None:
        log.info("no EK certificate in NV and none published by %s", ekfetch.manufacturer_name(manufacturer))
    return cert


def _outputs(fin: FinishResponse, key: ec.EllipticCurvePrivateKey, node_name: str) -> dict[str, bytes]:
    files = checked_credentials(fin, key, node_name, JOIN_FINISH_PATH)
    if fin.kubeconfig is not None:
        files[KUBECONFIG_FILE] = kubeconfig_with_key(fin.kubeconfig, key)
    # Last: join.json names a complete set, so its presence means the others are from this join.
    files[INDEX_FILE] = index_json(fin)
    return files


async def join(
    opts: JoinOptions,
    *,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    rng: random.Random | None = None,
) -> JoinResult:
    """Attest this node to the join server and write its credentials under ``opts.out``."""
    rng = rng if rng is not None else random.SystemRandom()
    base = base_url(opts.server)
    # Plain http (loopback dev server only, checked by base_url) never negotiates TLS.
    ssl_ctx: ssl.SSLContext | bool = tls_context(opts.ca_bundle) if base.startswith("https:") else True
    try:
        out = ensure_dir(opts.out)
    except OSError as exc:
        raise JoinFailed("file_error", f"cannot create {opts.out}: {exc}") from None
    async with folder_lock(out):
        key = node_key(out / KEY_FILE)
        csr = node_csr(key, opts.node_name)
        csr_der = csr.public_bytes(serialization.Encoding.DER)
        ek_kind: EkKind = "ecc" if opts.ek_kind == "ecc" else "rsa"
        boot = read_boot_evidence(
            opts.tcti, log, boot_id_path=opts.boot_id_file, event_log_path=opts.event_log
        )
        async with (
            AsyncTpm(opts.tcti, ek_kind) as device,
            http_session(ssl_ctx, opts.timeout, "nodegate-join") as s,
        ):
            client = ServiceClient(s, base, opts.ca_bundle)
            ek_cert = await ek_certificate(device, opts)
            fin = await with_retries(
                lambda: _attempt(client, device, opts, csr, csr_der, boot, ek_cert),
                what="join",
                attempts=opts.attempts,
                backoff=opts.backoff,
                sleep=sleep,
                rng=rng,
                logger=log,
            )
        files = _outputs(fin, key, opts.node_name)
        written = {KEY_FILE: out / KEY_FILE} | write_files(out, files)
    return JoinResult(fin.node_name, fin.spiffe_id, fin.svid_expires_at, written)
