"""The load the gate benchmark drives, in its own process (part of ``tests/bench/gate.py``).

The operator's and the node agent's writes, the baseline round trips and the node watch that
sees the gate's verdicts run in a child process, so that the gate's process spends CPU on the gate
alone ("gate CPU per reaction"). The parent holds a :class:`Load`, which offers the calls the
benchmark makes of its agent (a subset of ``Kube``) and a ``watch`` with ``arm``; each is sent over
a pipe and answered when the child is done. Times are the child's ``perf_counter_ns``
(CLOCK_MONOTONIC: one clock for both processes): a write's send time is the child's, taken just
before its request, and a verdict's time is when the child's watch decoded it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing
import os
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from bootstrap.kube.core import MERGE_PATCH
from tests.bench import procstat

_WANTS = {"released": None, "held_unattested": "unattested"}  # the hold taint's wanted value


class Load:
    """The parent's handle: forwards calls to the child and resolves their answers."""

    def __init__(self, url: str, nodes: int, cpus: set[int], agent: str, timeout: float) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_child_main,
            args=(child, url, nodes, sorted(cpus), agent, timeout),
            daemon=True,
            name="load",
        )
        self.proc.start()
        child.close()
        self._ids = itertools.count()
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self.last_sent_ns = 0  # the child's send time of the last write answered
        self.watch = Watch(self)
        self.replayed = self.watch.replayed

    def start(self) -> None:
        """Listen for answers on this event loop (call from inside it)."""
        asyncio.get_running_loop().add_reader(self._conn.fileno(), self._readable)

    def _readable(self) -> None:
        while self._conn.poll():
            try:
                ident, ok, value = self._conn.recv()
            except EOFError:
                for future in self._waiting.values():
                    if not future.done():
                        future.set_exception(RuntimeError("the load process exited"))
                self._waiting.clear()
                asyncio.get_running_loop().remove_reader(self._conn.fileno())
                return
            future = self._waiting.pop(ident, None)
            if future is None or future.done():
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(RuntimeError(f"load process: {value}"))

    async def ask(self, op: str, *args: Any) -> Any:
        ident = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[ident] = future
        self._conn.send((ident, op, args))
        return await future

    async def _write(self, op: str, *args: Any) -> Any:
        sent, result = await self.ask(op, *args)
        self.last_sent_ns = sent
        return result

    # -- what the benchmark calls of its agent ---------------------------------------------------

    async def patch_node(self, name: str, patch: dict[str, Any]) -> Any:
        return await self._write("patch_node", name, patch)

    async def patch_node_status(self, name: str, patch: dict[str, Any]) -> Any:
        return await self._write("patch_node_status", name, patch)

    async def patch_cluster_object(self, *args: Any, status: bool = False) -> Any:
        return await self._write("patch_cluster_object", status, *args)

    async def patch_cluster_object_sent(self, *args: Any, status: bool = False) -> int:
        """As patch_cluster_object; the child's send time (concurrent writes each get theirs)."""
        sent, _result = await self.ask("patch_cluster_object", status, *args)
        return int(sent)

    async def get_cluster_object(self, *args: Any) -> Any:
        return await self.ask("get_cluster_object", *args)

    async def get_node(self, name: str) -> Any:
        return await self.ask("get_node", name)

    async def patch_nodes(self, patches: list[tuple[str, dict[str, Any]]], in_flight: int) -> None:
        """Many Node merge patches, ``in_flight`` at a time (one message for all)."""
        await self.ask("patch_nodes", patches, in_flight)

    async def round_trip(self, i: int) -> int:
        """The baseline, measured in the child: a merge patch and a GET of an object nobody watches."""
        ns: int = await self.ask("round_trip", i)
        return ns

    def cpu_seconds(self) -> float | None:
        return procstat.pid_cpu_seconds(self.proc.pid)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ask("stop"), 30)
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(self._conn.fileno())
        self.proc.join(timeout=30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


class Watch:
    """``arm(node, want)``: a future of the time the child's node watch saw the node as wanted."""

    def __init__(self, load: Load) -> None:
        self.load = load
        self.replayed = asyncio.Event()

    def arm(self, node: str, want: Callable[[str | None], bool]) -> asyncio.Future[int]:
        return asyncio.ensure_future(self.load.ask("seen", node, want.__name__))

    async def wait_replayed(self) -> None:
        await self.load.ask("replayed")
        self.replayed.set()

    async def close(self) -> None:
        return None


# ------------------------------------------------------------------------------------------
# The child


async def _patch_unread(
    agent: Any, status: bool, group: str, version: str, plural: str, name: str, patch: Any
) -> int:
    """The operator's merge patch of a custom object (``status``: through /status), as
    ``Kube.patch_cluster_object`` sends it; the answer is read whole (its transfer is part of the
    round trip) but not decoded, and only its size goes back to the parent. A package CR's answer
    is ~1 MiB at 10,000 nodes: decoding it here (on the double's CPU) and pickling it to the
    gate's process put the operator's own client work into the double's and the gate's time, where
    a real operator spends it on its own machine. A status other than 2xx still raises."""
    custom = agent._custom
    call = custom.patch_cluster_custom_object_status if status else custom.patch_cluster_custom_object
    what = f"patch {plural}/{name}{'/status' if status else ''}"
    body: bytes = await agent._call(
        what,
        agent._body(
            call(group, version, plural, name, patch, _content_type=MERGE_PATCH, _preload_content=False)
        ),
    )
    return len(body)


def _child_main(conn: Connection, url: str, nodes: int, cpus: list[int], agent: str, timeout: float) -> None:
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(cpus))
    asyncio.run(_serve(conn, url, nodes, agent, timeout))


