"""Admission engine: upstream example CRs, one test per rule (allowed and denied), both groups."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from admission import rules
from admission.images import ImageError, allowed_by, parse_image, parse_prefix
from admission.policy import PackagePolicy
from admission.quantity import parse_quantity

DIGEST = "sha256:" + "ab" * 32

# research/nodewright.md §5 (a), (b), (c), (d)
UPSTREAM = yaml.safe_load_all(
    """
apiVersion: skyhook.nvidia.com/v1alpha1
kind: Skyhook
metadata: {name: auto-taint-new-nodes}
spec:
  runtimeRequired: true
  autoTaintNewNodes: true
  nodeSelectors: {matchLabels: {kubernetes.io/hostname: kind-worker}}
  packages:
    spencer:
      version: "3.2.3"
      image: ghcr.io/nvidia/skyhook/agentless
      env: [{name: SLEEP_LEN, value: "2"}]
---
apiVersion: skyhook.nvidia.com/v1alpha1
kind: Skyhook
metadata:
  name: demo
  annotations: {skyhook.nvidia.com/pause: "false", skyhook.nvidia.com/disable: "false"}
spec:
  nodeSelectors: {matchLabels: {skyhook.nvidia.com/test-node: skyhooke2e}}
  packages:
    baz:
      version: 1.1.0
      image: ghcr.io/nvidia/skyhook-packages/shellscript
      configMap:
        config.yaml: "#!/bin/bash\\nsleep 1\\necho \\"Hello, config!\\""
        config_check.yaml: "#!/bin/bash\\nsleep 1\\necho \\"Hello, config check!\\""
---
apiVersion: skyhook.nvidia.com/v1alpha1
kind: Skyhook
metadata: {name: sample}
spec:
  additionalTolerations: [{key: nvidia.com/gpu, operator: Exists}]
  nodeSelectors: {matchLabels: {agentpool: gpu}}
  podNonInterruptLabels: {matchLabels: {key: value}}
  interruptionBudget: {percent: 33}
  packages:
    something-important:
      version: 1.0.0
      image: ghcr.io/nvidia/skyhook-packages/shellscript
      dependsOn: {tuning: 1.0.0}
      configMap: {apply.sh: "...", apply_check.sh: "...", config.sh: "...", config_check.sh: "..."}
    tuning:
      version: 1.0.0
      image: ghcr.io/nvidia/skyhook-packages/tuning
      interrupt: {type: reboot}
      configInterrupts: {grub.conf: {type: reboot}, sysctl.conf: {type: restartAllServices}}
      configMap: {grub.conf: "hugepagesz=1G", sysctl.conf: "fs.inotify.max_user_instances=1", u.conf: "x"}
---
apiVersion: skyhook.nvidia.com/v1alpha1
kind: Skyhook
metadata: {name: explicit-uninstall}
spec:
  nodeSelectors: {matchLabels: {skyhook.nvidia.com/test-node: skyhooke2e}}
  interruptionBudget: {count: 1}
  packages:
    mypkg:
      version: "2.1.4"
      image: ghcr.io/nvidia/skyhook/agentless
      configMap: {install.sh: "echo installing", uninstall.sh: "echo uninstalling"}
      env: [{name: MY_VAR, value: "hello"}]
      interrupt: {type: reboot}
      uninstall: {enabled: true, apply: false}
