"""Node side of renewal: `nodegate renew` (docs/protocol.md, "Renewal: mTLS plus a fresh quote").

    result = await renew(RenewOptions(server="https://join.example:8443", ca_bundle=Path("ca.pem")))

It reads what `nodegate join` wrote (``join.json``, ``svid.pem``, ``node.key``) and does nothing
while the SVID has more than ``before`` left (default: a third of its lifetime). Otherwise it makes
a fresh P-256 key and CSR, authenticates with the current SVID as TLS client certificate, quotes
the server's nonce with the AK (a primary of the endorsement hierarchy, so the TPM recreates the
key the join registered; nothing about it is stored on disk), and checks the new SVID: it
certifies the new key, names the same SPIFFE ID and chains to the returned bundle.

Replacing the key and the SVID cannot be one rename, so the new key is first written next to the
old one (``node.key.next``); then ``bundle.pem``, ``svid.pem``, ``node.key`` and ``join.json``
are each replaced atomically (0600). A crash between ``svid.pem`` and ``node.key`` leaves a new
SVID whose key is ``node.key.next``: the next run finishes that step before anything else.
Until the new SVID is written the old pair is untouched and keeps working.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from attest import svid as svidlib
from bootstrap.files import read_limited
from bootstrap.names import is_node_name
from bootstrap.node.client import (
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
    SVID_FILE,
    X509POP_FILE,
    bad_response,
    checked_credentials,
    folder_lock,
    index_json,
    key_pem,
    node_csr,
    read_node_key,
    same_key,
    write_files,
)
from bootstrap.node.defaults import BOOT_ID, DEFAULT_TCTI
from bootstrap.node.errors import JoinFailed, JoinUsageError, one_line
from bootstrap.node.evidence import AsyncTpm, BootEvidence, quote_evidence, read_boot_evidence
from bootstrap.node.join import JoinOptions
from bootstrap.protocol import FinishResponse, RenewStartResponse

__all__ = ["PENDING_KEY_FILE", "RenewOptions", "RenewResult", "read_index", "renew"]

log = logging.getLogger("nodegate.renew")

PENDING_KEY_FILE = "node.key.next"
RENEW_PATH = "/v1/nodes/self/renew"
MAX_INDEX_FILE = 64 * 1024
MAX_SVID_FILE = 256 * 1024


@dataclass(frozen=True)
class RenewOptions:
    server: str  # https://host:port; renewal authenticates with the SVID, so never plain http
    ca_bundle: Path  # PEM roots to trust for the server's TLS certificate
    dir: Path = JoinOptions.out  # what `nodegate join --out` wrote
    tcti: str = DEFAULT_TCTI
    before: timedelta | None = None  # renew when less is left; None: a third of the SVID's lifetime
    attempts: int = JoinOptions.attempts
    backoff: float = JoinOptions.backoff
    timeout: float = JoinOptions.timeout
    event_log: Path | None = None  # None: the firmware's log when tcti is the platform TPM
    boot_id_file: Path | None = BOOT_ID  # None: send no boot id
    force: bool = False  # renew whatever the SVID has left (`nodegate attest`: a fresh quote per boot)

    def __post_init__(self) -> None:
        if not base_url(self.server).startswith("https:"):
            raise JoinUsageError("renewal authenticates with the SVID over TLS: the server must be https://")
        if self.before is not None and (
            not isinstance(self.before, timedelta) or self.before <= timedelta(0)
        ):
            raise JoinUsageError("before must be a positive duration")
        check_retry_options(self.attempts, self.backoff, self.timeout)


@dataclass(frozen=True)
class RenewResult:
    renewed: bool  # False: the SVID had more than ``before`` left and nothing was touched
    spiffe_id: str
    svid_expires_at: datetime  # of the SVID now in place
    before: timedelta  # the threshold that was applied
    files: dict[str, Path] = field(default_factory=dict)  # what was written


# -- what join left --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Current:
    node_name: str
    spiffe_id: svidlib.SpiffeId
    leaf: x509.Certificate


def _local(detail: str) -> JoinFailed:
    return JoinFailed("credentials_invalid", f"{detail}; run nodegate join again")


def read_index(folder: Path) -> str:
    path = folder / INDEX_FILE
    try:
        doc: Any = json.loads(read_limited(path, MAX_INDEX_FILE))
    except FileNotFoundError:
        raise JoinFailed("not_joined", f"{path} does not exist: run nodegate join first") from None
    except (OSError, ValueError) as exc:
        raise _local(f"cannot read {path} ({one_line(exc, 100)})") from None
    name = doc.get("node_name") if isinstance(doc, dict) else None
    if not is_node_name(name):
        raise _local(f"{path} names no valid node_name")
    return name


def _spiffe_id_of(leaf: x509.Certificate, path: Path) -> svidlib.SpiffeId:
    try:
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = san.get_values_for_type(x509.UniformResourceIdentifier)
        if len(uris) != 1:
            raise _local(f"{path} has {len(uris)} URI SANs, not one SPIFFE ID")
        return svidlib.parse_spiffe_id(uris[0])
    except (x509.ExtensionNotFound, ValueError) as exc:  # SpiffeIdError is a ValueError
        raise _local(f"{path} is not an X.509-SVID ({one_line(exc, 100)})") from None


def _load_current(folder: Path) -> _Current:
    """The node name, SPIFFE ID and SVID that join (or the last renewal) left, with ``node.key``
    certified by that SVID; finishes a renewal that was interrupted after writing ``svid.pem``."""
    node_name = read_index(folder)
    svid_path, key_path, pending_path = folder / SVID_FILE, folder / KEY_FILE, folder / PENDING_KEY_FILE
    try:
        leaf = x509.load_pem_x509_certificates(read_limited(svid_path, MAX_SVID_FILE))[0]
    except FileNotFoundError:
        raise _local(f"{svid_path} does not exist") from None
    except (OSError, ValueError) as exc:
        raise _local(f"cannot read {svid_path} as PEM certificates ({one_line(exc, 100)})") from None
    sid = _spiffe_id_of(leaf, svid_path)
    key = read_node_key(key_path, "it cannot authenticate a renewal")
    if key is None or not same_key(leaf, key):
        pending = read_node_key(pending_path, "ignoring it")
        if pending is None or not same_key(leaf, pending):
            raise _local(f"{svid_path} does not certify the key in {key_path}")
        log.warning("completing an interrupted renewal: %s becomes %s", pending_path, key_path)
        write_files(folder, {KEY_FILE: key_pem(pending)})
    # Left by a renewal interrupted before svid.pem or after node.key: its key certifies nothing.
    with contextlib.suppress(FileNotFoundError):
        pending_path.unlink()
    return _Current(node_name, sid, leaf)


def _threshold(leaf: x509.Certificate, before: timedelta | None) -> timedelta:
    if before is not None:
        return before
    return (leaf.not_valid_after_utc - leaf.not_valid_before_utc) / 3


# -- the protocol ----------------------------------------------------------------------------------


def _mtls_context(ca_bundle: Path, folder: Path) -> ssl.SSLContext:
    ctx = tls_context(ca_bundle)
    # Also the bundle the service handed out at the last join/renewal: after a CA rotation it
    # carries the new root, which a ca-bundle baked into the image does not. It came over a TLS
    # connection verified against ca_bundle, so trusting it widens nothing an attacker controls.
    folder_bundle = folder / BUNDLE_FILE
    if folder_bundle.is_file():
        try:
            ctx.load_verify_locations(cafile=str(folder_bundle))
        except (OSError, ssl.SSLError) as exc:
            log.warning("%s not used for TLS trust: %s", folder_bundle, exc)
    try:
        ctx.load_cert_chain(folder / SVID_FILE, folder / KEY_FILE)
    except (OSError, ssl.SSLError) as exc:
        raise _local(f"cannot use {folder / SVID_FILE} as TLS client certificate ({exc})") from None
    return ctx


async def _attempt(
    client: ServiceClient, device: AsyncTpm, csr_pem: str, csr_der: bytes, boot: BootEvidence
) -> FinishResponse:
    """One pass: start (CSR) -> quote over the nonce -> finish."""
    start = await client.post(RENEW_PATH, {"csr": csr_pem}, RenewStartResponse)
    body = await quote_evidence(device, start.session, start.nonce, start.pcr_selection, csr_der, boot)
    return await post_finish(client, RENEW_PATH, body)


async def renew(
    opts: RenewOptions,
    *,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    rng: random.Random | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> RenewResult:
    """Renew the SVID in ``opts.dir`` if it expires within ``opts.before``."""
    rng = rng if rng is not None else random.SystemRandom()
    base = base_url(opts.server)
    folder = opts.dir
    if not folder.is_dir():
        raise JoinFailed("not_joined", f"{folder} does not exist: run nodegate join first")
    async with folder_lock(folder):
        current = _load_current(folder)
        leaf = current.leaf
        before = _threshold(leaf, opts.before)
        left = leaf.not_valid_after_utc - now()
        if left > before and not opts.force:
            return RenewResult(False, str(current.spiffe_id), leaf.not_valid_after_utc, before)
        if left <= timedelta(0):
            # The server's TLS stack would refuse it before the renewal endpoint ever saw it.
            raise JoinFailed(
                "svid_expired",
                f"the SVID in {folder / SVID_FILE} expired at {leaf.not_valid_after_utc.isoformat()}; "
                "renewal needs a valid one: run nodegate join",
            )
        ssl_ctx = _mtls_context(opts.ca_bundle, folder)
        key = ec.generate_private_key(ec.SECP256R1())  # a fresh key: a leaked old key ages out
        csr = node_csr(key, current.node_name)
        csr_pem = csr.public_bytes(serialization.Encoding.PEM).decode("ascii")
        csr_der = csr.public_bytes(serialization.Encoding.DER)
        boot = read_boot_evidence(
            opts.tcti, log, boot_id_path=opts.boot_id_file, event_log_path=opts.event_log
        )
        async with (
            AsyncTpm(opts.tcti, None) as device,
            http_session(ssl_ctx, opts.timeout, "nodegate-renew") as s,
        ):
            client = ServiceClient(s, base, opts.ca_bundle)
            fin = await with_retries(
                lambda: _attempt(client, device, csr_pem, csr_der, boot),
                what="renew",
                attempts=opts.attempts,
                backoff=opts.backoff,
                sleep=sleep,
                rng=rng,
                logger=log,
            )
        files = checked_credentials(fin, key, current.node_name, RENEW_PATH)
        if fin.spiffe_id != str(current.spiffe_id):
            raise bad_response(
                f"the new SVID is for {one_line(fin.spiffe_id, 120)}, not {current.spiffe_id}", RENEW_PATH
            )
        new_leaf = x509.load_pem_x509_certificates(files[SVID_FILE])[0]
        # Order matters (see the module docstring): the pending key, then the set, index last.
        written = write_files(
            folder,
            {PENDING_KEY_FILE: key_pem(key), BUNDLE_FILE: files[BUNDLE_FILE], SVID_FILE: files[SVID_FILE]},
        )
        if X509POP_FILE in files:  # certificate and key in one file: one rename replaces the pair
            written |= write_files(folder, {X509POP_FILE: files[X509POP_FILE]})
        written |= write_files(folder, {KEY_FILE: key_pem(key)})
        del written[PENDING_KEY_FILE]
        try:
            (folder / PENDING_KEY_FILE).unlink()
        except OSError as exc:  # harmless: the next run removes it
            log.warning("cannot remove %s: %s", folder / PENDING_KEY_FILE, exc)
        written |= write_files(folder, {INDEX_FILE: index_json(fin)})
    return RenewResult(True, fin.spiffe_id, new_leaf.not_valid_after_utc, before, written)


# -- command line ----------------------------------------------------------------------------------
