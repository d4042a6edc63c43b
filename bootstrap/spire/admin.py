"""The SPIRE server's Agent API over its admin socket: ban an agent, lift a ban (delete it).

SPIRE treats callers on its ``socket_path`` (a unix socket) as local administrators, so nodegate
runs beside the server with that socket shared (docs/spire.md). The two requests are tiny protobuf
messages (``spire.api.server.agent.v1.BanAgentRequest`` / ``DeleteAgentRequest``: field 1, a
``spire.api.types.SPIFFEID`` of trust_domain = 1, path = 2), encoded here so that nodegate needs
grpcio (extra ``nodegate[spire]``) and no generated code.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from typing import Any

from attest.spiffeid import SpiffeId

log = logging.getLogger("nodegate.spire")

_SERVICE = "/spire.api.server.agent.v1.Agent/"
_TIMEOUT = 5.0
_NOT_FOUND = 5  # grpc.StatusCode.NOT_FOUND.value[0]


class SpireUnavailable(Exception):
    """The SPIRE server could not be asked (socket, timeout, or an error other than NotFound)."""


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _string_field(number: int, value: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def agent_request(agent_id: SpiffeId) -> bytes:
    """BanAgentRequest / DeleteAgentRequest (same shape): {id: {trust_domain, path}}."""
    sid = _string_field(1, agent_id.trust_domain.encode()) + _string_field(2, agent_id.path.encode())
    return _string_field(1, sid)


class SpireAdmin:
    """Bans and un-bans agents; one gRPC channel, opened on first use."""

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self._grpc: Any = _load_grpc()
        self._channel: Any = None

    def _call(self, method: str) -> Any:
        if self._channel is None:
            self._channel = self._grpc.aio.insecure_channel(f"unix:{self.socket_path}")
        return self._channel.unary_unary(_SERVICE + method)

    async def _agent_call(self, method: str, agent_id: SpiffeId) -> bool:
        """True when SPIRE did it, False when it knows no such agent."""
        try:
            await self._call(method)(agent_request(agent_id), timeout=_TIMEOUT)
        except self._grpc.aio.AioRpcError as exc:
            if exc.code().value[0] == _NOT_FOUND:
                return False
            raise SpireUnavailable(f"{method} {agent_id}: {exc.code().name} {exc.details()}"[:300]) from None
        return True

    async def ban(self, agent_id: SpiffeId) -> bool:
        """Evict the agent and refuse its re-attestation until the ban is lifted. False: no such
        agent (not attested yet: the periodic pass bans it once it is)."""
        return await self._agent_call("BanAgent", agent_id)

    async def lift(self, agent_id: SpiffeId) -> bool:
        """Delete the agent entry, which lifts a ban: the node's next attestation is admitted."""
        return await self._agent_call("DeleteAgent", agent_id)

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
