"""The structural rules in the order a decision lists them: NodeWright's own order of checking.

Each violation found while reading carries the rank of its rule; a stable sort by rank gives the
order of checking the rules one after the other, each rule in package order.
"""

from __future__ import annotations

from admission.violations import Violation

BUDGET, DURATIONS, SELECTOR, PACKAGE_NAME, INTERRUPTS, IMAGE, SEMVER, RESOURCES, UNINSTALL, DEPENDS_ON = (
    range(10)
)

# The violations found so far, each with the rank of its rule.
Found = list[tuple[int, Violation]]
