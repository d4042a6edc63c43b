"""The objects of the gate benchmark against the real API server (``tests.bench.gate_cluster``):
the package CRs' names, a node's package state as NodeWright writes it, and a held kwok Node.

Nodes are split over CRs of at most ``PER_CR`` nodes each (node ``bench-i`` is selected by CR
``bench-<i // PER_CR>`` through its ``bench-cr`` label). NodeWright keeps every selected node's
report in its CR's status; at 10,000 nodes one CR's status would be ~1.6 MB, over etcd's default
1.5 MiB request limit (docs/benchmarks.md), so a fleet that large is several CRs, one per pool.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

HOLD = "nodegate.io/hold"
CRS = "/apis/skyhook.nvidia.com/v1alpha1/skyhooks"
ATTESTATIONS = "/apis/nodegate.io/v1alpha1/nodeattestations"
PKG = "driver"
VERSION = "1.0.0"
IN_FLIGHT = 16
PER_CR = 1_000
MERGE = {"Content-Type": "application/merge-patch+json"}
CR_LABEL = "bench-cr"


def _stamp(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_name(i: int) -> str:
    return f"bench-{i:05d}"


def cr_of(name: str) -> str:
    """The CR that selects node ``name``."""
    return f"bench-{int(name.rsplit('-', 1)[1]) // PER_CR}"


def annotation(cr: str) -> str:
    return f"skyhook.nvidia.com/nodeState_{cr}"


def node_state(done: bool) -> dict[str, Any]:
    stage, state = ("config", "complete") if done else ("apply", "in_progress")
    return {
        f"{PKG}|{VERSION}": {
            "name": PKG,
            "version": VERSION,
            "image": "ghcr.io/nvidia/bench",
            "stage": stage,
            "state": state,
        }
    }


def cr_body(cr: str) -> dict[str, Any]:
    return {
        "apiVersion": "skyhook.nvidia.com/v1alpha1",
        "kind": "Skyhook",
        "metadata": {"name": cr},
        "spec": {
            "nodeSelectors": {"matchLabels": {"pool": "bench", CR_LABEL: cr}},
            "additionalTolerations": [
                {"key": HOLD, "operator": "Equal", "value": v, "effect": "NoSchedule"}
                for v in ("packages-pending", "validation-failed")
            ],
            "packages": {PKG: {"version": VERSION, "image": "ghcr.io/nvidia/bench"}},
        },
    }


def node_body(name: str) -> dict[str, Any]:
    cr = cr_of(name)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"pool": "bench", CR_LABEL: cr, "kubernetes.io/hostname": name, "type": "kwok"},
            "annotations": {"kwok.x-k8s.io/node": "fake", annotation(cr): json.dumps(node_state(False))},
        },
        "spec": {"taints": [{"key": HOLD, "value": "packages-pending", "effect": "NoSchedule"}]},
    }
