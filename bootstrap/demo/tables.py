"""Lists as the API server answers them, for ``kubectl get`` against the emulated API: a list
names its kind (``NodeAttestationList``), its apiVersion and a resourceVersion; and asked with
``Accept: application/json;as=Table;v=v1;g=meta.k8s.io`` (what kubectl sends), a
``meta.k8s.io/v1`` Table whose columns are the CRD's printer columns, after Name, with date
columns as ages the way apiextensions-apiserver's table convertor renders them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

# The NodeAttestation CRD's additionalPrinterColumns (charts/nodegate/crds/; a test keeps them equal).
NODEATTESTATION_COLUMNS: Final = (
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Reason", "type": "string", "jsonPath": ".status.reason"},
    {"name": "SPIFFE-ID", "type": "string", "jsonPath": ".spec.spiffeId"},
    {"name": "Attested", "type": "date", "jsonPath": ".status.attestedAt"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
)
# Without printer columns the API server shows Name and Age.
_DEFAULT: Final = ({"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},)


def wants_table(accept: str) -> bool:
    first = accept.split(",", 1)[0]
    params = {p.strip() for p in first.split(";")[1:]}
    return "as=Table" in params and "g=meta.k8s.io" in params


def as_list(out: dict[str, Any], kind: str, api_version: str, resource_version: str) -> dict[str, Any]:
    out["kind"] = f"{kind}List"
    out["apiVersion"] = api_version
    out["metadata"] = {**(out.get("metadata") or {}), "resourceVersion": resource_version}
    return out  # key order: kind and apiVersion first would only be cosmetic


def _at(obj: Mapping[str, Any], path: str) -> Any:
    value: Any = obj
    for part in path.strip(".").split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def age(value: object, now: datetime) -> str:
    """As apimachinery's ConvertToHumanReadableDateType: ``<unknown>`` for none, else the
    HumanDuration steps (seconds below 2m, m+s below 10m, hours and days, then years)."""
    if not isinstance(value, str):
        return "<unknown>"
    try:
        then = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return "<invalid>"
    seconds = int((now - then).total_seconds())
    if seconds < -1:
        return "<invalid>"
    seconds = max(seconds, 0)
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if hours < 24 * 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if days < 365 * 2:
        return f"{days}d"
    if days < 365 * 8:
        return f"{days // 365}y{days % 365}d" if days % 365 else f"{days // 365}y"
    return f"{days // 365}y"


def table(
    items: Sequence[Mapping[str, Any]],
    columns: Sequence[Mapping[str, str]] | None,
    resource_version: str,
    now: datetime | None = None,
) -> dict[str, Any]:
    now = now or datetime.now(UTC)
    cols = tuple(columns) if columns else _DEFAULT
    definitions = [{"name": "Name", "type": "string", "format": "name", "description": "", "priority": 0}]
    definitions += [
        {"name": c["name"], "type": c["type"], "format": "", "description": "", "priority": 0} for c in cols
    ]
    rows = []
    for obj in items:
        meta = obj.get("metadata") or {}
        cells: list[Any] = [meta.get("name", "")]
        for c in cols:
            value = _at(obj, c["jsonPath"])
            cells.append(age(value, now) if c["type"] == "date" else ("" if value is None else value))
        rows.append(
            {
                "cells": cells,
                "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta},
            }
        )
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": definitions,
        "rows": rows,
    }
