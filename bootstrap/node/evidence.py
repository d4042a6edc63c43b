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
import hashlib
import hmac
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

from attest.errors import AttestationError
from bootstrap.node import tpm
from bootstrap.node.errors import JoinFailed

__all__ = ["AsyncTpm", "credential_proof", "quote_evidence"]

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

    async def activate(self, blob: bytes, encrypted: bytes) -> bytes:
        a, ak = self.require()
        return await self._run(a.activate_credential, ak, self.require_ek(), blob, encrypted)

    async def quote(
        self, selection: str, qualifying_data: bytes
    ) -> tuple[bytes, bytes, dict[str, dict[int, bytes]]]:
        a, ak = self.require()
        return await self._run(a.quote_with_pcrs, ak, selection, qualifying_data)


async def credential_proof(device: AsyncTpm, blob: bytes, encrypted: bytes, session: str) -> bytes:
    """HMAC-SHA256(secret, session): the secret only the TPM holding both the EK and the AK can
    recover, bound to this session; the secret itself is dropped at once."""
    secret = await device.activate(blob, encrypted)
    proof = hmac.digest(secret, session.encode("utf-8"), "sha256")
    del secret
    return proof


async def quote_evidence(
    device: AsyncTpm, session: str, nonce: bytes, selection: str, csr_der: bytes
) -> dict[str, Any]:
    """The finish body's quote part: the AK quotes ``selection`` over SHA256(nonce || SHA256(csr))."""
    qualifying_data = hashlib.sha256(nonce + hashlib.sha256(csr_der).digest()).digest()
    quote, signature, pcrs = await device.quote(selection, qualifying_data)
    return {
        "session": session,
        "quote": _b64e(quote),
        "signature": _b64e(signature),
        "pcrs": {bank: {str(i): v.hex() for i, v in sorted(values.items())} for bank, values in pcrs.items()},
        "event_log": None,
    }
