"""Benchmark of the hold gate (bootstrap/gate/) on a large cluster: resync cost and per-event reaction.

What is measured, all in one run:

Double   the API is kmock with tests/support/kshim.py's ShimEmulator (resourceVersions, 409s, merge patches,
         watches), run in a child process pinned to CPU 0 so that the gate's own CPU time can be
         read apart; the gate and this process run on the other CPU(s). Four changes make kmock usable
         at 10,000 objects, all in the double's process and none changing an answer: requests for a
         resource go straight to the emulator's handlers instead of through kmock's reaction
         matching (~10 ms a request whatever the cluster size), a named object is found by key
         instead of by scanning every stored object (~20 ms a request at 10,000 nodes), a merge
         patch shares what it leaves alone with the stored version instead of deep-copying it, and
         JSON is rendered by msgspec (a 1 MiB CR's status write cost ~35 ms of json.dumps). It
         also counts requests as they arrive (by client, verb and resource) instead of keeping
         them, and keeps each object's latest version only.
Load     the agent's and the operator's writes, the baseline round trips and the node watch that
         sees the verdicts run in a third process (gate_load.py, on the double's CPU), so that this
         process's CPU in the reaction phases is the gate's alone; times are the load process's
         CLOCK_MONOTONIC (send before the request, seen when its watch decoded the event).
Cluster  N nodes over 8 pools and 3 zones, 20 package CRs (10 NodeWright, 10 Skyhook; selectors by
         pool, pool In (...), zone plus Exists, NotIn and In; 1-4 packages each, fewer where they
         select more nodes, some with an interrupt), so a node is selected by ~6 CRs and carries
         their nodeState annotations (~9 packages). Each CR's status holds every selected node's
         report, as the operator writes it (status.nodeState and nodeStatus; the largest is ~1 MiB
         at 10,000 nodes, under etcd's 1.5 MiB). 10 % of the nodes (drawn at random) have one
         package in progress, the rest have all complete. Every node has a valid NodeAttestation of
         its current boot and the hold taint the join service leaves (a quarter of them also a
         foreign taint, which the CRs tolerate). The gate's stability window is 0.
Resync   per N (1,000, 2,500, 5,000, 10,000; --quick 1,000 and 2,000) a fresh cluster and a fresh
         Gate; ``reconcile_all()`` once (the first pass: it releases 90 % of the nodes and writes
         every condition and status), then R more times (R = --rounds, default 1: the steady state,
         which must write nothing; with R > 1 the median pass is shown). A 200-node cluster goes
         first, unreported: a process's first requests are slow.
         Timed: wall time, this process's CPU time (the gate with its HTTP client) and the
         double's; API calls counted by the double.
Memory   at the largest N, a fresh Gate's ``load()`` (every list: the caches a pass decides from)
         under tracemalloc (8 frames): what is still allocated afterwards from a frame in
         bootstrap/ (the gate's caches), all that is still allocated, and the traced peak; and
         this process's RSS before that N's gate, after its passes (the gate alive) and at peak
         (RSS also holds what earlier sizes freed: read the tracemalloc figures first).
Reaction at the largest N, after the resync: ``Gate.run()`` (leader election on: a Lease in the
         double); once it has decided every node and gone idle, S times (200; --quick 50; after
         10 not counted) one pending node's package completes as NodeWright writes it: the
         "agent" client merge-patches the node's nodeState annotation (the gate decides and stays
         held: the operator's report is not there yet; it is let go idle), then the operator's
         report in the CR (status.nodeState[node], through /status: the gate's watch event is the
         whole CR), and a watch on every node (opened before run()) sees that node without the
         hold taint. Reaction = from sending the status patch to that watch event. After each
         sample the gate is let finish the release (taint, Event, condition, NodeAttestation
         status) and go idle (no call in flight, nothing queued), so every sample starts from an
         idle gate. The baseline is measured between the samples (the gate idle): the agent's
         merge patch plus GET of a node-sized object nobody watches; and the status write's own
         baseline: the operator's same merge patch through /status to a copy of the same CR (same
         size, same ~1 MiB answer) under a resource nobody watches. The load reads each answer of
         the operator's CR writes whole but does not decode it and sends the parent only its size
         (a real operator decodes it on its own machine, not on the API server's or the gate's CPU).
Reboot   then, S times on released nodes: the kubelet's new boot id (a Node status patch) until
         the watch sees the hold ``unattested``; the join service's attestation of that boot
         (NodeAttestation status bootID, resetCount, attestedAt) until it sees the release; each
         against the same kind of round trip measured between the samples.
Burst    then 1,000 further pending nodes walk the operator's states at once (gate_burst.py): the
         lag from the status write carrying a node's last state to its release, the writes per
         release, and every CR's index in the gate equal to a full index of the stored CR.
Relist   then each source listed again as after a 410 Gone, until the gate is idle (no writes).
Event    first, alone in this process: the CPU of one ~1 MiB CR watch event (gate_event.py).
Phases   the gate's CPU per phase (watch decode, index, decision) and its write steps, counted by
         wrappers around its own steps (gate_phases.py), per reaction, reboot and burst node.

How to read the output:
  ms/node         wall time of a pass / N; gate CPU = this process's CPU time / N, double CPU the
                  child's (clock ticks of 10 ms: coarse in --quick); others = CPU time the rest of
                  the machine used meanwhile (anything but 0 slows the pass: trust such rows less)
  calls           the gate's API calls in the pass, by verb and resource; calls/node = all / N;
                  writes = create + patch + update + delete
  scaling         ms/node at the largest N / ms/node at the smallest (1.0 = linear); also for the
                  gate's CPU time per node. Other load on the machine moves both: see the load
                  averages printed per run (and per pass in --json)
  reaction        median, p99 (nearest rank) and max over the counted samples; "from the patch's
                  answer" starts the clock when the agent's patch is answered instead
  x round trip    reaction / the baseline's median: how many bare patch + GET round trips a
                  release costs end to end; "x status write": reaction / the status write's own
                  bare round trip (the like-for-like ratio: the same request without the gate)
  calls/reaction  the gate's API calls in the reaction phase / reactions (its GET of the node,
                  the four writes of a release, the GETs the watch events of those writes cause,
                  lease renewals)
``NODEGATE_BENCH_PROFILE=DIR`` runs both processes under cProfile (DIR/gate.prof, DIR/gate-double.prof;
the gate's top functions printed to stderr); such a run's numbers are slowed by it.

The targets at the end are reported, never asserted. Checks (a first pass that decides every node
as planned, a steady pass that writes nothing, every reaction seen) are errors: exit code 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import functools
import gc
import hashlib
import itertools
import json
import multiprocessing
import os
import platform
import pstats
import random
import statistics
import sys
import time
import tracemalloc
import types
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import kmock
import msgspec
from kmock._internal import apps, enums, references, rendering
from kmock._internal import dicts as kmock_dicts
from kubernetes_asyncio import client as kc

from bootstrap.config import GateSettings
from bootstrap.gate import Gate, GateReport, crindex, holds
from bootstrap.gate.cache import ATTESTATIONS
from bootstrap.kube import Kube, WatchEvent
from bootstrap.kube.watch import watch_events
from tests.bench import common, gate_burst, gate_event, gate_load, gate_phases
from tests.support.kshim import ShimEmulator

SIZES = (1_000, 2_500, 5_000, 10_000)
QUICK_SIZES = (1_000, 2_000)
ROUNDS = 1  # steady-state passes per size: each adds ~70 s to a full run
QUICK_ROUNDS = 1
REACTIONS = 200
QUICK_REACTIONS = 50
WARMUP_REACTIONS = 10
WARMUP_NODES = 200  # a first cluster, not reported: the first requests of a process are slow
TRACE_FRAMES = 8  # enough to reach bootstrap/ from json and aiohttp allocations
PENDING_SHARE = 0.125  # 1,250 of 10,000: 210 for the reactions, 1,000 for the burst
POOLS = 8
ZONES = 3
CR_COUNT = 20
SEED = 4
# The package pods' tolerations a GPU fleet's CRs carry: the GPU taint, and the hold (docs/gate.md).
TOLERATIONS = [
    {"key": "nvidia.com/gpu", "operator": "Exists"},
    *({"key": GateSettings().taint_key, "operator": "Equal", "value": v, "effect": "NoSchedule"}
      for v in ("packages-pending", "validation-failed")),
]  # fmt: skip
ETCD_LIMIT = 3 << 19  # 1.5 MiB: etcd's default request limit, so the largest object it stores
TARGET_SCALING = 1.25  # ms/node at the largest N over the smallest: "linear" within 25 %
TIMEOUT = 120.0  # per API call of the gate and the agent (a 10,000-node list is ~50 MB of JSON)
WAIT = 120.0  # for one reaction, or for the gate to go idle
WAIT_PER_NODE = 0.05  # for run() to decide every node (plus WAIT): a bound for failure, not a pace
PROFILE_ENV = "NODEGATE_BENCH_PROFILE"
GATE_AGENT = "nodegate-gate-bench"
BENCH_AGENT = "nodegate-bench-agent"
NODEWRIGHT, SKYHOOK = "nodewright.nvidia.com", "skyhook.nvidia.com"
POOL_LABEL, ZONE_LABEL, GPU_LABEL = "nodegate.bench/pool", "nodegate.bench/zone", "nvidia.com/gpu.present"
KEY = GateSettings().taint_key
SETTINGS = GateSettings(stability_window=timedelta(0))
ROOT = Path(__file__).resolve().parents[2]
BOOTSTRAP = str(ROOT / "bootstrap")
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
PING = ("nodegate.bench", "v1", "pings", "ping")
CR_COPY = ("nodegate.bench", "v1", "crcopies")


# ------------------------------------------------------------------------------------------
# The cluster (deterministic: the same in both processes)


def _stamp(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _uid(name: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{name}.bench.nodegate.test"))


def package_crs() -> list[dict[str, Any]]:
    """The 20 CRs: pool-specific, multi-pool, GPU-only in one zone, zone-excluding and zone-wide
    ones. Their packages are few where they select many nodes: upstream keeps every selected node's
    report in the CR's status, which must fit etcd's request limit (1.5 MiB) at 10,000 nodes too;
    a CR selecting every node of a 10,000-node fleet could not store it (build_cluster checks)."""
    out: list[dict[str, Any]] = []
    for j in range(CR_COUNT):
        group = NODEWRIGHT if j % 2 == 0 else SKYHOOK
        selector: dict[str, Any]
        packages_count = 1
        if j < 8:
            selector = {"matchLabels": {POOL_LABEL: f"pool-{j}"}}
            packages_count = 1 + j % 4
        elif j < 14:
            pools = sorted({f"pool-{(j + d) % POOLS}" for d in (0, 2, 5)})
            selector = {"matchExpressions": [{"key": POOL_LABEL, "operator": "In", "values": pools}]}
            packages_count = 1 + j % 2
        elif j < 16:
            selector = {
                "matchLabels": {ZONE_LABEL: f"zone-{j % ZONES}"},
                "matchExpressions": [{"key": GPU_LABEL, "operator": "Exists"}],
            }
            packages_count = 2
        elif j < 18:
            selector = {
                "matchLabels": {"kubernetes.io/os": "linux"},
                "matchExpressions": [{"key": ZONE_LABEL, "operator": "NotIn", "values": ["zone-0"]}],
            }
        else:
            selector = {
                "matchExpressions": [{"key": ZONE_LABEL, "operator": "In", "values": [f"zone-{j % ZONES}"]}]
            }
        packages: dict[str, Any] = {}
        for k in range(packages_count):
            pkg: dict[str, Any] = {"version": f"{j}.{k}.0", "image": f"ghcr.io/bench/pkg-{j:02d}-{k}"}
            if k == 0 and j % 5 == 0:
                pkg["interrupt"] = {"type": "reboot"}
            if k == 1 and j % 3 == 0:
                pkg["configInterrupts"] = {"kernel.*": {"type": "service", "services": ["kubelet"]}}
                pkg["configMap"] = {"kernel.conf": "vm.max_map_count=262144\n"}
            packages[f"pkg-{j:02d}-{k}"] = pkg
        name = f"{'nw' if group == NODEWRIGHT else 'sh'}-{j:02d}"
        spec = {
            "runtimeRequired": True,
            "nodeSelectors": selector,
            "additionalTolerations": TOLERATIONS,
            "packages": packages,
        }
        out.append(
            {
                "apiVersion": f"{group}/v1alpha1",
                "kind": holds.GROUPS[group],
                "metadata": {"name": name, "uid": _uid(name), "annotations": {}},
                "spec": spec,
                "status": {"status": "in_progress"},
            }
        )
    return out


def _node_state(cr: holds.PackageCr, stuck: str | None) -> str:
    """The nodeState annotation NodeWright writes: every package complete at the stage the
    completion rule needs, except ``stuck`` (in progress at apply)."""
    value: dict[str, Any] = {}
    for pkg in cr.packages.values():
        done_stage = "post-interrupt" if pkg.interrupt else "config"
        stage, state = ("apply", "in_progress") if pkg.name == stuck else (done_stage, "complete")
        value[f"{pkg.name}|{pkg.version}"] = {
            "name": pkg.name,
            "version": pkg.version,
            "image": f"ghcr.io/bench/{pkg.name}",
            "stage": stage,
            "state": state,
        }
    return json.dumps(value, separators=(",", ":"))


def _prefix(cr: holds.PackageCr) -> str:
    return NODEWRIGHT if cr.group == NODEWRIGHT else SKYHOOK


@dataclass(frozen=True)
class Pending:
    """A node with one package in progress, and the operator's writes that complete it."""

    node: str
    annotation: str
    complete: str  # the annotation's value with every package complete
    cr: tuple[str, str, str, str]  # group, version, plural, name: its status.nodeState[node] too