async def _serve(conn: Connection, url: str, nodes: int, agent_name: str, timeout: float) -> None:
    # Imported here: gate_reaction imports this module (the child imports the benchmark itself, spawn).
    from bootstrap.kube import Kube
    from tests.bench.gate_kube import api_client
    from tests.bench.gate_reaction import NodeWatch, round_trip

    agent = Kube(api_client(url, agent_name), timeout)
    watch = NodeWatch(agent, nodes)
    loop = asyncio.get_running_loop()
    stop = loop.create_future()
    tasks: set[asyncio.Task[None]] = set()

    async def sent(coro_fn: Callable[[], Any]) -> tuple[int, Any]:
        at = time.perf_counter_ns()
        result = await coro_fn()
        return at, result

    async def handle(ident: int, op: str, args: tuple[Any, ...]) -> None:
        try:
            value: Any
            if op == "patch_node":
                value = await sent(lambda: agent.patch_node(*args))
            elif op == "patch_node_status":
                value = await sent(lambda: agent.patch_node_status(*args))
            elif op == "patch_cluster_object":
                status, *rest = args
                value = await sent(lambda: _patch_unread(agent, status, *rest))
            elif op == "get_cluster_object":
                value = await agent.get_cluster_object(*args)
            elif op == "get_node":
                value = await agent.get_node(*args)
            elif op == "patch_nodes":
                patches, in_flight = args
                limit = asyncio.Semaphore(in_flight)

                async def one(name: str, patch: dict[str, Any]) -> None:
                    async with limit:
                        await agent.patch_node(name, patch)

                await asyncio.gather(*(one(n, p) for n, p in patches))
                value = None
            elif op == "status_round_trip":
                group, version, plural, name, patch = args
                started = time.perf_counter_ns()
                await _patch_unread(agent, True, group, version, plural, name, patch)
                value = time.perf_counter_ns() - started
            elif op == "round_trip":
                value = await round_trip(agent, *args)
            elif op == "seen":
                node, want = args
                wanted = _WANTS[want]
                value = await watch.arm(node, lambda hold: hold == wanted)
            elif op == "replayed":
                await watch.replayed.wait()
                value = None
            elif op == "stop":
                conn.send((ident, True, None))
                if not stop.done():
                    stop.set_result(None)
                return
            else:
                conn.send((ident, False, f"unknown op {op!r}"))
                return
            conn.send((ident, True, value))
        except Exception as exc:  # noqa: BLE001  (reported to the parent, which fails the run)
            conn.send((ident, False, f"{type(exc).__name__}: {exc}"[:500]))

    def readable() -> None:
        while conn.poll():
            try:
                ident, op, args = conn.recv()
            except EOFError:
                if not stop.done():
                    stop.set_result(None)
                return
            task = loop.create_task(handle(ident, op, args))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    loop.add_reader(conn.fileno(), readable)
    try:
        await stop
    finally:
        loop.remove_reader(conn.fileno())
        for task in list(tasks):
            task.cancel()
        await watch.close()
        await agent.close()
