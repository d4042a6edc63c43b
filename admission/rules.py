"""Checks on NodeWright / Skyhook package CRs: CR (+ policies) -> violations. Pure functions.

Two layers of small named rules:

* structural rules hold for every CR whatever the policy (names, semver, tags, digests, the
  dependency graph, resources, uninstall, budget shape, tolerations, the hold-taint toleration);
  they are applied while the CR is read (:mod:`admission.structural`), in one pass;
* policy rules hold for one PackagePolicy (pool containment, registries, digest pinning,
  interrupts, budget caps, runtime-required, secret env, agent image override, priority).

Each violation names its rule, the field path, what is wrong and a one-line fix. Who may use
which policy (RBAC) is decided elsewhere; :func:`policy_verdicts` gives, per candidate policy,
what would still be violated, so the authorizer can pick the first the requester may use.

The rules read a :class:`~admission.crs.CrView` (the webhook reads one straight from the review)
and a :class:`CompiledPolicy` (a PackagePolicy with its allowlist parsed and its texts built
once, when it loads). The public functions also take the pydantic models.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from admission.crs import (
    PACKAGE_GROUPS,
    CrView,
    PackageCR,
    PackageView,
    Selector,
    packages_equal,
    parse_package_cr,
    specs_equal,
)
from admission.images import ImageError, ImageRef, allowed_by, parse_image, parse_prefix
from admission.policy import Budget, PackagePolicy, PriorityBounds
from admission.structural import INTERRUPT_TYPE_SET, read_package_cr, view_of
from admission.violations import Violation

__all__ = [  # re-exported
    "PACKAGE_GROUPS",
    "CrView",
    "PackageCR",
    "Selector",
    "Violation",
    "parse_package_cr",
    "read_package_cr",
]

HOLD_TAINT_KEY = "nodegate.io/hold"


def _view(cr: PackageCR | CrView) -> CrView:
    return cr if isinstance(cr, CrView) else view_of(cr)


# ------------------------------------------------------------------------------------------
# Structural rules


def structural_violations(cr: PackageCR | CrView, hold_taint_key: str = HOLD_TAINT_KEY) -> list[Violation]:
    """Every structural violation, rule by rule in a fixed order, each rule in package order."""
    view = _view(cr)
    out = [v for _rank, v in view.found] if view.found else []
    if view.runtime_required:
        hold = _hold_toleration(view, hold_taint_key)
        if hold is not None:
            out.append(hold)
    return out


def _hold_toleration(cr: CrView, hold: str) -> Violation | None:
    """Runtime-required packages run on held nodes, so they must tolerate the hold taint while
    its reason is packages-pending (an Equal toleration for another reason would never match)."""
    if not cr.runtime_required:
        return None
    for key, operator, value, effect in cr.tolerations:
        if key != hold or effect not in (None, "", "NoSchedule"):
            continue
        if operator == "Exists" or (operator in ("Equal", None) and value == "packages-pending"):
            return None
    return Violation(
        "hold-toleration",
        "spec.additionalTolerations",
        f"a runtimeRequired CR must tolerate the {hold} taint (nodes are held until it completes)",
        f"add {{key: {hold}, operator: Exists, effect: NoSchedule}}",
    )


def _interrupts(pkg: PackageView) -> list[tuple[str, str]]:
    """(field path of the interrupt, its type): the package's interrupt, then configInterrupts."""
    found = [(f"{pkg.path}.interrupt", pkg.interrupt)] if pkg.interrupt is not None else []
    found += [(f"{pkg.path}.configInterrupts.{glob}", kind) for glob, kind in pkg.config_interrupts]
    return found


# ------------------------------------------------------------------------------------------
# Pools


def _required(
    labels: Mapping[str, str], expressions: Iterable[tuple[str, str, Iterable[str]]]
) -> Mapping[str, str] | None:
    out: dict[str, str] | None = None
    for key, operator, values in expressions:
        if operator == "In":
            single = tuple(values)
            if len(single) == 1:
                value = single[0]
                if out is None:
                    out = dict(labels)
                if out.get(key, value) != value:
                    return None
                out[key] = value
    return labels if out is None else out


def required_labels(selector: Selector) -> dict[str, str] | None:
    """The labels every selected node must carry (matchLabels and single-value In), or None when
    the selector contradicts itself and selects nothing."""
    found = _required(
        selector.match_labels, ((r.key, r.operator, r.values) for r in selector.match_expressions)
    )
    return None if found is None else dict(found)


