"""The SPIRE server's Agent API over its admin socket: list the x509pop agents, ban one, lift a
ban (delete the agent).

SPIRE treats callers on its ``socket_path`` (a unix socket) as local administrators, so nodegate
runs beside the server with that socket shared (docs/spire.md). The messages are encoded and read
in ``bootstrap.spire.wire``, so that nodegate needs grpcio (extra ``nodegate[spire]``) and no
generated code.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from typing import Any, Final

from attest.spiffeid import SpiffeId
from bootstrap.spire.wire import (
    ListedAgent,
    WireError,
    agent_request,
    list_agents_request,
    list_agents_response,
)

log = logging.getLogger("nodegate.spire")

_SERVICE = "/spire.api.server.agent.v1.Agent/"
_TIMEOUT = 5.0
_NOT_FOUND = 5  # grpc.StatusCode.NOT_FOUND.value[0]
PAGE_SIZE: Final = 500
MAX_PAGES: Final = 10_000  # 5 million agents: past that, a server that never ends its pages
_OPTIONS: Final = (("grpc.max_receive_message_length", 16 * 1024 * 1024),)  # a page of 500 agents


class SpireUnavailable(Exception):
    """The SPIRE server could not be asked (socket, timeout, an error other than NotFound, or an
    answer that is not the API's)."""


class SpireAdmin:
    """Lists, bans and un-bans agents; one gRPC channel, opened on first use."""

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self._grpc: Any = _load_grpc()
        self._channel: Any = None

    def _call(self, method: str) -> Any:
        if self._channel is None:
            self._channel = self._grpc.aio.insecure_channel(f"unix:{self.socket_path}", options=_OPTIONS)
        return self._channel.unary_unary(_SERVICE + method)

    async def _request(self, method: str, body: bytes, what: object) -> bytes | None:
        """The answer's bytes; None when SPIRE answers NotFound."""
        try:
            answer: bytes = await self._call(method)(body, timeout=_TIMEOUT)
        except self._grpc.aio.AioRpcError as exc:
            if exc.code().value[0] == _NOT_FOUND:
                return None
            # A fresh channel for the next call: one that failed waits out gRPC's reconnect backoff,
            # and a SPIRE server back from a restart must get its bans at the next pass, not later.
            await self.close()
            raise SpireUnavailable(f"{method} {what}: {exc.code().name} {exc.details()}"[:300]) from None
        return answer

    async def ban(self, agent_id: SpiffeId) -> bool:
        """Evict the agent and refuse its re-attestation until the ban is lifted (idempotent).
        False: SPIRE knows no such agent (nothing to ban until one attests: the pass bans it then)."""
        return await self._request("BanAgent", agent_request(agent_id), agent_id) is not None

    async def lift(self, agent_id: SpiffeId) -> bool:
        """Delete the agent entry, which lifts a ban: the next attestation with that ID is admitted.
        False: no such agent."""
        return await self._request("DeleteAgent", agent_request(agent_id), agent_id) is not None

    async def agents(self, selector: tuple[str, str] | None = None) -> list[ListedAgent]:
        """Every x509pop agent SPIRE knows (banned ones too), or those carrying ``selector``
        (type, value), page by page."""
        out: list[ListedAgent] = []
        token = ""
        seen: set[str] = set()
        for _ in range(MAX_PAGES):
            body = list_agents_request(
                attestation_type="x509pop", selector=selector, page_size=PAGE_SIZE, page_token=token
            )
            answer = await self._request("ListAgents", body, "x509pop agents")
            try:
                page, token = list_agents_response(answer or b"")
            except WireError as exc:
                raise SpireUnavailable(f"ListAgents: not the API's answer ({exc})") from None
            out += page
            if not token:
                return out
            if token in seen:
                raise SpireUnavailable("ListAgents: the server repeated a page token")
            seen.add(token)
        raise SpireUnavailable(f"ListAgents: more than {MAX_PAGES} pages")

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None


def _load_grpc() -> Any:
    try:
        grpc = importlib.import_module("grpc")
        importlib.import_module("grpc.aio")
    except ImportError:
        raise SpireUnavailable("spire.server_socket needs grpcio: pip install 'nodegate[spire]'") from None
    return grpc
