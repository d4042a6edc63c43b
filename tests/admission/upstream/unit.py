"""Upstream's webhook unit tests (``operator/api/v1alpha1/*_test.go``), object by object.

The tests build Go structs and call ``Validate()``, ``ValidateCreate`` or ``ValidateUpdate``
(``ValidateUpdate(ctx, nil, obj)`` checks the object as a CREATE would). Each case here is such an
object as the Go client would send it (its JSON encoding: an unset image is ``""``, the name as
the test sets it) and the test's expectation. Where a test checks several objects, ``[sub]``
numbers them in the order the test does. The webhook and DeploymentPolicy tests are the same in
both repositories; ``skyhook_types_test.go``'s uninstall cases are NVIDIA/nodewright's only.
"""

from __future__ import annotations

from typing import Any

from tests.admission.upstream.gotypes import encode_deployment_policy_spec, encode_skyhook_spec
from tests.admission.upstream.model import NODEWRIGHT, SKYHOOK, Case
from tests.admission.upstream.objects import (
    budget,
    compartment,
    exponential,
    fixed,
    linear,
    service,
    uninstall,
)
from tests.admission.upstream.scenario import Scenario, policy, skyhook

WEBHOOK = "operator/api/v1alpha1/skyhook_webhook_test.go"
TYPES = "operator/api/v1alpha1/skyhook_types_test.go"
POLICY = "operator/api/v1alpha1/deployment_policy_webhook_test.go"
REBOOT = {"type": "reboot"}


def p(name: str, version: str, image: str = "", **fields: Any) -> dict[str, Any]:
    """A package as the test's struct literal sets it."""
    return {"name": name, "version": version, "image": image, **fields}


