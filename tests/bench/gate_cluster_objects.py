"""The objects of the gate benchmark against the real API server (``tests.bench.gate_cluster``):
the package CR's names, a node's package state as NodeWright writes it, and a held kwok Node."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

HOLD = "nodegate.io/hold"
CR = "bench"
CRS = "/apis/skyhook.nvidia.com/v1alpha1/skyhooks"
ANNOTATION = f"skyhook.nvidia.com/nodeState_{CR}"
PKG = "driver"
VERSION = "1.0.0"
IN_FLIGHT = 16
MERGE = {"Content-Type": "application/merge-patch+json"}


def _stamp(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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


def node_body(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"pool": "bench", "kubernetes.io/hostname": name, "type": "kwok"},
            "annotations": {"kwok.x-k8s.io/node": "fake", ANNOTATION: json.dumps(node_state(False))},
        },
        "spec": {"taints": [{"key": HOLD, "value": "packages-pending", "effect": "NoSchedule"}]},
    }
