"""A package's resources: all four of cpu/memory request/limit or none, quantities, positive,
limits not below requests (rule "resources")."""

from __future__ import annotations

from decimal import Decimal
from functools import lru_cache
from typing import Any

from admission.checks.ranks import RESOURCES, Found
from admission.checks.values import NotCanonical
from admission.quantity import parse_quantity
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
    given = [(k, v) for k, v in zip(_FIELDS, values, strict=True) if v is not None]
    if not given:
        return ()
    if len(given) != 4:
        named = {k for k, _v in given}
        missing = ", ".join(k for k in _FIELDS if k not in named)
        return (("resources", "set all four of cpu/memory request/limit or none", f"add {missing}"),)
    out = []
    parsed: dict[str, Decimal] = {}
    for k, v in given:
        try:
            parsed[k] = parse_quantity(v)
        except ValueError as exc:
            out.append((f"resources.{k}", str(exc), "use a quantity such as 500m or 1Gi"))
    if len(parsed) != 4:
        return tuple(out)
    for k, q in parsed.items():
        if q <= 0:
            out.append((f"resources.{k}", "must be positive", "use a value above zero"))
    for kind in ("cpu", "memory"):
        if parsed[f"{kind}Limit"] < parsed[f"{kind}Request"]:
            out.append(
                (
                    f"resources.{kind}Limit",
                    f"{kind} limit is below its request",
                    "raise the limit or lower the request",
                )
            )
    return tuple(out)
