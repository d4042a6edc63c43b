"""UPDATE and DELETE of package CRs: whether a change matters, which packages it would reboot,
and the DELETE rule on pending uninstalls."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from admission.crs import PACKAGE_GROUPS, CrView, PackageCR, packages_equal, specs_equal
from admission.structural import as_view, read_package_cr
from admission.violations import Violation

# The annotations that pause or disable a CR, in both API groups.
_GATES = tuple(f"{g}/{k}" for g in PACKAGE_GROUPS for k in ("pause", "disable"))


def spec_changed(old: PackageCR | CrView, new: PackageCR | CrView) -> bool:
    """Whether anything the operator acts on changed (spec, pause/disable annotations)."""
    old_view, new_view = as_view(old), as_view(new)
    return _gates(old_view) != _gates(new_view) or not specs_equal(old_view, new_view)


def _gates(cr: CrView) -> tuple[str | None, ...]:
    return tuple(map(cr.annotations.get, _GATES))


def new_reboots(old: PackageCR | CrView | None, new: PackageCR | CrView) -> list[str]:
    """Packages whose reboot interrupt this change would fire: packages with a reboot interrupt
    that are new, or differ in any field from before (a version bump re-runs and reboots)."""
    view = as_view(new)
    if not view.reboot:
        return []
    before = {} if old is None else as_view(old).by_key
    out = []
    for pkg in view.packages:
        if pkg.reboot:
            prior = before.get(pkg.key)
            if prior is None or not packages_equal(prior, pkg):
                out.append(pkg.key)
    return out


def delete_violations(old: Mapping[str, Any]) -> list[Violation]:
    """Upstream's rule: a CR that is paused or disabled cannot run its pending uninstalls, so
    deleting it would strand them (the operator blocks the finalizer; we refuse up front)."""
    cr = read_package_cr(old)
    if isinstance(cr, list):
        return []  # nothing we understand to protect; RBAC on delete still applies
    gate = next(
        (k for g in PACKAGE_GROUPS for k in ("pause", "disable") if cr.annotations.get(f"{g}/{k}") == "true"),
        None,
    )
    if gate is None:
        return []
    uninstalling = {p.key for p in cr.packages if p.uninstall is not None and p.uninstall[0]}
    node_state = old.get("status", {}).get("nodeState", {}) if isinstance(old.get("status"), Mapping) else {}
    pending = sorted(
        {
            str(entry).split("|", 1)[0]
            for states in node_state.values()
            if isinstance(states, Mapping)
            for entry in states
        }
        & uninstalling
    )
    if not pending:
        return []
    return [
        Violation(
            "delete-pending-uninstall",
            "metadata.annotations",
            f"the CR is {'paused' if gate == 'pause' else 'disabled'} with uninstalls pending on nodes "
            f"({', '.join(pending)})",
            f"remove the {gate} annotation so the uninstalls run, then delete",
        )
    ]
