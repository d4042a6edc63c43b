"""Small builders for the package CRs of upstream's tests.

PENDING SHARED DATA (issue 31): ``GAME`` and ``UI`` are the text of two configMap files of
upstream's e2e CRs; they go with those CRs (``shared_data_wanted.json``). The builders are ours.
"""

from __future__ import annotations

from typing import Any

from tests.admission.upstream.model import AGENTLESS

# The two configMap files several e2e tests give their packages.
GAME = "enemies=aliens\nlives=3\nenemies.cheat=true\nenemies.cheat.level=noGoodRotten\n"
UI = "color.good=purple\ncolor.bad=yellow\nallow.textmode=true\nhow.nice.to.look=fairlyNice\n"
GAME_UI = {"game.properties": GAME, "ui.properties": UI}


def pkg(version: str, image: str = AGENTLESS, **fields: Any) -> dict[str, Any]:
    return {"version": version, "image": image, **fields}


def with_fields(package: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """The package with more fields (for fields chosen at run time)."""
    return {**package, **fields}


def env(**values: str) -> list[dict[str, str]]:
    return [{"name": k, "value": v} for k, v in values.items()]


def sleep(seconds: int) -> list[dict[str, str]]:
    return env(SLEEP_LEN=str(seconds))


def service(*services: str) -> dict[str, Any]:
    return {"type": "service", "services": list(services)}


REBOOT = {"type": "reboot"}


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
