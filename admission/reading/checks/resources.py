"""A package's resources, as NodeWright checks them (rule "resources"): quantities; a zero counts
as unset; if any is set, all four of cpu/memory request/limit are, limits are not below their
requests, and all are positive."""

from __future__ import annotations

from decimal import Decimal
from functools import lru_cache
from typing import Any

from admission.reading.checks.ranks import RESOURCES, Found
from admission.reading.checks.values import NotCanonical
from admission.syntax.quantity import parse_quantity
from admission.violations import Violation

_FIELDS = ("cpuRequest", "cpuLimit", "memoryRequest", "memoryLimit")
_QUANTITY_TYPES = (str, int, float)

# cpuRequest, cpuLimit, memoryRequest, memoryLimit as given (None where absent)
Quantities = tuple[Any, Any, Any, Any]


def read_resources(res: Any, names: frozenset[str]) -> Quantities | None:
    if res is None:
        return None
    if type(res) is not dict or not names.isdisjoint(res):
        raise NotCanonical
    values = (res.get("cpuRequest"), res.get("cpuLimit"), res.get("memoryRequest"), res.get("memoryLimit"))
    for q in values:
        if q is not None and type(q) not in _QUANTITY_TYPES:
            raise NotCanonical
    return values


def resource_rules(path: str, resources: Quantities, found: Found) -> None:
    """The resources of the package at ``path``."""
    # A pure function of the four values; CRs give them as strings and repeat the same few, so
    # that case is memoised (other types are keyed badly: 2**240 == 2.0**240).
    a, b, c, d = resources
    strings = type(a) is str and type(b) is str and type(c) is str and type(d) is str
    for where, message, fix in _problems(resources) if strings else _check(resources):
        found.append((RESOURCES, Violation("resources", f"{path}.{where}", message, fix)))


@lru_cache(maxsize=1024)
def _problems(values: Quantities) -> tuple[tuple[str, str, str], ...]:
    return _check(values)


def _check(values: Quantities) -> tuple[tuple[str, str, str], ...]:
    """(path below the package, message, fix) for each problem."""
    out = []
    parsed: dict[str, Decimal] = {}
    for k, v in zip(_FIELDS, values, strict=True):
        if v is None:
            parsed[k] = Decimal(0)
            continue
        try:
            parsed[k] = parse_quantity(v)
        except ValueError as exc:  # the operator cannot even decode the CR
            out.append((f"resources.{k}", str(exc), "use a quantity such as 500m or 1Gi"))
    if out:
        return tuple(out)
    unset = [k for k in _FIELDS if parsed[k] == 0]
    if len(unset) == len(_FIELDS):
        return ()
    if unset:
        return (
            (
                "resources",
                "if any resource override is set (not zero), all four must be",
                f"set {', '.join(unset)} too, or none",
            ),
        )
    for kind in ("cpu", "memory"):
        if parsed[f"{kind}Limit"] < parsed[f"{kind}Request"]:
            out.append(
                (
                    f"resources.{kind}Limit",
                    f"{kind} limit is below its request",
                    "raise the limit or lower the request",
                )
            )
    for k, q in parsed.items():
        if q < 0:
            out.append((f"resources.{k}", "must be positive", "use a value above zero"))
    return tuple(out)
