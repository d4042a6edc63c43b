"""The policy rules: what one PackagePolicy forbids in a package CR (registries, digest pinning,
interrupts, budget caps, runtime-required, secret env, agent image override, priority).

Each rule reads a :class:`~admission.crs.CrView` and a :class:`~admission.compiled.CompiledPolicy`
and appends what it finds. :func:`compile_policy` keeps, per policy, only the rules that can find
something with it; :func:`compiled_violations` first asks the quick pass (each rule's condition
for a violation, negated, in one pass over the CR) and runs the rules only when it says no.
"""

from __future__ import annotations

from admission.budgetcaps import budget_cap_text, budget_within
from admission.checks.interrupts import INTERRUPT_TYPE_SET
from admission.compiled import CompiledPolicy, PolicyRule, registry_ok
from admission.crs import CrView, PackageView
from admission.images import ImageError, ImageRef, parse_image, parse_prefix
from admission.policy import PackagePolicy
from admission.violations import Violation


def prule_registries(cr: CrView, policy: CompiledPolicy, out: list[Violation]) -> None:
    if policy.bad_prefix is not None:
        out.append(policy.bad_prefix)
        return
    for pkg in cr.packages:
        for field_name, value in (("image", pkg.image), ("agentImageOverride", pkg.agent_image_override)):
            if value and registry_ok(policy, value) is False:
                out.append(
                    Violation(
                        "registry",
                        f"{pkg.path}.{field_name}",
                        f"{parse_image(value).repository} is not under an allowed registry",
                        policy.registry_fix,
                    )
                )


def prule_digest(cr: CrView, policy: CompiledPolicy, out: list[Violation]) -> None:
    if not policy.require_digest:
        return
    for pkg in cr.packages:
        if not pkg.container_sha:
            out.append(
                Violation(
                    "require-digest",
                    f"{pkg.path}.containerSHA",
                    "the pool requires images pinned by digest",
                    "set containerSHA to the image's sha256 digest",
                )
            )


def _interrupts(pkg: PackageView) -> list[tuple[str, str]]:
    """(field path of the interrupt, its type): the package's interrupt, then configInterrupts."""
    found = [(f"{pkg.path}.interrupt", pkg.interrupt)] if pkg.interrupt is not None else []
    found += [(f"{pkg.path}.configInterrupts.{glob}", kind) for glob, kind in pkg.config_interrupts]
    return found


def prule_interrupts(cr: CrView, policy: CompiledPolicy, out: list[Violation]) -> None:
    allowed = policy.allowed_interrupts
    if cr.interrupt_kinds <= allowed:
        return
    for pkg in cr.packages:
        out.extend(
            Violation(
                "interrupt-allowed",
                f"{where}.type",
                f"interrupt {kind!r} is not allowed in this pool",
                policy.interrupts_fix,
            )
            for where, kind in _interrupts(pkg)
            if kind in INTERRUPT_TYPE_SET and kind not in allowed
        )


def prule_budget(cr: CrView, policy: CompiledPolicy, out: list[Violation]) -> None:
    cap = policy.cap
    if cap is None or cr.deployment_policy:
        return  # DeploymentPolicies are judged against the caps of every pool they apply to
    budget = cr.budget
    if budget is None:
        out.append(
            Violation(
                "budget-cap",
                "spec.interruptionBudget",
                "no budget means 100% of the pool at once",
                f"set a budget within {budget_cap_text(cap)}",
            )
        )
    elif not budget_within(budget[0], budget[1], cap):
        unit = (
            f"percent <= {cap.percent} (or count: 1)" if cap.percent is not None else f"count <= {cap.count}"
        )
        out.append(
            Violation(
                "budget-cap",
                "spec.interruptionBudget",
                f"budget exceeds the pool's {budget_cap_text(cap)}",
                f"use {unit}",
            )
        )


def prule_runtime_required(cr: CrView, policy: CompiledPolicy, out: list[Violation]) -> None:
    if policy.allow_runtime_required:
        return
    for field_name, on in (
        ("runtimeRequired", cr.runtime_required),
        ("autoTaintNewNodes", cr.auto_taint_new_nodes),
    ):
        if on:
            out.append(
                Violation(
                    "runtime-required",
                    f"spec.{field_name}",
                    "this pool does not allow gating its nodes on this CR",
                    f"remove {field_name} or use a pool whose policy allows it",
                )
            )