def _contains(pool: Mapping[str, str], labels: Mapping[str, str] | None) -> bool:
    if labels is None:
        return True  # selects nothing; structural checks do not need to care
    return pool.items() <= labels.items()  # every label of the pool, with its value


def pool_contains(pool: Mapping[str, str], selector: Selector) -> bool:
    """Every node the selector can match carries all the pool's labels. An empty selector (every
    node) is only inside the pool of every node."""
    if not selector.match_labels and not selector.match_expressions:
        return not pool
    return _contains(pool, required_labels(selector))


def required_labels_of(cr: CrView) -> Mapping[str, str] | None:
    """:func:`required_labels` of the CR's selector (for :meth:`CompiledPolicy.contains`)."""
    return None if cr.selector_empty else _required(cr.match_labels, cr.match_expressions)


# ------------------------------------------------------------------------------------------
# Compiled policies


@dataclass(frozen=True, slots=True)
class CompiledPolicy:
    """A PackagePolicy as the rules use it, computed once when the policy loads."""

    policy: PackagePolicy
    name: str
    pool: frozenset[tuple[str, str]]  # its labels
    prefixes: tuple[ImageRef, ...]
    bad_prefix: Violation | None  # an allowlist entry that does not parse: the policy admits nothing
    registry_fix: str
    require_digest: bool
    allowed_interrupts: frozenset[str]
    interrupts_fix: str
    cap: Budget | None
    allow_runtime_required: bool
    allow_secret_env: bool
    allow_agent_image_override: bool
    priority: PriorityBounds | None
    checks: tuple[PolicyRule, ...]  # the policy rules that can find something with this policy
    # image reference -> under an allowed registry (None: not a reference); a memo of a pure
    # function, bounded, like the parsers' caches
    images: dict[str, bool | None] = field(default_factory=dict, compare=False, repr=False)

    def contains(self, cr: CrView, labels: Mapping[str, str] | None) -> bool:
        """Whether the pool contains the CR's selector (``labels``: :func:`required_labels_of`)."""
        if cr.selector_empty:
            return not self.pool
        return labels is None or labels.items() >= self.pool  # None: selects nothing


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


def _compiled(policy: PackagePolicy | CompiledPolicy) -> CompiledPolicy:
    return policy if isinstance(policy, CompiledPolicy) else compile_policy(policy)


# ------------------------------------------------------------------------------------------
# Policy rules


PolicyRule = Callable[[CrView, CompiledPolicy, list[Violation]], None]


_MAX_IMAGES = 4096


def _registry_ok(policy: CompiledPolicy, image: str) -> bool | None:
    """Whether ``image`` is under one of the policy's registries; None when it does not parse."""
    memo = policy.images
    if image in memo:
        return memo[image]
    try:
        ref = parse_image(image)
        ok: bool | None = any(allowed_by(ref, p) for p in policy.prefixes)
    except ImageError:
        ok = None  # structural rules report it
    if len(memo) >= _MAX_IMAGES:
        memo.clear()
    memo[image] = ok
    return ok


def prule_registries(cr: CrView, policy: CompiledPolicy, out: list[Violation]) -> None:
    if policy.bad_prefix is not None:
        out.append(policy.bad_prefix)
        return
    for pkg in cr.packages:
        for field_name, value in (("image", pkg.image), ("agentImageOverride", pkg.agent_image_override)):
            if value and _registry_ok(policy, value) is False:
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


def budget_within(percent: int | None, count: int | None, cap: Budget) -> bool:
    """Whether a budget is provably within a cap without knowing the pool's size. The operator's
    ceiling for a percent budget is max(1, floor(nodes * percent / 100)), so one node at a time
    is within every percent cap; other mixes of units cannot be compared and do not pass."""
    if cap.percent is not None:
        return (percent is not None and percent <= cap.percent) or count == 1
    return count is not None and cap.count is not None and count <= cap.count


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


def budget_cap_text(cap: Any) -> str:
    return f"{cap.percent}%" if cap.percent is not None else f"{cap.count} nodes"


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


@dataclass(frozen=True, slots=True)
class PolicyVerdict:
    policy: str
    violations: tuple[Violation, ...]
    reboot: bool  # the CR asks for reboot interrupts: the requester also needs verb "reboot"

    @property
    def ok(self) -> bool:
        return not self.violations


def policy_violations(cr: PackageCR | CrView, policy: PackagePolicy | CompiledPolicy) -> list[Violation]:
    return compiled_violations(_view(cr), _compiled(policy))


