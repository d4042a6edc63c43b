"""DeploymentPolicy objects (both API groups): shape, and budgets within every pool's cap."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Literal

from pydantic import Field, ValidationError

from admission.budgetcaps import budget_cap_text, budget_within
from admission.crs import LaxModel, Metadata, Selector, loc_path
from admission.policy import PackagePolicy
from admission.pools import required_labels
from admission.violations import Violation


class DpBudget(LaxModel):
    percent: int | None = None
    count: int | None = None


class DpCompartment(LaxModel):
    name: str = ""
    selector: Selector = Field(default_factory=Selector)
    budget: DpBudget = Field(default_factory=DpBudget)
    strategy: dict[str, Any] | None = None


class DpDefault(LaxModel):
    budget: DpBudget = Field(default_factory=DpBudget)
    strategy: dict[str, Any] | None = None


class DpSpec(LaxModel):
    default: DpDefault | None = None
    compartments: list[DpCompartment] = Field(default_factory=list)


class DeploymentPolicyCR(LaxModel):
    api_version: str = Field(alias="apiVersion")
    kind: Literal["DeploymentPolicy"]
    metadata: Metadata = Field(default_factory=Metadata)
    spec: DpSpec = Field(default_factory=DpSpec)


_STRATEGIES = ("fixed", "linear", "exponential")


def _dp_budget(path: str, budget: DpBudget) -> Iterator[Violation]:
    if (budget.percent is None) == (budget.count is None):
        yield Violation("budget", f"{path}.budget", "set exactly one of percent or count", "keep one of them")
    elif budget.percent is not None and not 1 <= budget.percent <= 100:
        yield Violation("budget", f"{path}.budget.percent", "percent is outside 1-100", "use 1-100")
    elif budget.count is not None and budget.count < 1:
        yield Violation("budget", f"{path}.budget.count", "count is below 1", "use 1 or more")


def _dp_strategy(path: str, strategy: dict[str, Any] | None) -> Iterator[Violation]:
    chosen = [k for k in _STRATEGIES if strategy and strategy.get(k) is not None]
    if len(chosen) != 1:
        yield Violation(
            "strategy", f"{path}.strategy", "set exactly one of fixed, linear or exponential", "keep one"
        )


def could_overlap(pool: Mapping[str, str], selector: Selector) -> bool:
    """Whether some node of the pool could match ``selector`` (no label of the pool is ruled out)."""
    labels = required_labels(selector)
    if labels is None:
        return False
    if any(k in labels and labels[k] != v for k, v in pool.items()):
        return False
    for req in selector.match_expressions:
        value = pool.get(req.key)
        if value is None:
            continue
        if (req.operator == "In" and value not in req.values) or (
            req.operator == "NotIn" and value in req.values
        ):
            return False
        if req.operator == "DoesNotExist":
            return False
    return True


def deployment_policy_violations(obj: Mapping[str, Any], policies: list[PackagePolicy]) -> list[Violation]:
    """Shape checks, then every budget within the cap of every pool it could apply to."""
    try:
        dp = DeploymentPolicyCR.model_validate(obj)
    except ValidationError as exc:
        return [
            Violation("schema", loc_path(e["loc"]), e["msg"], "fix the field's type")
            for e in exc.errors(include_input=False)[:20]
        ]
    out: list[Violation] = []
    if dp.spec.default is None:
        out.append(
            Violation("default", "spec.default", "a default compartment is required", "add spec.default")
        )
    else:
        out += [
            *_dp_budget("spec.default", dp.spec.default.budget),
            *_dp_strategy("spec.default", dp.spec.default.strategy),
        ]
    names = [c.name for c in dp.spec.compartments]
    for i, comp in enumerate(dp.spec.compartments):
        path = f"spec.compartments[{i}]"
        out += [*_dp_budget(path, comp.budget), *_dp_strategy(path, comp.strategy)]
        if not comp.name or comp.name == "__default__" or names.count(comp.name) > 1:
            out.append(
                Violation(
                    "compartment-name",
                    f"{path}.name",
                    f"name {comp.name!r} is empty, reserved or repeated",
                    "give each compartment a unique name",
                )
            )
    if out:
        return out
    capped = [
        (p, p.spec.max_interruption_budget) for p in policies if p.spec.max_interruption_budget is not None
    ]
    scopes: list[tuple[str, DpBudget, Selector]] = []
    if dp.spec.default is not None:
        scopes.append(("spec.default", dp.spec.default.budget, Selector()))
    scopes += [(f"spec.compartments[{i}]", c.budget, c.selector) for i, c in enumerate(dp.spec.compartments)]
    for path, budget, selector in scopes:
        for p, cap in capped:
            if could_overlap(p.pool, selector) and not budget_within(budget.percent, budget.count, cap):
                out.append(
                    Violation(
                        "budget-cap",
                        f"{path}.budget",
                        f"exceeds the {budget_cap_text(cap)} cap of PackagePolicy {p.name}",
                        f"use a budget within {budget_cap_text(cap)} (in the same unit)",
                    )
                )
    return out
