"""Upstream's chainsaw e2e tests under ``k8s-tests/chainsaw/{cli,deployment-policy,helm}/``.

As in :mod:`chainsaw_skyhook`, one function per test directory, its steps in order. The
``helm/helm-webhook-test`` scripts check that upstream's webhook refuses some requests
(``kubectl ... 2>err.txt`` then ``[ $ec -eq 0 ]`` fails the test): those steps carry the refusal
upstream prints. The CLI's ``pause``/``resume``/``disable``/``enable`` set or remove the
annotation with a patch (``SetSkyhookAnnotation``/``RemoveSkyhookAnnotation``,
``operator/internal/cli/utils/utils.go``).

PENDING SHARED DATA (issue 31): as in :mod:`chainsaw_skyhook`, the CR bodies are upstream's e2e
YAML retyped (each equal to the parsed upstream file); :mod:`e2e` replaces this module once the
files ``shared_data_wanted.json`` lists are in the public test data (the refusals upstream prints
are facts, kept there in ``SCRIPTS``).
"""

from __future__ import annotations

from typing import Any

from tests.admission.upstream.chainsaw_skyhook import step
from tests.admission.upstream.model import E2E_LABELS, NODEWRIGHT, SHELLSCRIPT, TEST_NODE, WORKERS
from tests.admission.upstream.objects import (
    budget,
    compartment,
    exponential,
    fixed,
    linear,
    pkg,
    sleep,
    uninstall,
)
from tests.admission.upstream.scenario import Scenario, policy, skyhook

PAUSE, DISABLE = "skyhook.nvidia.com/pause", "skyhook.nvidia.com/disable"


def cli_deployment_policy(s: Scenario, n: bool) -> None:
    spec = {
        "resetBatchStateOnCompletion": True,
        "default": {"budget": budget(count=1), "strategy": exponential(initialBatch=1, growthFactor=2)},
    }
    s.apply(
        "deployment-policy.yaml",
        "setup-policy / try[0] apply DeploymentPolicy/cli-dp-reset-policy",
        policy("cli-dp-reset-policy", spec),
    )
    sky = {
        "deploymentPolicy": "cli-dp-reset-policy",
        "deploymentPolicyOptions": {"resetBatchStateOnCompletion": False},
        "nodeSelectors": {"matchLabels": {"skyhook.nvidia.com/dp-reset-test": "true"}},
        "packages": {
            "test-package": pkg(
                "1.1.1" if n else "1.0.0",
                SHELLSCRIPT,
                configMap={"apply.sh": '#!/bin/bash\necho "DP reset CLI test"\nsleep 2\n'},
            )
        },
    }
    s.apply(
        "skyhook.yaml",
        "setup-skyhook / try[0] apply Skyhook/cli-dp-reset-test",
        skyhook("cli-dp-reset-test", sky),
    )
    s.delete(
        "chainsaw-test.yaml",
        "cleanup / try[0] delete Skyhook/cli-dp-reset-test",
        "Skyhook",
        "cli-dp-reset-test",
    )
    s.delete(
        "chainsaw-test.yaml",
        "cleanup / try[1] delete DeploymentPolicy/cli-dp-reset-policy",
        "DeploymentPolicy",
        "cli-dp-reset-policy",
    )


