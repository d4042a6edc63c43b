"""A scripted NodeWright operator in its hot loop (issue 45), against the real API server, and a
counter of nodegate's writes. Used by tests/cluster/test_gate_churn.py and the benchmark
tests/bench/gate_churn.py.

What the real operator was seen to write while a node it selects is held and a lower-priority CR
still has work elsewhere (docs/gate.md, "The real operator's writes and its hot loop"): on every
reconcile it flips the node's ``status_<cr>`` between ``waiting`` and ``blocked``, as a label and
an annotation (a Node patch guarded by the resourceVersion it read), its per-CR node condition
(``<group>/<cr>/NotReady``, a Node status patch guarded the same way, the whole condition list as
read) and the CR's ``status.nodeStatus[<node>]``. Each guarded patch that meets a write made
since its read gets 409 Conflict; the operator reads again and goes on (counted here).

The counter watches Nodes and NodeAttestations: a Node event whose hold taint or NodegateReady
condition changed is a nodegate write (no other writer touches them), as is every change of a
NodeAttestation after setup (the join service does not run here).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

HOLD = "nodegate.io/hold"
GROUP = "skyhook.nvidia.com"
CRS = f"/apis/{GROUP}/v1alpha1/skyhooks"
ATTESTATIONS = "/apis/nodegate.io/v1alpha1/nodeattestations"
MERGE = {"Content-Type": "application/merge-patch+json"}


@dataclass
class Counts:
    """What one churn saw."""

    flips: int = 0
    operator_requests: int = 0
    conflicts: int = 0  # 409s the operator's guarded patches got
    # who wrote the Node last when a guarded patch got 409 (its newest managedFields entry)
    conflicts_after: dict[str, int] = field(default_factory=dict)
    node_writes: dict[str, int] = field(default_factory=dict)  # nodegate's, by node
    attestation_writes: dict[str, int] = field(default_factory=dict)
    history: list[tuple[str, str, Any]] = field(default_factory=list)  # (kind, name, the change)
    other_taint_changes: int = 0  # taints of others (the node lifecycle controller's) changed
    seconds: float = 0.0

    @property
    def nodegate_node_writes(self) -> int:
        return sum(self.node_writes.values())

    @property
    def nodegate_attestation_writes(self) -> int:
        return sum(self.attestation_writes.values())


class Api:
    """aiohttp against the API server as admin."""

    def __init__(self, base: str, ctx: ssl.SSLContext) -> None:
        self.base = base
        self.http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, limit=128))

    async def close(self) -> None:
        await self.http.close()

    async def call(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        async with self.http.request(method, f"{self.base}{path}", json=body, headers=headers) as resp:
            out = await resp.read()
            return resp.status, (json.loads(out) if out else None)

    async def ok(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> Any:
        status, out = await self.call(method, path, body, headers)
        if status >= 400:
            raise RuntimeError(f"{method} {path}: {status} {str(out)[:300]}")
        return out


def _with_condition(conditions: list[dict[str, Any]], kind: str, value: str) -> list[dict[str, Any]]:
    want = {
        "type": kind,
        "status": "True" if value == "blocked" else "False",
        "reason": value.capitalize(),
        "message": f"node is {value}",
        "lastHeartbeatTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return [c for c in conditions if c.get("type") != kind] + [want]


def last_writer(node: dict[str, Any]) -> str:
    """The manager of the Node's newest managedFields entry (seconds resolution: a guess when two
    wrote within the same second), with the subresource it wrote."""
    entries = node["metadata"].get("managedFields") or []
    if not entries:
        return "?"
    newest = max(entries, key=lambda e: e.get("time", ""))
    sub = f"/{newest['subresource']}" if newest.get("subresource") else ""
    return f"{newest.get('manager', '?')}{sub}"


async def operator_flip(api: Api, counts: Counts, node: str, cr: str, value: str) -> None:
    """One reconcile of the real operator's hot loop for ``node`` and ``cr``."""
    counts.flips += 1
    key = f"{GROUP}/status_{cr}"
    conflicted = False
    for _attempt in range(5):
        counts.operator_requests += 1
        got = await api.ok("GET", f"/api/v1/nodes/{node}")
        if conflicted:
            who = last_writer(got)
            counts.conflicts_after[who] = counts.conflicts_after.get(who, 0) + 1
        conflicted = True  # until the patches below succeed
        rv = got["metadata"]["resourceVersion"]
        meta = {"resourceVersion": rv, "labels": {key: value}, "annotations": {key: value}}
        counts.operator_requests += 1
        status, out = await api.call("PATCH", f"/api/v1/nodes/{node}", {"metadata": meta}, MERGE)
        if status == 409:
            counts.conflicts += 1
            continue
        if status >= 400:
            raise RuntimeError(f"node patch {node}: {status} {str(out)[:300]}")
        conditions = _with_condition(out["status"].get("conditions") or [], f"{GROUP}/{cr}/NotReady", value)
        patch = {"metadata": {"resourceVersion": out["metadata"]["resourceVersion"]}}
        counts.operator_requests += 1
        status, out = await api.call(
            "PATCH", f"/api/v1/nodes/{node}/status", {**patch, "status": {"conditions": conditions}}, MERGE
        )
        if status == 409:
            counts.conflicts += 1
            continue
        if status >= 400:
            raise RuntimeError(f"node status patch {node}: {status} {str(out)[:300]}")
        break
    counts.operator_requests += 1
    await api.ok("PATCH", f"{CRS}/{cr}/status", {"status": {"nodeStatus": {node: value}}}, MERGE)


