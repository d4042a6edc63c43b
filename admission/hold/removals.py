"""Removing a package CR (issue 33, finding 5): a DELETE, or an UPDATE that takes NodeWright's
finalizer off. Pure.

The gate holds a node for every CR that selects it, so removing another team's CR releases that
team's nodes without its packages. RBAC's ``delete`` cannot be scoped to a pool, so a removal is
judged like a change: ``deploy`` on a PackagePolicy whose pool contains the CR. NodeWright's
finalizer keeps a deleted CR until its uninstalls ran; taking it off by hand ends the CR at once,
so that UPDATE is a removal too. The operator's own account (``admission.operator_users``) takes
its finalizer off when its work is done, and upstream's chart deletes every CR with that account
before an uninstall: both pass without a check.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The finalizers NodeWright's operator puts on package CRs: the legacy one (skyhook.nvidia.com
# Skyhooks, and NodeWrights of operators before the rename) and the renamed operator's.
FINALIZERS = frozenset({"skyhook.nvidia.com/skyhook", "nodewright.nvidia.com/nodewright"})
# Upstream's documented installs: `helm install nodewright ... -n nodewright` (the chart drops the
# release prefix) and the legacy `helm install skyhook ... -n skyhook` (chart skyhook-operator).
DEFAULT_OPERATORS = (
    "system:serviceaccount:nodewright:nodewright-controller-manager",
    "system:serviceaccount:skyhook:skyhook-skyhook-operator-controller-manager",
)


def finalizers(obj: Mapping[str, Any] | None) -> frozenset[str]:
    """NodeWright's finalizers on the object."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    found = meta.get("finalizers") if isinstance(meta, Mapping) else None
    if not isinstance(found, list) or not found:
        return frozenset()
    return FINALIZERS.intersection(f for f in found if isinstance(f, str))


def drops_finalizer(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> bool:
    """Whether the UPDATE takes one of NodeWright's finalizers off."""
    before = finalizers(old)
    return bool(before) and not before <= finalizers(new)
