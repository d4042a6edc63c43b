"""Checks on NodeWright / Skyhook package CRs: CR (+ policies) -> violations. Pure functions.

Two layers, each a list of small named rules:

* structural rules hold for every CR whatever the policy (names, semver, tags, digests, the
  dependency graph, resources, uninstall, budget shape, tolerations, the hold-taint toleration);
* policy rules hold for one PackagePolicy (pool containment, registries, digest pinning,
  interrupts, budget caps, runtime-required, secret env, agent image override, priority).

Each violation names its rule, the field path, what is wrong and a one-line fix. Who may use
which policy (RBAC) is decided elsewhere; :func:`policy_verdicts` gives, per candidate policy,
what would still be violated, so the authorizer can pick the first the requester may use.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from typing import Any

from admission.crs import (
    PACKAGE_GROUPS,
    Interrupt,
    Package,
    PackageCR,
    Selector,
    parse_package_cr,
)
from admission.images import DIGEST_RE, ImageError, ImageRef, allowed_by, parse_image, parse_prefix
from admission.policy import INTERRUPT_TYPES, Budget, PackagePolicy
from admission.quantity import parse_quantity
from admission.violations import Violation

__all__ = ["PACKAGE_GROUPS", "PackageCR", "Selector", "Violation", "parse_package_cr"]  # re-exported

HOLD_TAINT_KEY = "nodegate.io/hold"
_NAME_RE = re.compile(r"^[a-z][-a-z0-9]{0,41}[a-z]$")
# semver.org's regular expression: no "v" prefix, no shorthand versions.
_SEMVER_RE = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)


# ------------------------------------------------------------------------------------------
# Structural rules


StructuralRule = Callable[[PackageCR, str], Iterator[Violation]]


def _packages(cr: PackageCR) -> tuple[tuple[str, str, Package], ...]:
    return cr.package_items


def rule_package_names(cr: PackageCR, _hold: str) -> Iterator[Violation]:
    for key, path, pkg in _packages(cr):
        if not _NAME_RE.match(key):
            yield Violation(
                "package-name",
                path,
                f"package name {key!r} is not a DNS-style name of 2-43 characters",
                "use lower-case letters, digits and '-', starting with a letter",
            )
        if pkg.name is not None and pkg.name != key:
            yield Violation(
                "package-name",
                f"{path}.name",
                f"name {pkg.name!r} differs from its key {key!r}",
                "remove name; the key is the name",
            )


def rule_versions(cr: PackageCR, _hold: str) -> Iterator[Violation]:
    for _key, path, pkg in _packages(cr):
        if not pkg.version:
            yield Violation(
                "semver", f"{path}.version", "version is missing", "set a semver version such as 1.2.3"
            )
        elif pkg.version == "latest" or not _SEMVER_RE.match(pkg.version):
            yield Violation(
                "semver",
                f"{path}.version",
                f"version {pkg.version!r} is not strict semver",
                "use MAJOR.MINOR.PATCH, e.g. 1.2.3 (no 'v', no 'latest')",
            )


def _image(pkg_path: str, field: str, value: str) -> tuple[ImageRef | None, Violation | None]:
    try:
        return parse_image(value), None
    except ImageError as exc:
        return None, Violation(
            "image", f"{pkg_path}.{field}", str(exc), "give a reference like registry.example.com/team/pkg"
        )


def rule_images(cr: PackageCR, _hold: str) -> Iterator[Violation]:
    for _key, path, pkg in _packages(cr):
        if not pkg.image:
            yield Violation("image", f"{path}.image", "image is missing", "set image (without a tag)")
            continue
        ref, bad = _image(path, "image", pkg.image)
        if bad is not None:
            yield bad
            continue
        assert ref is not None  # noqa: S101  (the pair is one or the other)
        if ref.tag == "latest":
            yield Violation(
                "no-latest", f"{path}.image", "the 'latest' tag is mutable", "drop the tag; version sets it"
            )
        elif ref.tag is not None and ref.tag != pkg.version:
            yield Violation(
                "tag-version",
                f"{path}.image",
                f"image tag {ref.tag!r} differs from version {pkg.version!r}",
                "drop the tag from image; version is the tag",
            )
        if ref.digest is not None:
            yield Violation(
                "digest-field",
                f"{path}.image",
                "an inline @digest is not used by the operator",
                "put the digest in containerSHA",
            )
        if pkg.container_sha is not None and not DIGEST_RE.match(pkg.container_sha):
            yield Violation(
                "digest-format",
                f"{path}.containerSHA",
                f"{pkg.container_sha!r} is not sha256:<64 hex>",
                "use the image's sha256 digest",
            )
        if pkg.agent_image_override:
            agent, bad = _image(path, "agentImageOverride", pkg.agent_image_override)
            if bad is not None:
                yield bad
            elif agent is not None and agent.tag == "latest":
                yield Violation(
                    "no-latest",
                    f"{path}.agentImageOverride",
                    "the 'latest' tag is mutable",
                    "pin the agent by version or digest",
                )


def rule_dependencies(cr: PackageCR, _hold: str) -> Iterator[Violation]:
    packages = cr.spec.packages
    for _key, path, pkg in _packages(cr):
        for dep, version in pkg.depends_on.items():
            target = packages.get(dep)
            if target is None or not version or target.version != version:
                yield Violation(
                    "depends-on",
                    f"{path}.dependsOn.{dep}",
                    f"no package {dep}|{version} in this CR",
                    "depend on a package of this CR at its current version",
                )
    cycle = _find_cycle({k: list(p.depends_on) for k, p in packages.items()})
    if cycle:
        yield Violation(
            "depends-on",
            "spec.packages",
            "dependency cycle " + " -> ".join(cycle),
            "remove one dependsOn edge of the cycle",
        )


def _find_cycle(graph: dict[str, list[str]]) -> list[str]:
    state: dict[str, int] = {}  # 1 visiting, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in graph.get(node, []):
            if nxt not in graph:
                continue
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if state.get(nxt) is None:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if state.get(node) is None:
            found = visit(node)
            if found:
                return found
    return []


def rule_resources(cr: PackageCR, _hold: str) -> Iterator[Violation]:
    for _key, path, pkg in _packages(cr):
        res = pkg.resources
        if res is None:
            continue
        fields = {
            "cpuRequest": res.cpu_request,
            "cpuLimit": res.cpu_limit,
            "memoryRequest": res.memory_request,
            "memoryLimit": res.memory_limit,
        }
        given = {k: v for k, v in fields.items() if v is not None}
        if not given:
            continue
        if len(given) != 4:
            yield Violation(
                "resources",
                f"{path}.resources",
                "set all four of cpu/memory request/limit or none",
                f"add {', '.join(k for k in fields if k not in given)}",
            )
            continue
        parsed: dict[str, Decimal] = {}
        for k, v in given.items():
            try:
                parsed[k] = parse_quantity(v)
            except ValueError as exc:
                yield Violation(
                    "resources", f"{path}.resources.{k}", str(exc), "use a quantity such as 500m or 1Gi"
                )
        if len(parsed) != 4:
            continue
        for k, q in parsed.items():
            if q <= 0:
                yield Violation(
                    "resources", f"{path}.resources.{k}", "must be positive", "use a value above zero"
                )
        for kind in ("cpu", "memory"):
            if parsed[f"{kind}Limit"] < parsed[f"{kind}Request"]:
                yield Violation(
                    "resources",
                    f"{path}.resources.{kind}Limit",
                    f"{kind} limit is below its request",
                    "raise the limit or lower the request",
                )


def rule_uninstall(cr: PackageCR, _hold: str) -> Iterator[Violation]:
    for _key, path, pkg in _packages(cr):
        if pkg.uninstall is not None and pkg.uninstall.apply and not pkg.uninstall.enabled:
            yield Violation(
                "uninstall", f"{path}.uninstall.apply", "apply needs enabled", "set uninstall.enabled: true"
            )


def rule_interrupts(cr: PackageCR, _hold: str) -> Iterator[Violation]:
    for _key, path, pkg in _packages(cr):
        for where, intr in _interrupts(path, pkg):
            if intr.type not in INTERRUPT_TYPES:
                yield Violation(
                    "interrupt-type",
                    f"{where}.type",
                    f"unknown interrupt type {intr.type!r}",
                    f"use one of {', '.join(INTERRUPT_TYPES)}",
                )
        for glob in pkg.config_interrupts:
            pattern = _glob(glob)
            if not any(pattern.match(k) for k in pkg.config_map):
                yield Violation(
                    "config-interrupt",
                    f"{path}.configInterrupts.{glob}",
                    "matches no configMap key",
                    "name an existing configMap key (or a * glob matching one)",
                )


@lru_cache(maxsize=1024)
def _glob(glob: str) -> re.Pattern[str]:
    return re.compile("^" + ".*".join(map(re.escape, glob.split("*"))) + "$")


def _interrupts(path: str, pkg: Package) -> Iterator[tuple[str, Interrupt]]:
    if pkg.interrupt is not None:
        yield f"{path}.interrupt", pkg.interrupt
    for key, intr in pkg.config_interrupts.items():
        yield f"{path}.configInterrupts.{key}", intr


def rule_budget_shape(cr: PackageCR, _hold: str) -> Iterator[Violation]:
    budget = cr.spec.interruption_budget
    if budget is not None and (budget.percent is None) == (budget.count is None):
        yield Violation(
            "budget", "spec.interruptionBudget", "set exactly one of percent or count", "keep one of them"
        )
    if budget is not None and budget.percent is not None and not 0 <= budget.percent <= 100:
        yield Violation("budget", "spec.interruptionBudget.percent", "percent is outside 0-100", "use 0-100")
    if budget is not None and budget.count is not None and budget.count < 0:
        yield Violation("budget", "spec.interruptionBudget.count", "count is negative", "use 0 or more")
    if budget is not None and cr.spec.deployment_policy:
        yield Violation(
            "budget",
            "spec.deploymentPolicy",
            "interruptionBudget and deploymentPolicy exclude each other",
            "keep one of them",
        )


def rule_tolerations(cr: PackageCR, _hold: str) -> Iterator[Violation]:
    for i, tol in enumerate(cr.spec.additional_tolerations):
        if tol.operator == "Exists" and not tol.key:
            yield Violation(
                "toleration-wildcard",
                f"spec.additionalTolerations[{i}]",
                "operator Exists without a key tolerates every taint (control plane, quarantine)",
                "name the taint key to tolerate",
            )


def rule_hold_toleration(cr: PackageCR, hold: str) -> Iterator[Violation]:
    """Runtime-required packages run on held nodes, so they must tolerate the hold taint while
    its reason is packages-pending (an Equal toleration for another reason would never match)."""
    if not cr.spec.runtime_required:
        return
    for tol in cr.spec.additional_tolerations:
        if tol.key != hold or tol.effect not in (None, "", "NoSchedule"):
            continue
        if tol.operator == "Exists" or (tol.operator in ("Equal", None) and tol.value == "packages-pending"):
            return
    yield Violation(
        "hold-toleration",
        "spec.additionalTolerations",
        f"a runtimeRequired CR must tolerate the {hold} taint (nodes are held until it completes)",
        f"add {{key: {hold}, operator: Exists, effect: NoSchedule}}",
    )


_OPERATORS = {"In": True, "NotIn": True, "Exists": False, "DoesNotExist": False}  # needs values?


def rule_selector(cr: PackageCR, _hold: str) -> Iterator[Violation]:
    """The operator parses nodeSelectors as a LabelSelector and refuses what does not parse; a
    selector we read differently from the operator would make pool containment meaningless."""
    for i, req in enumerate(cr.selector.match_expressions):
        path = f"spec.nodeSelectors.matchExpressions[{i}]"
        needs_values = _OPERATORS.get(req.operator)
        if needs_values is None:
            yield Violation(
                "selector",
                f"{path}.operator",
                f"unknown operator {req.operator!r}",
                "use In, NotIn, Exists or DoesNotExist",
            )
        elif needs_values != bool(req.values):
            yield Violation(
                "selector",
                f"{path}.values",
                f"{req.operator} {'needs' if needs_values else 'takes no'} values",
                "fix the values",
            )


STRUCTURAL_RULES: tuple[StructuralRule, ...] = (
    rule_selector,
    rule_package_names,
    rule_versions,
    rule_images,
    rule_dependencies,
    rule_resources,
    rule_uninstall,
    rule_interrupts,
    rule_budget_shape,
    rule_tolerations,
    rule_hold_toleration,
)


def structural_violations(cr: PackageCR, hold_taint_key: str = HOLD_TAINT_KEY) -> list[Violation]:
    return [v for rule in STRUCTURAL_RULES for v in rule(cr, hold_taint_key)]


# ------------------------------------------------------------------------------------------
# Pools


def required_labels(selector: Selector) -> dict[str, str] | None:
    """The labels every selected node must carry (matchLabels and single-value In), or None when
    the selector contradicts itself and selects nothing."""
    out = dict(selector.match_labels)
    for req in selector.match_expressions:
        if req.operator == "In" and len(req.values) == 1:
            value = req.values[0]
            if out.get(req.key, value) != value:
                return None
            out[req.key] = value
    return out


def pool_contains(pool: Mapping[str, str], selector: Selector) -> bool:
    """Every node the selector can match carries all the pool's labels. An empty selector (every
    node) is only inside the pool of every node."""
    if not selector.match_labels and not selector.match_expressions:
        return not pool
    labels = required_labels(selector)
    if labels is None:
        return True  # selects nothing; structural checks do not need to care
    return all(labels.get(k) == v for k, v in pool.items())


# ------------------------------------------------------------------------------------------
# Policy rules


PolicyRule = Callable[[PackageCR, PackagePolicy], Iterator[Violation]]


def prule_registries(cr: PackageCR, policy: PackagePolicy) -> Iterator[Violation]:
    prefixes = [parse_prefix(p) for p in policy.spec.images.registries]
    for _key, path, pkg in _packages(cr):
        for field, value in (("image", pkg.image), ("agentImageOverride", pkg.agent_image_override)):
            if not value:
                continue
            try:
                ref = parse_image(value)
            except ImageError:
                continue  # structural rules report it
            if not any(allowed_by(ref, p) for p in prefixes):
                yield Violation(
                    "registry",
                    f"{path}.{field}",
                    f"{ref.repository} is not under an allowed registry",
                    f"use an image from {', '.join(policy.spec.images.registries) or '(none allowed)'}",
                )


def prule_digest(cr: PackageCR, policy: PackagePolicy) -> Iterator[Violation]:
    if not policy.spec.images.require_digest:
        return
    for _key, path, pkg in _packages(cr):
        if not pkg.container_sha:
            yield Violation(
                "require-digest",
                f"{path}.containerSHA",
                "the pool requires images pinned by digest",
                "set containerSHA to the image's sha256 digest",
            )


def prule_interrupts(cr: PackageCR, policy: PackagePolicy) -> Iterator[Violation]:
    allowed = policy.spec.interrupts.allowed
    for _key, path, pkg in _packages(cr):
        for where, intr in _interrupts(path, pkg):
            if intr.type in INTERRUPT_TYPES and intr.type not in allowed:
                yield Violation(
                    "interrupt-allowed",
                    f"{where}.type",
                    f"interrupt {intr.type!r} is not allowed in this pool",
                    f"use one of {', '.join(allowed)}",
                )


def budget_within(percent: int | None, count: int | None, cap: Budget) -> bool:
    """Whether a budget is provably within a cap without knowing the pool's size. The operator's
    ceiling for a percent budget is max(1, floor(nodes * percent / 100)), so one node at a time
    is within every percent cap; other mixes of units cannot be compared and do not pass."""
    if cap.percent is not None:
        return (percent is not None and percent <= cap.percent) or count == 1
    return count is not None and cap.count is not None and count <= cap.count


def prule_budget(cr: PackageCR, policy: PackagePolicy) -> Iterator[Violation]:
    cap = policy.spec.max_interruption_budget
    if cap is None or cr.spec.deployment_policy:
        return  # DeploymentPolicies are judged against the caps of every pool they apply to
    budget = cr.spec.interruption_budget
    if budget is None:
        yield Violation(
            "budget-cap",
            "spec.interruptionBudget",
            "no budget means 100% of the pool at once",
            f"set a budget within {budget_cap_text(cap)}",
        )
    elif not budget_within(budget.percent, budget.count, cap):
        unit = (
            f"percent <= {cap.percent} (or count: 1)" if cap.percent is not None else f"count <= {cap.count}"
        )
        yield Violation(
            "budget-cap",
            "spec.interruptionBudget",
            f"budget exceeds the pool's {budget_cap_text(cap)}",
            f"use {unit}",
        )


def budget_cap_text(cap: Any) -> str:
    return f"{cap.percent}%" if cap.percent is not None else f"{cap.count} nodes"


def prule_runtime_required(cr: PackageCR, policy: PackagePolicy) -> Iterator[Violation]:
    if policy.spec.allow_runtime_required:
        return
    for field, on in (
        ("runtimeRequired", cr.spec.runtime_required),
        ("autoTaintNewNodes", cr.spec.auto_taint_new_nodes),
    ):
        if on:
            yield Violation(
                "runtime-required",
                f"spec.{field}",
                "this pool does not allow gating its nodes on this CR",
                f"remove {field} or use a pool whose policy allows it",
            )


def prule_secret_env(cr: PackageCR, policy: PackagePolicy) -> Iterator[Violation]:
    if policy.spec.allow_secret_env:
        return
    for _key, path, pkg in _packages(cr):
        for i, env in enumerate(pkg.env):
            if env.value_from is not None:
                yield Violation(
                    "secret-env",
                    f"{path}.env[{i}].valueFrom",
                    "valueFrom reads Secrets/ConfigMaps of the operator namespace into a root pod",
                    "pass a literal value, or use a pool that allows secret env",
                )


def prule_agent_override(cr: PackageCR, policy: PackagePolicy) -> Iterator[Violation]:
    if policy.spec.allow_agent_image_override:
        return
    for _key, path, pkg in _packages(cr):
        if pkg.agent_image_override:
            yield Violation(
                "agent-override",
                f"{path}.agentImageOverride",
                "replaces the trusted privileged agent",
                "remove agentImageOverride",
            )


def prule_priority(cr: PackageCR, policy: PackagePolicy) -> Iterator[Violation]:
    bounds = policy.spec.priority
    if bounds is None:
        return
    p = cr.spec.priority
    if p < bounds.min or (bounds.max is not None and p > bounds.max):
        yield Violation(
            "priority",
            "spec.priority",
            f"priority {p} is outside {bounds.min}-{bounds.max or 'any'}",
            f"use a priority from {bounds.min}{f' to {bounds.max}' if bounds.max else ' up'}",
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


def policy_violations(cr: PackageCR, policy: PackagePolicy) -> list[Violation]:
    return [v for rule in POLICY_RULES for v in rule(cr, policy)]


def uses_reboot(cr: PackageCR) -> bool:
    return any(i.type == "reboot" for _k, path, pkg in _packages(cr) for _w, i in _interrupts(path, pkg))


def candidate_policies(cr: PackageCR, policies: list[PackagePolicy]) -> list[PackagePolicy]:
    """The policies whose pool contains the CR's selector, in name order."""
    return sorted((p for p in policies if pool_contains(p.pool, cr.selector)), key=lambda p: p.name)


