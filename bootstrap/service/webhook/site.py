"""The admission listener: a socket whose connections go through the listener's limits
(``bootstrap.service.http.listener``) to :class:`~bootstrap.service.webhook.protocol.ReviewProtocol`."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from typing import Final

from bootstrap.service.http.framing import HeadReader
from bootstrap.service.http.listener import ConnectionLimits, Connections
from bootstrap.service.metrics import Metrics
from bootstrap.service.webhook.app import Reviews
from bootstrap.service.webhook.protocol import Clock, OpenSet, ReviewProtocol

STOP_SECONDS: Final = (
    10.0  # answers in flight at a stop get this long (the API server's timeout is 10 s by default)
)


class ReviewSite:
    """``start`` binds and serves; ``stop`` stops accepting, lets the answers in flight finish
    (up to ``STOP_SECONDS``) and closes every connection."""

    def __init__(
        self,
        app: Reviews,
        host: str,
        port: int,
        *,
        tls: ssl.SSLContext | None,
        limits: ConnectionLimits,
        metrics: Metrics,
        backlog: int = 1024,
    ) -> None:
        self.app = app
        self._host = host
        self._port = port
        self._tls = tls
        self._limits = limits
        self._metrics = metrics
        self._backlog = backlog
        self._clock = Clock()
        self._heads = HeadReader()  # shared by the connections: the API server's heads repeat
        self._protocols = OpenSet()
        self.connections: Connections | None = None
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        """The bound port (the configured one until started)."""
        if self._server is not None:
            for sock in self._server.sockets:
                return int(sock.getsockname()[1])
        return self._port

    @property
    def name(self) -> str:
        return f"{'https' if self._tls is not None else 'http'}://{self._host}:{self.port}"

    def _protocol(self) -> ReviewProtocol:
        return ReviewProtocol(self.app, self._clock, self._protocols, self._heads)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._protocols.draining = False
        self.connections = Connections(self._limits, self._metrics, self._protocol, self._tls)
        self._server = await loop.create_server(
            self.connections.protocol, self._host, self._port, backlog=self._backlog, reuse_address=True
        )
        if self._limits.sweep is not None:
            self._sweeper = loop.create_task(self._sweep(self._limits.sweep))

    async def _sweep(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            if self.connections is not None:
                self.connections.sweep(time.monotonic())

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self._protocols.draining = True
        for proto in list(self._protocols.members):
            proto.drain()  # before any await: an answer finishing meanwhile closes its connection
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        if self.connections is not None:
            self.connections.abort_unserved()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._protocols.empty.wait(), STOP_SECONDS)
        for proto in list(self._protocols.members):
            proto.abort()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
