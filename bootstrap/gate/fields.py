"""Reading fields of plain Kubernetes objects (JSON dicts) without trusting their shape: a
missing or mistyped field reads as empty."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def name_of(obj: Mapping[str, Any]) -> str:
    """``metadata.name``, or "" when there is none."""
    meta = obj.get("metadata")
    return str(meta.get("name", "")) if isinstance(meta, Mapping) else ""


def dict_at(obj: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    """The dict at ``keys``, or {} when any step is missing or not a mapping."""
    cur: Any = obj
    for key in keys:
        cur = cur.get(key) if isinstance(cur, Mapping) else None
    return cur if isinstance(cur, dict) else {}


def list_at(obj: Mapping[str, Any], *keys: str) -> list[Any]:
    """The list at ``keys``, or [] when any step is missing or not a mapping."""
    cur: Any = obj
    for key in keys:
        cur = cur.get(key) if isinstance(cur, Mapping) else None
    return cur if isinstance(cur, list) else []