def cli_lifecycle(s: Scenario, n: bool) -> None:
    name = "cli-lifecycle-test"
    spec = {
        "nodeSelectors": TEST_NODE,
        "packages": {
            "test-package": pkg(
                "1.0.0",
                SHELLSCRIPT,
                configMap={"apply.sh": '#!/bin/bash\necho "Lifecycle test apply"\nsleep 2\n'},
            )
        },
    }
    s.apply("skyhook.yaml", f"setup-skyhook / try[0] apply Skyhook/{name}", skyhook(name, spec))
    steps: tuple[tuple[str, str, dict[str, str | None]], ...] = (
        ("test-pause / try[0]", "pause", {PAUSE: "true"}),
        ("test-resume / try[0]", "resume", {PAUSE: None}),
        ("test-disable / try[0]", "disable", {DISABLE: "true"}),
        ("test-enable / try[0]", "enable", {DISABLE: None}),
        ("test-pause-and-disable / try[0]", "pause", {PAUSE: "true"}),
        ("test-pause-and-disable / try[0]", "disable", {DISABLE: "true"}),
        ("test-pause-and-disable / try[2]", "resume", {PAUSE: None}),
        ("test-pause-and-disable / try[4]", "enable", {DISABLE: None}),
    )
    for step_name, cli, changes in steps:
        s.annotate("chainsaw-test.yaml", f"{step_name} script: ../skyhook-cli {cli} {name}", name, changes)
    s.delete(
        "chainsaw-test.yaml",
        f"cleanup / try[0] script: kubectl delete skyhook {name} 2>/dev/null || true",
        "Skyhook",
        name,
    )


def _hello(name: str, sleep_len: int) -> dict[str, Any]:
    return skyhook(
        name, {"nodeSelectors": TEST_NODE, "packages": {"hello-world": pkg("3.2.3", env=sleep(sleep_len))}}
    )


def cli_node(s: Scenario, n: bool) -> None:
    s.apply("skyhook.yaml", "setup-skyhook / try[0] apply Skyhook/cli-node-test", _hello("cli-node-test", 10))


def cli_package(s: Scenario, n: bool) -> None:
    s.apply(
        "skyhook.yaml", "setup-skyhook / try[0] apply Skyhook/cli-package-test", _hello("cli-package-test", 5)
    )


def cli_reset(s: Scenario, n: bool) -> None:
    spec = {
        "nodeSelectors": TEST_NODE,
        "packages": {
            "test-package": pkg(
                "1.0.0",
                SHELLSCRIPT,
                configMap={"apply.sh": '#!/bin/bash\necho "Reset test apply"\nsleep 2\n'},
            )
        },
    }
    s.apply(
        "skyhook.yaml", "setup-skyhook / try[0] apply Skyhook/cli-reset-test", skyhook("cli-reset-test", spec)
    )


def batch_state_reset(s: Scenario, n: bool) -> None:
    grow = exponential(initialBatch=1, growthFactor=2)
    spec = {
        "resetBatchStateOnCompletion": True,
        "default": {"budget": budget(count=2), "strategy": grow},
        "compartments": [compartment("tier1", {"tier": "1"}, budget(count=2), grow)],
    }
    s.apply(
        "deployment-policy.yaml",
        "apply-policy / try[0] apply DeploymentPolicy/test-batch-reset-policy",
        policy("test-batch-reset-policy", spec),
    )

    def sky(name: str, options: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"deploymentPolicy": "test-batch-reset-policy"}
        if options:
            body["deploymentPolicyOptions"] = {"resetBatchStateOnCompletion": False}
        body["nodeSelectors"] = {"matchLabels": {"skyhook.nvidia.com/test-node": "batch-reset-test"}}
        body["packages"] = {
            "quick-package": pkg(
                "3.21.0", "alpine", configMap={"test.sh": '#!/bin/sh\necho "Test package"\nexit 0\n'}
            )
        }
        return skyhook(name, body)

    s.apply(
        "skyhook-auto-reset.yaml",
        "test-auto-reset-enabled / try[0] apply Skyhook/test-auto-reset-enabled",
        sky("test-auto-reset-enabled", False),
    )
    s.delete(
        "chainsaw-test.yaml",
        (
            "cleanup-test-1 / try[0] script: kubectl delete skyhook test-auto-reset-enabled "
            "--ignore-not-found --wait=true"
        ),
        "Skyhook",
        "test-auto-reset-enabled",
    )
    s.apply(
        "skyhook-override-disabled.yaml",
        "test-config-precedence / try[0] apply Skyhook/test-override-disabled",
        sky("test-override-disabled", True),
    )
    s.delete(
        "chainsaw-test.yaml",
        "cleanup / try[1] delete Skyhook/test-override-disabled",
        "Skyhook",
        "test-override-disabled",
    )
    s.delete(
        "chainsaw-test.yaml",
        "cleanup / try[2] delete DeploymentPolicy/test-batch-reset-policy",
        "DeploymentPolicy",
        "test-batch-reset-policy",
    )