def _boot_id(name: str, boot: int = 0) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, f"boot-{boot}.{name}.bench.nodegate.test"))


@dataclass
class Cluster:
    nodes: list[dict[str, Any]]
    attestations: list[dict[str, Any]]
    crs: list[dict[str, Any]]
    pending: list[Pending]

    def ping(self) -> dict[str, Any]:
        """The baseline's object: the first node's body under another resource."""
        node = json.loads(json.dumps(self.nodes[0]))
        node["metadata"]["name"] = PING[3]
        return {**node, "apiVersion": f"{PING[0]}/{PING[1]}", "kind": "Ping"}


def build_cluster(n: int, now: datetime, seed: int = SEED) -> Cluster:
    rng = random.Random(seed)
    crs = package_crs()
    parsed = [holds.parse_cr(cr) for cr in crs]
    statuses: dict[str, dict[str, Any]] = {}
    for cr in crs:
        cr["status"] = {"status": "in_progress", "nodeState": {}, "nodeStatus": {}}
        statuses[cr["metadata"]["name"]] = cr["status"]
    stuck = set(rng.sample(range(n), round(n * PENDING_SHARE)))
    nodes: list[dict[str, Any]] = []
    attestations: list[dict[str, Any]] = []
    pending: list[Pending] = []
    attested = now - timedelta(hours=1)
    for i in range(n):
        name = f"gpu-{i:05d}"
        pool = i % POOLS
        labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "node.kubernetes.io/instance-type": f"bench.{pool}xlarge",
            POOL_LABEL: f"pool-{pool}",
            ZONE_LABEL: f"zone-{i % ZONES}",
        }
        if pool < 6:
            labels[GPU_LABEL] = "true"
        matched = [cr for cr in parsed if holds.selector_matches(cr.selector, labels)]
        hold_cr = rng.choice(matched) if i in stuck else None
        hold_pkg = rng.choice(sorted(hold_cr.packages)) if hold_cr is not None else None
        annotations = {
            "node.alpha.kubernetes.io/ttl": "0",
            "volumes.kubernetes.io/controller-managed-attach-detach": "true",
        }
        for cr in matched:
            key = f"{_prefix(cr)}/nodeState_{cr.name}"
            annotations[key] = _node_state(cr, hold_pkg if cr is hold_cr else None)
            # The operator mirrors it into the CR's status (wrapper/node.go SetStatus).
            status = statuses[cr.name]
            status["nodeState"][name] = json.loads(annotations[key])
            status["nodeStatus"][name] = "in_progress" if cr is hold_cr else "complete"
            if cr is hold_cr:
                plural = "nodewrights" if cr.group == NODEWRIGHT else "skyhooks"
                where = (cr.group, "v1alpha1", plural, cr.name)
                pending.append(Pending(name, key, _node_state(cr, None), where))
        taints: list[dict[str, Any]] = [{"key": KEY, "value": "packages-pending", "effect": "NoSchedule"}]
        if i % 4 == 0:
            taints.insert(0, {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"})
        beat = _stamp(now - timedelta(seconds=i % 40))
        nodes.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "uid": _uid(name),
                    "creationTimestamp": _stamp(attested),
                    "labels": labels,
                    "annotations": annotations,
                },
                "spec": {
                    "providerID": f"bench://{name}",
                    "podCIDR": f"10.{i // 256 % 256}.{i % 256}.0/24",
                    "taints": taints,
                },
                "status": {
                    "conditions": [
                        {
                            "type": t,
                            "status": s,
                            "reason": r,
                            "message": m,
                            "lastHeartbeatTime": beat,
                            "lastTransitionTime": _stamp(attested),
                        }
                        for t, s, r, m in (
                            ("MemoryPressure", "False", "KubeletHasSufficientMemory", "sufficient memory"),
                            ("DiskPressure", "False", "KubeletHasNoDiskPressure", "no disk pressure"),
                            ("PIDPressure", "False", "KubeletHasSufficientPID", "sufficient PID"),
                            ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
                        )
                    ],
                    "addresses": [
                        {"type": "InternalIP", "address": f"10.200.{i // 256 % 256}.{i % 256}"},
                        {"type": "Hostname", "address": name},
                    ],
                    "capacity": {"cpu": "96", "memory": "1056457164Ki", "nvidia.com/gpu": "8", "pods": "110"},
                    "allocatable": {
                        "cpu": "95",
                        "memory": "1045971404Ki",
                        "nvidia.com/gpu": "8",
                        "pods": "110",
                    },
                    "nodeInfo": {
                        "kubeletVersion": "v1.31.4",
                        "containerRuntimeVersion": "containerd://1.7.24",
                        "kernelVersion": "6.8.0-51-generic",
                        "osImage": "Ubuntu 24.04.1 LTS",
                        "architecture": "amd64",
                        "operatingSystem": "linux",
                        "machineID": hashlib.md5(name.encode(), usedforsecurity=False).hexdigest(),
                        "bootID": _boot_id(name),
                    },
                },
            }
        )
        attestations.append(
            {
                "apiVersion": "nodegate.io/v1alpha1",
                "kind": "NodeAttestation",
                "metadata": {"name": name, "uid": _uid(f"att.{name}")},
                "spec": {
                    "ekSha256": hashlib.sha256(name.encode()).hexdigest(),
                    "spiffeId": f"spiffe://bench.nodegate.test/node/{name}",
                    "revoked": False,
                },
                "status": {
                    "attestedAt": _stamp(attested),
                    "expiresAt": _stamp(now + timedelta(days=30)),
                    "bootID": _boot_id(name),
                    "resetCount": 1,
                },
            }
        )
    return Cluster(nodes, attestations, crs, pending)


