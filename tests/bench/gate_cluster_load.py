"""The load process of the gate benchmark against the real API server (``tests.bench.gate_cluster``):
it plays NodeWright's operator (its node-state writes, its waiting/blocked loop), measures the API
server's own round trip and write floor, and watches Nodes and NodeAttestations to see each release
and the gate's reports. It runs in its own process; its times are CLOCK_MONOTONIC, shared with the
parent."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from multiprocessing.connection import Connection
from typing import Any

import aiohttp

from tests.bench import procstat
from tests.bench.gate_cluster_objects import (
    ATTESTATIONS,
    CRS,
    HOLD,
    IN_FLIGHT,
    MERGE,
    _stamp,
    annotation,
    cr_body,
    cr_of,
    node_body,
    node_name,
    node_state,
)


class Load:
    def __init__(self, base: str, ctx: ssl.SSLContext) -> None:
        self.base = base
        self.ctx = ctx
        self.http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, limit=64))
        self.released: dict[str, int] = {}
        self.waiters: dict[str, asyncio.Event] = {}
        self.watching = asyncio.Event()
        self.watching_attestations = asyncio.Event()
        self.nodes = 0
        self.conditioned: set[str] = set()  # nodes that carry nodegate's NodegateReady condition
        self.phased: set[str] = set()  # NodeAttestations with a phase written by the gate
        self.phases: dict[str, str] = {}  # the newest phase of each
        self.ready: dict[str, str] = {}  # the newest NodegateReady status of each node
        self.seen = asyncio.Event()  # set by each report seen (``settled`` waits on it)
        self.reported: dict[str, float] = {}  # "conditions" / "phases" -> when every node had one
        self.all_reported = asyncio.Event()

    async def call(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> Any:
        async with self.http.request(method, f"{self.base}{path}", json=body, headers=headers) as resp:
            out = await resp.read()
            if resp.status >= 400:
                raise RuntimeError(f"{method} {path}: {resp.status} {out[:300]!r}")
            return json.loads(out) if out else None

    async def many(
        self, calls: list[tuple[str, str, Any, dict[str, str] | None]], in_flight: int = IN_FLIGHT
    ) -> list[int]:
        """The calls, ``in_flight`` at a time; each one's completion (monotonic ns)."""
        sem = asyncio.Semaphore(in_flight)

        async def one(c: tuple[str, str, Any, dict[str, str] | None]) -> int:
            async with sem:
                await self.call(*c)
                return time.monotonic_ns()

        return list(await asyncio.gather(*(one(c) for c in calls)))

    async def setup(self, n: int) -> list[str]:
        names = [node_name(i) for i in range(n)]
        self.nodes = n
        now = datetime.now(UTC)
        await self.call(
            "POST",
            "/api/v1/namespaces/default/configmaps",
            {"metadata": {"name": "bench-ping"}, "data": {"i": "0"}},
        )
        for cr in sorted({cr_of(n_) for n_ in names}):
            mine = [n_ for n_ in names if cr_of(n_) == cr]
            await self.call("POST", CRS, cr_body(cr))
            await self.call(
                "PATCH",
                f"{CRS}/{cr}/status",
                {
                    "status": {
                        "status": "in_progress",
                        "nodeState": {n_: node_state(False) for n_ in mine},
                        "nodeStatus": {n_: "in_progress" for n_ in mine},
                    }
                },
                MERGE,
            )
        status = {
            "status": {
                "attestedAt": _stamp(now),
                "expiresAt": _stamp(now + timedelta(days=1)),
                "resetCount": 1,
            }
        }
        await self.many(
            [
                (
                    "POST",
                    ATTESTATIONS,
                    {
                        "apiVersion": "nodegate.io/v1alpha1",
                        "kind": "NodeAttestation",
                        "metadata": {"name": n_},
                        "spec": {"ekSha256": f"{i:064x}"},
                    },
                    None,
                )
                for i, n_ in enumerate(names)
            ]
        )
        await self.many([("PATCH", f"{ATTESTATIONS}/{n_}/status", status, MERGE) for n_ in names])
        await self.many([("POST", "/api/v1/nodes", node_body(n_), None) for n_ in names])
        return names

    def _reported(self, what: str, done: set[str]) -> None:
        if what not in self.reported and self.nodes and len(done) >= self.nodes:
            self.reported[what] = time.monotonic()
            if len(self.reported) == 2:
                self.all_reported.set()

    async def _stream(
        self, path: str, selector: str | None, opened: asyncio.Event
    ) -> AsyncIterator[tuple[int, dict[str, Any]]]:
        """Watch events of ``path`` from now on, forever: (seen at, object)."""
        first = {"limit": "1", **({"labelSelector": selector} if selector else {})}
        async with self.http.get(f"{self.base}{path}", params=first) as resp:
            if resp.status != 200:
                raise RuntimeError(f"list {path}: {resp.status} {(await resp.read())[:300]!r}")
            rv = (await resp.json())["metadata"]["resourceVersion"]
        while True:
            params = {
                "watch": "true",
                "resourceVersion": rv,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": "600",
                **({"labelSelector": selector} if selector else {}),
            }
            async with self.http.get(
                f"{self.base}{path}", params=params, timeout=aiohttp.ClientTimeout(total=None)
            ) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"watch {path}: {resp.status} {(await resp.read())[:300]!r}")
                opened.set()
                async for line in resp.content:
                    ev = json.loads(line)
                    obj = ev.get("object", {})
                    rv = obj.get("metadata", {}).get("resourceVersion", rv)
                    if ev.get("type") in ("ADDED", "MODIFIED"):
                        yield time.monotonic_ns(), obj

    async def watch(self) -> None:
        async for seen, obj in self._stream("/api/v1/nodes", "pool=bench", self.watching):
            name = obj["metadata"]["name"]
            taints = (obj.get("spec") or {}).get("taints") or []
            if name not in self.released and not any(t.get("key") == HOLD for t in taints):
                self.released[name] = seen
                if name in self.waiters:
                    self.waiters[name].set()
            for c in (obj.get("status") or {}).get("conditions") or ():
                if c.get("type") == "NodegateReady":
                    self.ready[name] = str(c.get("status"))
                    self.seen.set()
                    if name not in self.conditioned:
                        self.conditioned.add(name)
                        self._reported("conditions", self.conditioned)

    async def watch_attestations(self) -> None:
        async for _, obj in self._stream(ATTESTATIONS, None, self.watching_attestations):
            phase = (obj.get("status") or {}).get("phase")
            if phase:
                self.phases[obj["metadata"]["name"]] = str(phase)
                self.seen.set()
                self.phased.add(obj["metadata"]["name"])
                self._reported("phases", self.phased)

    async def settled(self, names: list[str], timeout: float) -> float:
        """Wait until the gate reported every released node as released (its condition True, its
        NodeAttestation Ready): the burst's trailing writes are done. Returns when (monotonic)."""
        async with asyncio.timeout(timeout):
            while not all(self.ready.get(n) == "True" and self.phases.get(n) == "Ready" for n in names):
                self.seen.clear()
                await self.seen.wait()
        return time.monotonic()

    async def baseline(self, k: int, node: str) -> list[float]:
        out = []
        for i in range(k):
            t0 = time.monotonic_ns()
            await self.call(
                "PATCH", "/api/v1/namespaces/default/configmaps/bench-ping", {"data": {"i": str(i)}}, MERGE
            )
            await self.call("GET", f"/api/v1/nodes/{node}")
            out.append((time.monotonic_ns() - t0) / 1e6)
        return out

    async def complete(self, names: list[str]) -> tuple[int, int]:
        """The operator's writes for ``names``: annotations, then one status patch per CR, all at
        once. Returns when the status patches were sent and when the last was answered."""
        by_cr: dict[str, list[str]] = {}
        for n in names:
            by_cr.setdefault(cr_of(n), []).append(n)
        done = json.dumps(node_state(True))
        await self.many(
            [
                (
                    "PATCH",
                    f"/api/v1/nodes/{n}",
                    {"metadata": {"annotations": {annotation(cr_of(n)): done}}},
                    MERGE,
                )
                for n in names
            ]
        )
        t0 = time.monotonic_ns()
        acks = await self.many(
            [
                (
                    "PATCH",
                    f"{CRS}/{cr}/status",
                    {
                        "status": {
                            "nodeState": {n: node_state(True) for n in mine},
                            "nodeStatus": {n: "complete" for n in mine},
                        }
                    },
                    MERGE,
                )
                for cr, mine in by_cr.items()
            ],
            in_flight=len(by_cr),
        )
        return t0, max(acks)

    async def sample(self, name: str) -> tuple[float, float]:
        """(release after the status write was sent, after it was answered), ms."""
        self.waiters[name] = asyncio.Event()
        t0, ack = await self.complete([name])
        async with asyncio.timeout(60):
            await self.waiters[name].wait()
        return (self.released[name] - t0) / 1e6, (self.released[name] - ack) / 1e6

    async def burst(self, names: list[str]) -> tuple[list[float], float]:
        """Every node's lag from the status writes being sent, and how long they took."""
        for n in names:
            self.waiters[n] = asyncio.Event()
        t0, ack = await self.complete(names)
        async with asyncio.timeout(600):
            for n in names:
                await self.waiters[n].wait()
        return [(self.released[n] - t0) / 1e6 for n in names], (ack - t0) / 1e6

    async def floor(self, names: list[str], in_flight: int) -> list[float]:
        """What the API server allows a burst: one Node patch per node, ``in_flight`` at a time
        (as the gate's workers write taints); each one's completion from the start, ms."""
        t0 = time.monotonic_ns()
        done = await self.many(
            [
                ("PATCH", f"/api/v1/nodes/{n}", {"metadata": {"labels": {"bench-floor": "1"}}}, MERGE)
                for n in names
            ],
            in_flight=in_flight,
        )
        return [(t - t0) / 1e6 for t in done]

    async def churn(self, names: list[str], per_second: float, stop: asyncio.Event) -> dict[str, int]:
        """The real operator's waiting/blocked loop (docs/gate.md) on ``names`` until ``stop``:
        ``per_second`` flips in all, each a GET, a guarded Node patch, a guarded Node status patch
        and a CR status patch (tests/cluster/churn.py)."""
        from tests.cluster import churn as ch

        api = ch.Api(self.base, self.ctx)
        counts = ch.Counts()
        interval = len(names) / per_second
        failed = 0

        async def one(i: int, node: str) -> None:
            nonlocal failed
            k = 0
            due = time.monotonic() + interval * i / len(names)
            while not stop.is_set():
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                try:
                    await ch.operator_flip(
                        api, counts, node, cr_of(node), "waiting" if k % 2 == 0 else "blocked"
                    )
                except RuntimeError:  # 504 from an overloaded API server: the operator retries too
                    failed += 1
                k += 1
                due += interval

        try:
            await asyncio.gather(*(one(i, n) for i, n in enumerate(names)))
        finally:
            await api.close()
        return {"flips": counts.flips, "conflicts_409": counts.conflicts, "failed": failed}


