"""The node's side of a disk-key release (docs/disk-keys.md, "The exchange"):

    released = await release(ReleaseOptions(server=..., ca_bundle=Path(...), node_name="gpu-017",
                                            volume="0f2c...", tcti="device:/dev/tpmrm0"))
    released.key             # the key of the version asked for (None: the current one)
    released.current_key     # the current version's (the same unless the server rotated)

The TPM recreates the EK and the AK the node joined with (both primaries: nothing on disk), quotes
the server's nonce bound to the volume, epoch and version, and recovers the secret the keys are
sealed under by ActivateCredential. The keys never touch a file here; transient failures are
retried as a join's are, every refusal carries the server's machine code (JoinFailed).
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

from attest import diskkey
from attest.identity import ek_digest
from bootstrap.node.client import (
    ServiceClient,
    base_url,
    check_retry_options,
    http_session,
    post_finish,
    tls_context,
    with_retries,
)
from bootstrap.node.defaults import ATTEMPTS, BOOT_ID, DEFAULT_TCTI
from bootstrap.node.errors import JoinFailed, JoinUsageError, one_line
from bootstrap.node.evidence import AsyncTpm, BootEvidence, quote_body, read_boot_evidence
from bootstrap.node.join import check_identity
from bootstrap.node.tpm import EkKind
from bootstrap.protocol import (
    DISK_FINISH_PATH,
    DISK_START_PATH,
    DiskFinishResponse,
    DiskStartResponse,
    disk_qualifying_data,
    disk_release_aad,
    is_volume_uuid,
)

__all__ = ["ReleaseOptions", "Released", "release"]

log = logging.getLogger("nodegate.disk")


@dataclass(frozen=True)
class ReleaseOptions:
    server: str
    ca_bundle: Path
    node_name: str
    volume: str  # the LUKS UUID
    tcti: str = DEFAULT_TCTI
    ek_kind: str = "rsa"  # the EK the node joined with
    key_version: int | None = None  # None: the current one (a new binding)
    epoch: int | None = None
    attempts: int = ATTEMPTS
    backoff: float = 1.0
    timeout: float = 30.0
    event_log: Path | None = None  # None: the firmware's log when tcti is the platform TPM
    boot_id_file: Path | None = BOOT_ID

    def __post_init__(self) -> None:
        base_url(self.server)
        check_identity(self.node_name, self.ek_kind)
        if not is_volume_uuid(self.volume):
            raise JoinUsageError(f"volume {one_line(repr(self.volume), 80)} is not a LUKS UUID")
        check_retry_options(self.attempts, self.backoff, self.timeout)


@dataclass(frozen=True)
class Released:
    node_name: str
    volume: str
    epoch: int
    key_version: int
    current_version: int
    ek_sha256: str
    keys: dict[int, bytes] = field(repr=False)

    @property
    def key(self) -> bytes:
        return self.keys[self.key_version]

    @property
    def current_key(self) -> bytes:
        return self.keys[self.current_version]


def _b64e(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _bad(detail: str) -> JoinFailed:
    return JoinFailed("bad_response", f"{DISK_FINISH_PATH}: {detail}")


async def _attempt(
    client: ServiceClient, device: AsyncTpm, opts: ReleaseOptions, boot: BootEvidence
) -> Released:
    ek = device.require_ek()
    body: dict[str, object] = {
        "node_name": opts.node_name,
        "volume": opts.volume,
        "ek_public": _b64e(ek.public),
    }
    if opts.key_version is not None:
        body["key_version"] = opts.key_version
    if opts.epoch is not None:
        body["epoch"] = opts.epoch
    start = await client.post(DISK_START_PATH, body, DiskStartResponse)
    if (opts.key_version not in (None, start.key_version)) or (opts.epoch not in (None, start.epoch)):
        raise JoinFailed("bad_response", f"{DISK_START_PATH}: the server chose another key than asked for")
    qualifying = disk_qualifying_data(
        start.nonce, opts.node_name, opts.volume, start.epoch, start.key_version, boot.boot_id
    )
    evidence = await quote_body(device, start.session, start.pcr_selection, qualifying, boot)
    fin = await post_finish(client, DISK_FINISH_PATH, evidence, DiskFinishResponse)
    if (fin.node_name, fin.volume, fin.epoch, fin.key_version) != (
        opts.node_name,
        opts.volume,
        start.epoch,
        start.key_version,
    ):
        raise _bad("the answer is for another node, volume or key")
    transport = await device.activate(fin.credential_blob, fin.encrypted_secret)
    try:
        keys = diskkey.open_keys(
            transport,
            fin.sealed_keys,
            disk_release_aad(start.session, opts.node_name, opts.volume, start.epoch),
        )
    except diskkey.DiskKeyUnsealable as exc:
        raise _bad(exc.detail) from None
    finally:
        del transport
    if set(keys) != {fin.key_version, fin.current_version}:
        raise _bad("the sealed keys are not the versions the answer names")
    return Released(
        opts.node_name,
        opts.volume,
        fin.epoch,
        fin.key_version,
        fin.current_version,
        ek_digest(ek.public),
        keys,
    )


async def release(
    opts: ReleaseOptions,
    *,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    rng: random.Random | None = None,
) -> Released:
    """The volume's key (and the current version's), released to this node's TPM."""
    rng = rng if rng is not None else random.SystemRandom()
    base = base_url(opts.server)
    ssl_ctx: ssl.SSLContext | bool = tls_context(opts.ca_bundle) if base.startswith("https:") else True
    boot = read_boot_evidence(opts.tcti, log, boot_id_path=opts.boot_id_file, event_log_path=opts.event_log)
    ek_kind: EkKind = "ecc" if opts.ek_kind == "ecc" else "rsa"
    async with (
        AsyncTpm(opts.tcti, ek_kind) as device,
        http_session(ssl_ctx, opts.timeout, "nodegate-disk") as s,
    ):
        client = ServiceClient(s, base, opts.ca_bundle)
        return await with_retries(
            lambda: _attempt(client, device, opts, boot),
            what="disk key",
            attempts=opts.attempts,
            backoff=opts.backoff,
            sleep=sleep,
            rng=rng,
            logger=log,
        )