def sky(repo: str, name: str, packages: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    body = {**spec, "packages": packages or {}}
    return skyhook(name, encode_skyhook_spec(body, decode=False, skyhook_repo=repo == SKYHOOK))


def dp(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return policy(name, encode_deployment_policy_spec(spec))


def webhook_cases(s: Scenario, repo: str) -> None:
    def create(it: str, call: str, body: dict[str, Any], deny: str = "", **extra: Any) -> None:
        s.create(WEBHOOK, f"{it} ({call})", body, deny, **extra)

    nil_update, create_call, validate = "ValidateUpdate(nil, obj)", "ValidateCreate(obj)", "Validate()"
    missing = (
        "error trying to validate skyhook spec graph is invalid: error graph is not valid, "
        "missing: [CATS|2.3]"
    )
    create(
        "Should deny if missing a depends on",
        nil_update,
        sky(repo, "test", {"foobar": p("foobar", "1.0.0", dependsOn={"CATS": "2.3"})}),
        missing,
    )
    create(
        "Should deny if duplicate packages",
        nil_update,
        sky(repo, "test", {"foobar": p("foobar", "1.0.0"), "foobar2": p("foobar", "1.0.0")}),
        (
            "error package foobar2's name was set to foobar. Do not explicitly set the name in "
            "the package's definition"
        ),
    )
    it = "Should deny if a package's name is explicitly set and changed"
    create(
        f"{it} [1-names-match]",
        create_call,
        sky(repo, "test", {"foo": p("foo", "1.0.0"), "bar": p("bar", "1.0.0")}),
    )
    create(
        f"{it} [2-names-changed]",
        create_call,
        sky(repo, "test", {"foo": p("changed", "1.0.0"), "bar": p("changed", "1.0.0")}),
        (
            "error package bar's name was set to changed. Do not explicitly set the name in the "
            "package's definition"
        ),
    )
    it = "Should deny if an image tag for a package is explicitly set and changed"
    create(
        f"{it} [1-tag-equals-version]",
        create_call,
        sky(repo, "test", {"foo": p("foo", "1.0.0", "testing"), "bar": p("bar", "1.0.0", "testing:1.0.0")}),
    )
    # The test calls ValidateCreate on the struct, so the tag is still there; a request is decoded
    # first (Packages.UnmarshalJSON cuts the tag), and then upstream's webhook allows it.
    create(
        f"{it} [2-tag-differs]",
        create_call,
        sky(
            repo,
            "test",
            {"foo": p("foo", "1.0.0", "testing:1.2.1"), "bar": p("bar", "1.0.0", "testing:1.2.1")},
        ),
        (
            "error package bar's image tag was set to '1.2.1' for 'testing' and doesn't match "
            "the pacakge's version '1.0.0'"
        ),
        on_request=True,
        note="Go-level test; on a real request the tag is cut before Validate() and upstream allows it",
    )
    it = "should validate that the configInterrupts are for valid configMaps"
    cm = {"key": "value", "dog": "value"}
    create(
        f"{it} [1-missing-key]",
        nil_update,
        sky(
            repo,
            "test",
            {
                "foo": p("foo", "1.0.0", configMap=cm, configInterrupts={"dog": REBOOT}),
                "bar": p("bar", "1.0.0", configMap=cm, configInterrupts={"cat": REBOOT}),
            },
        ),
        "error config interrupt for key that doesn't exist: cat doesn't exist as a configmap",
    )
    create(
        f"{it} [2-keys-exist]",
        nil_update,
        sky(
            repo,
            "test",
            {
                "foo": p("foo", "1.0.0", configMap=cm, configInterrupts={"key": service("cron")}),
                "bar": p(
                    "bar", "1.0.0", configMap=cm, configInterrupts={"key": REBOOT, "dog": service("cat")}
                ),
            },
        ),
    )
    scripts = {"config.sh": "abc", "upgrade.sh": "def"}
    create(
        "should allow glob patterns in configInterrupts that match at least one key",
        create_call,
        sky(
            repo,
            "test",
            {"foo": p("foo", "1.0.0", configMap=scripts, configInterrupts={"*.sh": service("kubelet")})},
        ),
    )
    create(
        "should reject glob patterns in configInterrupts that match no keys",
        create_call,
        sky(
            repo,
            "test",
            {
                "foo": p(
                    "foo",
                    "1.0.0",
                    configMap={"config.txt": "abc"},
                    configInterrupts={"*.sh": service("kubelet")},
                )
            },
        ),
        'error config interrupt glob "*.sh" does not match any configMap keys',
    )
    create(
        "Should deny if ambiguous version match",
        nil_update,
        sky(
            repo,
            "test",
            {
                "cats": p("cats", "2.0.0"),
                "cats2": p("cats", "1.0.0"),
                "foobar": p("foobar", "1.0.0", dependsOn={"cats": "1.0.0"}),
            },
        ),
        (
            "error package cats2's name was set to cats. Do not explicitly set the name in the "
            "package's definition"
        ),
    )
    it = "Should deny if invalid version string is provided"
    create(
        f"{it} [1-slash-date]",
        create_call,
        sky(
            repo,
            "test",
            {"cats": p("cats", "2.0.0"), "foobar": p("foobar", "2024/07/06", dependsOn={"cats": "2.0.0"})},
        ),
        "error version string for foobar is invalid: 2024/07/06",
    )
    create(
        f"{it} [2-dotted-date]",
        create_call,
        sky(
            repo,
            "test",
            {"cats": p("cats", "2.1.1"), "foobar": p("foobar", "2024.7.6", dependsOn={"cats": "2.1.1"})},
        ),
    )
    create("Should admit graph is valid", create_call, sky(repo, "test", {"foobar": p("foobar", "1.0.0")}))
    it = "Should validate node selectors"
    too_long = "123123123112312312311231231231123123123112312312311231231231123123"
    for sub, labels, deny in (
        ("1-empty-value", {"foo": ""}, ""),
        ("2-plain", {"foo": "bar"}, ""),
        ("3-key-leading-dash", {"-foo": "bar"}, 'node selectors are not valid: key: Invalid value: "-foo"'),
        (
            "4-key-leading-underscore",
            {"_foo": "bar"},
            'node selectors are not valid: key: Invalid value: "_foo"',
        ),
        (
            "5-value-leading-dash",
            {"foo": "-bar"},
            'node selectors are not valid: values[0][foo]: Invalid value: "-bar"',
        ),
        (
            "6-value-too-long",
            {"foo": too_long},
            f'node selectors are not valid: values[0][foo]: Invalid value: "{too_long}"',
        ),
    ):
        create(f"{it} [{sub}]", validate, sky(repo, "test", nodeSelectors={"matchLabels": labels}), deny)
    # The test re-uses one *ResourceRequirements, so each call sees the earlier edits: these are
    # the values each Validate() received.
    it = "should validate resource override requirements"
    all_or_none = (
        'package "foo": if any resource override is set, all of cpuRequest, cpuLimit, '
        "memoryRequest, memoryLimit must be set"
    )
    for sub, res, deny in (
        ("1-all-unset", {}, ""),
        (
            "2-all-set",
            {"cpuRequest": "100m", "cpuLimit": "200m", "memoryRequest": "128Mi", "memoryLimit": "256Mi"},
            "",
        ),
        (
            "3-cpuLimit-unset",
            {"cpuRequest": "100m", "memoryRequest": "128Mi", "memoryLimit": "256Mi"},
            all_or_none,
        ),
        (
            "4a-cpuLimit-below-request",
            {"cpuRequest": "100m", "cpuLimit": "50m", "memoryRequest": "128Mi", "memoryLimit": "256Mi"},
            'package "foo": cpuLimit (50m) must be >= cpuRequest (100m)',
        ),
        (
            "4b-memoryLimit-below-request",
            {"cpuRequest": "100m", "cpuLimit": "50m", "memoryRequest": "128Mi", "memoryLimit": "64Mi"},
            'package "foo": cpuLimit (50m) must be >= cpuRequest (100m)',
        ),
        (
            "5a-zero-cpuRequest",
            {"cpuRequest": "0", "cpuLimit": "50m", "memoryRequest": "128Mi", "memoryLimit": "64Mi"},
            all_or_none,
        ),
        (
            "5b-negative-memoryLimit",
            {"cpuRequest": "0", "cpuLimit": "50m", "memoryRequest": "128Mi", "memoryLimit": "-1Mi"},
            all_or_none,
        ),
    ):
        create(
            f"{it} [{sub}]",
            validate,
            sky(repo, "test", {"foo": p("foo", "1.0.0", "alpine", resources=res)}),
            deny,
        )
    # A decoding test: the JSON it decodes, sent as a request (upstream asserts no verdict).
    create(
        "packages should UnmarshalJSON correctly",
        "json.Unmarshal (decode test, not a webhook call)",
        skyhook("test", {"packages": {"foo": {"version": "1.2.2", "image": "bar:1.2.2"}}}),
        basis="derived from upstream's rules (the test asserts decoding only)",
    )
    create(
        "should validate the package name is a valid RFC 1123 name",
        create_call,
        sky(repo, "test", {"11": {"name": "", "version": "1"}}),
        "error package 11's name was set to . Do not explicitly set the name in the package's definition",
    )
    create(
        "should validate the deployment policy",
        create_call,
        sky(repo, "test", deploymentPolicy="foobar", interruptionBudget=budget(percent=25)),
        "deploymentPolicy and interruptionBudget are mutually exclusive",
    )
    test_pkg = {"test-pkg": p("test-pkg", "1.0.0")}
    create(
        "should reject skyhook with non-existent deployment policy",
        create_call,
        sky(repo, "test-skyhook", test_pkg, deploymentPolicy="non-existent-policy"),
        'deploymentPolicy "non-existent-policy" not found',
    )
    create(
        "should accept skyhook when deployment policy exists",
        create_call,
        sky(repo, "test-skyhook-valid", test_pkg, deploymentPolicy="test-policy-webhook"),
    )
    for name, target, deny in (
        ("test-skyhook-update", "does-not-exist", 'deploymentPolicy "does-not-exist" not found'),
        ("test-skyhook-update-valid", "valid-policy-for-update", ""),
    ):
        s.seed(sky(repo, name, test_pkg))
        verb = "reject" if deny else "allow"
        target_kind = "non-existent" if deny else "valid"
        it = f"should {verb} skyhook update to reference {target_kind} deployment policy"
        s.update(
            WEBHOOK,
            f"{it} (ValidateUpdate(old, obj))",
            sky(repo, name, test_pkg, deploymentPolicy=target),
            deny,
        )


def types_cases(s: Scenario, repo: str) -> None:
    """skyhook_types_test.go: uninstall.apply needs enabled, and the downgrade rules."""

    def my(version: str, enabled: bool, apply: bool) -> dict[str, Any]:
        return sky(
            repo, "test", {"my-pkg": p("my-pkg", version, "my-image", uninstall=uninstall(enabled, apply))}
        )

    validate = "Validate()"
    s.create(
        TYPES,
        f"Should reject uninstall.apply=true with enabled=false via Validate ({validate})",
        my("1.0.0", False, True),
        'package "my-pkg": uninstall.apply requires uninstall.enabled to be true',
    )
    s.create(
        TYPES,
        f"Should allow uninstall.apply=true with enabled=true via Validate ({validate})",
        my("1.0.0", True, True),
    )
    s.create(
        TYPES,
        f"Should pass validation with nil Uninstall field ({validate})",
        sky(repo, "test", {"my-pkg": p("my-pkg", "1.0.0", "my-image")}),
    )
    set_apply = (
        'package "my-pkg": downgrade not allowed \u2014 set uninstall.apply=true first, wait for '
        "uninstall to complete, then change version"
    )
    not_done = (
        'package "my-pkg": downgrade not allowed \u2014 uninstall has not yet completed on all '
        "nodes. Wait for the uninstall to finish, then change version"
    )
    state = {
        "my-pkg|v2.0.0": {
            "name": "my-pkg",
            "version": "v2.0.0",
            "image": "",
            "stage": "uninstall",
            "state": "in_progress",
        }
    }
    for it, old, new, status, deny in (
        (
            "Should reject downgrade of enabled package without apply=true via ValidateUpdate",
            ("2.0.0", True, False),
            ("1.0.0", True, False),
            None,
            set_apply,
        ),
        (
            "Should reject downgrade when old apply=false",
            ("v2.0.0", True, False),
            ("v1.0.0", True, False),
            None,
            set_apply,
        ),
        (
            "Should reject downgrade when node state still contains package",
            ("v2.0.0", True, True),
            ("v1.0.0", True, True),
            {"node-1": state},
            not_done,
        ),
        (
            "Should allow downgrade when old apply=true AND package absent from all nodes",
            ("v2.0.0", True, True),
            ("v1.0.0", True, False),
            {"node-1": {}},
            "",
        ),
        (
            "Should allow upgrade regardless of apply setting",
            ("v1.0.0", True, False),
            ("v2.0.0", True, False),
            None,
            "",
        ),
        (
            "Should skip downgrade check for invalid semver (defers to Validate)",
            ("not-a-semver", True, False),
            ("also-invalid", True, False),
            None,
            "error version string for my-pkg is invalid: also-invalid",
        ),
    ):
        scenario = Scenario(repo, "unit", "", "unit test")
        full: dict[str, Any] | None = (
            None
            if status is None
            else {"nodeState": status, "completeNodes": "0/0", "nodesInProgress": 0, "packageList": ""}
        )
        scenario.seed(my(*old), full)
        scenario.update(TYPES, f"{it} (ValidateUpdate(old, obj))", my(*new), deny)
        s.cases += scenario.cases


def policy_cases(s: Scenario) -> None:
    create_call = "ValidateCreate(obj)"
    web, api = {"tier": "web"}, {"tier": "api"}
    s.create(
        POLICY,
        (
            "Should fill in the default value if a required field is empty (Default(obj) "
            "(mutating webhook only))"
        ),
        dp(
            "foobar",
            {
                "default": {"strategy": {"fixed": {}}},
                "compartments": [
                    compartment("foo", web, budget(percent=25), {"linear": {}}),
                    compartment("bar", api, budget(count=3), {"exponential": {}}),
                ],
            },
        ),
        "default budget: exactly one of percent or count must be set",
        basis="derived from upstream's rules (the test asserts the mutating defaults only)",
    )
    it = "should require exactly one of fixed, linear, or exponential"
    one = "default strategy: exactly one of fixed, linear, or exponential must be set"
    for sub, strategy, deny in (
        ("1-none", {}, one),
        ("2-fixed", fixed(), ""),
        ("3-two", {**linear(), **exponential()}, one),
    ):
        s.create(
            POLICY,
            f"{it} [{sub}] ({create_call})",
            dp("foobar", {"default": {"budget": budget(percent=25), "strategy": strategy}}),
            deny,
        )
    it = "should require exactly one of percent or count"
    for sub, amount, deny in (
        ("1-neither", {}, "default budget: exactly one of percent or count must be set"),
        ("2-percent", budget(percent=25), ""),
        ("3-count", budget(count=5), ""),
        ("4-both", budget(percent=25, count=5), "default budget: percent and count are mutually exclusive"),
    ):
        s.create(
            POLICY,
            f"{it} [{sub}] ({create_call})",
            dp("foobar", {"default": {"budget": amount, "strategy": fixed()}}),
            deny,
        )
    base = {"budget": budget(percent=25), "strategy": fixed()}
    for it, sub, compartments, deny in (
        (
            "should require unique compartment names",
            "1-duplicate",
            [compartment("system", web, budget(percent=25)), compartment("system", api, budget(count=3))],
            'compartment name "system" is not unique',
        ),
        (
            "should require unique compartment names",
            "2-renamed",
            [compartment("system", web, budget(percent=25)), compartment("gpu", api, budget(count=3))],
            "",
        ),
        (
            "should reject compartment name '__default__' as reserved",
            "1-reserved",
            [compartment("__default__", web, budget(percent=25))],
            'compartment name "__default__" is reserved and cannot be used',
        ),
        (
            "should reject compartment name '__default__' as reserved",
            "2-renamed",
            [compartment("system", web, budget(percent=25))],
            "",
        ),
        (
            "should allow different selectors",
            "1-identical",
            [
                compartment("system", {"node-type": "system"}, budget(percent=25)),
                compartment("gpu", {"node-type": "system"}, budget(count=3)),
            ],
            'compartment "gpu" has identical selector to compartment "system"',
        ),
        (
            "should allow different selectors",
            "2-different",
            [
                compartment("system", {"node-type": "system"}, budget(percent=25)),
                compartment("gpu", {"node-type": "gpu"}, budget(count=3)),
            ],
            "",
        ),
    ):
        s.create(
            POLICY,
            f"{it} [{sub}] ({create_call})",
            dp("foobar", {"default": base, "compartments": compartments}),
            deny,
        )
    everything = {"default": {"budget": budget(percent=100), "strategy": fixed()}}
    for it, name, deny in (
        ("should allow deletion when no Skyhooks reference it", "unused-policy", ""),
        (
            "should reject deletion when Skyhooks reference it",
            "policy-in-use",
            (
                'cannot delete DeploymentPolicy "policy-in-use": still referenced by 1 '
                "Skyhook(s): [test-skyhook-using-policy]"
            ),
        ),
        ("should allow deletion after Skyhooks no longer reference it", "policy-to-be-freed", ""),
    ):
        s.seed(dp(name, everything))
        s.delete(POLICY, f"{it} (ValidateDelete(obj))", "DeploymentPolicy", name, deny)


def cases(repo: str) -> list[Case]:
    s = Scenario(repo, "unit", "", "unit test")
    webhook_cases(s, repo)
    if repo == NODEWRIGHT:
        types_cases(s, repo)
    policy_cases(s)
    return s.cases
