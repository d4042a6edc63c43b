"""The admission listener: a socket whose connections go through the listener's limits
(``bootstrap.service.http.listener``) to :class:`~bootstrap.service.webhook.protocol.ReviewProtocol`."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Final

from bootstrap.service.http.framing import HeadReader
from bootstrap.service.http.guarded import bound_port, listen, stop_sweeping
from bootstrap.service.http.limits import ConnectionLimits
from bootstrap.service.http.listener import Connections
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
        return bound_port(self._server, self._port)

    @property
    def protocols(self) -> frozenset[ReviewProtocol]:
        """The connections being served (what each holds: ``ReviewProtocol.buffered``)."""
        return frozenset(self._protocols.members)

    @property
    def name(self) -> str:
        return f"{'https' if self._tls is not None else 'http'}://{self._host}:{self.port}"

    def _protocol(self) -> ReviewProtocol:
        return ReviewProtocol(self.app, self._clock, self._protocols, self._heads)

    async def start(self) -> None:
        self._protocols.draining = False
        self.connections = Connections(self._limits, self._metrics, self._protocol, self._tls)
        self._server, self._sweeper = await listen(self.connections, self._host, self._port, self._backlog)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self._protocols.draining = True
        for proto in list(self._protocols.members):
            proto.drain()  # before any await: an answer finishing meanwhile closes its connection
        await stop_sweeping(self._sweeper)
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
