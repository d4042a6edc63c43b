"""``nodegate serve``: build the service and run it on TLS (or, with the dev flag, plaintext on
loopback only) until SIGTERM or SIGINT, behind the connection limits of ``listener``.

Every failure to start is one line (``StartupError``) that names the file and the fix; the CLI
prints it and exits 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import signal
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from aiohttp import web

from bootstrap.config import Settings, host_port
from bootstrap.files import write_atomic
from bootstrap.names import is_loopback
from bootstrap.service import preflight
from bootstrap.service.compose import build_service, make_app, tls_context
from bootstrap.service.listener import ConnectionLimits, GuardedSite
from bootstrap.service.startup import StartupError, one_line
from bootstrap.service.state import Service

log = logging.getLogger("nodegate.server")

_FD_RESERVE = 128  # descriptors kept for the store, CA files, the Kubernetes client and logs
_FD_WANTED = 65536


@dataclass
class Serving:
    """A started service: its parts, the listener and the port it is bound to."""

    service: Service
    runner: web.AppRunner
    site: GuardedSite
    port: int

    async def close(self) -> None:
        await self.runner.cleanup()
        await self.service.close()


async def start(
    settings: Settings,
    *,
    insecure_plaintext: bool = False,
    new_ca: bool = False,
    limits: ConnectionLimits | None = None,
    kube: bool = True,
) -> Serving:
    """Build the service and listen; StartupError (one line) for anything that stops it."""
    host, port = host_port(settings.listen)
    if insecure_plaintext and not is_loopback(host):
        raise StartupError(f"--insecure-plaintext only binds loopback; listen is {settings.listen}")
    preflight.check(settings, insecure_plaintext=insecure_plaintext)  # before anything is written
    with preflight.nothing_left_behind(settings.state_dir):
        return await _start(settings, host, port, insecure_plaintext, new_ca, limits, kube)


async def _start(
    settings: Settings,
    host: str,
    port: int,
    insecure_plaintext: bool,
    new_ca: bool,
    limits: ConnectionLimits | None,
    kube: bool,
) -> Serving:
    try:
        service = await build_service(settings, kube=kube, new_ca=new_ca)
    except StartupError:
        raise
    except Exception as exc:  # one line for every known and unknown start failure
        raise StartupError(one_line(exc, settings)) from exc
    try:
        ctx = None if insecure_plaintext else tls_context(service)
        app = make_app(service)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = GuardedSite(
            runner, host, port, tls=ctx, limits=limits or default_limits(), metrics=service.metrics
        )
        await site.start()
    except Exception as exc:
        await service.close()
        if isinstance(exc, StartupError):
            raise
        raise StartupError(one_line(exc, settings)) from exc
    return Serving(service, runner, site, site.port)


async def serve(
    settings: Settings,
    *,
    insecure_plaintext: bool = False,
    ready: Callable[[int], None] | None = None,
    stop: asyncio.Event | None = None,
    new_ca: bool = False,
) -> None:
    running = await start(settings, insecure_plaintext=insecure_plaintext, new_ca=new_ca)
    if insecure_plaintext:
        log.warning(
            "PLAINTEXT LISTENER (--insecure-plaintext): development only, loopback only, no mTLS",
            extra={"listen": settings.listen},
        )
    host, _ = host_port(settings.listen)
    log.info("nodegate serving", extra={"listen": f"{host}:{running.port}"})
    if ready is not None:
        ready(running.port)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await running.close()


def default_limits() -> ConnectionLimits:
    """The default limits, with ``total`` within what the process may open (raised to the hard
    limit first: a service that runs out of descriptors stops accepting anyone)."""
    limits = ConnectionLimits()
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = _FD_WANTED if hard == resource.RLIM_INFINITY else min(hard, _FD_WANTED)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
    except (OSError, ValueError):
        return limits
    if soft == resource.RLIM_INFINITY:
        return limits
    total = max(limits.per_address, min(limits.total, soft - _FD_RESERVE))
    return replace(limits, total=total)


def write_port(path: Path, port: int) -> None:
    write_atomic(path, f"{port}\n".encode(), mode=0o644)
