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
from functools import lru_cache
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


@lru_cache(maxsize=16)  # one hold taint key per deployment; read-only here, never handed out
def _wanted(key: str) -> tuple[dict[str, str], ...]:
    return tuple(hold_tolerations(key))


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """core/v1 ``Toleration.ToleratesTaint`` as NodeWright calls it (comparison operators off: Lt
    and Gt tolerate nothing; an empty operator is Equal; an empty key or effect matches any; a
    field that is not a string counts as empty). The key first: most tolerations name another."""
    key = toleration.get("key")
    if key and isinstance(key, str) and key != taint.get("key"):
        return False
    effect = toleration.get("effect")
    if effect and isinstance(effect, str) and effect != taint.get("effect"):
        return False
    operator = toleration.get("operator")
    if operator == "Exists":
        return True
    if operator and operator != "Equal" and isinstance(operator, str):
        return False
    value = toleration.get("value")
    want = taint.get("value")
    return (value if isinstance(value, str) else "") == (want if isinstance(want, str) else "")


def missing_hold_tolerations(tolerations: object, key: str) -> list[dict[str, str]]:
    """The hold tolerations not already covered by ``tolerations`` (a CR's
    ``spec.additionalTolerations`` as sent, from JSON: absent, null or a list; entries that are
    not objects tolerate nothing). Covered means some toleration already tolerates that hold taint."""
    return [
        {"key": key, "operator": "Equal", "value": value, "effect": HOLD_EFFECT}
        for value in missing_hold_values(tolerations, key)
    ]


def missing_hold_values(tolerations: object, key: str) -> tuple[str, ...]:
    """The hold reasons (of :data:`PACKAGE_HOLD_VALUES`, in order) whose toleration
    :func:`missing_hold_tolerations` names. On the validating webhook's path for every admitted
    CR: the common answers (both present, or no toleration of the key at all) are quick."""
    if not isinstance(tolerations, list) or not tolerations:  # none: every one is missing
        return PACKAGE_HOLD_VALUES
    for wanted in _wanted(key):  # as the mutation wrote them: one C-level compare each
        if wanted not in tolerations:
            break
    else:
        return ()
    # A toleration naming another key (a string) tolerates no hold taint (``tolerates`` says no
    # at its first test): only the others are asked.
    have = [
        t
        for t in tolerations
        if isinstance(t, dict) and not ((k := t.get("key")) and isinstance(k, str) and k != key)
    ]
    if not have:
        return PACKAGE_HOLD_VALUES
    return tuple(
        value
        for value in PACKAGE_HOLD_VALUES
        if not any(tolerates(t, {"key": key, "value": value, "effect": HOLD_EFFECT}) for t in have)
    )


def show(tolerations: Sequence[Mapping[str, Any]]) -> str:
    """``key=value:Effect (Equal)`` for each, as the warning and the gate name them."""
    return ", ".join(
        f"{t.get('key')}={t.get('value')}:{t.get('effect')} ({t.get('operator') or 'Equal'})"
        for t in tolerations
    )
