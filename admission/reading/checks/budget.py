"""spec.interruptionBudget: not both percent and count, and neither together with a
deploymentPolicy (rule "budget"). An empty budget is valid (NodeWright's own re-encoding writes
``interruptionBudget: {}``). Whether a budget fits a pool's cap is a policy rule."""

from __future__ import annotations

from typing import Any

from admission.reading.checks.ranks import BUDGET, Found
from admission.reading.checks.values import NotCanonical, opt_int
from admission.violations import Violation


def read_budget(
    value: Any, deployment_policy: str | None, found: Found
) -> tuple[int | None, int | None] | None:
    """(percent, count), or None when neither is set."""
    if value is None:
        return None
    if type(value) is not dict:
        raise NotCanonical
    percent, count = opt_int(value.get("percent")), opt_int(value.get("count"))
    if percent is not None and count is not None:
        found.append(
            (
                BUDGET,
                Violation(
                    "budget",
                    "spec.interruptionBudget",
                    "percent and count cannot be set at the same time",
                    "keep one of them",
                ),
            )
        )
    # The CRD's bounds, so that a budget the cap rules compare is always a meaningful one.
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
    if deployment_policy and (percent is not None or count is not None):
        found.append(
            (
                BUDGET,
                Violation(
                    "budget",
                    "spec.deploymentPolicy",
                    "deploymentPolicy and interruptionBudget are mutually exclusive",
                    "keep one of them",
                ),
            )
        )
    return None if percent is None and count is None else (percent, count)
