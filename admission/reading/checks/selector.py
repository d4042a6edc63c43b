"""spec.nodeSelectors (and, for NodeWright, spec.podNonInterruptLabels): a Kubernetes
LabelSelector that converts as the API machinery converts it (rule "selector").

The operator refuses a selector that does not convert; a selector read differently from the
operator would also make pool containment meaningless.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from admission.reading.checks.ranks import SELECTOR, Found
from admission.reading.checks.values import ABSENT, NO_MAP, NotCanonical, str_list, str_map
from admission.syntax.labels import selector_problems
from admission.violations import Violation

Expressions = tuple[tuple[str, str, tuple[str, ...]], ...]  # (key, operator, values)


def read_selector(
    value: Any, names: frozenset[str], found: Found, path: str = "spec.nodeSelectors", check: bool = True
) -> tuple[Mapping[str, str], Expressions]:
    """matchLabels and matchExpressions; with ``check``, what does not convert is a violation."""
    if value is None:
        return NO_MAP, ()
    if type(value) is not dict or not names.isdisjoint(value):
        raise NotCanonical
    labels = value.get("matchLabels", ABSENT)
    exprs = value.get("matchExpressions", ABSENT)
    expressions: Expressions = ()
    if exprs is not ABSENT:
        if type(exprs) is not list:
            raise NotCanonical
        requirements = []
        for req in exprs:
            if type(req) is not dict:
                raise NotCanonical
            key, operator, values = req.get("key"), req.get("operator"), req.get("values", ABSENT)
            if type(key) is not str or type(operator) is not str:
                raise NotCanonical
            requirements.append((key, operator, () if values is ABSENT else str_list(values)))
        expressions = tuple(requirements)
    match_labels = NO_MAP if labels is ABSENT else str_map(labels)
    if check and (match_labels or expressions):
        # A pure function of the selector; CRs repeat the same few (the usual one: a label or two).
        problems = (
            _problems(tuple(match_labels.items()), expressions)
            if len(match_labels) <= _MEMO_LABELS
            else selector_problems(match_labels, expressions)
        )
        for where, problem in problems:
            found.append((SELECTOR, _violation(path, where, problem)))
    return match_labels, expressions


_MEMO_LABELS = 8  # memo keys of at most this many labels


@lru_cache(maxsize=1024)
def _problems(labels: tuple[tuple[str, str], ...], expressions: Expressions) -> tuple[tuple[str, str], ...]:
    return tuple(selector_problems(dict(labels), expressions))


def _violation(path: str, where: str, problem: str) -> Violation:
    return Violation(
        "selector",
        f"{path}.{where}",
        problem,
        "use a label selector Kubernetes accepts (NodeWright refuses this one)",
    )


def selector_rules(path: str, labels: Mapping[str, str], expressions: Expressions, found: Found) -> None:
    for where, problem in selector_problems(labels, expressions):
        found.append((SELECTOR, _violation(path, where, problem)))
