"""A listening socket whose connections go through a listener's limits
(``bootstrap.service.http.listener``), the sweep that enforces their deadlines, and the aiohttp
site on it (the join listener; the admission listener has ``bootstrap.service.webhook.site``)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time

from aiohttp import web

from bootstrap.service.http.limits import ConnectionLimits
from bootstrap.service.http.listener import Connection, Connections
from bootstrap.service.metrics import Metrics


async def listen(
    connections: Connections, host: str, port: int, backlog: int
) -> tuple[asyncio.Server, asyncio.Task[None] | None]:
    """The bound socket whose connections go through ``connections``, and the task that enforces
    their deadlines when ``limits.sweep`` is set (None: a timer per phase instead)."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(connections.protocol, host, port, backlog=backlog, reuse_address=True)
    size = connections.limits.socket_buffer
    if size is not None:
        # On the listening socket: accepted ones inherit the sizes from their first segment, so
        # the window a client is offered is bounded too (set later, it is already advertised).
        for sock in server.sockets:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)
    interval = connections.limits.sweep
    return server, None if interval is None else loop.create_task(_sweep(connections, interval))


async def _sweep(connections: Connections, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        connections.sweep(time.monotonic())


async def stop_sweeping(sweeper: asyncio.Task[None] | None) -> None:
    if sweeper is not None:
        sweeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sweeper


def bound_port(server: asyncio.AbstractServer | None, configured: int) -> int:
    """The port ``server`` is bound to (``configured`` until it is)."""
    for sock in getattr(server, "sockets", None) or []:
        return int(sock.getsockname()[1])
    return configured


def connection_of(request: web.BaseRequest) -> Connection | None:
    """The guarded connection a request came on (None under a plain aiohttp site, in tests)."""
    transport = request.transport
    if transport is None:
        return None
    with contextlib.suppress(AttributeError, NotImplementedError):
        proto = transport.get_protocol()
        if isinstance(proto, Connection):
            return proto
    return None


class GuardedSite(web.BaseSite):
    """An aiohttp site whose connections go through ``Connections`` (TLS done there)."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        tls: ssl.SSLContext | None,
        limits: ConnectionLimits,
        metrics: Metrics,
        backlog: int = 1024,
    ) -> None:
        super().__init__(runner, backlog=backlog)
        self._host = host
        self._port = port
        self._tls = tls
        self._limits = limits
        self._metrics = metrics
        self.connections: Connections | None = None
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        scheme = "https" if self._tls is not None else "http"
        return f"{scheme}://{self._host}:{self.port}"

    @property
    def port(self) -> int:
        """The bound port (the configured one until started)."""
        return bound_port(self._server, self._port)

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        if server is None:
            raise RuntimeError("call runner.setup() first")
        self.connections = Connections(self._limits, self._metrics, server, self._tls)
        self._server, self._sweeper = await listen(self.connections, self._host, self._port, self._backlog)

    async def stop(self) -> None:
        await stop_sweeping(self._sweeper)
        await super().stop()
        if self.connections is not None:
            self.connections.abort_unserved()