# ------------------------------------------------------------------------------------------
# The double (runs in the child process)


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
        return _cpu_seconds(self.proc.pid)

    def rss_kib(self) -> int | None:
        return _rss_kib(self.proc.pid)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._ask("stop")
        self.proc.join(timeout=30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


def _cpu_seconds(pid: int | None) -> float | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # fields 3.. of proc(5); utime, stime: 14, 15
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _busy_seconds() -> float | None:
    """CPU time the whole machine has spent busy (all CPUs, every process), from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    # Interrupt time is left out: loopback traffic of the gate and the double lands there.
    user, nice, system, _idle, _iowait, _irq, _softirq, steal = (int(x) for x in fields[1:9])
    return (user + nice + system + steal) / os.sysconf("SC_CLK_TCK")


class Others:
    """CPU time that neither the gate's process nor the double's spent, over a span: other work on
    the machine, which slows both (the tick counts are coarse: tenths of a second)."""

    def __init__(self, double: Double, load: gate_load.Load | None = None) -> None:
        self._double = double
        self._load = load
        self._start = self._mine_and_all()

    def _mine_and_all(self) -> tuple[float | None, float | None]:
        busy = _busy_seconds()
        me, child = _cpu_seconds(os.getpid()), self._double.cpu_seconds()
        load = self._load.cpu_seconds() if self._load is not None else 0.0
        if me is None or child is None or load is None:
            return None, busy
        return me + child + load, busy

    def seconds(self) -> float | None:
        mine, busy = self._mine_and_all()
        mine0, busy0 = self._start
        if mine is None or busy is None or mine0 is None or busy0 is None:
            return None
        return round(max(0.0, (busy - busy0) - (mine - mine0)), 2)


def _status_kib(pid: int | str | None, key: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _rss_kib(pid: int | str | None = "self") -> int | None:
    return _status_kib(pid, "VmRSS")


def _hwm_kib(pid: int | str | None = "self") -> int | None:
    return _status_kib(pid, "VmHWM")


# ------------------------------------------------------------------------------------------
# The gate's side


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
    async def watch_nodes(self, resource_version: str) -> AsyncIterator[WatchEvent[dict[str, Any]]]:
        async for event in watch_events(
            "nodes", self._core.list_node, resource_version=resource_version, decoder=gate_phases.GATE_PLAIN
        ):
            yield event

    async def watch_cluster_objects(
        self, group: str, version: str, plural: str, resource_version: str
    ) -> AsyncIterator[WatchEvent[dict[str, Any]]]:
        async for event in self.watch_cluster_objects_as(
            group, version, plural, resource_version, gate_phases.GATE_PLAIN
        ):
            yield event


def _api(url: str, agent: str) -> kc.ApiClient:
    api = kc.ApiClient(configuration=kc.Configuration(host=url.rstrip("/")))
    api.user_agent = agent
    return api


def make_gate(kube: Kube, identity: str = "bench-gate") -> Gate:
    gate = Gate(kube, SETTINGS, events_namespace="nodegate", now=lambda: datetime.now(UTC), identity=identity)
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


@dataclass
class Pass:
    wall_s: float
    gate_cpu_s: float
    double_cpu_s: float | None
    calls: dict[str, int]
    report: GateReport
    others_cpu_s: float | None

    def summary(self, n: int) -> dict[str, Any]:
        total = sum(self.calls.values())
        writes = sum(
            v for k, v in self.calls.items() if k.split()[0] in ("create", "patch", "update", "delete")
        )
        return {
            "wall_s": round(self.wall_s, 3),
            "ms_per_node": self.wall_s * 1000 / n,
            "gate_cpu_s": round(self.gate_cpu_s, 3),
            "gate_cpu_ms_per_node": self.gate_cpu_s * 1000 / n,
            "double_cpu_s": self.double_cpu_s,
            "calls": self.calls,
            "calls_total": total,
            "calls_per_node": total / n,
            "writes": writes,
            "gate_writes": self.report.writes,
            "released": self.report.released,
            "held": dict(self.report.held),
            "errors": self.report.errors[:5],
            "others_cpu_s": self.others_cpu_s,
        }


async def timed_pass(gate: Gate, double: Double) -> Pass:
    double.calls()  # reset the count
    others = Others(double)
    cpu, dcpu, started = time.process_time(), double.cpu_seconds(), time.perf_counter()
    report = await gate.reconcile_all()
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu
    after = double.cpu_seconds()
    calls = double.calls()["gate"]
    spent = None if dcpu is None or after is None else after - dcpu
    return Pass(wall, cpu, spent, calls, report, others.seconds())


@dataclass
class SizeResult:
    nodes: int
    pending: int
    first: Pass
    steady: list[Pass]
    rss_before_kib: int | None
    rss_after_kib: int | None  # the gate still alive
    hwm_kib: int | None
    cr_bytes: list[int] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)


async def measure_size(double: Double, n: int, rounds: int) -> tuple[SizeResult, list[Pending]]:
    pending, cr_bytes = double.populate(n)
    gc.collect()
    rss_before = _rss_kib()
    kube = TrackedKube(_api(double.url, GATE_AGENT), TIMEOUT)
    try:
        gate = make_gate(kube)
        first = await timed_pass(gate, double)
        steady = [await timed_pass(gate, double) for _ in range(rounds)]
        gc.collect()
        rss_after = _rss_kib()
    finally:
        await kube.close()
    result = SizeResult(n, len(pending), first, steady, rss_before, rss_after, _hwm_kib(), cr_bytes)
    want = {"nodes": n, "released": n - len(pending), "held": {"packages-pending": len(pending)}}
    got = {"nodes": first.report.nodes, "released": first.report.released, "held": first.report.held}
    if got != want or first.report.errors:
        result.checks.append(
            f"{n} nodes, first pass: {got} (wanted {want}); errors {first.report.errors[:3]}"
        )
    for i, p in enumerate(steady):
        writes = {k: v for k, v in p.calls.items() if not k.startswith(("get ", "list "))}
        if p.report.writes or writes or p.report.errors or p.report.released != n - len(pending):
            result.checks.append(
                f"{n} nodes, steady pass {i + 1}: writes {p.report.writes} {writes}, "
                f"released {p.report.released}, errors {p.report.errors[:3]}"
            )
    return result, pending


async def measure_memory(double: Double) -> dict[str, Any]:
    """The caches of a fresh gate after one load(), at the double's current cluster."""
    kube = TrackedKube(_api(double.url, GATE_AGENT), TIMEOUT)
    gate: Gate | None = None
    try:
        gc.collect()
        tracemalloc.start(TRACE_FRAMES)
        try:
            base = tracemalloc.take_snapshot()
            base_current, _ = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            gate = make_gate(kube)
            errors = await gate.load()
            gc.collect()
            current, peak = tracemalloc.get_traced_memory()
            snap = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
        # bootstrap/emulator.py is the double's code: it runs in the other process, but say so.
        ours = [
            tracemalloc.Filter(True, f"{BOOTSTRAP}{os.sep}*", all_frames=True),
            tracemalloc.Filter(False, f"{BOOTSTRAP}{os.sep}emulator.py", all_frames=True),
        ]
        diff = snap.filter_traces(ours).compare_to(base.filter_traces(ours), "filename")
        gate_bytes = sum(d.size_diff for d in diff)
        nodes = len(gate._sources["nodes"].objects or {})
    finally:
        await kube.close()
    return {
        "nodes": nodes,
        "load_errors": errors,
        "gate_retained_bytes": gate_bytes,
        "retained_bytes": current - base_current,
        "peak_bytes": peak - base_current,
        "gate_bytes_per_node": gate_bytes / max(nodes, 1),
        "trace_frames": TRACE_FRAMES,
    }


# ------------------------------------------------------------------------------------------
# Reaction


Want = Callable[[str | None], bool]  # on the hold taint's value (None: no hold taint)


def released(hold: str | None) -> bool:
    return hold is None


def held_unattested(hold: str | None) -> bool:
    return hold == "unattested"


class NodeWatch:
    """One watch on every node (the agent's view): resolves a future when the armed node shows up
    with its hold taint as wanted."""

    def __init__(self, kube: Kube, nodes: int) -> None:
        self._kube = kube
        self._armed: dict[str, tuple[Want, asyncio.Future[int]]] = {}
        self._nodes = nodes
        self.events = 0
        self.replayed = asyncio.Event()  # kmock starts a watch with every stored object as ADDED
        self.task = asyncio.create_task(self._run(), name="bench-node-watch")

    def arm(self, node: str, want: Want = released) -> asyncio.Future[int]:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._armed[node] = (want, future)
        return future

    async def _run(self) -> None:
        while True:
            async for event in self._kube.watch_nodes(""):
                self.events += 1
                if self.events >= self._nodes:
                    self.replayed.set()
                obj = event.object
                armed = self._armed.get((obj.get("metadata") or {}).get("name", ""))
                if armed is None or armed[1].done():
                    continue
                taints = (obj.get("spec") or {}).get("taints") or []
                hold = next(
                    (t.get("value") for t in taints if isinstance(t, dict) and t.get("key") == KEY), None
                )
                if armed[0](hold):
                    armed[1].set_result(time.perf_counter_ns())

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


def _idle(gate: Gate, kube: TrackedKube) -> bool:
    # Private peek (bench only): nothing queued and no call in flight means the worker waits.
    return kube.inflight == 0 and gate._queue.idle()


async def _until(check: Callable[[], bool], kube: TrackedKube, what: str, limit: float = WAIT) -> None:
    """Wait (woken by every completed API call of the gate, no polling) until ``check()``."""
    try:
        async with asyncio.timeout(limit):
            while not check():
                kube.done.clear()
                await kube.done.wait()
    except TimeoutError:
        raise RuntimeError(f"the gate never {what} within {limit:.0f} s") from None


async def _settle(gate: Gate, kube: TrackedKube, agent: Any, probe: str, writes: int) -> None:
    """Until the gate has written ``writes`` in all and is idle; a round trip to the double lets a
    watch event that was already sent reach the gate, after which it must still be idle."""
    await _until(lambda: gate.writes >= writes and _idle(gate, kube), kube, "went idle")
    while True:
        await agent.get_node(probe)
        if _idle(gate, kube):
            return
        await _until(lambda: _idle(gate, kube), kube, "went idle")


@dataclass
class ReactionResult:
    nodes: int
    samples_ns: list[int] = field(default_factory=list)
    from_ack_ns: list[int] = field(default_factory=list)
    baseline_ns: list[int] = field(default_factory=list)
    # The operator's same status write to the CR's unwatched copy: that request's bare round trip.
    status_baseline_ns: list[int] = field(default_factory=list)
    reactions: int = 0  # done, warm-up included
    # The reboot loop: a Node's boot id changes -> the hold taint; the fresh attestation -> release.
    reboot_ns: list[int] = field(default_factory=list)
    attest_ns: list[int] = field(default_factory=list)
    reboot_baseline_ns: list[int] = field(default_factory=list)
    reboots: int = 0
    reboot_seconds: float = 0.0
    reboot_calls: dict[str, int] = field(default_factory=dict)
    converge_s: float = 0.0
    converge_calls: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0  # the reactions' part
    others_cpu_s: float | None = None
    cpu_s: float = 0.0  # this process: the gate and its client (the load runs in its own process)
    reboot_cpu_s: float = 0.0
    calls: dict[str, int] = field(default_factory=dict)
    checks: list[str] = field(default_factory=list)
    phases: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)  # per part of the run
    burst: gate_burst.BurstResult | None = None
    burst_calls: dict[str, int] = field(default_factory=dict)
    relist: list[dict[str, Any]] = field(default_factory=list)
    load_cpu_s: float = 0.0  # the load's process in the reaction phase (the agent, operator, node watch)


