"""spec.additionalTolerations: no wildcard (rule "toleration-wildcard"), and the hold taint
tolerated by runtime-required CRs (rule "hold-toleration")."""

from __future__ import annotations

from typing import Any

from admission.checks.ranks import TOLERATIONS, Found
from admission.checks.values import ABSENT, NotCanonical
from admission.crs import CrView
from admission.violations import Violation

# key, operator, value, effect
Toleration = tuple[str | None, str | None, str | None, str | None]


def read_tolerations(value: Any, found: Found) -> tuple[Toleration, ...]:
    """The tolerations; ``operator: Exists`` without a key tolerates every taint."""
    if value is ABSENT:
        return ()
    if type(value) is not list:
        raise NotCanonical
    out = []
    for i, tol in enumerate(value):
        if type(tol) is not dict:
            raise NotCanonical
        entry = (tol.get("key"), tol.get("operator"), tol.get("value"), tol.get("effect"))
        for v in entry:
            if v is not None and type(v) is not str:
                raise NotCanonical
        out.append(entry)
        key, operator = entry[0], entry[1]
        if operator == "Exists" and not key:
            found.append(
                (
                    TOLERATIONS,
                    Violation(
                        "toleration-wildcard",
                        f"spec.additionalTolerations[{i}]",
                        "operator Exists without a key tolerates every taint (control plane, quarantine)",
                        "name the taint key to tolerate",
                    ),
                )
            )
    return tuple(out)


def hold_toleration(cr: CrView, hold: str) -> Violation | None:
    """Runtime-required packages run on held nodes, so they must tolerate the hold taint while
    its reason is packages-pending (an Equal toleration for another reason would never match)."""
    if not cr.runtime_required:
        return None
    for key, operator, value, effect in cr.tolerations:
        if key != hold or effect not in (None, "", "NoSchedule"):
            continue
        if operator == "Exists" or (operator in ("Equal", None) and value == "packages-pending"):
            return None
    return Violation(
        "hold-toleration",
        "spec.additionalTolerations",
        f"a runtimeRequired CR must tolerate the {hold} taint (nodes are held until it completes)",
        f"add {{key: {hold}, operator: Exists, effect: NoSchedule}}",
    )
