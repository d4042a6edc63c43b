"""spec.nodeSelectors: a Kubernetes LabelSelector (rule "selector").

The operator parses nodeSelectors as a LabelSelector and refuses what does not parse; a selector
read differently from the operator would make pool containment meaningless.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from admission.checks.ranks import SELECTOR, Found
from admission.checks.values import ABSENT, NO_MAP, NotCanonical, str_list, str_map
from admission.violations import Violation

# The operators of a LabelSelector requirement, and whether each needs values.
OPERATORS = {"In": True, "NotIn": True, "Exists": False, "DoesNotExist": False}


def read_selector(
    value: Any, names: frozenset[str], found: Found
) -> tuple[Mapping[str, str], tuple[tuple[str, str, tuple[str, ...]], ...]]:
    """matchLabels and matchExpressions as (key, operator, values); an unknown operator, or values
    that do not fit the operator, is a violation."""
    if value is None:
        return NO_MAP, ()
    if type(value) is not dict or not names.isdisjoint(value):
        raise NotCanonical
    labels = value.get("matchLabels", ABSENT)
    exprs = value.get("matchExpressions", ABSENT)
    requirements: list[tuple[str, str, tuple[str, ...]]] = []
    if exprs is not ABSENT:
        if type(exprs) is not list:
            raise NotCanonical
        for i, req in enumerate(exprs):
            if type(req) is not dict:
                raise NotCanonical
            key, operator, values = req.get("key"), req.get("operator"), req.get("values", ABSENT)
            if type(key) is not str or type(operator) is not str:
                raise NotCanonical
            given = () if values is ABSENT else str_list(values)
            requirements.append((key, operator, given))
            needs_values = OPERATORS.get(operator)
            if needs_values is None:
                found.append(
                    (
                        SELECTOR,
                        Violation(
                            "selector",
                            f"spec.nodeSelectors.matchExpressions[{i}].operator",
                            f"unknown operator {operator!r}",
                            "use In, NotIn, Exists or DoesNotExist",
                        ),
                    )
                )
            elif needs_values != bool(given):
                found.append(
                    (
                        SELECTOR,
                        Violation(
                            "selector",
                            f"spec.nodeSelectors.matchExpressions[{i}].values",
                            f"{operator} {'needs' if needs_values else 'takes no'} values",
                            "fix the values",
                        ),
                    )
                )
    return (NO_MAP if labels is ABSENT else str_map(labels)), tuple(requirements)