def prule_secret_env(cr: CrView, policy: CompiledPolicy, out: list[Violation]) -> None:
    if policy.allow_secret_env:
        return
    for pkg in cr.packages:
        for i in pkg.value_from:
            out.append(
                Violation(
                    "secret-env",
                    f"{pkg.path}.env[{i}].valueFrom",
                    "valueFrom reads Secrets/ConfigMaps of the operator namespace into a root pod",
                    "pass a literal value, or use a pool that allows secret env",
                )
            )


def prule_agent_override(cr: CrView, policy: CompiledPolicy, out: list[Violation]) -> None:
    if policy.allow_agent_image_override:
        return
    for pkg in cr.packages:
        if pkg.agent_image_override:
            out.append(
                Violation(
                    "agent-override",
                    f"{pkg.path}.agentImageOverride",
                    "replaces the trusted privileged agent",
                    "remove agentImageOverride",
                )
            )


def prule_priority(cr: CrView, policy: CompiledPolicy, out: list[Violation]) -> None:
    bounds = policy.priority
    if bounds is None:
        return
    p = cr.priority
    if p < bounds.min or (bounds.max is not None and p > bounds.max):
        out.append(
            Violation(
                "priority",
                "spec.priority",
                f"priority {p} is outside {bounds.min}-{bounds.max or 'any'}",
                f"use a priority from {bounds.min}{f' to {bounds.max}' if bounds.max else ' up'}",
            )
        )


POLICY_RULES: tuple[PolicyRule, ...] = (
    prule_registries,
    prule_digest,
    prule_interrupts,
    prule_budget,
    prule_runtime_required,
    prule_secret_env,
    prule_agent_override,
    prule_priority,
)


def compile_policy(policy: PackagePolicy) -> CompiledPolicy:
    spec = policy.spec
    prefixes: list[ImageRef] = []
    bad = None
    for entry in spec.images.registries:
        try:
            prefixes.append(parse_prefix(entry))
        except ImageError as exc:
            bad = bad or Violation(
                "registry",
                f"PackagePolicy {policy.name}",
                f"the policy's registry allowlist is invalid: {exc}",
                "fix spec.images.registries of the PackagePolicy",
            )
    return CompiledPolicy(
        policy=policy,
        name=policy.name,
        pool=frozenset(policy.pool.items()),
        prefixes=tuple(prefixes),
        bad_prefix=bad,
        registry_fix=f"use an image from {', '.join(spec.images.registries) or '(none allowed)'}",
        require_digest=spec.images.require_digest,
        allowed_interrupts=frozenset(spec.interrupts.allowed),
        interrupts_fix=f"use one of {', '.join(spec.interrupts.allowed)}",
        cap=spec.max_interruption_budget,
        allow_runtime_required=spec.allow_runtime_required,
        allow_secret_env=spec.allow_secret_env,
        allow_agent_image_override=spec.allow_agent_image_override,
        priority=spec.priority,
        checks=tuple(
            rule
            for rule, applies in (
                (prule_registries, True),
                (prule_digest, spec.images.require_digest),
                (prule_interrupts, True),
                (prule_budget, spec.max_interruption_budget is not None),
                (prule_runtime_required, not spec.allow_runtime_required),
                (prule_secret_env, not spec.allow_secret_env),
                (prule_agent_override, not spec.allow_agent_image_override),
                (prule_priority, spec.priority is not None),
            )
            if applies
        ),
    )


def compiled_violations(cr: CrView, policy: CompiledPolicy) -> list[Violation]:
    """What the policy's rules find in the CR, rule by rule."""
    if _nothing_to_find(cr, policy):
        return []
    out: list[Violation] = []
    for rule in policy.checks:
        rule(cr, policy, out)
    return out


def _nothing_to_find(cr: CrView, p: CompiledPolicy) -> bool:
    """True only when no policy rule would find anything: each rule's condition for a violation,
    negated, in one pass (the usual CR). False sends the CR through the rules themselves."""
    if p.bad_prefix is not None or not cr.interrupt_kinds <= p.allowed_interrupts:
        return False
    for pkg in cr.packages:
        agent = pkg.agent_image_override
        if (
            (pkg.image and registry_ok(p, pkg.image) is False)
            or (agent and (not p.allow_agent_image_override or registry_ok(p, agent) is False))
            or (p.require_digest and not pkg.container_sha)
            or (pkg.value_from and not p.allow_secret_env)
        ):
            return False
    cap, bounds = p.cap, p.priority
    if (
        cap is not None
        and not cr.deployment_policy
        and (cr.budget is None or not budget_within(*cr.budget, cap))
    ):
        return False
    if (cr.runtime_required or cr.auto_taint_new_nodes) and not p.allow_runtime_required:
        return False
    return bounds is None or not (
        cr.priority < bounds.min or (bounds.max is not None and cr.priority > bounds.max)
    )