async def _watch(api: Api, path: str, rv: str, names: set[str], seen: dict[str, Any], counts: Counts) -> None:
    """Count changes of what only nodegate writes, per object, from ``rv`` on."""
    node = path.startswith("/api/v1/nodes")
    out = counts.node_writes if node else counts.attestation_writes
    others: dict[str, str] = {}
    sep = "&" if "?" in path else "?"
    url = f"{api.base}{path}{sep}watch=1&allowWatchBookmarks=true&resourceVersion={rv}"
    async with api.http.get(url, timeout=aiohttp.ClientTimeout(total=None, sock_read=None)) as resp:
        async for line in resp.content:
            event = json.loads(line)
            obj = event.get("object") or {}
            name = (obj.get("metadata") or {}).get("name")
            if event.get("type") != "MODIFIED" or name not in names:
                continue
            mark = _nodegate_part(obj, node=node)
            if node:
                theirs = [t for t in obj["spec"].get("taints") or [] if t.get("key") != HOLD]
                text = json.dumps(theirs, sort_keys=True)
                if others.setdefault(name, text) != text:
                    others[name] = text
                    counts.other_taint_changes += 1
            if mark != seen.get(name):
                seen[name] = mark
                counts.history.append(("node" if node else "attestation", name, mark))
                out[name] = out.get(name, 0) + 1


def _nodegate_part(obj: dict[str, Any], *, node: bool) -> Any:
    if node:
        taints = [t for t in (obj.get("spec") or {}).get("taints") or [] if t.get("key") == HOLD]
        conditions = (obj.get("status") or {}).get("conditions") or []
        mine = [c for c in conditions if c.get("type") == "NodegateReady"]
        return json.dumps([taints, mine], sort_keys=True)
    return obj.get("metadata", {}).get("resourceVersion")  # a NodeAttestation: every change


async def churn(
    api: Api,
    nodes: Sequence[str],
    crs: Sequence[str],
    *,
    per_second: float,
    seconds: float,
    during: Callable[[], Awaitable[None]] | None = None,
) -> Counts:
    """Flip ``status_<cr>`` on ``nodes`` at ``per_second`` flips in all (round robin over nodes
    and CRs, one reconcile in flight per node; none at 0) for ``seconds``, counting nodegate's
    writes meanwhile (and running ``during`` at the start)."""
    counts = Counts()
    names = set(nodes)
    _, node_list = await api.call("GET", "/api/v1/nodes?labelSelector=churn%3Dyes")
    _, att_list = await api.call("GET", ATTESTATIONS)
    seen_nodes = {i["metadata"]["name"]: _nodegate_part(i, node=True) for i in node_list["items"]}
    seen_atts: dict[str, Any] = {}
    watchers = [
        asyncio.create_task(
            _watch(api, "/api/v1/nodes?labelSelector=churn%3Dyes", node_list["metadata"]["resourceVersion"],
                   names, seen_nodes, counts)
        ),
        asyncio.create_task(
            _watch(api, ATTESTATIONS, att_list["metadata"]["resourceVersion"], names, seen_atts,
                   counts)
        ),
    ]  # fmt: skip
    interval = len(nodes) / per_second if per_second > 0 else seconds + 1  # per node
    start = time.monotonic()

    async def one(i: int, node: str) -> None:
        k = 0
        due = start + interval * i / len(nodes)
        while due < start + seconds:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            value = "waiting" if k % 2 == 0 else "blocked"
            await operator_flip(api, counts, node, crs[k % len(crs)], value)
            k += 1
            due += interval

    try:
        jobs = [one(i, n) for i, n in enumerate(nodes)] if per_second > 0 else []
        await asyncio.gather(*jobs, *([during()] if during is not None else []), asyncio.sleep(seconds))
        counts.seconds = time.monotonic() - start
        await asyncio.sleep(1.0)  # the last writes' events
    finally:
        for task in watchers:
            task.cancel()
        for task in watchers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return counts


def held_nodes(names: Sequence[str], *, quarantined: bool) -> list[dict[str, Any]]:
    """kwok Nodes as nodegate pre-creates them (the hold taint), labelled for the churn CRs."""
    value = "quarantined" if quarantined else "unattested"
    return [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": n,
                "labels": {"churn": "yes", "agentpool": "gpu", "kubernetes.io/hostname": n, "type": "kwok"},
                "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            },
            "spec": {"taints": [{"key": HOLD, "value": value, "effect": "NoSchedule"}]},
        }
        for n in names
    ]


def churn_cr(name: str) -> dict[str, Any]:
    """A Skyhook as upstream documents it plus the hold tolerations nodegate's webhook adds."""
    return {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "Skyhook",
        "metadata": {"name": name},
        "spec": {
            "nodeSelectors": {"matchLabels": {"churn": "yes", "agentpool": "gpu"}},
            "additionalTolerations": [
                {"key": HOLD, "operator": "Equal", "value": v, "effect": "NoSchedule"}
                for v in ("packages-pending", "validation-failed")
            ],
            "packages": {"driver": {"version": "1.0.0", "image": "ghcr.io/nvidia/churn"}},
        },
    }


def revoked_attestation(
    name: str, i: int, attested: str, expires: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A NodeAttestation revoked by an admin (the gate holds the node ``quarantined``), and its
    status as the join service left it."""
    body = {
        "apiVersion": "nodegate.io/v1alpha1",
        "kind": "NodeAttestation",
        "metadata": {"name": name},
        "spec": {"ekSha256": f"{i:064x}", "revoked": True},
    }
    return body, {"status": {"attestedAt": attested, "expiresAt": expires, "resetCount": 1}}
