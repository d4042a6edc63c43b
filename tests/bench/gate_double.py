"""The gate benchmark's API double (``tests.bench.gate``): kmock with the shim's emulator, made
usable at 10,000 objects, run in a child process; ``Double`` is the parent's handle on it."""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import functools
import gc
import itertools
import json
import multiprocessing
import os
import types
from collections import Counter
from collections.abc import Mapping
from datetime import UTC, datetime
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import kmock
import msgspec
from kmock._internal import apps, enums, references, rendering
from kmock._internal import dicts as kmock_dicts

from tests.bench import gate_procstat
from tests.bench.gate_fleet import NODEWRIGHT, PING, SKYHOOK, Pending, build_cluster
from tests.support.kshim import ShimEmulator

ETCD_LIMIT = 3 << 19  # 1.5 MiB: etcd's default request limit, so the largest object it stores
GATE_AGENT = "nodegate-gate-bench"
RESOURCES: dict[str, dict[str, Any]] = {
    "v1/nodes": {"kind": "Node", "namespaced": False},
    "v1/events": {"kind": "Event", "namespaced": True},
    "nodegate.io/v1alpha1/nodeattestations": {"kind": "NodeAttestation", "namespaced": False},
    "coordination.k8s.io/v1/leases": {"kind": "Lease", "namespaced": True},
    f"{NODEWRIGHT}/v1alpha1/nodewrights": {"kind": "NodeWright", "namespaced": False},
    f"{SKYHOOK}/v1alpha1/skyhooks": {"kind": "Skyhook", "namespaced": False},
    "nodegate.bench/v1/pings": {"kind": "Ping", "namespaced": False},  # the baseline's: nobody watches it
    # A copy of every package CR under its own name, watched by nobody: the status write's baseline.
    "nodegate.bench/v1/crcopies": {"kind": "CrCopy", "namespaced": False},
}
CR_COPY = ("nodegate.bench", "v1", "crcopies")


_ROUTES = {
    enums.action.FETCH: "_serve_fetch",
    enums.action.LIST: "_serve_list",
    enums.action.WATCH: "_serve_watch",
    enums.action.CREATE: "_serve_create",
    enums.action.UPDATE: "_serve_update",
    enums.action.DELETE: "_serve_delete",
}


class _Direct(apps.RawHandler):
    """Placed between kmock's Kubernetes classes and RawHandler (see _BenchDouble's MRO): a request
    for a resource goes to the handler kmock's fallback reactions would pick after trying every
    reaction's filters, rendered by kmock's own Response; everything else takes kmock's way."""

    __slots__ = ()

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        res = request.resource
        route = _ROUTES.get(request.action) if res is not None and res.plural and request.action else None
        if route is None:
            return await super()._handle(request)
        # The handler's coroutine (or a watch's generator), not the method: kmock would inspect
        # the method's signature on every request to learn whether to pass the request.
        return await rendering.Response(payload=getattr(self, route)(request))(request)


class _Stored(kmock.Object):
    """A stored object whose whole-object replace (what the shim turns every PATCH and PUT into)
    takes the shim's fresh copy as the new version. kmock would first deep-copy the old version
    and then jsonpatch would copy it again, only to replace it: two thirds of a write's cost."""

    def patch(self, changes: Any = None, /, **kwargs: Any) -> None:
        if (
            not kwargs
            and not self.deleted
            and isinstance(changes, list)
            and len(changes) == 1
            and isinstance(changes[0], dict)
            and changes[0].get("op") == "replace"
            and changes[0].get("path") == ""
            and isinstance(changes[0].get("value"), dict)
        ):
            self.history.append(kmock.ObjectVersion(changes[0]["value"]))
            return
        super().patch(changes, **kwargs)


