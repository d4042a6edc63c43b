"""``nodegate serve``: build the service and run it on TLS (or, with the dev flag, plaintext on
loopback only) until SIGTERM or SIGINT, behind the connection limits of ``listener``: the join API
on ``listen``, the admission webhooks on their own listener, ``admission.listen``.

Every failure to start is one line (``StartupError``) that names the file and the fix; the CLI
prints it and exits 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from aiohttp import web

from bootstrap.config import Settings, host_port
from bootstrap.files import write_atomic
from bootstrap.names import is_loopback
from bootstrap.service import preflight
from bootstrap.service.compose import build_service, make_admission_app, make_app, tls_context
from bootstrap.service.http.guarded import GuardedSite
from bootstrap.service.http.limits import ConnectionLimits, Network
from bootstrap.service.pki.startup import StartupError, one_line
from bootstrap.service.state import Service
from bootstrap.service.webhook.site import ReviewSite

log = logging.getLogger("nodegate.server")

_FD_RESERVE = 128  # descriptors kept for the store, CA files, the Kubernetes client and logs
_FD_WANTED = 65536
# The admission listener's connections: the API server is its only client (its keep-alive pool
# to each replica). One address that is not one of admission.api_server_sources holds at most
# ADMISSION_PER_ADDRESS, and ADMISSION_RESERVED are kept for those sources (issue 41, finding 3).
ADMISSION_CONNECTIONS = 512
ADMISSION_PER_ADDRESS = 64
ADMISSION_RESERVED = 128
# Kernel send and receive buffers per admission connection, and a TLS connection's own buffers
# each way: reviews are KiBs (etcd stores at most 1.5 MiB an object) and the API server reads its
# answers at once, so these bound what a client that pipelines without reading holds (finding 4)
# without slowing genuine reviews (docs/benchmarks.md).
ADMISSION_SOCKET_BUFFER = 64 * 1024
ADMISSION_TLS_BUFFER = 16 * 1024
# From a review's first byte to its answer: the API server gives up after timeoutSeconds (at most
# 30 s), so a request still incomplete after that is not the API server's.
ADMISSION_REQUEST_SECONDS = 35.0
# Longer than the API server's idle keep-alive (Go's 90 s): it never sends on a connection the
# listener is closing.
ADMISSION_IDLE_SECONDS = 120.0


@dataclass
class Serving:
    """A started service: its parts, the listener and the port it is bound to."""

    service: Service
    runner: web.AppRunner
    site: GuardedSite
    port: int
    admission_site: ReviewSite | None = None
    admission_port: int = 0

    async def close(self) -> None:
        if self.admission_site is not None:
            await self.admission_site.stop()
        await self.runner.cleanup()
        await self.service.close()


async def start(
    settings: Settings,
    *,
    insecure_plaintext: bool = False,
    new_ca: bool = False,
    limits: ConnectionLimits | None = None,
    kube: bool = True,
    admission_limits: ConnectionLimits | None = None,
) -> Serving:
    """Build the service and listen; StartupError (one line) for anything that stops it."""
    host, port = host_port(settings.listen)
    if insecure_plaintext and not is_loopback(host):
        raise StartupError(f"--insecure-plaintext only binds loopback; listen is {settings.listen}")
    adm_host, adm_port = host_port(settings.admission.listen)
    if insecure_plaintext and not is_loopback(adm_host):
        raise StartupError(
            f"--insecure-plaintext only binds loopback; admission.listen is {settings.admission.listen}"
        )
    preflight.check(settings, insecure_plaintext=insecure_plaintext)  # before anything is written
    with preflight.nothing_left_behind(settings.state_dir):
        return await _start(
            settings,
            host,
            port,
            adm_host,
            adm_port,
            insecure_plaintext,
            new_ca,
            limits,
            kube,
            admission_limits,
        )


async def _start(
    settings: Settings,
    host: str,
    port: int,
    adm_host: str,
    adm_port: int,
    insecure_plaintext: bool,
    new_ca: bool,
    limits: ConnectionLimits | None,
    kube: bool,
    admission_limits: ConnectionLimits | None,
) -> Serving:
    try:
        service = await build_service(settings, kube=kube, new_ca=new_ca)
    except StartupError:
        raise
    except Exception as exc:  # one line for every known and unknown start failure
        raise StartupError(one_line(exc, settings)) from exc
    serving: Serving | None = None
    try:
        ctx = None if insecure_plaintext else tls_context(service)
        app = make_app(service)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = GuardedSite(
            runner, host, port, tls=ctx, limits=limits or default_limits(), metrics=service.metrics
        )
        await site.start()
        serving = Serving(service, runner, site, site.port)
        serving.admission_site = ReviewSite(
            make_admission_app(service),
            adm_host,
            adm_port,
            tls=ctx,
            limits=admission_limits or default_admission_limits(settings.admission.api_server_sources),
            metrics=service.metrics,
        )
        try:
            await serving.admission_site.start()
        except OSError as exc:
            raise StartupError(
                f"admission.listen {settings.admission.listen}: {exc.strerror or exc}; "
                "choose a free port (the webhooks' own listener)"
            ) from exc
        serving.admission_port = serving.admission_site.port
    except Exception as exc:
        if serving is not None:
            await serving.close()
        else:
            await service.close()
        if isinstance(exc, StartupError):
            raise
        raise StartupError(one_line(exc, settings)) from exc
    return serving


async def serve(
    settings: Settings,
    *,
    insecure_plaintext: bool = False,
    ready: Callable[[int], None] | None = None,
    stop: asyncio.Event | None = None,
    new_ca: bool = False,
    admission_ready: Callable[[int], None] | None = None,
) -> None:
    running = await start(settings, insecure_plaintext=insecure_plaintext, new_ca=new_ca)
    if insecure_plaintext:
        log.warning(
            "PLAINTEXT LISTENER (--insecure-plaintext): development only, loopback only, no mTLS",
            extra={"listen": settings.listen},
        )
    host, _ = host_port(settings.listen)
    log.info("nodegate serving", extra={"listen": f"{host}:{running.port}"})
    adm_host, _ = host_port(settings.admission.listen)
    log.info("admission webhooks serving", extra={"listen": f"{adm_host}:{running.admission_port}"})
    if admission_ready is not None:
        admission_ready(running.admission_port)
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
    total = max(limits.per_address, min(limits.total, soft - _FD_RESERVE - ADMISSION_CONNECTIONS))
    return replace(limits, total=total)


def default_admission_limits(sources: Sequence[Network] = ()) -> ConnectionLimits:
    """The admission listener's: the API server is its only client (NetworkPolicy), from a few
    addresses (``sources``, ``admission.api_server_sources``: no per-address cap and reserved
    room; a network of prefix length 0 would exempt every address, so it counts as none); no
    maximum age or request count (meant for nodes' connections); the request deadline covers
    headers, body and decision (the body also has its own, shorter one:
    ``WebhookLimits.body_seconds``, armed by the connection only while a body is awaited); under
    pressure a busy connection of the address with the most is closed for a newcomer from an
    address with fewer (``evict_busy``)."""
    narrow = tuple(net for net in sources if net.prefixlen > 0)
    return ConnectionLimits(
        per_address=ADMISSION_PER_ADDRESS,
        total=ADMISSION_CONNECTIONS,
        evict_busy=True,
        sources=narrow,
        reserved=ADMISSION_RESERVED if narrow else 0,
        socket_buffer=ADMISSION_SOCKET_BUFFER,
        tls_buffer=ADMISSION_TLS_BUFFER,
        handshake_timeout=10.0,
        header_timeout=ADMISSION_REQUEST_SECONDS,
        idle_timeout=ADMISSION_IDLE_SECONDS,
        max_age=None,
        max_requests=None,
        sweep=1.0,  # deadlines of tens of seconds: a sweep a second, no timer per review
    )


def write_port(path: Path, port: int) -> None:
    write_atomic(path, f"{port}\n".encode(), mode=0o644)
