"""spec.interruptionBudget: exactly one of percent or count, in range, and not together with a
deploymentPolicy (rule "budget"). Whether it fits a pool's cap is a policy rule."""

from __future__ import annotations

from typing import Any

from admission.checks.ranks import BUDGET, Found
from admission.checks.values import NotCanonical, opt_int
from admission.violations import Violation


def read_budget(
    value: Any, deployment_policy: str | None, found: Found
) -> tuple[int | None, int | None] | None:
    """(percent, count), or None without a budget."""
    if value is None:
        return None
    if type(value) is not dict:
        raise NotCanonical
    percent, count = opt_int(value.get("percent")), opt_int(value.get("count"))
    if (percent is None) == (count is None):
        found.append(
            (
                BUDGET,
                Violation(
                    "budget",
                    "spec.interruptionBudget",
                    "set exactly one of percent or count",
                    "keep one of them",
                ),
            )
        )
    if percent is not None and not 0 <= percent <= 100:
        found.append(
            (
                BUDGET,
                Violation(
                    "budget", "spec.interruptionBudget.percent", "percent is outside 0-100", "use 0-100"
                ),
            )
        )
    if count is not None and count < 0:
        found.append(
            (
                BUDGET,
                Violation("budget", "spec.interruptionBudget.count", "count is negative", "use 0 or more"),
            )
        )
    if deployment_policy:
        found.append(
            (
                BUDGET,
                Violation(
                    "budget",
                    "spec.deploymentPolicy",
                    "interruptionBudget and deploymentPolicy exclude each other",
                    "keep one of them",
                ),
            )
        )
    return percent, count
