"""The hold tolerations a package CR needs so that NodeWright reaches held nodes: pure, shared by
the mutating webhook (which adds them), the validating webhook (which warns when they are missing)
and the gate (which names them when a node is blocked).

NodeWright's operator picks a node for a CR only when the CR's own tolerations (the cordon
toleration, ``spec.additionalTolerations`` and, for runtimeRequired CRs, the runtime-required one)
tolerate every taint on the node, and gives its package pods that same list. So the hold taint is
tolerated in the CR, for exactly the reasons under which packages are meant to run
(``packages-pending``, ``validation-failed``) and with ``operator: Equal``, so that packages never
run on nodes held ``unattested`` or ``quarantined``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# The hold reasons under which package pods are meant to run, in the order they are added.
PACKAGE_HOLD_VALUES = ("packages-pending", "validation-failed")
HOLD_EFFECT = "NoSchedule"


def hold_tolerations(key: str) -> list[dict[str, str]]:
    """The tolerations a package CR gets, one per hold reason its packages run under."""
    return [
        {"key": key, "operator": "Equal", "value": value, "effect": HOLD_EFFECT}
        for value in PACKAGE_HOLD_VALUES
    ]


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """core/v1 ``Toleration.ToleratesTaint`` as NodeWright calls it (comparison operators off: Lt
    and Gt tolerate nothing; an empty operator is Equal; an empty key or effect matches any)."""
    effect, key = _text(toleration.get("effect")), _text(toleration.get("key"))
    if effect and effect != taint.get("effect"):
        return False
    if key and key != taint.get("key"):
        return False
    operator = _text(toleration.get("operator"))
    if operator == "Exists":
        return True
    return operator in ("", "Equal") and _text(toleration.get("value")) == _text(taint.get("value"))


def missing_hold_tolerations(tolerations: object, key: str) -> list[dict[str, str]]:
    """The hold tolerations not already covered by ``tolerations`` (a CR's
    ``spec.additionalTolerations`` as sent: absent, null or a list; entries that are not objects
    tolerate nothing). Covered means some toleration already tolerates that hold taint."""
    have = [t for t in tolerations if isinstance(t, Mapping)] if isinstance(tolerations, list) else []
    return [
        wanted
        for wanted in hold_tolerations(key)
        if not any(tolerates(t, {"key": key, "value": wanted["value"], "effect": HOLD_EFFECT}) for t in have)
    ]


def show(tolerations: Sequence[Mapping[str, Any]]) -> str:
    """``key=value:Effect (Equal)`` for each, as the warning and the gate name them."""
    return ", ".join(
        f"{t.get('key')}={t.get('value')}:{t.get('effect')} ({t.get('operator') or 'Equal'})"
        for t in tolerations
    )