def compiled_violations(cr: CrView, policy: CompiledPolicy) -> list[Violation]:
    """:func:`policy_violations` of a view and a compiled policy."""
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
            (pkg.image and _registry_ok(p, pkg.image) is False)
            or (agent and (not p.allow_agent_image_override or _registry_ok(p, agent) is False))
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


def uses_reboot(cr: PackageCR | CrView) -> bool:
    return _view(cr).reboot


def candidates(cr: CrView, policies: Iterable[CompiledPolicy]) -> list[CompiledPolicy]:
    """The compiled policies whose pool contains the CR's selector, in the given order."""
    labels = required_labels_of(cr)
    return [p for p in policies if p.contains(cr, labels)]


def candidate_policies(cr: PackageCR | CrView, policies: list[PackagePolicy]) -> list[PackagePolicy]:
    """The policies whose pool contains the CR's selector, in name order."""
    compiled = sorted((compile_policy(p) for p in policies), key=lambda c: c.name)
    return [c.policy for c in candidates(_view(cr), compiled)]


def policy_verdicts(cr: PackageCR | CrView, policies: list[PackagePolicy]) -> list[PolicyVerdict]:
    """One verdict per policy whose pool contains the CR's selector, in name order."""
    view = _view(cr)
    compiled = sorted((compile_policy(p) for p in policies), key=lambda c: c.name)
    return [
        PolicyVerdict(c.name, tuple(policy_violations(view, c)), view.reboot)
        for c in candidates(view, compiled)
    ]


def no_pool_violation(cr: PackageCR | CrView) -> Violation:
    labels = _view(cr).match_labels
    return Violation(
        "pool",
        "spec.nodeSelectors",
        "no PackagePolicy's pool contains this selector" + (" (empty: every node)" if not labels else ""),
        "select nodes by the labels of a pool you may deploy to",
    )


# ------------------------------------------------------------------------------------------
# UPDATE and DELETE of package CRs


def spec_changed(old: PackageCR | CrView, new: PackageCR | CrView) -> bool:
    """Whether anything the operator acts on changed (spec, pause/disable annotations)."""
    old_view, new_view = _view(old), _view(new)
    return _gates(old_view) != _gates(new_view) or not specs_equal(old_view, new_view)


_GATES = tuple(f"{g}/{k}" for g in PACKAGE_GROUPS for k in ("pause", "disable"))  # annotations


def _gates(cr: CrView) -> tuple[str | None, ...]:
    return tuple(map(cr.annotations.get, _GATES))


def new_reboots(old: PackageCR | CrView | None, new: PackageCR | CrView) -> list[str]:
    """Packages whose reboot interrupt this change would fire: packages with a reboot interrupt
    that are new, or differ in any field from before (a version bump re-runs and reboots)."""
    view = _view(new)
    if not view.reboot:
        return []
    before = {} if old is None else _view(old).by_key
    out = []
    for pkg in view.packages:
        if pkg.reboot:
            prior = before.get(pkg.key)
            if prior is None or not packages_equal(prior, pkg):
                out.append(pkg.key)
    return out


def delete_violations(old: Mapping[str, Any]) -> list[Violation]:
    """Upstream's rule: a CR that is paused or disabled cannot run its pending uninstalls, so
    deleting it would strand them (the operator blocks the finalizer; we refuse up front)."""
    cr = read_package_cr(old)
    if isinstance(cr, list):
        return []  # nothing we understand to protect; RBAC on delete still applies
    gate = next(
        (k for g in PACKAGE_GROUPS for k in ("pause", "disable") if cr.annotations.get(f"{g}/{k}") == "true"),
        None,
    )
    if gate is None:
        return []
    uninstalling = {p.key for p in cr.packages if p.uninstall is not None and p.uninstall[0]}
    node_state = old.get("status", {}).get("nodeState", {}) if isinstance(old.get("status"), Mapping) else {}
    pending = sorted(
        {
            str(entry).split("|", 1)[0]
            for states in node_state.values()
            if isinstance(states, Mapping)
            for entry in states
        }
        & uninstalling
    )
    if not pending:
        return []
    return [
        Violation(
            "delete-pending-uninstall",
            "metadata.annotations",
            f"the CR is {'paused' if gate == 'pause' else 'disabled'} with uninstalls pending on nodes "
            f"({', '.join(pending)})",
            f"remove the {gate} annotation so the uninstalls run, then delete",
        )
    ]
