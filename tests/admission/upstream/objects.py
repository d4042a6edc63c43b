"""Small builders for the package CRs and DeploymentPolicies of upstream's webhook unit tests
(:mod:`unit`). They are ours: upstream's e2e, sample and documentation CRs are read from the public
test data."""

from __future__ import annotations

from typing import Any


def service(*services: str) -> dict[str, Any]:
    return {"type": "service", "services": list(services)}


def uninstall(enabled: bool, apply: bool) -> dict[str, bool]:
    return {"enabled": enabled, "apply": apply}


def budget(percent: int | None = None, count: int | None = None) -> dict[str, int]:
    return {k: v for k, v in (("percent", percent), ("count", count)) if v is not None}


def fixed(**params: int) -> dict[str, Any]:
    return {"fixed": params}


def linear(**params: int) -> dict[str, Any]:
    return {"linear": params}


def exponential(**params: int) -> dict[str, Any]:
    return {"exponential": params}


def compartment(
    name: str, labels: dict[str, str], budget_: dict[str, int], strategy: Any = None
) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "selector": {"matchLabels": labels}, "budget": budget_}
    if strategy is not None:
        out["strategy"] = strategy
    return out