async def _round_trip(agent: Any, i: int) -> int:
    """The baseline: a merge patch and a GET of a node-sized object that nobody watches, ns."""
    if isinstance(agent, gate_load.Load):
        return await agent.round_trip(i)  # measured in the load's process
    started = time.perf_counter_ns()
    patch = {"metadata": {"annotations": {"nodegate.bench/ping": str(i)}}}
    await agent.patch_cluster_object(*PING, patch)
    await agent.get_cluster_object(*PING)
    return time.perf_counter_ns() - started


async def _status_round_trip(agent: Any, name: str, status: dict[str, Any]) -> int:
    """The status write's own bare round trip: the same merge patch through /status, to the copy
    of the same CR (same size, same answer) that nobody watches, ns."""
    if isinstance(agent, gate_load.Load):
        ns: int = await agent.ask("status_round_trip", *CR_COPY, name, {"status": status})
        return ns
    started = time.perf_counter_ns()
    await agent.patch_cluster_object(*CR_COPY, name, {"status": status}, status=True)
    return time.perf_counter_ns() - started


async def _timed(watch: Any, node: str, want: Want, write: Coroutine[Any, Any, Any]) -> tuple[int, int]:
    """Send ``write`` and wait for the node's hold to become as wanted: (sent, seen) in ns. With
    the load in its own process, the send time is the child's, just before its request."""
    seen = watch.arm(node, want)
    sent = time.perf_counter_ns()
    await write
    if isinstance(watch, gate_load.Watch):
        sent = watch.load.last_sent_ns
    async with asyncio.timeout(WAIT):
        at = await seen
    return sent, at