def merge_patch(value: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """kmock's merge patch (``dicts.merge_patch_dict``) with the same result, key order and
    errors, but the keys the patch leaves alone are copied by ``dict()`` instead of one Python
    step each: the operator's status write names a few nodes of a CR whose status.nodeState and
    nodeStatus have a key per node, ~7 ms a write at 10,000 nodes in kmock's loop."""
    try:
        return _merge_patch(value, patch)
    except ValueError:
        # Refused: kmock walks the stored keys first and names the first conflict in that order;
        # its own merge gives the very same error (never reached on success, so no cost there).
        kmock_dicts.merge_patch_dict(value, patch)
        raise


def _merge_patch(value: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    result = dict(value)
    for key, b in patch.items():
        if b is None:
            result.pop(key, None)
        elif key not in value:
            result[key] = _merge_patch({}, b) if isinstance(b, Mapping) else b
        elif isinstance(a := value[key], Mapping) and isinstance(b, Mapping):
            result[key] = _merge_patch(a, b)
        elif isinstance(a, Mapping):
            raise ValueError(f"Cannot patch a dict by a scalar: {a!r} << {b!r}")
        elif isinstance(b, Mapping):
            raise ValueError(f"Cannot patch a scalar by a dict: {a!r} << {b!r}")
        else:
            result[key] = b
    return result


def _kind(request: kmock.Request) -> str:
    """``verb resource[/subresource]`` as Kubernetes names them."""
    res = request.resource
    what = (res.plural or "?") if res is not None else request.url.path
    if request.subresource:
        what = f"{what}/{request.subresource}"
    method = request.method.value.upper() if request.method is not None else "?"
    if method == "GET":
        verb = (
            "watch"
            if request.params.get("watch") in ("true", "True", "1")
            else ("get" if request.name else "list")
        )
    else:
        verb = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}.get(method, method)
    return f"{verb} {what}"


@attrs.define(kw_only=True)
class _BenchDouble(ShimEmulator, _Direct):
    _calls: dict[str, Counter[str]] = attrs.field(factory=lambda: {"gate": Counter(), "other": Counter()})

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        who = "gate" if str(request.headers.get("User-Agent", "")).startswith(GATE_AGENT) else "other"
        self._calls[who][_kind(request)] += 1
        self._requests.clear()  # counted: a 10,000-node pass would otherwise keep ~50,000 requests
        try:
            return await super()._handle(request)
        finally:
            if request.method in (enums.method.PATCH, enums.method.PUT) and request.resource is not None:
                key = (request.resource, request.namespace, request.name or "")
                if key in self.objects and not self.objects[key].deleted:
                    del self.objects[key].history[:-1]  # kmock keeps every version otherwise

    def _prepare_write(self, request: kmock.Request) -> aiohttp.web.StreamResponse | None:
        # The shim deep-copies the stored object before a merge patch (~1 MiB for a big CR's
        # status write); kmock's merge is copy-on-write already, and no stored version is changed
        # in place here, so the new version shares what the patch leaves alone. Same answer.
        data = request.data
        key: Any = (request.resource, request.namespace, request.name)
        if (
            request.method != enums.method.PATCH
            or not isinstance(data, dict)
            or key not in self.objects
            or self.objects[key].deleted
            or (data.get("metadata") or {}).get("resourceVersion") is not None  # the shim's 409 check
        ):
            return super()._prepare_write(request)
        object.__setattr__(request, "action", enums.action.UPDATE)
        result = merge_patch(self.objects[key].raw, data)
        meta = result.get("metadata")
        result["metadata"] = {
            **(meta if isinstance(meta, dict) else {}),
            "resourceVersion": str(next(self._versions)),
        }
        object.__setattr__(request, "data", [{"op": "replace", "path": "", "value": result}])
        return None

    def _KubernetesEmulator__get_objs(self, request: kmock.Request, strict: bool) -> list[kmock.Object]:
        # kmock's own version scans every stored object, also for one named object.
        if strict and request.name is not None:
            key: Any = (request.resource, request.namespace, request.name)
            return [self.objects[key]] if key in self.objects else []
        return [
            obj
            for (res, ns, name), obj in self.objects.items()
            if res == request.resource
            and (ns == request.namespace if strict else request.namespace is None or ns == request.namespace)
            and (request.name is None or name == request.name)
        ]

    def take_calls(self) -> dict[str, dict[str, int]]:
        out = {who: dict(sorted(c.items())) for who, c in self._calls.items()}
        self._calls = {"gate": Counter(), "other": Counter()}
        return out

    def populate(self, n: int) -> tuple[list[Pending], list[int]]:
        """Replace everything stored with a fresh cluster of ``n`` nodes; its pending nodes and
        the size of each CR's JSON (its status.nodeState is most of it)."""
        self.objects.clear()
        cluster = build_cluster(n, datetime.now(UTC))
        sizes = [len(json.dumps(cr, separators=(",", ":"))) for cr in cluster.crs]
        if max(sizes) > ETCD_LIMIT:
            raise ValueError(f"a CR of {max(sizes):,} bytes: more than etcd stores ({ETCD_LIMIT:,})")
        version = itertools.count(1)
        keys = {k: references.resource(*_split(k)) for k in RESOURCES}
        groups: list[tuple[str, list[dict[str, Any]]]] = [
            ("v1/nodes", cluster.nodes),
            ("nodegate.io/v1alpha1/nodeattestations", cluster.attestations),
            ("/".join(PING[:3]), [cluster.ping()]),
        ]
        for cr in cluster.crs:
            plural = "nodewrights" if cr["apiVersion"].startswith(NODEWRIGHT) else "skyhooks"
            groups.append((f"{cr['apiVersion']}/{plural}", [cr]))
            # The same document under a resource nobody watches (status shared: every write is a
            # copy-on-write merge, nothing changes a stored version in place).
            copy = {
                **cr,
                "apiVersion": f"{CR_COPY[0]}/{CR_COPY[1]}",
                "kind": "CrCopy",
                "metadata": dict(cr["metadata"]),
            }
            groups.append(("/".join(CR_COPY), [copy]))
        stored = self.objects._objects  # kmock wraps whatever it is given in a plain Object
        for resource, objects in groups:
            for obj in objects:
                obj["metadata"]["resourceVersion"] = str(next(version))
                stored[keys[resource], None, obj["metadata"]["name"]] = _Stored(obj)
        # The shim's own counter must not hand out a resourceVersion an object already has.
        self._versions = itertools.count(next(version) + 1000)
        gc.collect()
        gc.freeze()  # the stored cluster is not the gate's cost: keep it out of the double's GC passes
        return cluster.pending, sizes


def _split(resource: str) -> tuple[str, str, str]:
    parts = resource.split("/")
    return ("", parts[0], parts[1]) if len(parts) == 2 else (parts[0], parts[1], parts[2])


def _fast_json() -> None:
    """In the double's process only: kmock renders answers and watch events with msgspec instead of
    the json module (~10x faster on a 1 MiB CR: ~8 ms per encode, twice per status write, was most
    of the double's time per write). The same documents, compact as the API server writes them;
    anything msgspec cannot encode goes the old way."""

    def dumps(obj: Any, **kwargs: Any) -> str:
        try:
            return msgspec.json.encode(obj).decode()
        except TypeError:
            return json.dumps(obj, **kwargs)

    rendering.json = types.SimpleNamespace(dumps=dumps)  # type: ignore[attr-defined]
    aiohttp.web.json_response = functools.partial(aiohttp.web.json_response, dumps=dumps)  # type: ignore[assignment]


def _double_main(conn: Connection, cpus: list[int], profile: str | None) -> None:
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(cpus))
    _fast_json()
    if profile is None:
        asyncio.run(_serve_double(conn))
        return
    profiler = cProfile.Profile()
    try:
        profiler.runcall(asyncio.run, _serve_double(conn))
    finally:
        profiler.dump_stats(profile)