def legacy_compatibility(s: Scenario, n: bool) -> None:
    spec = {
        "priority": 100,
        "interruptionBudget": budget(count=3),
        "nodeSelectors": TEST_NODE,
        "packages": {"test-pkg": pkg("6.2.0")},
    }
    s.apply(
        "skyhook.yaml",
        "apply-skyhook / try[0] apply Skyhook/legacy-interruption-budget-test",
        skyhook("legacy-interruption-budget-test", spec),
    )


_DEFAULT_FIXED = fixed(initialBatch=1, batchThreshold=100, failureThreshold=3, safetyLimit=50)


def _rollout(s: Scenario, policy_name: str, dp_spec: dict[str, Any], sky_name: str) -> None:
    s.apply(
        "deployment-policy.yaml",
        f"apply-resources / try[0] apply DeploymentPolicy/{policy_name}",
        policy(policy_name, dp_spec),
    )
    spec = {
        "deploymentPolicy": policy_name,
        "nodeSelectors": TEST_NODE,
        "packages": {"test-package": pkg("6.2.0", "ghcr.io/nvidia/skyhook/agentless:6.2.0", env=sleep(2))},
    }
    s.apply("skyhook.yaml", f"apply-resources / try[1] apply Skyhook/{sky_name}", skyhook(sky_name, spec))
    s.delete("chainsaw-test.yaml", f"cleanup / try[1] delete Skyhook/{sky_name}", "Skyhook", sky_name)
    s.delete(
        "chainsaw-test.yaml",
        f"cleanup / try[2] delete DeploymentPolicy/{policy_name}",
        "DeploymentPolicy",
        policy_name,
    )


def linear_strategy(s: Scenario, n: bool) -> None:
    spec = {
        "default": {"budget": budget(percent=100), "strategy": _DEFAULT_FIXED},
        "compartments": [
            compartment(
                "production",
                {"tier": "production"},
                budget(count=4),
                linear(initialBatch=1, delta=1, batchThreshold=100, failureThreshold=2, safetyLimit=50),
            )
        ],
    }
    _rollout(s, "linear-ramp-policy", spec, "linear-strategy-test")


def multi_compartment(s: Scenario, n: bool) -> None:
    def grow(initial: int, threshold: int, failures: int, limit: int) -> dict[str, Any]:
        return exponential(
            initialBatch=initial,
            growthFactor=2,
            batchThreshold=threshold,
            failureThreshold=failures,
            safetyLimit=limit,
        )

    spec = {
        "default": {"budget": budget(percent=100), "strategy": _DEFAULT_FIXED},
        "compartments": [
            compartment("critical", {"priority": "critical"}, budget(count=2), grow(1, 100, 1, 50)),
            compartment("standard", {"priority": "standard"}, budget(percent=33), grow(1, 100, 2, 50)),
            compartment("test", {"priority": "test"}, budget(percent=50), grow(2, 90, 3, 60)),
        ],
    }
    _rollout(s, "multi-tier-policy", spec, "multi-compartment-test")


def overlapping_selectors(s: Scenario, n: bool) -> None:
    grow = exponential(initialBatch=1, growthFactor=2, batchThreshold=100, failureThreshold=1, safetyLimit=50)
    spec: dict[str, Any] = {"resetBatchStateOnCompletion": False} if n else {}
    spec |= {
        "default": {"budget": budget(percent=100), "strategy": _DEFAULT_FIXED},
        "compartments": [
            compartment("us-west", {"region": "us-west"}, budget(count=2), grow),
            compartment("production", {"env": "production"}, budget(count=2), grow),
            compartment(
                "prod-us-west", {"region": "us-west", "env": "production"}, budget(count=1), _DEFAULT_FIXED
            ),
        ],
    }
    _rollout(s, "overlapping-selector-policy", spec, "overlapping-selectors-test")