"""
)
AUTO_TAINT, DEMO, SAMPLE, UNINSTALL = list(UPSTREAM)

# The upstream negative case: cookies depends on milkshake, only milk exists.
INVALID_DEPENDS = {
    "apiVersion": "skyhook.nvidia.com/v1alpha1",
    "kind": "Skyhook",
    "metadata": {"name": "invalid"},
    "spec": {
        "packages": {
            "milk": {"version": "1.2.3", "image": "ghcr.io/nvidia/skyhook/agentless"},
            "cookies": {
                "version": "1.2.3",
                "image": "ghcr.io/nvidia/skyhook/agentless",
                "dependsOn": {"milkshake": "1.2.3"},
            },
        }
    },
}


def cr(doc: dict[str, Any], group: str = "skyhook.nvidia.com") -> rules.PackageCR:
    doc = copy.deepcopy(doc)
    doc["apiVersion"] = f"{group}/v1alpha1"
    doc["kind"] = rules.PACKAGE_GROUPS[group]
    parsed = rules.parse_package_cr(doc)
    assert isinstance(parsed, rules.PackageCR), parsed
    return parsed


def policy(name: str = "gpu", **spec: Any) -> PackagePolicy:
    return PackagePolicy.model_validate(
        {
            "apiVersion": "nodegate.io/v1alpha1",
            "kind": "PackagePolicy",
            "metadata": {"name": name},
            "spec": spec,
        }
    )


def structural(doc: dict[str, Any], group: str = "skyhook.nvidia.com") -> list[str]:
    return [v.rule for v in rules.structural_violations(cr(doc, group))]


GROUPS = pytest.mark.parametrize("group", ["skyhook.nvidia.com", "nodewright.nvidia.com"])


# -- upstream examples -----------------------------------------------------------------------


@GROUPS
def test_upstream_examples_are_structurally_valid(group: str) -> None:
    for doc in (DEMO, SAMPLE, UNINSTALL):
        assert structural(doc, group) == []
    # (a) is runtime-required without a toleration for nodegate's hold taint.
    assert structural(AUTO_TAINT, group) == ["hold-toleration"]


@GROUPS
def test_upstream_negative_case_is_refused(group: str) -> None:
    found = rules.structural_violations(cr(INVALID_DEPENDS, group))
    assert [(v.rule, v.path) for v in found] == [("depends-on", "spec.packages.cookies.dependsOn.milkshake")]
    assert "milkshake|1.2.3" in found[0].message


def test_unknown_fields_are_tolerated_and_wrong_types_named() -> None:
    doc = copy.deepcopy(DEMO)
    doc["spec"]["drainConfig"] = {"disableEviction": False}  # NodeWright v0.18 field
    doc["spec"]["packages"]["baz"]["stageTimeout"] = "1h"
    assert structural(doc, "nodewright.nvidia.com") == []
    doc["spec"]["priority"] = "high"
    out = rules.parse_package_cr(doc)
    assert isinstance(out, list)
    assert out[0].path == "spec.priority"


def test_objects_of_other_kinds_are_not_package_crs() -> None:
    out = rules.parse_package_cr({"apiVersion": "skyhook.nvidia.com/v1alpha1", "kind": "NodeWright"})
    assert isinstance(out, list)
    assert out[0].rule == "kind"


# -- structural rules, one each ------------------------------------------------------------------


def _with_pkg(**fields: Any) -> dict[str, Any]:
    doc = copy.deepcopy(DEMO)
    doc["spec"]["packages"]["baz"].update(fields)
    return doc


@GROUPS
@pytest.mark.parametrize(
    ("fields", "rule"),
    [
        ({"name": "other"}, "package-name"),
        ({"version": "v1.1.0"}, "semver"),
        ({"version": "1.2"}, "semver"),  # upstream's lenient shorthand is refused
        ({"version": "latest"}, "semver"),
        ({"image": "ghcr.io/nvidia/shellscript:latest"}, "no-latest"),
        ({"image": "ghcr.io/nvidia/shellscript:1.0.0"}, "tag-version"),
        ({"image": f"ghcr.io/nvidia/shellscript@{DIGEST}"}, "digest-field"),
        ({"containerSHA": "sha256:abc"}, "digest-format"),
        ({"image": "Not A Ref"}, "image"),
        ({"resources": {"cpuRequest": "100m"}}, "resources"),
        (
            {"resources": {"cpuRequest": "2", "cpuLimit": "1", "memoryRequest": "1Gi", "memoryLimit": "1Gi"}},
            "resources",
        ),
        (
            {"resources": {"cpuRequest": "0", "cpuLimit": "1", "memoryRequest": "1Gi", "memoryLimit": "1Gi"}},
            "resources",
        ),
        (
            {"resources": {"cpuRequest": "x", "cpuLimit": "1", "memoryRequest": "1Gi", "memoryLimit": "1Gi"}},
            "resources",
        ),
        ({"uninstall": {"enabled": False, "apply": True}}, "uninstall"),
        ({"interrupt": {"type": "kexec"}}, "interrupt-type"),
        ({"configInterrupts": {"missing.conf": {"type": "noop"}}}, "config-interrupt"),
        ({"dependsOn": {"baz": "1.1.0"}}, "depends-on"),  # self-cycle
        ({"agentImageOverride": "ghcr.io/nvidia/agent:latest"}, "no-latest"),
    ],
)
def test_structural_rule_refuses(group: str, fields: dict[str, Any], rule: str) -> None:
    assert rule in structural(_with_pkg(**fields), group)


@GROUPS
@pytest.mark.parametrize(
    "fields",
    [
        {"image": "ghcr.io/nvidia/shellscript:1.1.0"},  # tag equal to version
        {"containerSHA": DIGEST},
        {"version": "1.1.0-rc.1+build.5"},
        {
            "resources": {
                "cpuRequest": "500m",
                "cpuLimit": "1",
                "memoryRequest": "512Mi",
                "memoryLimit": "1Gi",
            }
        },
        {"uninstall": {"enabled": True, "apply": True}},
        {"configInterrupts": {"config*": {"type": "service", "services": ["containerd"]}}},
        {"agentImageOverride": f"ghcr.io/nvidia/agent@{DIGEST}"},
    ],
)
def test_structural_rule_allows(group: str, fields: dict[str, Any]) -> None:
    assert structural(_with_pkg(**fields), group) == []


def test_dependency_cycles_are_found() -> None:
    doc = copy.deepcopy(SAMPLE)
    doc["spec"]["packages"]["tuning"]["dependsOn"] = {"something-important": "1.0.0"}
    found = [v for v in rules.structural_violations(cr(doc)) if v.rule == "depends-on"]
    assert len(found) == 1
    assert "tuning" in found[0].message
    assert "something-important" in found[0].message


def test_budget_shape_rules() -> None:
    for budget, extra in (({"percent": 10, "count": 1}, {}), ({}, {}), ({"percent": 150}, {}),
                          ({"percent": 10}, {"deploymentPolicy": "p"})):  # fmt: skip
        doc = copy.deepcopy(DEMO)
        doc["spec"]["interruptionBudget"] = budget
        doc["spec"].update(extra)
        assert "budget" in structural(doc)


@pytest.mark.parametrize(
    "expr",
    [
        {"key": "agentpool", "operator": "Gt", "values": ["1"]},
        {"key": "agentpool", "operator": "In", "values": []},
        {"key": "agentpool", "operator": "Exists", "values": ["gpu"]},
    ],
)
def test_selectors_the_operator_would_not_parse_are_refused(expr: dict[str, Any]) -> None:
    doc = copy.deepcopy(DEMO)
    doc["spec"]["nodeSelectors"] = {"matchLabels": {"agentpool": "gpu"}, "matchExpressions": [expr]}
    assert structural(doc) == ["selector"]


def test_wildcard_toleration_is_refused() -> None:
    doc = copy.deepcopy(DEMO)
    doc["spec"]["additionalTolerations"] = [{"operator": "Exists"}]
    assert structural(doc) == ["toleration-wildcard"]
    doc["spec"]["additionalTolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert structural(doc) == []


def test_runtime_required_needs_the_hold_toleration() -> None:
    doc = copy.deepcopy(AUTO_TAINT)
    doc["spec"]["additionalTolerations"] = [
        {"key": "nodegate.io/hold", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert structural(doc) == []
    doc["spec"]["additionalTolerations"] = [
        {"key": "nodegate.io/hold", "operator": "Exists", "effect": "NoExecute"}
    ]
    assert structural(doc) == ["hold-toleration"]
    equal = {"key": "nodegate.io/hold", "operator": "Equal", "effect": "NoSchedule"}
    doc["spec"]["additionalTolerations"] = [{**equal, "value": "packages-pending"}]
    assert structural(doc) == []
    doc["spec"]["additionalTolerations"] = [{**equal, "value": "unattested"}]  # never matches while pending
    assert structural(doc) == ["hold-toleration"]


# -- pools -------------------------------------------------------------------------------------


def _sel(**kw: Any) -> rules.Selector:
    return rules.Selector.model_validate(kw)


@pytest.mark.parametrize(
    ("pool", "selector", "inside"),
    [
        ({"pool": "gpu"}, {"matchLabels": {"pool": "gpu", "zone": "a"}}, True),
        ({"pool": "gpu"}, {"matchLabels": {"zone": "a"}}, False),
        ({"pool": "gpu"}, {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]}, True),
        (
            {"pool": "gpu"},
            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu", "cpu"]}]},
            False,
        ),
        (
            {"pool": "gpu"},
            {"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["cpu"]}]},
            False,
        ),
        ({"pool": "gpu"}, {"matchExpressions": [{"key": "pool", "operator": "Exists"}]}, False),
        ({"pool": "gpu"}, {}, False),  # empty: every node
        ({}, {}, True),
        ({}, {"matchLabels": {"pool": "gpu"}}, True),
    ],
)
def test_pool_containment(pool: dict[str, str], selector: dict[str, Any], inside: bool) -> None:
    assert rules.pool_contains(pool, _sel(**selector)) is inside


# -- policy rules, one each ----------------------------------------------------------------------

GPU_POOL = {"matchLabels": {"agentpool": "gpu"}}
OPEN = {
    "nodeSelector": GPU_POOL,
    "images": {"registries": ["ghcr.io/nvidia"]},
    "interrupts": {"allowed": ["noop", "service", "restartAllServices", "reboot"]},
}


def verdict(doc: dict[str, Any], group: str = "skyhook.nvidia.com", **spec: Any) -> list[str]:
    found = rules.policy_violations(cr(doc, group), policy(**{**OPEN, **spec}))
    return [v.rule for v in found]


@GROUPS
def test_sample_passes_an_open_gpu_policy(group: str) -> None:
    assert verdict(SAMPLE, group) == []
    verdicts = rules.policy_verdicts(
        cr(SAMPLE, group), [policy("other", nodeSelector={"matchLabels": {"x": "y"}}), policy(**OPEN)]
    )
    assert [(v.policy, v.ok, v.reboot) for v in verdicts] == [("gpu", True, True)]


@GROUPS
@pytest.mark.parametrize(
    ("spec", "rule"),
    [
        (
            {"images": {"registries": ["ghcr.io/nvidia/skyhook-packages/shellscript"]}},
            "registry",
        ),  # not tuning
        ({"images": {"registries": ["ghcr.io/nvidia"], "requireDigest": True}}, "require-digest"),
        ({"interrupts": {"allowed": ["noop", "restartAllServices"]}}, "interrupt-allowed"),  # reboot
        ({"maxInterruptionBudget": {"percent": 10}}, "budget-cap"),
        ({"maxInterruptionBudget": {"count": 2}}, "budget-cap"),  # CR uses percent: not comparable
        ({"priority": {"min": 300}}, "priority"),
    ],
)
def test_policy_rule_refuses(group: str, spec: dict[str, Any], rule: str) -> None:
    assert rule in verdict(SAMPLE, group, **spec)


def test_registry_allowlist_compares_parts_not_prefixes() -> None:
    prefix = parse_prefix("registry.example.com/nodewright")
    assert allowed_by(parse_image("registry.example.com/nodewright/driver"), prefix)
    assert allowed_by(parse_image("REGISTRY.example.com/nodewright/driver"), prefix)
    for bad in (
        "registry.example.com.evil.io/nodewright/x",
        "registry.example.com/nodewright-evil/x",
        "registry.example.com:5000/nodewright/x",
        "evil.io/registry.example.com/nodewright/x",
    ):
        assert not allowed_by(parse_image(bad), prefix), bad
    assert parse_image("busybox").repository == "docker.io/library/busybox"
    with pytest.raises(ImageError):
        parse_prefix("nodewright")  # no registry host


def test_runtime_required_secret_env_and_agent_override_need_the_policy() -> None:
    doc = copy.deepcopy(AUTO_TAINT)
    doc["spec"]["nodeSelectors"] = GPU_POOL
    doc["spec"]["interruptionBudget"] = {"percent": 10}
    pkg = doc["spec"]["packages"]["spencer"]
    pkg["env"].append(
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "webhook-cert", "key": "tls.key"}}}
    )
    pkg["agentImageOverride"] = f"ghcr.io/nvidia/agent@{DIGEST}"
    assert sorted(verdict(doc)) == ["agent-override", "runtime-required", "runtime-required", "secret-env"]
    allowed = verdict(doc, allowRuntimeRequired=True, allowSecretEnv=True, allowAgentImageOverride=True)
    assert allowed == []


def test_no_budget_exceeds_any_cap_and_a_deployment_policy_is_judged_elsewhere() -> None:
    doc = copy.deepcopy(DEMO)
    doc["spec"]["nodeSelectors"] = GPU_POOL
    assert verdict(doc, maxInterruptionBudget={"percent": 50}) == ["budget-cap"]
    doc["spec"]["deploymentPolicy"] = "rollout"
    assert verdict(doc, maxInterruptionBudget={"percent": 50}) == []


def test_one_node_at_a_time_is_within_every_percent_cap() -> None:
    doc = copy.deepcopy(SAMPLE)
    doc["spec"]["interruptionBudget"] = {"count": 1}
    assert verdict(doc, maxInterruptionBudget={"percent": 5}) == []
    doc["spec"]["interruptionBudget"] = {"count": 2}
    assert verdict(doc, maxInterruptionBudget={"percent": 5}) == ["budget-cap"]
    assert verdict(doc, maxInterruptionBudget={"count": 2}) == []


def test_policy_defaults_are_strict() -> None:
    p = policy()
    assert p.spec.interrupts.allowed == ("noop",)
    assert not p.spec.allow_runtime_required
    assert not p.spec.allow_secret_env
    assert not p.spec.allow_agent_image_override
    with pytest.raises(ValueError, match="exactly one"):
        policy(maxInterruptionBudget={"percent": 1, "count": 1})
    with pytest.raises(ValueError, match="matchLabels only"):
        policy(nodeSelector={"matchExpressions": [{"key": "a", "operator": "Exists"}]})


def test_no_pool_violation_says_what_to_do() -> None:
    v = rules.no_pool_violation(cr(INVALID_DEPENDS))
    assert v.path == "spec.nodeSelectors"
    assert "every node" in v.message


@pytest.mark.parametrize(
    ("text", "value"),
    [("500m", "0.5"), ("1Gi", str(2**30)), ("2", "2"), ("1.5k", "1500"), ("1e3", "1000"), (3, "3")],
)
def test_quantities(text: object, value: str) -> None:
    from decimal import Decimal

    assert parse_quantity(text) == Decimal(value)


@pytest.mark.parametrize("bad", ["", "1.2.3", "Mi", "1 Gi", True, None, "1" * 100])
def test_bad_quantities(bad: object) -> None:
    with pytest.raises(ValueError, match="quantity"):
        parse_quantity(bad)