async def _react(
    gate: Gate,
    kube: TrackedKube,
    agent: Any,
    watch: Any,
    todo: list[Pending],
    warmup: int,
    result: ReactionResult,
    others: Others,
) -> None:
    """Package complete -> released. As upstream writes it: the agent-side annotation on the Node
    first (the gate decides on it and stays held: the operator's report is not there yet), then,
    timed, the operator's status.nodeState[node] in the CR, a merge patch through /status (the
    watch event the gate gets is the whole CR)."""
    started, cpu = time.perf_counter(), time.process_time()
    for i, p in enumerate(todo):
        await agent.patch_node(p.node, {"metadata": {"annotations": {p.annotation: p.complete}}})
        await _settle(gate, kube, agent, p.node, gate.writes)
        writes = gate.writes
        status = {"nodeState": {p.node: json.loads(p.complete)}, "nodeStatus": {p.node: "complete"}}
        acked = 0

        async def operator(p: Pending = p, status: dict[str, Any] = status) -> None:
            nonlocal acked
            await agent.patch_cluster_object(*p.cr, {"status": status}, status=True)
            acked = time.perf_counter_ns()

        try:
            sent, at = await _timed(watch, p.node, released, operator())
        except TimeoutError:
            result.checks.append(f"{p.node}: the hold taint was not removed within {WAIT:.0f} s")
            return
        result.reactions += 1
        # The release writes the taint, an Event, the condition and the status.
        await _settle(gate, kube, agent, p.node, writes + 4)
        # The baseline between the reactions (the gate idle), so that drift hits both alike.
        trip = await _round_trip(agent, i)
        status_trip = await _status_round_trip(agent, p.cr[3], status)
        if i >= warmup:
            result.samples_ns.append(at - sent)
            result.from_ack_ns.append(at - acked)
            result.baseline_ns.append(trip)
            result.status_baseline_ns.append(status_trip)
    result.seconds, result.others_cpu_s = time.perf_counter() - started, others.seconds()
    result.cpu_s = time.process_time() - cpu


async def _reboots(
    gate: Gate,
    kube: TrackedKube,
    agent: Any,
    watch: Any,
    nodes: list[str],
    warmup: int,
    result: ReactionResult,
) -> None:
    """Released node -> its kubelet reports a new boot id (a Node status patch) -> held
    ``unattested``; then the join service records the attestation of that boot (NodeAttestation
    status bootID, resetCount, attestedAt) -> released. Each timed from the write's send to the
    node watch showing the hold as wanted; the gate idle before each write."""
    started, cpu = time.perf_counter(), time.process_time()
    for i, name in enumerate(nodes):
        new_boot = _boot_id(name, 1)
        writes = gate.writes
        reboot = agent.patch_node_status(name, {"status": {"nodeInfo": {"bootID": new_boot}}})
        try:
            sent, held = await _timed(watch, name, held_unattested, reboot)
        except TimeoutError:
            result.checks.append(f"{name}: not held within {WAIT:.0f} s of its new boot id")
            return
        await _settle(gate, kube, agent, name, writes + 4)  # taint, Event, condition, status
        writes = gate.writes
        fresh = {"bootID": new_boot, "resetCount": 2, "attestedAt": _stamp(datetime.now(UTC))}
        attested = agent.patch_cluster_object(*ATTESTATIONS, name, {"status": fresh}, status=True)
        try:
            sent2, free = await _timed(watch, name, released, attested)
        except TimeoutError:
            result.checks.append(f"{name}: not released within {WAIT:.0f} s of its fresh attestation")
            return
        result.reboots += 1
        await _settle(gate, kube, agent, name, writes + 4)
        trip = await _round_trip(agent, 10_000 + i)
        if i >= warmup:
            result.reboot_ns.append(held - sent)
            result.attest_ns.append(free - sent2)
            result.reboot_baseline_ns.append(trip)
    result.reboot_seconds = time.perf_counter() - started
    result.reboot_cpu_s = time.process_time() - cpu


async def _relists(
    gate: Gate, kube: TrackedKube, agent: Any, probe: str, double: Double
) -> list[dict[str, Any]]:
    """What a 410 Gone costs: each source listed again as Cache.inform does after one (the caches
    replaced, every node queued and decided again on its watched copy), until the gate is idle.
    Nothing is to be written: the cluster did not change."""
    out = []
    for key, src in gate._cache.sources.items():
        writes = gate.writes
        double.calls()
        cpu, started = time.process_time(), time.perf_counter()
        await gate._cache.relist(src)
        listed = time.perf_counter() - started
        await _settle(gate, kube, agent, probe, writes)
        out.append(
            {
                "source": key,
                "objects": len(src.objects or {}),
                "list_s": listed,
                "idle_s": time.perf_counter() - started,
                "cpu_s": time.process_time() - cpu,
                "writes": gate.writes - writes,
                "calls": double.calls()["gate"],
            }
        )
    return out


