"""DeploymentPolicy objects (both API groups): NodeWright's own rules on their shape, and budgets
within every pool's cap.

NodeWright's rules: the default budget has exactly one of percent or count; a strategy, where
given, has exactly one of fixed, linear, exponential (a compartment may leave it out); a
compartment's name is neither ``__default__`` nor one used before; its budget as the default's;
its selector converts to a label selector; no two compartments have identical selectors
(compared as given: the same requirements in another order are not identical, overlapping ones
are allowed). Refusing a DELETE of a policy that Skyhooks still use needs the cluster and is left
to NodeWright's webhook.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Literal

from pydantic import Field, ValidationError

from admission.policies.budgetcaps import budget_cap_text, budget_within
from admission.policies.pools import required_labels
from admission.reading.crs import LaxModel, Metadata, Selector
from admission.reading.policy import PackagePolicy
from admission.syntax.labels import selector_problems
from admission.violations import Violation
from attest import validation


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
_SELECTOR_FIX = "use a label selector Kubernetes accepts"


def _dp_budget(path: str, budget: DpBudget) -> Iterator[Violation]:
    if budget.percent is None and budget.count is None:
        yield Violation("budget", f"{path}.budget", "set exactly one of percent or count", "add one of them")
    elif budget.percent is not None and budget.count is not None:
        yield Violation(
            "budget", f"{path}.budget", "percent and count are mutually exclusive", "keep one of them"
        )
    # The CRD's bounds, so that the caps below compare meaningful budgets.
    elif budget.percent is not None and not 1 <= budget.percent <= 100:
        yield Violation("budget", f"{path}.budget.percent", "percent is outside 1-100", "use 1-100")
    elif budget.count is not None and budget.count < 1:
        yield Violation("budget", f"{path}.budget.count", "count is below 1", "use 1 or more")


def _dp_strategy(path: str, strategy: dict[str, Any] | None) -> Iterator[Violation]:
    if strategy is None:
        return  # optional to NodeWright's webhook (its CRD requires the default's)
    chosen = [k for k in _STRATEGIES if strategy.get(k) is not None]
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
            Violation("schema", where or "<root>", what, "fix the field's type")
            for where, what in validation.pairs(exc, DeploymentPolicyCR)
        ]
    out = _shape(obj, dp)
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


def _shape(obj: Mapping[str, Any], dp: DeploymentPolicyCR) -> list[Violation]:
    """NodeWright's own rules on the policy's shape."""
    default = dp.spec.default or DpDefault()
    out = [*_dp_budget("spec.default", default.budget), *_dp_strategy("spec.default", default.strategy)]
    spec = obj.get("spec")
    raw = spec.get("compartments") if isinstance(spec, Mapping) else None
    raw_compartments = raw if isinstance(raw, list) else []
    seen: dict[str, int] = {}
    selectors: list[tuple[str, Any]] = []
    for i, comp in enumerate(dp.spec.compartments):
        path = f"spec.compartments[{i}]"
        if not comp.name or comp.name == "__default__" or comp.name in seen:
            out.append(
                Violation(
                    "compartment-name",
                    f"{path}.name",
                    f"name {comp.name!r} is empty, reserved or used before",
                    "give each compartment a unique name other than __default__",
                )
            )
        seen.setdefault(comp.name, i)
        out += [*_dp_budget(path, comp.budget), *_dp_strategy(path, comp.strategy)]
        sel = comp.selector
        expressions = [(r.key, r.operator, tuple(r.values)) for r in sel.match_expressions]
        out += [
            Violation(
                "selector", f"{path}.selector.{where}", problem, "use a label selector Kubernetes accepts"
            )
            for where, problem in selector_problems(sel.match_labels, expressions)
        ]
        # As given, like NodeWright's deep comparison of the decoded selectors (absent and {} are
        # the same, an empty matchLabels map is not an absent one).
        given = raw_compartments[i].get("selector") if i < len(raw_compartments) else None
        given = given if isinstance(given, dict) and given else None
        twin = next((name for name, other in selectors if other == given), None)
        if twin is not None:
            out.append(
                Violation(
                    "compartment-selector",
                    f"{path}.selector",
                    f"identical to the selector of compartment {twin!r}",
                    "merge the two compartments or tell their selectors apart",
                )
            )
        selectors.append((comp.name, given))
    return out
