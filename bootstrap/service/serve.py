"""``nodegate serve``: build the service and run it on TLS (or, with the dev flag, plaintext on
loopback only) until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from bootstrap.config import Settings, host_port
from bootstrap.files import write_atomic
from bootstrap.names import is_loopback
from bootstrap.service.compose import build_service, make_app, tls_context

log = logging.getLogger("nodegate.server")


async def serve(
    settings: Settings,
    *,
    insecure_plaintext: bool = False,
    ready: Callable[[int], None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    host, port = host_port(settings.listen)
    if insecure_plaintext and not is_loopback(host):
        raise ValueError(f"--insecure-plaintext only binds loopback; listen is {settings.listen}")
    service = await build_service(settings)
    app = make_app(service)
    ctx = None if insecure_plaintext else tls_context(service)
    if insecure_plaintext:
        log.warning(
            "PLAINTEXT LISTENER (--insecure-plaintext): development only, loopback only, no mTLS",
            extra={"listen": settings.listen},
        )
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ctx, backlog=1024)
    await site.start()
    bound = _bound_port(runner, port)
    log.info("nodegate serving", extra={"listen": f"{host}:{bound}"})
    if ready is not None:
        ready(bound)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
        await service.close()


def _bound_port(runner: web.AppRunner, default: int) -> int:
    for server in runner.sites:
        sock = getattr(server, "_server", None)
        sockets = getattr(sock, "sockets", None) or []
        for s in sockets:
            return int(s.getsockname()[1])
    return default


def write_port(path: Path, port: int) -> None:
    write_atomic(path, f"{port}\n".encode(), mode=0o644)