def helm_chart_test(s: Scenario, n: bool) -> None:
    spec = {
        "default": {
            "budget": budget(percent=100),
            "strategy": fixed(initialBatch=1, batchThreshold=100, safetyLimit=50),
        }
    }
    s.apply(
        "deployment-policy.yaml",
        "step-1 / try[6] apply DeploymentPolicy/helm-test-policy",
        policy("helm-test-policy", spec),
    )
    sky = {
        "nodeSelectors": WORKERS,
        "deploymentPolicy": "helm-test-policy",
        "additionalTolerations": [{"key": "dedicated", "value": "system-cpu", "effect": "NoSchedule"}],
        "packages": {"helm-test": pkg("6.2.0", env=sleep(1))},
    }
    s.apply(
        "skyhook.yaml", "step-1 / try[7] apply Skyhook/helm-test-skyhook", skyhook("helm-test-skyhook", sky)
    )


_SCRIPT = "step-1 / try[{}] script: "


def helm_webhook_test(s: Scenario, n: bool) -> None:
    invalid = {
        "packages": {
            "cookies": pkg("3.2.3", dependsOn={"milkshake": "1.2.3"}),  # upstream's "invalid dependency"
            "milk": pkg("1.2"),
        }
    }
    s.apply(
        "invalid-skyhook.yaml",
        _SCRIPT.format(4) + "kubectl apply -f invalid-skyhook.yaml 2>err.txt",
        skyhook("invalid-skyhook", invalid, labels=E2E_LABELS),
        deny=(
            "error trying to validate skyhook spec graph is invalid: error graph is not valid, "
            "missing: [milkshake|1.2.3]"
        ),
        kubectl=True,
    )
    dp = {
        "default": {"budget": budget(percent=50), "strategy": fixed(initialBatch=5)},
        "compartments": [
            compartment("duplicate-name", {"zone": "us-west-1"}, budget(count=10)),
            compartment(
                "duplicate-name", {"zone": "us-east-1"}, budget(count=5)
            ),  # upstream: "Invalid: duplicate"
        ],
    }
    s.apply(
        "invalid-deploymentpolicy.yaml",
        _SCRIPT.format(5) + "kubectl apply -f invalid-deploymentpolicy.yaml 2>err.txt",
        policy("invalid-deploymentpolicy", dp, labels=E2E_LABELS),
        deny='compartment name "duplicate-name" is not unique',
        kubectl=True,
    )
    missing = {"deploymentPolicy": "non-existent-policy", "packages": {"test-pkg": pkg("1.2.3")}}
    s.apply(
        "skyhook-missing-policy.yaml",
        _SCRIPT.format(6) + "kubectl apply -f skyhook-missing-policy.yaml 2>err.txt",
        skyhook("skyhook-missing-policy", missing),
        deny='deploymentPolicy "non-existent-policy" not found',
        kubectl=True,
    )
    test_policy = {"default": {"budget": budget(percent=100), "strategy": {"fixed": {}}}}
    s.apply(
        "valid-deploymentpolicy.yaml",
        "step-1 / try[7] apply DeploymentPolicy/test-policy",
        policy("test-policy", test_policy),
    )
    valid = {"deploymentPolicy": "test-policy", "packages": {"test-pkg": pkg("1.2.3")}}
    s.apply(
        "skyhook-valid-policy.yaml",
        "step-1 / try[8] apply Skyhook/skyhook-valid-policy",
        skyhook("skyhook-valid-policy", valid),
    )
    patch = (
        "kubectl patch skyhook skyhook-valid-policy --type=merge "
        """-p '{"spec":{"deploymentPolicy":"does-not-exist"}}' 2>err.txt"""
    )
    s.patch(
        "chainsaw-test.yaml",
        _SCRIPT.format(9) + patch,
        "Skyhook",
        "skyhook-valid-policy",
        {"spec": {"deploymentPolicy": "does-not-exist"}},
        deny='deploymentPolicy "does-not-exist" not found',
    )
    s.delete(
        "chainsaw-test.yaml",
        _SCRIPT.format(10) + "kubectl delete deploymentpolicy test-policy 2>err.txt",
        "DeploymentPolicy",
        "test-policy",
        deny=(
            'cannot delete DeploymentPolicy "test-policy": still referenced by 1 Skyhook(s): '
            "[skyhook-valid-policy]"
        ),
    )
    s.delete(
        "chainsaw-test.yaml",
        _SCRIPT.format(11) + "kubectl delete skyhook skyhook-valid-policy",
        "Skyhook",
        "skyhook-valid-policy",
    )
    s.delete(
        "chainsaw-test.yaml",
        _SCRIPT.format(11) + "kubectl delete deploymentpolicy test-policy",
        "DeploymentPolicy",
        "test-policy",
    )
    if not n:
        return  # the uninstall steps are NVIDIA/nodewright's only

    def mypkg(version: str, enabled: bool, apply: bool) -> dict[str, Any]:
        return {"mypkg": pkg(version, uninstall=uninstall(enabled, apply))}

    def sky(packages: dict[str, Any] | None) -> dict[str, Any]:
        spec = {"nodeSelectors": TEST_NODE, "interruptionBudget": budget(count=1), "packages": packages}
        return skyhook("uninstall-webhook-reject", spec)

    s.apply(
        "skyhook-apply-without-enabled.yaml",
        _SCRIPT.format(12) + "kubectl apply -f skyhook-apply-without-enabled.yaml 2>err.txt",
        sky(mypkg("2.1.4", False, True)),
        deny='package "mypkg": uninstall.apply requires uninstall.enabled to be true',
        kubectl=True,
    )
    s.apply(
        "skyhook-uninstall-valid.yaml",
        "step-1 / try[13] apply Skyhook/uninstall-webhook-reject",
        sky(mypkg("2.1.4", True, False)),
    )
    # kubectl apply onto an object it did not create: the manifest merged in, its `packages:` (null)
    # removes them all.
    s.apply(
        "update-remove-enabled-pkg.yaml",
        _SCRIPT.format(15) + "kubectl apply -f update-remove-enabled-pkg.yaml 2>err.txt",
        sky(None),
        deny=(
            'package "mypkg" has uninstall.enabled=true; set uninstall.apply=true and wait for '
            "completion before removing from spec"
        ),
        kubectl=True,
    )
    s.apply(
        "update-downgrade-enabled-pkg.yaml",
        _SCRIPT.format(16) + "kubectl apply -f update-downgrade-enabled-pkg.yaml 2>err.txt",
        sky(mypkg("1.0.0", True, False)),
        deny=(
            'package "mypkg": downgrade not allowed \u2014 set uninstall.apply=true first, wait '
            "for uninstall to complete, then change version"
        ),
        kubectl=True,
    )
    s.delete(
        "chainsaw-test.yaml",
        _SCRIPT.format(17) + "kubectl delete skyhook uninstall-webhook-reject --timeout=120s || true",
        "Skyhook",
        "uninstall-webhook-reject",
    )


TESTS = {
    "cli/deployment-policy": cli_deployment_policy,
    "cli/lifecycle": cli_lifecycle,
    "cli/node": cli_node,
    "cli/package": cli_package,
    "cli/reset": cli_reset,
    "deployment-policy/batch-state-reset": batch_state_reset,
    "deployment-policy/legacy-compatibility": legacy_compatibility,
    "deployment-policy/linear-strategy": linear_strategy,
    "deployment-policy/multi-compartment": multi_compartment,
    "deployment-policy/overlapping-selectors": overlapping_selectors,
    "helm/helm-chart-test": helm_chart_test,
    "helm/helm-webhook-test": helm_webhook_test,
}


def scenarios(repo: str) -> list[Scenario]:
    out = []
    for name, fn in TESTS.items():
        s = Scenario(repo, "chainsaw", f"k8s-tests/chainsaw/{name}/", "chainsaw step", label=name)
        fn(s, repo == NODEWRIGHT)
        out.append(s)
    return out


__all__ = ["TESTS", "scenarios", "step"]
