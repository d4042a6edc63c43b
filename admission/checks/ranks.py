"""The structural rules in the order a decision lists them.

Each violation found while reading carries the rank of its rule; a stable sort by rank gives the
order of checking the rules one after the other, each rule in package order. The hold-taint
toleration comes last and is applied after reading (its key is the webhook's setting).
"""

from __future__ import annotations

from admission.violations import Violation

SELECTOR, PACKAGE_NAME, SEMVER, IMAGE, DEPENDS_ON, RESOURCES, UNINSTALL, INTERRUPTS, BUDGET, TOLERATIONS = (
    range(10)
)

# The violations found so far, each with the rank of its rule.
Found = list[tuple[int, Violation]]