async def measure_reaction(double: Double, n: int, pending: list[Pending], samples: int) -> ReactionResult:
    warmup = min(WARMUP_REACTIONS, max(1, samples // 5))
    todo = pending[: warmup + samples]
    result = ReactionResult(n)
    if len(todo) < warmup + samples:
        result.checks.append(f"only {len(todo)} pending nodes for {warmup + samples} reactions")
    # The agent, the operator and the node watch in their own process (on the double's CPU), so
    # that this process's CPU is the gate's.
    agent = gate_load.Load(double.url, n, double.cpus, BENCH_AGENT, TIMEOUT)
    agent.start()
    kube = TrackedKube(_api(double.url, GATE_AGENT), TIMEOUT)
    watch = agent.watch
    probe = todo[0].node if todo else "gpu-00000"
    try:
        try:
            async with asyncio.timeout(WAIT):
                await watch.wait_replayed()  # before anything is timed: ~50 MB of JSON at 10,000 nodes
        except TimeoutError:
            result.checks.append(f"the agent's watch did not list {n} nodes within {WAIT:.0f} s")
            return result
        gate = make_gate(kube)
        phases = gate_phases.Phases()
        undo = phases.install(gate, (crindex.DECODER,))
        started = time.perf_counter()
        task = asyncio.create_task(gate.run(), name="bench-gate")
        try:

            def decided() -> bool:
                # Every node decided (the gate records each decision's completeSince, also for
                # nodes decided on the watched copy without a GET) and nothing in flight.
                return len(gate._complete_since) >= n and _idle(gate, kube)

            await _until(decided, kube, "decided every node", WAIT + n * WAIT_PER_NODE)
            await _settle(gate, kube, agent, probe, gate.writes)
            result.converge_s = time.perf_counter() - started
            result.converge_calls = double.calls()["gate"]
            phases.take()
            load_cpu = agent.cpu_seconds() or 0.0
            await _react(gate, kube, agent, watch, todo, warmup, result, Others(double, agent))
            result.load_cpu_s = (agent.cpu_seconds() or 0.0) - load_cpu
            result.calls = double.calls()["gate"]
            result.phases["reaction"] = phases.take()
            stuck = {p.node for p in pending}
            rebooting = [f"gpu-{i:05d}" for i in range(n) if f"gpu-{i:05d}" not in stuck][: warmup + samples]
            await _reboots(gate, kube, agent, watch, rebooting, warmup, result)
            result.reboot_calls = double.calls()["gate"]
            result.phases["reboot"] = phases.take()
            burst = pending[warmup + samples :][: gate_burst.BURST_NODES]
            crs = {c.name: c for c in gate._cache.package_crs()}
            result.burst = await gate_burst.run(gate, agent, watch, gate_burst.walkers(burst, crs))
            await _settle(gate, kube, agent, probe, gate.writes)
            result.burst_calls = double.calls()["gate"]
            result.phases["burst"] = phases.take()
            result.relist = await _relists(gate, kube, agent, probe, double)
            result.phases["relist"] = phases.take()
            if task.done():
                result.checks.append(f"Gate.run() ended: {task.exception()!r}")
        except RuntimeError as exc:  # the gate never converged or never went idle
            result.checks.append(str(exc))
        finally:
            undo()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    finally:
        await watch.close()
        await agent.close()
        await kube.close()
    return result


# ------------------------------------------------------------------------------------------
# Results


def _ms(values: Sequence[int]) -> dict[str, float | None]:
    if not values:
        return {"median_ms": None, "p99_ms": None, "max_ms": None}
    return {
        "median_ms": statistics.median(values) / 1e6,
        "p99_ms": common.percentile(values, 0.99) / 1e6,
        "max_ms": max(values) / 1e6,
    }


def _median_pass(passes: list[Pass], n: int) -> dict[str, Any]:
    summaries = [p.summary(n) for p in passes]
    order = sorted(range(len(passes)), key=lambda i: passes[i].wall_s)
    out = dict(summaries[order[len(order) // 2]])  # the median pass, whole (calls included)
    out["ms_per_node_rounds"] = [round(s["ms_per_node"], 4) for s in summaries]
    out["ms_per_node"] = statistics.median(s["ms_per_node"] for s in summaries)
    out["gate_cpu_ms_per_node"] = statistics.median(s["gate_cpu_ms_per_node"] for s in summaries)
    return out


def summarise(
    sizes: list[SizeResult], memory: dict[str, Any], reaction: ReactionResult, config: dict[str, Any]
) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for s in sizes:
        rows.append(
            {
                "nodes": s.nodes,
                "pending": s.pending,
                "first": s.first.summary(s.nodes),
                "steady": _median_pass(s.steady, s.nodes),
                "rss_before_kib": s.rss_before_kib,
                "rss_after_kib": s.rss_after_kib,
                "hwm_kib": s.hwm_kib,
                "cr_bytes_total": sum(s.cr_bytes),
                "cr_bytes_max": max(s.cr_bytes, default=0),
            }
        )
    small, large = rows[0], rows[-1]
    scaling = {
        "from_nodes": small["nodes"],
        "to_nodes": large["nodes"],
        "first": large["first"]["ms_per_node"] / small["first"]["ms_per_node"],
        "steady": large["steady"]["ms_per_node"] / small["steady"]["ms_per_node"],
        "first_gate_cpu": large["first"]["gate_cpu_ms_per_node"] / small["first"]["gate_cpu_ms_per_node"],
        "steady_gate_cpu": large["steady"]["gate_cpu_ms_per_node"] / small["steady"]["gate_cpu_ms_per_node"],
    }
    base = _ms(reaction.baseline_ns)
    react = _ms(reaction.samples_ns)
    status_base = _ms(reaction.status_baseline_ns)
    counted = max(reaction.reactions, 1)
    reaction_out: dict[str, Any] = {
        "nodes": reaction.nodes,
        "samples": len(reaction.samples_ns),
        "warmup": reaction.reactions - len(reaction.samples_ns),
        **react,
        "from_ack": _ms(reaction.from_ack_ns),
        "from_ack_vs_roundtrip_median": None
        if not reaction.from_ack_ns or not base["median_ms"]
        else statistics.median(reaction.from_ack_ns) / 1e6 / base["median_ms"],
        "baseline": base,
        "status_baseline": status_base,
        "vs_status_write_median": None
        if react["median_ms"] is None or not status_base["median_ms"]
        else react["median_ms"] / status_base["median_ms"],
        "vs_status_write_p99": None
        if react["p99_ms"] is None or not status_base["median_ms"]
        else react["p99_ms"] / status_base["median_ms"],
        "vs_roundtrip_median": None
        if react["median_ms"] is None or not base["median_ms"]
        else react["median_ms"] / base["median_ms"],
        "vs_roundtrip_p99": None
        if react["p99_ms"] is None or not base["median_ms"]
        else react["p99_ms"] / base["median_ms"],
        "converge_s": round(reaction.converge_s, 2),
        "converge_calls": reaction.converge_calls,
        "seconds": round(reaction.seconds, 2),
        "others_cpu_s": reaction.others_cpu_s,
        # this process's CPU per reaction (the gate alone), both writes of it (annotation, CR status)
        "cpu_ms_per_reaction": reaction.cpu_s * 1000 / counted,
        "load_cpu_ms_per_reaction": reaction.load_cpu_s * 1000 / counted,
        "calls": reaction.calls,
        "calls_per_reaction": sum(reaction.calls.values()) / counted,
    }
    reboot_base = _ms(reaction.reboot_baseline_ns)

    def vs(values: dict[str, float | None], key: str) -> float | None:
        value, trip = values[key], reboot_base["median_ms"]
        return None if value is None or not trip else value / trip

    to_hold, to_release = _ms(reaction.reboot_ns), _ms(reaction.attest_ns)
    reboot_out = {
        "nodes": reaction.nodes,
        "samples": len(reaction.reboot_ns),
        "warmup": reaction.reboots - len(reaction.reboot_ns),
        "boot_to_hold": {**to_hold, "vs_roundtrip_median": vs(to_hold, "median_ms"),
                         "vs_roundtrip_p99": vs(to_hold, "p99_ms")},
        "attestation_to_release": {**to_release, "vs_roundtrip_median": vs(to_release, "median_ms"),
                                   "vs_roundtrip_p99": vs(to_release, "p99_ms")},
        "baseline": reboot_base,
        "seconds": round(reaction.reboot_seconds, 2),
        "calls": reaction.reboot_calls,
        "calls_per_reboot": sum(reaction.reboot_calls.values()) / max(reaction.reboots, 1),
        "cpu_ms_per_reboot": reaction.reboot_cpu_s * 1000 / max(reaction.reboots, 1),
    }  # fmt: skip
    errors = [c for s in sizes for c in s.checks] + reaction.checks
    if memory.get("load_errors"):
        errors.append(f"memory load: {memory['load_errors']}")
    targets = [
        {
            "metric": f"{name} pass ms/node at {large['nodes']:,} vs {small['nodes']:,}",
            "value": scaling[name],
            "op": "<=",
            "threshold": TARGET_SCALING,
            "met": scaling[name] <= TARGET_SCALING,
        }
        for name in ("first", "steady")
    ]
    event = config.get("event") or {}
    burst = reaction.burst
    burst_out: dict[str, Any] = {}
    if burst is not None:
        lag = _ms(burst.lag_ns)
        released = max(burst.released, 1)
        writes = sum(
            v
            for k, v in reaction.burst_calls.items()
            if k.split()[0] in ("create", "patch", "update", "delete")
        )
        burst_out = {
            "nodes": burst.nodes,
            "released": burst.released,
            "seconds": round(burst.seconds, 2),
            "ticks": burst.ticks,
            "operator_writes": burst.operator_writes,
            "lag": lag,
            "gate_calls": reaction.burst_calls,
            "gate_writes_per_release": writes / released,
            "cpu_ms_per_node": burst.cpu_s * 1000 / max(burst.nodes, 1),
        }
        errors += burst.checks

    def target(metric: str, value: float | None, op: str, threshold: float, unit: str) -> dict[str, Any]:
        met = value is not None and (value <= threshold if op == "<=" else value >= threshold)
        return {"metric": metric, "value": value, "op": op, "threshold": threshold, "unit": unit, "met": met}

    if event:
        targets.append(target("CPU per MiB of package CR watch event, decode included",
                              event.get("ms_per_mib"),
                              "<=", gate_event.TARGET_MS_PER_MIB, " ms"))  # fmt: skip
    targets.append(target(f"package completion -> release at {reaction.nodes:,}, median vs round trip",
                          reaction_out["vs_roundtrip_median"], "<=", 5.0, "x"))  # fmt: skip
    targets.append(target(f"package completion -> release at {reaction.nodes:,}, p99 vs round-trip median",
                          reaction_out["vs_roundtrip_p99"], "<=", 15.0, "x"))  # fmt: skip
    targets.append(target(f"package completion -> release at {reaction.nodes:,}, median vs the status "
                          "write's own round trip", reaction_out["vs_status_write_median"],
                          "<=", 5.0, "x"))  # fmt: skip
    targets.append(target(f"package completion -> release at {reaction.nodes:,}, p99 vs the status "
                          "write's own round-trip median", reaction_out["vs_status_write_p99"],
                          "<=", 15.0, "x"))  # fmt: skip
    if burst_out:
        targets.append(target(f"burst of {burst_out['nodes']:,} nodes: released",
                              float(burst_out["released"]),
                              ">=", float(burst_out["nodes"]), ""))  # fmt: skip
        targets.append(
            target("burst: seconds for all to walk and be released", burst_out["seconds"], "<=", 60.0, " s")
        )
        targets.append(target("burst: lag (last status write -> release) p99", burst_out["lag"]["p99_ms"],
                              "<=", 1000.0, " ms"))  # fmt: skip
    return {
        "benchmark": "gate",
        "event": event,
        "burst": burst_out,
        "relist": reaction.relist,
        "phases": reaction.phases,
        "environment": _environment(config),
        "config": config,
        "resync": rows,
        "scaling": scaling,
        "memory": memory,
        "reaction": reaction_out,
        "reboot": reboot_out,
        "targets": targets,
        "errors": errors,
    }


def _environment(config: dict[str, Any]) -> dict[str, Any]:
    versions = common.versions(("aiohttp", "kubernetes_asyncio", "kmock", "nodegate"))
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "double_cpus": config["double_cpus"],
        "gate_cpus": config["gate_cpus"],
        "versions": versions,
    }


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value / (1 << 20):.1f} MiB"


def _kib(value: float | None) -> str:
    return _mib(None if value is None else value * 1024)


def _calls(calls: dict[str, int]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in sorted(calls.items(), key=lambda kv: -kv[1]))


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _timing(label: str, t: dict[str, Any]) -> str:
    return (
        f"  {label} median {_num(t['median_ms'], '.2f')} ms  p99 {_num(t['p99_ms'], '.2f')} ms  "
        f"max {_num(t['max_ms'], '.2f')} ms  ({_num(t['vs_roundtrip_median'], '.2f')}x / "
        f"{_num(t['vs_roundtrip_p99'], '.2f')}x the round trip median)"
    )


def render(results: dict[str, Any]) -> str:
    env, config = results["environment"], results["config"]
    lines = [
        "gate benchmark: bootstrap/gate.py against kmock (tests/support/kshim.py) in a child process",
        f"  Python {env['python']} ({env['implementation']}, {env['machine']}), {env['cpus']} CPUs; "
        f"double on CPU {env['double_cpus']}, gate on {env['gate_cpus']}",
        "  " + ", ".join(f"{k} {v}" for k, v in env["versions"].items()),
        f"  {config['crs']} package CRs, {config['pending_share']:.0%} of nodes pending, stability window 0; "
        f"{config['rounds']} steady pass(es) per size; run {config['seconds']} s, load average "
        f"{config['loadavg_before']} -> {config['loadavg_after']}",
    ]
    if config["profile_dir"]:
        lines.append(
            f"  PROFILING ON (cProfile in both processes, stats in {config['profile_dir']}): slowed numbers"
        )
    lines += [
        "",
        "resync (reconcile_all; first = writes everything once, steady = writes nothing)",
        f"  {'nodes':>6} {'pass':<6} {'wall s':>7} {'ms/node':>8} {'gate CPU':>9} {'double':>7} "
        f"{'others':>7} {'calls':>7} {'/node':>6} {'writes':>7}",
    ]
    for row in results["resync"]:
        for label in ("first", "steady"):
            p = row[label]
            lines.append(
                f"  {row['nodes']:>6,} {label:<6} {p['wall_s']:>7.2f} {p['ms_per_node']:>8.3f} "
                f"{p['gate_cpu_ms_per_node']:>7.3f}ms {_num(p['double_cpu_s'], '.1f'):>6}s "
                f"{_num(p['others_cpu_s'], '.1f'):>6}s {p['calls_total']:>7,} {p['calls_per_node']:>6.2f} "
                f"{p['writes']:>7,}"
            )
    large = results["resync"][-1]
    lines.append(
        f"  package CRs at {large['nodes']:,} nodes: {_mib(large['cr_bytes_total'])} of JSON in all, the "
        f"largest {_mib(large['cr_bytes_max'])} (mostly status.nodeState; etcd's request limit: 1.5 MiB)"
    )
    lines.append(f"  calls at {large['nodes']:,}, first: {_calls(large['first']['calls'])}")
    lines.append(f"  calls at {large['nodes']:,}, steady: {_calls(large['steady']['calls'])}")
    sc = results["scaling"]
    lines.append(
        f"  scaling {sc['from_nodes']:,} -> {sc['to_nodes']:,} nodes (ms/node ratio, 1.0 = linear): "
        f"first {sc['first']:.2f}x, steady {sc['steady']:.2f}x; gate CPU/node: first "
        f"{sc['first_gate_cpu']:.2f}x, steady {sc['steady_gate_cpu']:.2f}x"
    )
    mem = results["memory"]
    lines += [
        "",
        f"memory at {mem['nodes']:,} nodes (a fresh gate's load(), tracemalloc)",
        f"  still allocated from bootstrap/ frames (the gate's caches): {_mib(mem['gate_retained_bytes'])} "
        f"({mem['gate_bytes_per_node']:,.0f} B/node); all still allocated {_mib(mem['retained_bytes'])}; "
        f"traced peak {_mib(mem['peak_bytes'])}",
        f"  this process (gate, client, benchmark): RSS {_kib(large['rss_before_kib'])} before the "
        f"{large['nodes']:,}-node gate, {_kib(large['rss_after_kib'])} after its passes (gate alive), "
        f"peak {_kib(large['hwm_kib'])}",
    ]
    r = results["reaction"]
    lines += [
        "",
        f"reaction at {r['nodes']:,} nodes (Gate.run(): package complete -> hold taint gone, "
        f"{r['samples']} samples in {r['seconds']} s, others used {_num(r['others_cpu_s'], '.1f')} s CPU)",
        f"  run() start-up: every node decided and the gate idle after {r['converge_s']} s "
        f"({r['converge_calls'].get('get nodes', 0):,} node GETs: {_calls(r['converge_calls'])})",
        f"  reaction      median {_num(r['median_ms'], '.2f')} ms  p99 {_num(r['p99_ms'], '.2f')} ms  "
        f"max {_num(r['max_ms'], '.2f')} ms  (from the patch's answer: median "
        f"{_num(r['from_ack']['median_ms'], '.2f')} ms, p99 {_num(r['from_ack']['p99_ms'], '.2f')} ms)",
        f"  baseline      median {_num(r['baseline']['median_ms'], '.2f')} ms  p99 "
        f"{_num(r['baseline']['p99_ms'], '.2f')} ms  (the agent's patch + GET of a node-sized object)",
        f"  status write  median {_num(r['status_baseline']['median_ms'], '.2f')} ms  p99 "
        f"{_num(r['status_baseline']['p99_ms'], '.2f')} ms  (the operator's same merge patch through /status "
        f"to an unwatched copy of the same CR: that request's bare round trip); reaction / it: median "
        f"{_num(r['vs_status_write_median'], '.2f')}x, p99 {_num(r['vs_status_write_p99'], '.2f')}x",
        f"  reaction / round trip: median {_num(r['vs_roundtrip_median'], '.2f')}x, p99 "
        f"{_num(r['vs_roundtrip_p99'], '.2f')}x the baseline median; from the status write's answer "
        f"(the API's work before its answer left out) median "
        f"{_num(r['from_ack_vs_roundtrip_median'], '.2f')}x",
        f"  the gate's calls: {r['calls_per_reaction']:.2f} per reaction ({_calls(r['calls'])}); this "
        f"process's CPU (the gate's alone) {r['cpu_ms_per_reaction']:.1f} ms per reaction (two events, one a "
        f"whole CR); the load's process {r['load_cpu_ms_per_reaction']:.1f} ms",
    ]
    b = results["reboot"]
    hold, free = b["boot_to_hold"], b["attestation_to_release"]
    lines += [
        "",
        f"reboot at {b['nodes']:,} nodes (Gate.run(): a released node's boot id changes -> held unattested; "
        f"the attestation of the new boot -> released; {b['samples']} samples in {b['seconds']} s)",
        _timing("boot id -> hold    ", hold),
        _timing("attested -> release", free),
        f"  baseline            median {_num(b['baseline']['median_ms'], '.2f')} ms  p99 "
        f"{_num(b['baseline']['p99_ms'], '.2f')} ms  (the agent's patch + GET of a node-sized object)",
        f"  the gate's calls: {b['calls_per_reboot']:.2f} per reboot and attestation ({_calls(b['calls'])}); "
        f"this process's CPU {b['cpu_ms_per_reboot']:.1f} ms per reboot and attestation",
    ]
    if results["errors"]:
        lines += ["", "ERRORS (the numbers of this run are suspect)"]
        lines += [f"  {e}" for e in results["errors"]]
    lines += _render_new(results)
    lines += ["", "targets (reported, not asserted)"]
    for t in results["targets"]:
        verdict = "PASS" if t["met"] else "MISS"
        unit = t.get("unit", "x")
        lines.append(
            f"  {verdict}  {t['metric']}: {_num(t['value'], '.2f')}{unit} {t['op']} "
            f"{t['threshold']:.2f}{unit}"
        )
    return "\n".join(lines)


def _render_new(results: dict[str, Any]) -> list[str]:
    """The event cost, the per-phase split, the burst and the re-lists."""
    lines: list[str] = []
    if results.get("event"):
        lines += ["", *gate_event.render(results["event"])]
    phases = results.get("phases") or {}
    r, b = results["reaction"], results["reboot"]
    per = {"reaction": r["samples"] + r["warmup"], "reboot": b["samples"] + b["warmup"]}
    burst = results.get("burst") or {}
    if burst:
        per["burst"] = burst["nodes"]
    if phases:
        lines += ["", "where the gate's time goes (gate_phases: its own steps, no profiler)"]
        for label, what in (
            ("reaction", "reaction"),
            ("reboot", "reboot and attestation"),
            ("burst", "node walked"),
        ):
            if label in phases and label in per:
                lines.append(gate_phases.render(label, phases[label], per[label], what))
    if burst:
        lag = burst["lag"]
        lines += [
            "",
            f"burst: {burst['nodes']:,} held nodes walk apply, config (, interrupt, post-interrupt), each "
            f"in_progress then complete, in waves; {burst['operator_writes']:,} operator writes in "
            f"{burst['ticks']} ticks",
            f"  {burst['released']:,} released in {burst['seconds']} s; lag (last status write -> release) "
            f"median {_num(lag['median_ms'], '.1f')} ms, p99 {_num(lag['p99_ms'], '.1f')} ms, "
            f"max {_num(lag['max_ms'], '.1f')} ms",
            f"  the gate's writes per release {burst['gate_writes_per_release']:.2f} (a held node's status "
            f"follows each step); its calls: {_calls(burst['gate_calls'])}; this process's CPU "
            f"{burst['cpu_ms_per_node']:.1f} ms per node (the operator's writes included)",
        ]
    for row in results.get("relist") or []:
        if not lines or not lines[-1].startswith("  relist"):
            lines += ["", "re-list after 410 Gone (Cache.relist, then every node decided again until idle)"]
        lines.append(
            f"  relist {row['source']:<22} {row['objects']:>6,} objects: listed in {row['list_s']:.2f} s, "
            f"idle after {row['idle_s']:.2f} s, this process's CPU {row['cpu_s']:.2f} s, "
            f"writes {row['writes']}"
        )
    return lines


# ------------------------------------------------------------------------------------------
# Entry point


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.bench", description=(__doc__ or "").split("\n")[0])
    p.add_argument("--json", action="store_true", help="print the results as one JSON object on one line")
    p.add_argument(
        "--rounds",
        type=common.positive,
        default=ROUNDS,
        help=f"steady-state passes per size (default {ROUNDS})",
    )
    p.add_argument("--quick", action="store_true", help="a smoke run: 1,000 and 2,000 nodes, 50 reactions")
    p.add_argument(
        "--nodes",
        type=common.positive,
        action="append",
        help="cluster sizes to run instead of the default ones (repeatable; the last is the reaction's)",
    )
    return p


async def _measure(
    double: Double, sizes: Sequence[int], rounds: int, samples: int
) -> tuple[list[SizeResult], dict[str, Any], ReactionResult]:
    results: list[SizeResult] = []
    pending: list[Pending] = []
    await measure_size(double, WARMUP_NODES, 1)  # not reported
    for n in sizes:
        result, pending = await measure_size(double, n, rounds)
        results.append(result)
    # The largest cluster is converged now (pending nodes held, the rest released): react on it.
    reaction = await measure_reaction(double, sizes[-1], pending, samples)
    # Last: tracemalloc's snapshots leave this process's RSS high for what would come after.
    memory = await measure_memory(double)
    return results, memory, reaction


def run(rounds: int = ROUNDS, quick: bool = False, nodes: Sequence[int] | None = None) -> dict[str, Any]:
    if rounds < 1:
        raise ValueError("rounds must be at least 1")
    sizes = tuple(nodes) if nodes else QUICK_SIZES if quick else SIZES
    # First, alone in this process: the CPU of one package-CR event at the largest size.
    event = gate_event.measure(
        build_cluster(sizes[-1], datetime.now(UTC)),
        SETTINGS,
        gate_event.QUICK_EVENT_SAMPLES if quick else gate_event.EVENT_SAMPLES,
    )
    gc.collect()
    rounds = min(rounds, QUICK_ROUNDS) if quick else rounds
    samples = QUICK_REACTIONS if quick else REACTIONS
    double_cpus, gate_cpus = common.split_cpus()  # the double gets the first CPU
    profile_env = os.environ.get(PROFILE_ENV)
    profile_dir = Path(profile_env).resolve() if profile_env else None
    if profile_dir is not None:
        profile_dir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    started = time.perf_counter()
    double = Double(double_cpus, profile_dir / "gate-double.prof" if profile_dir else None)
    before = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    profiler = cProfile.Profile() if profile_dir else None
    try:
        if gate_cpus and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, gate_cpus)
        coro: Coroutine[Any, Any, tuple[list[SizeResult], dict[str, Any], ReactionResult]]
        coro = _measure(double, sizes, rounds, samples)
        if profiler is None:
            sized, memory, reaction = asyncio.run(coro)
        else:
            sized, memory, reaction = profiler.runcall(asyncio.run, coro)
    finally:
        if before and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, before)
        double.stop()
    if profiler is not None and profile_dir is not None:
        path = profile_dir / "gate.prof"
        profiler.dump_stats(path)
        print(f"\ngate process profile ({path}; the double's: {double.profile}),", file=sys.stderr)
        print("top 30 by own time:", file=sys.stderr)
        pstats.Stats(str(path), stream=sys.stderr).sort_stats(pstats.SortKey.TIME).print_stats(30)
    config = {
        "sizes": list(sizes),
        "rounds": rounds,
        "reactions": samples,
        "crs": CR_COUNT,
        "pools": POOLS,
        "pending_share": PENDING_SHARE,
        "stability_window_s": SETTINGS.stability_window.total_seconds(),
        "double_cpus": sorted(double_cpus),
        "gate_cpus": sorted(gate_cpus),
        "seconds": round(time.perf_counter() - started, 1),
        # Other work on the machine slows both processes: the 1-minute load average around the run.
        "loadavg_before": round(load_before[0], 2),
        "loadavg_after": round(os.getloadavg()[0], 2),
        "profile_dir": str(profile_dir) if profile_dir else None,
        "event": event,
    }
    return summarise(sized, memory, reaction, config)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    results = run(rounds=args.rounds, quick=args.quick, nodes=args.nodes)
    print(json.dumps(results, separators=(",", ":")) if args.json else render(results), flush=True)
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
