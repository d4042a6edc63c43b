"""Kubernetes label keys, label values and LabelSelectors, judged as the API machinery judges them.

NodeWright's webhook turns ``nodeSelectors`` (and DeploymentPolicy compartment selectors) into a
label selector and refuses what does not convert: a key that is not a qualified name (optional
DNS-1123 subdomain prefix and ``/``, then a name of at most 63 characters), a value that is not a
label value, an operator other than In, NotIn, Exists, DoesNotExist, In/NotIn without values,
Exists/DoesNotExist with values. An empty selector is valid and selects every node. These
functions give the same answers, each problem with the field it is about.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from functools import lru_cache

_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
MAX_NAME = 63
MAX_PREFIX = 253

# The operators of a requirement, and whether each needs values (True) or takes none (False).
OPERATORS = {"In": True, "NotIn": True, "Exists": False, "DoesNotExist": False}


@lru_cache(maxsize=4096)  # selectors repeat the same few keys
def key_problem(key: str) -> str | None:
    """Why ``key`` is not a label key (a qualified name), or None."""
    parts = key.split("/")
    if len(parts) > 2:
        return "a label key is a name with an optional DNS subdomain prefix and '/' (e.g. example.com/name)"
    name = parts[-1]
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix:
            return "the prefix part of a label key must not be empty"
        if len(prefix) > MAX_PREFIX or not _SUBDOMAIN.fullmatch(prefix):
            return f"the prefix part {prefix!r} is not a DNS-1123 subdomain (lower case, digits, '-', '.')"
    if not name:
        return "the name part of a label key must not be empty"
    if len(name) > MAX_NAME:
        return f"the name part of a label key must be at most {MAX_NAME} characters"
    if not _NAME.fullmatch(name):
        return (
            "the name part of a label key must consist of alphanumerics, '-', '_' or '.', and start "
            "and end with an alphanumeric"
        )
    return None


@lru_cache(maxsize=4096)
def value_problem(value: str) -> str | None:
    """Why ``value`` is not a label value, or None (the empty value is one)."""
    if len(value) > MAX_NAME:
        return f"a label value must be at most {MAX_NAME} characters"
    if not _VALUE.fullmatch(value):
        return (
            "a label value must be empty or consist of alphanumerics, '-', '_' or '.', and start and "
            "end with an alphanumeric"
        )
    return None


def selector_problems(
    labels: Mapping[str, str], expressions: Iterable[tuple[str, str, tuple[str, ...]]]
) -> list[tuple[str, str]]:
    """(path below the selector, problem) for everything a LabelSelector conversion refuses."""
    out: list[tuple[str, str]] = []
    for key, value in labels.items():
        problem = key_problem(key)
        if problem is not None:
            out.append((f"matchLabels.{key}", problem))
        problem = value_problem(value)
        if problem is not None:
            out.append((f"matchLabels.{key}", problem))
    for i, (key, operator, values) in enumerate(expressions):
        at = f"matchExpressions[{i}]"
        needs_values = OPERATORS.get(operator)
        if needs_values is None:
            out.append((f"{at}.operator", f"{operator!r} is not a valid label selector operator"))
            continue  # the conversion stops at the operator
        problem = key_problem(key)
        if problem is not None:
            out.append((f"{at}.key", problem))
        if needs_values and not values:
            out.append((f"{at}.values", f"{operator} needs at least one value"))
        elif not needs_values and values:
            out.append((f"{at}.values", f"{operator} takes no values"))
        for j, value in enumerate(values):
            problem = value_problem(value)
            if problem is not None:
                out.append((f"{at}.values[{j}]", problem))
    return out
