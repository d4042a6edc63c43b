"""The policy rules: what one PackagePolicy forbids in a package CR (registries of the images the
operator will pull, digest pinning, tags, strict versions, interrupts, budget caps,
runtime-required, secret env, agent image override, priority).

Each rule reads a :class:`~admission.reading.crs.CrView` and a
:class:`~admission.policies.compiled.CompiledPolicy` and appends what it finds.
:func:`compile_policy` keeps, per policy, only the rules that can find something with it;
:func:`compiled_violations` first asks the quick pass (each rule's condition for a violation,
negated, in one pass over the CR) and runs the rules only when it says no.
"""

from __future__ import annotations

from admission.policies.budgetcaps import budget_cap_text, budget_within
from admission.policies.compiled import CompiledPolicy, PolicyRule, registry_ok
from admission.reading.checks.images import valid_digest
from admission.reading.checks.interrupts import INTERRUPT_TYPE_SET
from admission.reading.crs import CrView, PackageView
from admission.reading.policy import ANY_REGISTRY, PackagePolicy
from admission.syntax.images import ImageError, ImageRef, parse_image, parse_prefix, pulled_repository
from admission.syntax.versions import strict_semver
from admission.violations import Violation


def _repository_text(image: str) -> str:
    try:
        return parse_image(image).repository
    except ImageError:
        return repr(image)


def prule_registries(cr: CrView, policy: CompiledPolicy, out: list[Violation]) -> None:
    if policy.bad_prefix is not None:
        out.append(policy.bad_prefix)
        return
    group = cr.group
    for pkg in cr.packages:
        # What the operator pulls: the image as it decodes it (with version or containerSHA),
        # and the agent image override as given.
        pulled = [("image", pulled_repository(pkg.image or "", group))]
        if pkg.agent_image_override:
            pulled.append(("agentImageOverride", pkg.agent_image_override))
        for field_name, value in pulled:
            if not registry_ok(policy, value):
                out.append(
                    Violation(
                        "registry",
                        f"{pkg.path}.{field_name}",
                        f"{_repository_text(value)} is not under an allowed registry"
                        + (f" (the operator pulls {value!r})" if value != (pkg.image or "") else ""),
                        policy.registry_fix,
                    )
                )


def prule_digest(cr: CrView, policy: CompiledPolicy, out: list[Violation]) -> None:
    if not policy.require_digest:
        return
    for pkg in cr.packages:
        sha = pkg.container_sha
        if not sha or not valid_digest(sha):
            out.append(
                Violation(
                    "require-digest",
                    f"{pkg.path}.containerSHA",
                    "the pool requires images pinned by digest"
                    + ("" if not sha else f" ({sha!r} is not sha256:<64 hex>)"),
                    "set containerSHA to the image's sha256 digest",
                )
            )


def image_tag(image: str | None, group: str) -> str | None:
    """The tag the operator drops from a skyhook.nvidia.com image (after its first ``:``), or
    None. nodewright.nvidia.com refuses tags outright."""
    if group != "skyhook.nvidia.com" or not image or ":" not in image:
        return None
    return image.split(":", 1)[1]


def prule_tag(cr: CrView, policy: CompiledPolicy, out: list[Violation]) -> None:
    if not policy.tag_must_equal_version:
        return
    for pkg in cr.packages:
        tag = image_tag(pkg.image, cr.group)
        if tag is not None and tag != pkg.version:
            out.append(
                Violation(
                    "tag-version",
                    f"{pkg.path}.image",
                    f"image tag {tag!r} differs from version {pkg.version!r} (the operator pulls the "
                    "version)",
                    "drop the tag from image; version is the tag",
                )
            )


def prule_versions(cr: CrView, policy: CompiledPolicy, out: list[Violation]) -> None:
    if not policy.strict_versions:
        return
    for pkg in cr.packages:
        if pkg.version and not strict_semver(pkg.version):
            out.append(
                Violation(
                    "semver",
                    f"{pkg.path}.version",
                    f"version {pkg.version!r} is not MAJOR.MINOR.PATCH semver, as this pool requires",
                    "use a version such as 1.2.3 (no 'v', no shorthand)",
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
    prule_tag,
    prule_versions,
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
        if entry == ANY_REGISTRY:
            continue
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
        any_registry=ANY_REGISTRY in spec.images.registries,
        bad_prefix=bad,
        registry_fix=f"use an image from {', '.join(spec.images.registries) or '(none allowed)'}",
        require_digest=spec.images.require_digest,
        tag_must_equal_version=spec.images.tag_must_equal_version,
        strict_versions=spec.versions == "semver",
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
                (prule_registries, ANY_REGISTRY not in spec.images.registries or bad is not None),
                (prule_digest, spec.images.require_digest),
                (prule_tag, spec.images.tag_must_equal_version),
                (prule_versions, spec.versions == "semver"),
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


def policy_admits(cr: CrView, policy: CompiledPolicy) -> bool:
    """Whether the policy's rules find nothing in the CR: ``not compiled_violations(cr, policy)``,
    stopping at the first rule that finds something (the decider needs the list only to deny)."""
    if _nothing_to_find(cr, policy):
        return True
    out: list[Violation] = []
    for rule in policy.checks:
        rule(cr, policy, out)
        if out:
            return False
    return True


def _nothing_to_find(cr: CrView, p: CompiledPolicy) -> bool:
    """True only when no policy rule would find anything: each rule's condition for a violation,
    negated, in one pass (the usual CR). False sends the CR through the rules themselves."""
    if p.bad_prefix is not None or not cr.interrupt_kinds <= p.allowed_interrupts:
        return False
    group = cr.group
    for pkg in cr.packages:
        agent, sha = pkg.agent_image_override, pkg.container_sha
        if (
            not registry_ok(p, pulled_repository(pkg.image or "", group))
            or (agent and (not p.allow_agent_image_override or not registry_ok(p, agent)))
            or (p.require_digest and (not sha or not valid_digest(sha)))
            or (p.tag_must_equal_version and image_tag(pkg.image, group) not in (None, pkg.version))
            or (p.strict_versions and pkg.version and not strict_semver(pkg.version))
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
