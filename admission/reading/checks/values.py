"""Values read as they are: strings, booleans, integers, maps and lists of strings with exactly
the types the pydantic models of :mod:`admission.reading.crs` declare. Anything else (another type, null
where a model has no None, a field name that populate_by_name would accept) raises NotCanonical,
and the models decide instead, with their coercions and their error messages."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from pydantic import BaseModel


class NotCanonical(Exception):
    """A value the reader does not take as is: pydantic decides instead."""


ABSENT: Any = object()  # a key that is not there (unlike one that is null)
NO_MAP: Mapping[str, str] = MappingProxyType({})  # the shared value of an absent map


def aliased(model: type[BaseModel]) -> frozenset[str]:
    """The field names that differ from their alias (populate_by_name accepts both)."""
    return frozenset(n for n, f in model.model_fields.items() if f.alias is not None and f.alias != n)


class Names(NamedTuple):
    """Per model, the field names a dict must not use for the reader to take it as is."""

    cr: frozenset[str]
    spec: frozenset[str]
    package: frozenset[str]
    selector: frozenset[str]
    resources: frozenset[str]
    env: frozenset[str]
    drain: frozenset[str]


def str_map(value: Any) -> Mapping[str, str]:
    if type(value) is not dict:
        raise NotCanonical
    for k, v in value.items():
        if type(k) is not str or type(v) is not str:
            raise NotCanonical
    return value


def str_list(value: Any) -> tuple[str, ...]:
    if type(value) is not list:
        raise NotCanonical
    for v in value:
        if type(v) is not str:
            raise NotCanonical
    return tuple(value)


def flag(obj: Mapping[str, Any], key: str) -> bool:
    value = obj.get(key, False)
    if type(value) is not bool:
        raise NotCanonical
    return value


def opt_int(value: Any) -> int | None:
    if value is None or type(value) is int:
        return value
    raise NotCanonical
