"""A package CR against the PackagePolicies: those whose pool contains its selector, and what
each would still refuse. Who may use which policy (RBAC) is decided elsewhere; the authorizer
picks the first verdict without violations whose policy the requester may use."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from admission.policies.compiled import CompiledPolicy
from admission.policies.policyrules import compile_policy, compiled_violations
from admission.policies.pools import required_labels_of
from admission.reading.crs import CrView, PackageCR
from admission.reading.policy import PackagePolicy
from admission.reading.structural import as_view
from admission.violations import Violation


@dataclass(frozen=True, slots=True)
class PolicyVerdict:
    policy: str
    violations: tuple[Violation, ...]
    reboot: bool  # the CR asks for reboot interrupts: the requester also needs verb "reboot"

    @property
    def ok(self) -> bool:
        return not self.violations


def policy_violations(cr: PackageCR | CrView, policy: PackagePolicy | CompiledPolicy) -> list[Violation]:
    view = as_view(cr)
    return compiled_violations(view, policy if isinstance(policy, CompiledPolicy) else compile_policy(policy))


def uses_reboot(cr: PackageCR | CrView) -> bool:
    return as_view(cr).reboot


def candidates(cr: CrView, policies: Iterable[CompiledPolicy]) -> list[CompiledPolicy]:
    """The compiled policies whose pool contains the CR's selector, in the given order."""
    labels = required_labels_of(cr)
    return [p for p in policies if p.contains(cr, labels)]


def candidate_policies(cr: PackageCR | CrView, policies: list[PackagePolicy]) -> list[PackagePolicy]:
    """The policies whose pool contains the CR's selector, in name order."""
    compiled = sorted((compile_policy(p) for p in policies), key=lambda c: c.name)
    return [c.policy for c in candidates(as_view(cr), compiled)]


def policy_verdicts(cr: PackageCR | CrView, policies: list[PackagePolicy]) -> list[PolicyVerdict]:
    """One verdict per policy whose pool contains the CR's selector, in name order."""
    view = as_view(cr)
    compiled = sorted((compile_policy(p) for p in policies), key=lambda c: c.name)
    return [
        PolicyVerdict(c.name, tuple(policy_violations(view, c)), view.reboot)
        for c in candidates(view, compiled)
    ]


def no_pool_violation(cr: PackageCR | CrView) -> Violation:
    labels = as_view(cr).match_labels
    return Violation(
        "pool",
        "spec.nodeSelectors",
        "no PackagePolicy's pool contains this selector" + (" (empty: every node)" if not labels else ""),
        "select nodes by the labels of a pool you may deploy to",
    )