def load_main(conn: Connection, base: str, ca: str, cert: tuple[str, str]) -> None:
    async def serve() -> None:
        ctx = ssl.create_default_context(cafile=ca)
        ctx.load_cert_chain(*cert)
        load = Load(base, ctx)
        watchers: list[asyncio.Task[None]] = []
        churning: asyncio.Task[dict[str, int]] | None = None
        stop_churn = asyncio.Event()
        loop = asyncio.get_running_loop()
        while True:
            cmd, arg = await loop.run_in_executor(None, conn.recv)
            if cmd == "stop":
                break
            if cmd == "setup":
                out: Any = await load.setup(arg)
            elif cmd == "watch":
                watchers += [
                    asyncio.create_task(load.watch()),
                    asyncio.create_task(load.watch_attestations()),
                ]
                await load.watching.wait()
                await load.watching_attestations.wait()
                out = True
            elif cmd == "reported":  # when every node had its condition and its phase
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(arg):
                        await load.all_reported.wait()
                out = (dict(load.reported), len(load.conditioned), len(load.phased))
            elif cmd == "baseline":
                out = await load.baseline(*arg)
            elif cmd == "sample":
                out = await load.sample(arg)
            elif cmd == "burst":
                out = await load.burst(arg)
            elif cmd == "settled":
                out = await load.settled(*arg)
            elif cmd == "floor":
                out = await load.floor(*arg)
            elif cmd == "churn":
                churning = asyncio.create_task(load.churn(*arg, stop_churn))
                out = True
            elif cmd == "churn_stop":
                stop_churn.set()
                out = await churning if churning is not None else None
            elif cmd == "rss":
                out = procstat.rss_kib(os.getpid()) or 0
            else:
                out = None
            conn.send(out)
        for task in watchers:
            task.cancel()
        await load.http.close()

    asyncio.run(serve())
