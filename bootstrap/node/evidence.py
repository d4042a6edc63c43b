"""The TPM's part of a join or renewal: credential activation and the quote (docs/protocol.md).

The TPM runs on one worker thread (ESAPI contexts are not meant to be shared between threads), so
the event loop keeps serving the HTTP client while the TPM works. TPM failures become
:class:`JoinFailed` with a local code (``tpm_unavailable``, ``tpm_locked_out``, ``tpm_error``).
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import functools
import hmac
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from attest import filekind
from attest.errors import AttestationError
from bootstrap.node import tpm
from bootstrap.node.defaults import BOOT_ID, EVENT_LOG
from bootstrap.node.errors import JoinFailed, JoinUsageError
from bootstrap.protocol import EVENT_LOG_BYTES, is_boot_id, qualifying_data

__all__ = ["AsyncTpm", "credential_proof", "quote_body", "quote_evidence"]

T = TypeVar("T")


def _b64e(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class AsyncTpm:
    """The AK, and the EK when ``ek_kind`` is given (a renewal only quotes: no EK). The AK is a
    primary of the endorsement hierarchy, so every run recreates the key the join registered."""

    def __init__(self, tcti: str, ek_kind: tpm.EkKind | None) -> None:
        self._tcti = tcti
        self._ek_kind: tpm.EkKind | None = ek_kind
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="nodegate-tpm")
        self._agent: tpm.Agent | None = None
        self.ek: tpm.Ek | None = None
        self.ak: tpm.Key | None = None

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, functools.partial(fn, *args))
        except tpm.TpmUnavailable as exc:
            raise JoinFailed("tpm_unavailable", str(exc)) from None
        except tpm.TpmLockedOut as exc:
            raise JoinFailed("tpm_locked_out", str(exc)) from None
        except tpm.TpmError as exc:
            raise JoinFailed("tpm_error", str(exc)) from None
        except AttestationError as exc:  # a server value the agent refused before the TPM saw it
            raise JoinFailed("bad_response", exc.detail) from None

    def _open(self) -> None:
        a = tpm.Agent(self._tcti)
        a.__enter__()
        self._agent = a
        if self._ek_kind is not None:
            self.ek = a.create_ek(self._ek_kind)  # reads the EK certificate from NV too
        self.ak = a.create_ak()

    async def __aenter__(self) -> AsyncTpm:
        try:
            await self._run(self._open)
        except BaseException:
            await self._close()
            raise
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._close()

    async def _close(self) -> None:
        if self._agent is not None:
            a, self._agent = self._agent, None
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._pool, a.close)
        self._pool.shutdown(wait=False)

    def require(self) -> tuple[tpm.Agent, tpm.Key]:
        if self._agent is None or self.ak is None:
            raise JoinFailed("tpm_error", "the TPM connection is closed")
        return self._agent, self.ak

    def require_ek(self) -> tpm.Ek:
        if self.ek is None:
            raise JoinFailed("tpm_error", "the EK is not loaded")
        return self.ek

    async def manufacturer(self) -> int:
        a, _ = self.require()
        return await self._run(a.manufacturer)

    async def activate(self, blob: bytes, encrypted: bytes) -> bytes:
        a, ak = self.require()
        return await self._run(a.activate_credential, ak, self.require_ek(), blob, encrypted)

    async def quote(
        self, selection: str, qualifying_data: bytes
    ) -> tuple[bytes, bytes, dict[str, dict[int, bytes]]]:
        a, ak = self.require()
        return await self._run(a.quote_with_pcrs, ak, selection, qualifying_data)


@dataclass(frozen=True, slots=True)
class BootEvidence:
    """What the node says about this boot beside the quote: the kernel's boot id (bound into the
    quote) and the firmware's measured-boot event log (checked against the quoted PCRs)."""

    boot_id: str | None = None
    event_log: bytes | None = None


def read_boot_evidence(
    tcti: str,
    log: logging.Logger,
    *,
    boot_id_path: Path | None = BOOT_ID,
    event_log_path: Path | None = None,
) -> BootEvidence:
    """This boot's id and event log, when the machine has them. Without ``event_log_path`` the
    firmware's log is sent only when ``tcti`` is the platform TPM (``device:``), since the log
    describes that TPM alone; a log that cannot be read or is too large is left out with a
    warning (the service decides whether a log is required). A named log that is recognisably not
    a TCG log (an IMA list, a YAML dump, a compressed copy) is a usage error naming what it is."""
    boot_id: str | None = None
    if boot_id_path is not None:
        try:
            text = boot_id_path.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError) as exc:
            log.warning("no boot id from %s: %s", boot_id_path, exc)
        else:
            boot_id = text if is_boot_id(text) else None
            if boot_id is None:
                log.warning("%s holds no boot id", boot_id_path)
    event_log: bytes | None = None
    explicit = event_log_path is not None
    if event_log_path is None and tcti.startswith("device:") and EVENT_LOG.exists():
        event_log_path = EVENT_LOG
    if event_log_path is not None:
        try:
            with event_log_path.open("rb") as f:
                data = f.read(EVENT_LOG_BYTES + 1)
        except OSError as exc:
            log.warning("no event log from %s: %s", event_log_path, exc)
        else:
            kind = filekind.describe(data) if data and explicit else None
            if kind is not None:  # the operator named the wrong file: say what it is, send nothing
                raise JoinUsageError(f"--event-log {event_log_path}: {kind}")
            if len(data) > EVENT_LOG_BYTES:
                log.warning("%s is larger than %d bytes: not sent", event_log_path, EVENT_LOG_BYTES)
            elif data:
                event_log = data
    return BootEvidence(boot_id, event_log)


async def credential_proof(device: AsyncTpm, blob: bytes, encrypted: bytes, session: str) -> bytes:
    """HMAC-SHA256(secret, session): the secret only the TPM holding both the EK and the AK can
    recover, bound to this session; the secret itself is dropped at once."""
    secret = await device.activate(blob, encrypted)
    proof = hmac.digest(secret, session.encode("utf-8"), "sha256")
    del secret
    return proof


async def quote_evidence(
    device: AsyncTpm,
    session: str,
    nonce: bytes,
    selection: str,
    csr_der: bytes,
    boot: BootEvidence | None = None,
) -> dict[str, Any]:
    """The finish body's quote part: the AK quotes ``selection`` over the protocol's qualifying
    data (nonce, CSR and, when known, this boot's id), plus the firmware's event log."""
    boot = boot if boot is not None else BootEvidence()
    return await quote_body(device, session, selection, qualifying_data(nonce, csr_der, boot.boot_id), boot)


async def quote_body(
    device: AsyncTpm, session: str, selection: str, qualifying: bytes, boot: BootEvidence
) -> dict[str, Any]:
    """A finish body's quote part over ``qualifying`` (a join's, a renewal's or a disk-key
    release's, bootstrap.protocol), with the boot id and event log of ``boot``."""
    quote, signature, pcrs = await device.quote(selection, qualifying)
    return {
        "session": session,
        "quote": _b64e(quote),
        "signature": _b64e(signature),
        "pcrs": {bank: {str(i): v.hex() for i, v in sorted(values.items())} for bank, values in pcrs.items()},
        "event_log": None if boot.event_log is None else _b64e(boot.event_log),
        "boot_id": boot.boot_id,
    }
