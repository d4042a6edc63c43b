"""Node objects: the hold taint belongs to nodegate."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from admission.violations import Violation

HOLD_TAINT_KEY = "nodegate.io/hold"


def _hold_taints(node: Mapping[str, Any] | None, key: str) -> list[dict[str, Any]]:
    if not isinstance(node, Mapping):
        return []
    spec = node.get("spec")
    taints = spec.get("taints") if isinstance(spec, Mapping) else None
    if not isinstance(taints, list):
        return []
    return sorted((t for t in taints if isinstance(t, Mapping) and t.get("key") == key), key=repr)  # type: ignore[misc]


def node_violations(
    operation: str,
    new: Mapping[str, Any] | None,
    old: Mapping[str, Any] | None,
    *,
    username: str,
    owner: str,
    hold_taint_key: str = HOLD_TAINT_KEY,
) -> list[Violation]:
    """A Node is created only with the hold taint; only ``owner`` (nodegate's service account)
    may remove or change it. Adding it, or keeping it, is always fine."""
    if operation == "CREATE":
        held = _hold_taints(new, hold_taint_key)
        if not any(t.get("effect") in ("NoSchedule", "NoExecute") for t in held):
            return [
                Violation(
                    "node-hold-taint",
                    "spec.taints",
                    f"a Node must be created with the {hold_taint_key} taint",
                    "let nodegate pre-create the Node at join, or register with the taint",
                )
            ]
    elif operation == "UPDATE":
        before, after = _hold_taints(old, hold_taint_key), _hold_taints(new, hold_taint_key)
        if before and before != after and username != owner:
            return [
                Violation(
                    "node-hold-taint",
                    "spec.taints",
                    f"only nodegate may remove or change the {hold_taint_key} taint",
                    "wait for the gate to release the node; see kubectl nodegate status",
                )
            ]
    return []
