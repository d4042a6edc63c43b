"""Every rule id a denial names (``violations[].rule`` in the response, ``rules:`` in a ``nodegate
policy test --expect`` table), with what it checks. tests/admission/test_rule_ids.py keeps this in
step with the code (every ``Violation("id", ...)``) and with the table in docs/admission.md,
which ``markdown_table()`` writes."""

from __future__ import annotations

from typing import Final

RULE_IDS: Final[dict[str, str]] = {
    # NodeWright's own rules (structural)
    "kind": "the object is a NodeWright or Skyhook package CR",
    "schema": "a field has the type NodeWright's CRD declares",
    "package-name": "a package's key is a DNS-style name and its name matches the key",
    "semver": "versions are semantic versions (and MAJOR.MINOR.PATCH where the pool asks for semver)",
    "image": "image is a repository without an inline tag or digest",
    "digest-format": "an image digest is sha256:<64 hex>",
    "interrupt-type": "interrupt types are ones NodeWright knows",
    "config-interrupt": "configInterrupts name keys of the package's configMap",
    "depends-on": "dependsOn names a package and version of the same CR",
    "duration": "durations parse as Go durations and are not negative",
    "resources": "resource requests and limits are quantities, requests within limits",
    "selector": "label selectors are valid",
    "budget": "an interruption budget sets one of percent (0-100) or count (>= 0)",
    "strategy": "a DeploymentPolicy strategy sets exactly one of fixed, linear or exponential",
    "compartment-name": "DeploymentPolicy compartment names are unique and not reserved",
    "compartment-selector": "no two DeploymentPolicy compartments share a selector",
    "uninstall": "uninstall.apply needs uninstall.enabled",
    "uninstall-pending": "a package marked for uninstall is not changed or downgraded before it is gone",
    # nodegate's guards
    "toleration-wildcard": "no toleration with operator Exists and no key (it tolerates every taint)",
    "hold-toleration": "only the package holds (packages-pending, validation-failed) are tolerated",
    "node-hold-taint": "Nodes are created with the hold taint and only nodegate lifts or changes it",
    "node-package-state": "a node does not write NodeWright's package state annotations itself",
    "node-hold-value": "a Node created by anyone but nodegate carries the hold taint's unattested value",
    "node-package-selection": "a node does not change its own labels so that package CRs stop selecting it",
    # PackagePolicy limits
    "pool": "some PackagePolicy's pool contains the CR's node selector",
    "rbac": "the requester may use the PackagePolicy (deploy, and reboot for reboot interrupts)",
    "registry": "images are under an allowed registry (spec.images.registries)",
    "require-digest": "images are pinned by digest where the pool requires it",
    "tag-version": "the image tag equals the package version where the pool requires it",
    "interrupt-allowed": "interrupts are among the pool's allowed ones",
    "budget-cap": "the interruption budget is within the pool's maxInterruptionBudget",
    "runtime-required": "runtimeRequired only where the pool allows it",
    "secret-env": "no env valueFrom Secrets or ConfigMaps unless the pool allows it",
    "agent-override": "no agentImageOverride unless the pool allows it",
    "priority": "the priority is within the pool's bounds",
}


def markdown_table() -> str:
    lines = ["| rule | what it checks |", "|---|---|"]
    lines += [f"| `{rule}` | {text} |" for rule, text in RULE_IDS.items()]
    return "\n".join(lines) + "\n"
