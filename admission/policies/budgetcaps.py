"""Interruption budgets against a PackagePolicy's cap (maxInterruptionBudget)."""

from __future__ import annotations

from admission.reading.policy import Budget


def budget_within(percent: int | None, count: int | None, cap: Budget) -> bool:
    """Whether a budget is provably within a cap without knowing the pool's size. The operator's
    ceiling for a percent budget is max(1, floor(nodes * percent / 100)), so one node at a time
    is within every percent cap; other mixes of units cannot be compared and do not pass."""
    if cap.percent is not None:
        return (percent is not None and percent <= cap.percent) or count == 1
    return count is not None and cap.count is not None and count <= cap.count


def budget_cap_text(cap: Budget) -> str:
    return f"{cap.percent}%" if cap.percent is not None else f"{cap.count} nodes"
