"""The gate's CPU per package-CR watch event, alone (part of ``tests/bench/gate.py``).

In this process, no API and no other load: the largest CR of the benchmark's 10,000-node cluster
(~1 MiB, as the operator stores it), loaded into a gate's cache with every Node and
NodeAttestation. Then S times one node's report in the CR's status changes, as the operator writes
it (one package's stage and state), and the event line the API server would send (built outside
the clock) goes through what the gate does with it, each phase timed on this thread's CPU clock:

  decode    bootstrap/kube/watch.py: the event line -> the envelope and the CR (crindex.CrDoc)
  index     Cache.apply_event: parse the spec, compare each node's report JSON, re-index the changed
  decision  holds.decide for every node the event named (Gate.decide)

The baseline in the same run is what the gate did before (kubernetes_asyncio's Watch: json.loads,
json.dumps and json.loads again of the event, then parse_cr's index of every node and the
node-by-node comparison of all reports). The target is <= 10 ms of CPU per MiB of event.
"""

from __future__ import annotations

import copy
import gc
import json
import statistics
import time
from datetime import UTC, datetime
from typing import Any, cast

from bootstrap.gate import Gate, crindex, holds
from bootstrap.gate.cache import ATTESTATION_SOURCE, NODES
from bootstrap.kube import Kube, WatchEvent
from bootstrap.kube import watch as watch_mod

EVENT_SAMPLES = 200
QUICK_EVENT_SAMPLES = 50
TARGET_MS_PER_MIB = 10.0
MIB = 1 << 20


def _line(cr: dict[str, Any]) -> bytes:
    return json.dumps({"type": "MODIFIED", "object": cr}, separators=(",", ":")).encode()


def _old_path(line: bytes, before: holds.PackageCr | None) -> int:
    """What the gate did per event before: three decodes, the whole index, every node compared."""
    first = json.loads(line)
    obj = json.loads(json.dumps(first["raw_object" if "raw_object" in first else "object"]))
    after = holds.parse_cr(obj)
    if before is None:
        return 0
    old, new = before.reports, after.reports
    return len({n for n in old.keys() | new.keys() if old.get(n) != new.get(n)})


def measure(cluster: Any, settings: Any, samples: int) -> dict[str, Any]:
    """``cluster``: tests/bench/gate.py's Cluster (built by the caller, its pending nodes used)."""
    sizes = [len(_line(cr)) for cr in cluster.crs]
    cr = copy.deepcopy(cluster.crs[max(range(len(sizes)), key=sizes.__getitem__)])
    group = cr["apiVersion"].split("/", 1)[0]
    parsed = holds.parse_cr(cr)
    gate = Gate(
        cast(Kube, None), settings, events_namespace="nodegate", now=lambda: datetime.now(UTC), identity="b"
    )
    cache = gate._cache
    named: list[str] = []
    cache._changed = named.append  # type: ignore[method-assign]  (the queue is not running here)
    for key, items in ((NODES, cluster.nodes), (ATTESTATION_SOURCE, cluster.attestations)):
        src = cache.sources[key]
        src.objects = {}
        for obj in items:
            cache.apply_event(src, WatchEvent("ADDED", copy.deepcopy(obj)))
    for key, src in cache.sources.items():
        if src.objects is None:
            src.objects = {}
        src.synced = True
        del key
    src = cache.sources[group]
    rv = 10_000_000
    cr["metadata"]["resourceVersion"] = str(rv)
    cache.apply_event(src, WatchEvent("ADDED", crindex.DECODER.from_json(json.dumps(cr).encode())))
    nodes = {n["metadata"]["name"]: n for n in cluster.nodes}
    selected = [n for n in cr["status"]["nodeState"] if n in nodes]
    key = next(iter(parsed.packages.values()))
    pkg_key = f"{key.name}|{key.version}"
    walk = [
        ("apply", "in_progress"),
        ("apply", "complete"),
        ("config", "in_progress"),
        ("config", "complete"),
    ]
    phases: dict[str, list[int]] = {"decode": [], "index": [], "decision": [], "total": [], "old": []}
    decided: list[int] = []
    old_before = holds.parse_cr(cr)
    gc.collect()
    for i in range(samples):
        node = selected[(i * 7919) % len(selected)]
        stage, state = walk[i % len(walk)]
        entry = cr["status"]["nodeState"][node].setdefault(
            pkg_key, {"name": key.name, "version": key.version}
        )
        entry["stage"], entry["state"] = stage, state
        rv += 1
        cr["metadata"]["resourceVersion"] = str(rv)
        line = _line(cr)  # the API server's work, not the gate's
        named.clear()
        gc.disable()
        try:
            t0 = time.thread_time_ns()
            event = watch_mod._event("bench", line, crindex.DECODER)
            t1 = time.thread_time_ns()
            assert event is not None
            cache.apply_event(src, event)
            t2 = time.thread_time_ns()
            for name in named:
                gate.decide(nodes[name])
            t3 = time.thread_time_ns()
            _old_path(line, old_before)
            t4 = time.thread_time_ns()
        finally:
            gc.enable()
        phases["decode"].append(t1 - t0)
        phases["index"].append(t2 - t1)
        phases["decision"].append(t3 - t2)
        phases["total"].append(t3 - t0)
        phases["old"].append(t4 - t3)
        decided.append(len(named))
    mib = len(line) / MIB
    out: dict[str, Any] = {
        "event_bytes": len(line),
        "nodes_in_cr": len(cr["status"]["nodeState"]),
        "samples": samples,
        "nodes_decided_median": statistics.median(decided),
    }
    for name, values in phases.items():
        out[f"{name}_ms"] = statistics.median(values) / 1e6
    out["ms_per_mib"] = out["total_ms"] / mib
    out["old_ms_per_mib"] = out["old_ms"] / mib
    out["speedup"] = out["old_ms"] / out["total_ms"] if out["total_ms"] else None
    return out


def render(e: dict[str, Any]) -> list[str]:
    return [
        f"package CR watch event ({e['event_bytes'] / MIB:.2f} MiB, {e['nodes_in_cr']:,} nodes' reports; "
        f"one node's report changes; {e['samples']} samples, medians, this thread's CPU)",
        f"  decode {e['decode_ms']:.2f} ms  index {e['index_ms']:.2f} ms  decision {e['decision_ms']:.3f} ms "
        f"({e['nodes_decided_median']:g} node)  = {e['total_ms']:.2f} ms, {e['ms_per_mib']:.2f} ms per MiB",
        f"  before (kubernetes_asyncio's triple decode, every node indexed and compared): "
        f"{e['old_ms']:.1f} ms ({e['old_ms_per_mib']:.1f} ms per MiB): {e['speedup']:.1f}x",
    ]