def policy_verdicts(cr: PackageCR, policies: list[PackagePolicy]) -> list[PolicyVerdict]:
    """One verdict per policy whose pool contains the CR's selector, in name order."""
    reboot = uses_reboot(cr)
    return [
        PolicyVerdict(p.name, tuple(policy_violations(cr, p)), reboot)
        for p in candidate_policies(cr, policies)
    ]


def no_pool_violation(cr: PackageCR) -> Violation:
    labels = cr.selector.match_labels
    return Violation(
        "pool",
        "spec.nodeSelectors",
        "no PackagePolicy's pool contains this selector" + (" (empty: every node)" if not labels else ""),
        "select nodes by the labels of a pool you may deploy to",
    )


# ------------------------------------------------------------------------------------------
# UPDATE and DELETE of package CRs


def spec_changed(old: PackageCR, new: PackageCR) -> bool:
    """Whether anything the operator acts on changed (spec, pause/disable annotations)."""
    return old.spec != new.spec or _gates(old) != _gates(new)


def _gates(cr: PackageCR) -> tuple[str | None, ...]:
    ann = cr.metadata.annotations
    return tuple(ann.get(f"{g}/{k}") for g in PACKAGE_GROUPS for k in ("pause", "disable"))


def new_reboots(old: PackageCR | None, new: PackageCR) -> list[str]:
    """Packages whose reboot interrupt this change would fire: packages with a reboot interrupt
    that are new, or differ in any field from before (a version bump re-runs and reboots)."""
    out = []
    before = old.spec.packages if old is not None else {}
    for key, path, pkg in _packages(new):
        if any(i.type == "reboot" for _w, i in _interrupts(path, pkg)) and before.get(key) != pkg:
            out.append(key)
    return out


def delete_violations(old: Mapping[str, Any]) -> list[Violation]:
    """Upstream's rule: a CR that is paused or disabled cannot run its pending uninstalls, so
    deleting it would strand them (the operator blocks the finalizer; we refuse up front)."""
    cr = parse_package_cr(old)
    if isinstance(cr, list):
        return []  # nothing we understand to protect; RBAC on delete still applies
    gate = next(
        (
            k
            for g in PACKAGE_GROUPS
            for k in ("pause", "disable")
            if cr.metadata.annotations.get(f"{g}/{k}") == "true"
        ),
        None,
    )
    if gate is None:
        return []
    uninstalling = {k for k, p in cr.spec.packages.items() if p.uninstall is not None and p.uninstall.enabled}
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