async def _serve_double(conn: Connection) -> None:
    async with _BenchDouble() as double, apps.Server(double) as server:
        for resource, info in RESOURCES.items():
            double.resources[resource] = info  # type: ignore[assignment]
        conn.send(("ok", str(server.url)))
        while True:
            command, arg = await asyncio.to_thread(conn.recv)
            try:
                if command == "populate":
                    conn.send(("ok", double.populate(int(arg))))
                elif command == "calls":
                    conn.send(("ok", double.take_calls()))
                elif command == "stop":
                    conn.send(("ok", None))
                    return
                else:
                    conn.send(("error", f"unknown command {command!r}"))
            except Exception as exc:  # noqa: BLE001  (reported to the parent, which fails the run)
                conn.send(("error", f"{type(exc).__name__}: {exc}"))


class Double:
    """The parent's handle on the double's process."""

    def __init__(self, cpus: set[int], profile: Path | None = None) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.profile = profile
        self.cpus = cpus
        args = (child, sorted(cpus), str(profile) if profile else None)
        self.proc = ctx.Process(target=_double_main, args=args, daemon=True, name="kmock")
        self.proc.start()
        child.close()
        self.url = str(self._ask(None))

    def _ask(self, command: str | None, arg: Any = None) -> Any:
        if command is not None:
            self._conn.send((command, arg))
        try:
            if not self._conn.poll(600):
                raise RuntimeError(f"the double did not answer {command or 'start'}")
            status, value = self._conn.recv()
        except EOFError:
            raise RuntimeError(
                f"the double exited with {self.proc.exitcode} ({command or 'start'})"
            ) from None
        if status != "ok":
            raise RuntimeError(f"the double failed {command}: {value}")
        return value

    def populate(self, n: int) -> tuple[list[Pending], list[int]]:
        pending, sizes = self._ask("populate", n)
        return pending, sizes

    def calls(self) -> dict[str, dict[str, int]]:
        calls: dict[str, dict[str, int]] = self._ask("calls")
        return calls

    def cpu_seconds(self) -> float | None:
        return gate_procstat.pid_cpu_seconds(self.proc.pid)

    def rss_kib(self) -> int | None:
        return gate_procstat.rss_kib(self.proc.pid)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._ask("stop")
        self.proc.join(timeout=30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
