"""Node objects: the hold taint belongs to nodegate, and NodeWright's package state on the Node
belongs to the NodeWright operator, not to the node's own kubelet credentials."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from admission.violations import Violation

HOLD_TAINT_KEY = "nodegate.io/hold"
# The hold's value on a Node nodegate did not create itself: the node is not attested yet. The
# package values (packages-pending, validation-failed) are tolerated by package CRs, so a Node
# created with one would run package pods before the gate has looked at it (issue 33, finding 7).
UNATTESTED = "unattested"
NODE_USER_PREFIX = "system:node:"
# The operator reports per-node package state in these annotations (both API groups); the gate
# cross-checks them with the CR's status, which the operator rebuilds from them at its next
# reconcile: a node must not be able to rewrite them with its own credentials.
PACKAGE_STATE_PREFIXES = ("skyhook.nvidia.com/nodeState_", "nodewright.nvidia.com/nodeState_")


_PACKAGE_STATE = Violation(
    "node-package-state",
    "metadata.annotations",
    "a node may not set or change NodeWright's package state annotations (nodeState_*) "
    "with its own credentials",
    "only the NodeWright operator reports package state",
)


def _package_state(node: Mapping[str, Any] | None) -> dict[str, Any]:
    meta = node.get("metadata") if isinstance(node, Mapping) else None
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    if not isinstance(annotations, Mapping):
        return {}
    return {
        k: v for k, v in annotations.items() if isinstance(k, str) and k.startswith(PACKAGE_STATE_PREFIXES)
    }


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
    """A Node is created only with the hold taint, by anyone but ``owner`` (nodegate's service
    account, which pre-creates Nodes at join) with the value ``unattested``; only ``owner`` may
    remove or change it. Adding it, or keeping it, is always fine. A node's own credentials
    (``system:node:*``) may not set or change NodeWright's ``nodeState_*`` annotations, on CREATE
    or UPDATE, whether through ``nodes`` or ``nodes/status`` (the API server keeps metadata
    changes made through the status subresource, and the review of either is judged alike)."""
    found: list[Violation] = []
    if operation == "CREATE":
        held = _hold_taints(new, hold_taint_key)
        if not any(t.get("effect") in ("NoSchedule", "NoExecute") for t in held):
            found.append(
                Violation(
                    "node-hold-taint",
                    "spec.taints",
                    f"a Node must be created with the {hold_taint_key} taint",
                    "let nodegate pre-create the Node at join, or register with the taint",
                )
            )
        elif username != owner and any(t.get("value") != UNATTESTED for t in held):
            values = sorted({str(t.get("value")) for t in held if t.get("value") != UNATTESTED})
            found.append(
                Violation(
                    "node-hold-value",
                    "spec.taints",
                    f"a Node created by anyone but nodegate must carry {hold_taint_key}={UNATTESTED}, "
                    f"not {', '.join(values)}: the gate sets the value once the node is attested",
                    f"register with --register-with-taints={hold_taint_key}={UNATTESTED}:NoSchedule",
                )
            )
        if username.startswith(NODE_USER_PREFIX) and _package_state(new):
            found.append(_PACKAGE_STATE)
        return found
    if operation == "UPDATE":
        before, after = _hold_taints(old, hold_taint_key), _hold_taints(new, hold_taint_key)
        if before and before != after and username != owner:
            found.append(
                Violation(
                    "node-hold-taint",
                    "spec.taints",
                    f"only nodegate may remove or change the {hold_taint_key} taint",
                    "wait for the gate to release the node; see kubectl nodegate status",
                )
            )
        if username.startswith(NODE_USER_PREFIX) and _package_state(old) != _package_state(new):
            found.append(_PACKAGE_STATE)
        return found
    return []
