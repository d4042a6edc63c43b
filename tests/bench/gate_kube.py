"""The gate under measurement (``tests.bench.gate``): its API client, instrumented so that the
benchmark can tell when it has caught up, and the gate built as the benchmark runs it."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncGenerator
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes_asyncio import client as kc

from bootstrap.config import GateSettings
from bootstrap.gate import Gate, holds
from bootstrap.kube import Kube, WatchEvent
from bootstrap.kube.watch import watch_events
from tests.bench import gate_phases

TIMEOUT = 120.0  # per API call of the gate and the agent (a 10,000-node list is ~50 MB of JSON)


@functools.cache
def bench_settings() -> GateSettings:
    """The gate's settings for the benchmark (no stability window), validated when first asked: the
    benchmark modules are imported by tests (tests/gate/test_bench_merge_patch.py), and a refusal by
    the settings model must fail the benchmark, not the collection of the suite."""
    return GateSettings(stability_window=timedelta(0))


class TrackedKube(Kube):
    """A Kube that knows how many of its calls are in flight (watches are not calls) and which
    nodes it has read, so the benchmark can tell when the gate has caught up."""

    def __init__(self, api: kc.ApiClient, timeout: float, *, ca_pem: bytes | None = None) -> None:
        super().__init__(api, timeout, ca_pem=ca_pem)
        self.inflight = 0
        self.read: set[str] = set()
        self.done = asyncio.Event()

    async def _call(self, what: str, coro: Any, *, echo: bool = True) -> Any:
        self.inflight += 1
        try:
            return await super()._call(what, coro, echo=echo)
        finally:
            self.inflight -= 1
            self.done.set()

    async def get_node(self, name: str) -> dict[str, Any] | None:
        self.read.add(name)
        return await super().get_node(name)

    # The gate's own decoder object, so that gate_phases counts its decodes and not the agent's.
    async def watch_nodes(
        self, resource_version: str, label_selector: str | None = None, *, initial_events: bool = False
    ) -> AsyncGenerator[WatchEvent[dict[str, Any]], None]:
        async for event in watch_events(
            "nodes",
            self._core.list_node,
            resource_version=resource_version,
            decoder=gate_phases.GATE_PLAIN,
            label_selector=label_selector,
            initial_events=initial_events,
        ):
            yield event

    async def watch_cluster_objects(
        self, group: str, version: str, plural: str, resource_version: str, *, initial_events: bool = False
    ) -> AsyncGenerator[WatchEvent[dict[str, Any]], None]:
        async for event in self.watch_cluster_objects_as(
            group, version, plural, resource_version, gate_phases.GATE_PLAIN, initial_events=initial_events
        ):
            yield event


def api_client(url: str, agent: str) -> kc.ApiClient:
    api = kc.ApiClient(configuration=kc.Configuration(host=url.rstrip("/")))
    api.user_agent = agent
    return api


def make_gate(kube: Kube, identity: str = "bench-gate") -> Gate:
    gate = Gate(
        kube, bench_settings(), events_namespace="nodegate", now=lambda: datetime.now(UTC), identity=identity
    )
    if isinstance(kube, TrackedKube):
        # The waits below wake on the gate's API calls; a decision that needs none (the watch
        # event of the gate's own write, decided on the watched copy) must wake them too, or they
        # sleep until the next lease renewal (5 s) before seeing the gate idle.
        decide = gate.reconcile

        async def reconcile(name: str, *, cached: bool = False) -> holds.Decision | None:
            try:
                return await decide(name, cached=cached)
            finally:
                kube.done.set()

        gate.reconcile = reconcile  # type: ignore[method-assign]
    return gate
