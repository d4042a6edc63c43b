"""The service's background tasks, started and stopped with the aiohttp app: reload the CA and
the TLS certificate, prune expired sessions, run the hold gate, the PackagePolicy watch and the
package CRs' selector watch."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from aiohttp import web

from attest.bootrecord import fleet
from bootstrap.service.pki import authority, startup
from bootstrap.service.state import SERVICE, BootCounts, Service
from bootstrap.store import StoreUnavailable

log = logging.getLogger("nodegate.server")

RELOAD_SECONDS = 2.0
BOOT_COUNT_SECONDS = 300.0  # the boot metrics move with joins and renewals: minutes are enough

_TASKS = web.AppKey("tasks", list)


async def start(app: web.Application) -> None:
    service = app[SERVICE]
    try:
        await count_boots(service)
    except StoreUnavailable as exc:
        log.warning("boot metrics not counted yet", extra={"error": str(exc)[:300]})
    tasks: list[asyncio.Task[None]] = [
        # the store's watched copy for the periodic passes (a kubernetes store: no LIST per pass)
        asyncio.get_running_loop().create_task(service.store.keep_current()),
        asyncio.get_running_loop().create_task(_every(RELOAD_SECONDS, lambda: _reload(service))),
        asyncio.get_running_loop().create_task(_every(service.store.prune_interval, lambda: _prune(service))),
        asyncio.get_running_loop().create_task(_every(BOOT_COUNT_SECONDS, lambda: count_boots(service))),
    ]
    if service.spire is not None and service.spire.admin is not None:
        interval = service.settings.spire.ban_interval.total_seconds()
        tasks.append(asyncio.get_running_loop().create_task(_every(interval, lambda: _ban(service))))
    if service.gate is not None:
        # gate.run() never ends on API errors; only the leader of its Lease writes.
        tasks.append(asyncio.get_running_loop().create_task(service.gate.run(), name="gate"))
    for source in (service.decider.policy_source, service.decider.selector_source):
        run = getattr(source, "run", None)
        if callable(run):
            tasks.append(asyncio.get_running_loop().create_task(run()))
    app[_TASKS] = tasks


async def stop(app: web.Application) -> None:
    for task in app.get(_TASKS, []):
        task.cancel()
    for task in app.get(_TASKS, []):
        with contextlib.suppress(asyncio.CancelledError):
            await task
    service = app[SERVICE]
    if service.spire is not None:
        await service.spire.close()


async def _every(seconds: float, step: Callable[[], Awaitable[None]]) -> None:
    while True:
        await asyncio.sleep(seconds)
        try:
            await step()
        except (StoreUnavailable, authority.CaUnavailable, OSError) as exc:
            log.warning("background step failed", extra={"error": str(exc)[:300]})


async def _reload(service: Service) -> None:
    if service.reload_ca():  # a rotation: the store learns the new CA's certificate
        await startup.remember(service.store, service.cas)
    service.reload_tls_files()
    service.refresh_server_certificate()
    if service.spire is not None:  # also when a retired CA leaves the bundle, not only on rotation
        service.spire.sync_bundle(service.cas, datetime.now(UTC))


async def _ban(service: Service) -> None:
    if service.spire is not None:  # every agent SPIRE knows against the store (docs/spire.md)
        await service.spire.reconcile(service.store, datetime.now(UTC))


async def count_boots(service: Service) -> None:
    """The store's boot records counted for the metrics (bounded series: fleet.metric_groups)."""
    nodes = await service.store.list_nodes(recent=True)
    records = [n.boot_record for n in nodes if n.boot_record is not None]
    service.boots = BootCounts(fleet.metric_groups(records), len(nodes) - len(records))


async def _prune(service: Service) -> None:
    await service.store.prune(datetime.now(UTC))
