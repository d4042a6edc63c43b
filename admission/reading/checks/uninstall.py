"""A package's uninstall: apply needs enabled (rule "uninstall"). NodeWright's rules on removing
or downgrading a package before its uninstall finished are :func:`admission.reading.changes.update_rules`."""

from __future__ import annotations

from typing import Any

from admission.reading.checks.ranks import UNINSTALL, Found
from admission.reading.checks.values import NotCanonical, flag
from admission.violations import Violation


def read_uninstall(value: Any) -> tuple[bool, bool] | None:
    """(enabled, apply), or None without an uninstall."""
    if value is None:
        return None
    if type(value) is not dict:
        raise NotCanonical
    return flag(value, "enabled"), flag(value, "apply")


def uninstall_rules(path: str, uninstall: tuple[bool, bool], found: Found) -> None:
    """The uninstall of the package at ``path``."""
    enabled, apply = uninstall
    if apply and not enabled:
        found.append(
            (
                UNINSTALL,
                Violation(
                    "uninstall",
                    f"{path}.uninstall.apply",
                    "apply needs enabled",
                    "set uninstall.enabled: true",
                ),
            )
        )
