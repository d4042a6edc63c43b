"""Checks on NodeWright / Skyhook package CRs: CR (+ policies) -> violations. Pure functions.

Two layers of small named rules:

* structural rules are NodeWright's own: exactly what its validating webhook refuses without
  looking at the cluster (budget shape, selectors, package names, config interrupts, versions,
  resources, uninstall, durations, the dependency graph, image references of NodeWright CRs);
  they are applied while the CR is read (:mod:`admission.reading.structural`, one module of
  :mod:`admission.reading.checks` per part of the spec), in one pass;
* nodegate's own rules on every CR (:mod:`admission.policies.guards`: no toleration of every
  taint or of the hold taint beyond the reasons package pods need);
* policy rules hold for one PackagePolicy (pool containment, registries of what the operator
  pulls, digest pinning, tags, strict versions, interrupts, budget caps, runtime-required, secret
  env, agent image override, priority): :mod:`admission.policies.pools`,
  :mod:`admission.policies.budgetcaps`, :mod:`admission.policies.policyrules` on a
  :class:`~admission.policies.compiled.CompiledPolicy` (a PackagePolicy with its allowlist parsed
  and its texts built once, when it loads), and :mod:`admission.policies.verdicts` over all the
  policies.

UPDATE has NodeWright's uninstall rules (:mod:`admission.reading.changes`); a DELETE needs rights
only (:mod:`admission.hold.removals`, judged by the decider). Each
violation names its rule, the field path, what is wrong and a one-line fix. Who may use which
policy (RBAC) is decided elsewhere; :func:`policy_verdicts` gives, per candidate policy, what
would still be violated, so the authorizer can pick the first the requester may use.

This module is the public surface: it re-exports the names the webhook, the service and the
tests use. The public functions take a :class:`~admission.reading.crs.CrView` (the webhook reads
one straight from the review) or the pydantic models.
"""

from __future__ import annotations

from admission.hold.nodes import HOLD_TAINT_KEY
from admission.policies.budgetcaps import budget_cap_text, budget_within
from admission.policies.compiled import CompiledPolicy, PolicyRule
from admission.policies.guards import guard_violations
from admission.policies.policyrules import (
    POLICY_RULES,
    compile_policy,
    compiled_violations,
    policy_admits,
    prule_agent_override,
    prule_budget,
    prule_digest,
    prule_interrupts,
    prule_priority,
    prule_registries,
    prule_runtime_required,
    prule_secret_env,
    prule_tag,
    prule_versions,
)
from admission.policies.pools import pool_contains, required_labels, required_labels_of
from admission.policies.verdicts import (
    PolicyVerdict,
    candidate_policies,
    candidates,
    no_pool_violation,
    policy_verdicts,
    policy_violations,
    uses_reboot,
)
from admission.reading.changes import new_reboots, spec_changed, update_rules
from admission.reading.crs import PACKAGE_GROUPS, CrView, PackageCR, Selector, parse_package_cr
from admission.reading.structural import read_package_cr, structural_violations
from admission.violations import Violation

__all__ = [  # re-exported
    "HOLD_TAINT_KEY",
    "PACKAGE_GROUPS",
    "POLICY_RULES",
    "CompiledPolicy",
    "CrView",
    "PackageCR",
    "PolicyRule",
    "PolicyVerdict",
    "Selector",
    "Violation",
    "budget_cap_text",
    "budget_within",
    "candidate_policies",
    "candidates",
    "compile_policy",
    "compiled_violations",
    "guard_violations",
    "new_reboots",
    "no_pool_violation",
    "parse_package_cr",
    "policy_admits",
    "policy_verdicts",
    "policy_violations",
    "pool_contains",
    "prule_agent_override",
    "prule_budget",
    "prule_digest",
    "prule_interrupts",
    "prule_priority",
    "prule_registries",
    "prule_runtime_required",
    "prule_secret_env",
    "prule_tag",
    "prule_versions",
    "read_package_cr",
    "required_labels",
    "required_labels_of",
    "spec_changed",
    "structural_violations",
    "update_rules",
    "uses_reboot",
]
