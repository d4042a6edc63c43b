"""Admission engine: the project's own package CRs (and upstream's examples, from the public test
data), one test per rule (allowed and denied), both groups."""

from __future__ import annotations

import contextlib
import copy
import functools
from decimal import Decimal
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from admission.decision.advice import soft_warnings
from admission.policies import rules
from admission.reading import crs
from admission.reading import structural as reader
from admission.reading.policy import PackagePolicy
from admission.syntax.images import ImageError, allowed_by, parse_image, parse_prefix
from admission.syntax.quantity import parse_quantity
from tests.support.package_crs import AUTO_TAINT, MISSING_DEPENDENCY, SAMPLE, SIMPLE, UNINSTALL
from tests.support.shared_data import shared

DIGEST = "sha256:" + "ab" * 32


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


# -- the examples ------------------------------------------------------------------------------


@GROUPS
def test_own_examples_are_structurally_valid(group: str) -> None:
    for doc in (AUTO_TAINT, SIMPLE, SAMPLE, UNINSTALL):
        assert structural(doc, group) == []


# Upstream's simplest example and its operator sample, unedited (public test data, not committed).
_UPSTREAM_EXAMPLES = (
    ("nodewright-demo", "examples/simple/scr.yaml"),
    ("nodewright", "operator/config/samples/skyhook_v1alpha1_skyhook.yaml"),
)


@GROUPS
def test_upstream_examples_are_structurally_valid(group: str) -> None:
    for folder, name in _UPSTREAM_EXAMPLES:
        assert structural(yaml.safe_load(shared(folder).read(name)), group) == [], name


@GROUPS
def test_a_missing_dependency_is_refused(group: str) -> None:
    found = rules.structural_violations(cr(MISSING_DEPENDENCY, group))
    assert [(v.rule, v.path) for v in found] == [("depends-on", "spec.packages.toolkit.dependsOn.driver")]
    assert "driver|2.4.0" in found[0].message


def test_unknown_fields_are_tolerated_and_wrong_types_named() -> None:
    doc = copy.deepcopy(SIMPLE)
    doc["spec"]["drainConfig"] = {"disableEviction": False}  # NodeWright v0.18 field
    doc["spec"]["packages"]["greeter"]["stageTimeout"] = "1h"
    assert structural(doc, "nodewright.nvidia.com") == []
    doc["spec"]["priority"] = "high"
    out = rules.parse_package_cr(doc)
    assert isinstance(out, list)
    assert out[0].path == "spec.priority"


def test_objects_of_other_kinds_are_not_package_crs() -> None:
    out = rules.parse_package_cr({"apiVersion": "skyhook.nvidia.com/v1alpha1", "kind": "NodeWright"})
    assert isinstance(out, list)
    assert out[0].rule == "kind"


# -- structural rules: what NodeWright's own webhook refuses, one each ------------------------------


def _with_pkg(**fields: Any) -> dict[str, Any]:
    doc: dict[str, Any] = copy.deepcopy(SIMPLE)
    doc["spec"]["packages"]["greeter"].update(fields)
    return doc


_ALL_FOUR = {"cpuRequest": "500m", "cpuLimit": "1", "memoryRequest": "512Mi", "memoryLimit": "1Gi"}


@GROUPS
@pytest.mark.parametrize(
    ("fields", "rule"),
    [
        ({"name": "other"}, "package-name"),
        ({"version": "2024/07/06"}, "semver"),
        ({"version": "01.2.3"}, "semver"),  # a leading zero
        ({"version": "1.2-rc1"}, "semver"),  # a pre-release needs all three numbers
        ({"version": "1.2.3.4"}, "semver"),
        ({"version": "latest"}, "semver"),
        ({"version": ""}, "semver"),
        ({"resources": {"cpuRequest": "100m"}}, "resources"),
        ({"resources": {**_ALL_FOUR, "cpuLimit": "100m"}}, "resources"),  # limit below request
        ({"resources": {**_ALL_FOUR, "cpuRequest": "0"}}, "resources"),  # zero is unset: three of four
        ({"resources": {**_ALL_FOUR, "memoryRequest": "-1Mi"}}, "resources"),  # negative
        ({"resources": {**_ALL_FOUR, "cpuRequest": "x"}}, "resources"),  # not a quantity
        ({"uninstall": {"enabled": False, "apply": True}}, "uninstall"),
        ({"interrupt": {"type": "kexec"}}, "interrupt-type"),
        ({"configInterrupts": {"missing.conf": {"type": "noop"}}}, "config-interrupt"),
        ({"configInterrupts": {"*.sh": {"type": "noop"}}}, "config-interrupt"),  # matches no key
        ({"configInterrupts": {"config.y?ml": {"type": "noop"}}}, "config-interrupt"),  # no '*': a key
        ({"configInterrupts": {"config[*": {"type": "noop"}}}, "config-interrupt"),  # malformed pattern
        ({"dependsOn": {"nope": "1.0.0"}}, "depends-on"),
        ({"dependsOn": {"greeter": ""}}, "depends-on"),  # a dependency without a version
        ({"gracefulShutdown": "5 minutes"}, "duration"),  # the operator cannot decode it
    ],
)
def test_structural_rule_refuses(group: str, fields: dict[str, Any], rule: str) -> None:
    assert rule in structural(_with_pkg(**fields), group)


@GROUPS
@pytest.mark.parametrize(
    "fields",
    [
        {"version": "1.2"},  # what upstream accepts: shorthand, a leading v, dates with dots
        {"version": "v1.0.0"},
        {"version": "2024.7.6"},
        {"version": "1.1.0-rc.1+build.5"},
        {"containerSHA": DIGEST},
        {"resources": _ALL_FOUR},
        {"resources": {"cpuRequest": "0", "cpuLimit": "0", "memoryRequest": "0", "memoryLimit": "0"}},
        {"resources": {}},
        {"uninstall": {"enabled": True, "apply": True}},
        {"configInterrupts": {"config*": {"type": "service", "services": ["containerd"]}}},
        {"configInterrupts": {"config.y?ml*": {"type": "noop"}}},
        {"configInterrupts": {"config[._]*": {"type": "noop"}}},
        {"agentImageOverride": "ghcr.io/nvidia/agent:latest"},  # a warning, not a refusal
        {"dependsOn": {"greeter": "0.4.0"}},  # a cycle: upstream does not look for one (a warning)
        {"gracefulShutdown": "1m30s"},
    ],
)
def test_structural_rule_allows(group: str, fields: dict[str, Any]) -> None:
    assert structural(_with_pkg(**fields), group) == []


@pytest.mark.parametrize(
    "fields",
    [
        {"image": "ghcr.io/nvidia/shellscript:latest"},
        {"image": "ghcr.io/nvidia/shellscript:1.0.0"},
        {"image": f"ghcr.io/nvidia/shellscript@{DIGEST}"},
        {"image": "registry.example.com:5000/team/pkg:1.1.0"},
        {"image": ""},
        {"containerSHA": "sha256:abc"},
    ],
)
def test_skyhook_images_are_not_checked_nodewright_images_are(fields: dict[str, Any]) -> None:
    """skyhook.nvidia.com cuts the image at its first ':' while decoding and checks nothing;
    nodewright.nvidia.com refuses an inline tag or digest, and the CRD a bad containerSHA."""
    assert structural(_with_pkg(**fields), "skyhook.nvidia.com") == []
    found = structural(_with_pkg(**fields), "nodewright.nvidia.com")
    assert found in (["image"], ["digest-format"])


def test_nodewright_allows_a_registry_port() -> None:
    doc = _with_pkg(image="registry.example.com:5000/team/pkg")
    assert structural(doc, "nodewright.nvidia.com") == []


@pytest.mark.parametrize(
    ("spec", "rule"),
    [
        ({"drainConfig": {"timeout": "-1s"}}, "duration"),
        ({"drainConfig": {"gracePeriod": "soon"}}, "duration"),
        ({"podNonInterruptLabels": {"matchLabels": {"-app": "x"}}}, "selector"),
    ],
)
def test_fields_only_nodewright_checks(spec: dict[str, Any], rule: str) -> None:
    doc = copy.deepcopy(SIMPLE)
    doc["spec"].update(spec)
    assert structural(doc, "nodewright.nvidia.com") == [rule]
    assert structural(doc, "skyhook.nvidia.com") == []
    stage = _with_pkg(stageTimeout="-5m")
    assert structural(stage, "nodewright.nvidia.com") == ["duration"]
    assert structural(stage, "skyhook.nvidia.com") == []


def test_dependency_cycles_are_a_warning_not_a_refusal() -> None:
    doc = copy.deepcopy(SAMPLE)
    doc["spec"]["packages"]["node-tuning"]["dependsOn"] = {"boot-marker": "2.0.0"}
    view = rules.read_package_cr(doc)
    assert isinstance(view, rules.CrView)
    assert rules.structural_violations(view) == []
    assert set(view.cycle) == {"node-tuning", "boot-marker"}
    assert any("cycle" in w for w in soft_warnings(view))


@pytest.mark.parametrize(
    ("budget", "extra", "refused"),
    [
        ({"percent": 10, "count": 1}, {}, True),
        ({}, {}, False),  # the operator's own re-encoding writes interruptionBudget: {}
        ({"percent": 0}, {}, False),
        ({"percent": 150}, {}, True),
        ({"count": -1}, {}, True),
        ({"percent": 10}, {"deploymentPolicy": "p"}, True),
        ({}, {"deploymentPolicy": "p"}, False),
        ({"count": None}, {"deploymentPolicy": "p"}, False),
    ],
)
def test_budget_shape_rules(budget: dict[str, Any], extra: dict[str, Any], refused: bool) -> None:
    doc = copy.deepcopy(SIMPLE)
    doc["spec"]["interruptionBudget"] = budget
    doc["spec"].update(extra)
    assert ("budget" in structural(doc)) is refused


@pytest.mark.parametrize(
    "selector",
    [
        {"matchExpressions": [{"key": "agentpool", "operator": "Gt", "values": ["1"]}]},
        {"matchExpressions": [{"key": "agentpool", "operator": "In", "values": []}]},
        {"matchExpressions": [{"key": "agentpool", "operator": "Exists", "values": ["gpu"]}]},
        {"matchExpressions": [{"key": "bad key", "operator": "Exists"}]},
        {"matchExpressions": [{"key": "agentpool", "operator": "In", "values": ["-gpu"]}]},
        {"matchLabels": {"-foo": "bar"}},
        {"matchLabels": {"_foo": "bar"}},
        {"matchLabels": {"foo": "-bar"}},
        {"matchLabels": {"foo": "x" * 64}},
        {"matchLabels": {"a/b/c": "x"}},
        {"matchLabels": {"/x": "x"}},
        {"matchLabels": {"Example.com/x": "x"}},  # the prefix is a lower-case DNS subdomain
        {"matchLabels": {"x" * 64: "x"}},
    ],
)
def test_selectors_the_operator_would_not_parse_are_refused(selector: dict[str, Any]) -> None:
    doc = copy.deepcopy(SIMPLE)
    doc["spec"]["nodeSelectors"] = selector
    assert set(structural(doc)) == {"selector"}


@pytest.mark.parametrize(
    "selector",
    [
        {},
        {"matchLabels": {"foo": ""}},  # an empty value is a value
        {"matchLabels": {"example.com/My_Name.1": "v-1"}},
        {"matchExpressions": [{"key": "node-role.kubernetes.io/control-plane", "operator": "DoesNotExist"}]},
    ],
)
def test_selectors_the_operator_parses_are_allowed(selector: dict[str, Any]) -> None:
    doc = copy.deepcopy(SIMPLE)
    doc["spec"]["nodeSelectors"] = selector
    assert structural(doc) == []


def _guards(tolerations: list[dict[str, Any]]) -> list[str]:
    doc = copy.deepcopy(SIMPLE)
    doc["spec"]["additionalTolerations"] = tolerations
    view = rules.read_package_cr(doc)
    assert isinstance(view, rules.CrView)
    assert rules.structural_violations(view) == []  # nodegate's rules, not NodeWright's
    return [v.rule for v in rules.guard_violations(view, rules.HOLD_TAINT_KEY)]


def test_wildcard_toleration_is_refused_by_nodegate() -> None:
    assert _guards([{"operator": "Exists"}]) == ["toleration-wildcard"]
    assert _guards([{"key": "", "operator": "Exists", "effect": "NoSchedule"}]) == ["toleration-wildcard"]
    assert _guards([{"key": "nvidia.com/gpu", "operator": "Exists"}]) == []


@pytest.mark.parametrize(
    ("toleration", "refused"),
    [
        ({"key": "nodegate.io/hold", "operator": "Exists", "effect": "NoSchedule"}, True),
        ({"key": "nodegate.io/hold", "operator": "Exists"}, True),
        ({"key": "nodegate.io/hold", "operator": "Equal", "value": "unattested"}, True),
        (
            {"key": "nodegate.io/hold", "operator": "Equal", "value": "quarantined", "effect": "NoExecute"},
            True,
        ),
        ({"key": "nodegate.io/hold", "value": "quarantined"}, True),
        (
            {
                "key": "nodegate.io/hold",
                "operator": "Equal",
                "value": "packages-pending",
                "effect": "NoSchedule",
            },
            False,
        ),
        ({"key": "nodegate.io/hold", "value": "validation-failed"}, False),
        ({"key": "nvidia.com/gpu", "operator": "Exists"}, False),
    ],
)
def test_tolerating_the_hold_taint_beyond_package_reasons_is_refused(
    toleration: dict[str, Any], refused: bool
) -> None:
    """Package pods get the packages-pending and validation-failed tolerations from nodegate's
    mutating webhook; a CR that tolerates more would run as root on unattested or quarantined
    nodes. A runtimeRequired CR needs no toleration of its own any more."""
    assert _guards([toleration]) == (["hold-toleration"] if refused else [])
    runtime = copy.deepcopy(AUTO_TAINT)
    assert structural(runtime) == []


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
OPEN: dict[str, Any] = {
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
        ),  # not the tuning image
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
    pkg = doc["spec"]["packages"]["firmware-check"]
    pkg["env"].append(
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "webhook-cert", "key": "tls.key"}}}
    )
    pkg["agentImageOverride"] = f"ghcr.io/nvidia/agent@{DIGEST}"
    assert sorted(verdict(doc)) == ["agent-override", "runtime-required", "runtime-required", "secret-env"]
    allowed = verdict(doc, allowRuntimeRequired=True, allowSecretEnv=True, allowAgentImageOverride=True)
    assert allowed == []


def test_no_budget_exceeds_any_cap_and_a_deployment_policy_is_judged_elsewhere() -> None:
    doc = copy.deepcopy(SIMPLE)
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
    v = rules.no_pool_violation(cr(MISSING_DEPENDENCY))
    assert v.path == "spec.nodeSelectors"
    assert "every node" in v.message


@pytest.mark.parametrize(
    ("text", "value"),
    [("500m", "0.5"), ("1Gi", str(2**30)), ("2", "2"), ("1.5k", "1500"), ("1e3", "1000"), (3, "3")],
)
def test_quantities(text: object, value: str) -> None:
    assert parse_quantity(text) == Decimal(value)


@pytest.mark.parametrize("bad", ["", "1.2.3", "Mi", "1 Gi", True, None, "1" * 100])
def test_bad_quantities(bad: object) -> None:
    with pytest.raises(ValueError, match="quantity"):
        parse_quantity(bad)


# -- the fast reader (admission.reading.structural) against the models ---------------------------------


def _fields(model: type[Any]) -> dict[str, str]:
    return {
        (f.alias or n): str(f.annotation).replace("admission.reading.crs.", "").replace("typing.", "")
        for n, f in model.model_fields.items()
    }


_OPT = "str | None"
_QTY = "str | int | float | None"
_STR, _BOOL, _INT = "<class 'str'>", "<class 'bool'>", "<class 'int'>"


def test_the_reader_knows_every_field_of_the_models() -> None:
    """admission/reading/structural.py and admission/reading/checks/ read these fields by hand,
    with these types: change both."""
    models: list[type[Any]] = [crs.PackageCR, crs.Metadata, crs.PackageSpec, crs.Package, crs.Selector]
    models += [crs.Requirement, crs.BudgetSpec, crs.Interrupt, crs.EnvVar, crs.Resources, crs.Uninstall]
    models += [crs.Toleration, crs.DrainConfig]
    assert {m.__name__: _fields(m) for m in models} == {
        "PackageCR": {"apiVersion": _STR, "kind": "Literal['NodeWright', 'Skyhook']",
                      "metadata": "<class 'Metadata'>", "spec": "<class 'PackageSpec'>"},
        "Metadata": {"name": _STR, "annotations": "dict[str, str]"},
        "PackageSpec": {"nodeSelectors": "Selector | None", "podNonInterruptLabels": "Selector | None",
                        "drainConfig": "DrainConfig | None", "interruptionBudget": "BudgetSpec | None",
                        "deploymentPolicy": _OPT, "packages": "dict[str, Package]",
                        "additionalTolerations": "list[Toleration]", "runtimeRequired": _BOOL,
                        "autoTaintNewNodes": _BOOL, "priority": _INT},
        "Package": {"name": _OPT, "version": _OPT, "image": _OPT, "containerSHA": _OPT,
                    "agentImageOverride": _OPT, "interrupt": "Interrupt | None",
                    "configInterrupts": "dict[str, Interrupt]", "configMap": "dict[str, str]",
                    "dependsOn": "dict[str, str]", "env": "list[EnvVar]", "resources": "Resources | None",
                    "uninstall": "Uninstall | None", "gracefulShutdown": _OPT, "stageTimeout": _OPT},
        "Selector": {"matchLabels": "dict[str, str]", "matchExpressions": "list[Requirement]"},
        "Requirement": {"key": _STR, "operator": _STR, "values": "list[str]"},
        "BudgetSpec": {"percent": "int | None", "count": "int | None"},
        "Interrupt": {"type": _STR, "services": "list[str]"},
        "EnvVar": {"name": _STR, "value": _OPT, "valueFrom": "dict[str, Any] | None"},
        "Resources": {"cpuRequest": _QTY, "cpuLimit": _QTY, "memoryRequest": _QTY, "memoryLimit": _QTY},
        "Uninstall": {"enabled": _BOOL, "apply": _BOOL},
        "Toleration": {"key": _OPT, "operator": _OPT, "value": _OPT, "effect": _OPT},
        "DrainConfig": {"timeout": _OPT, "gracePeriod": _OPT},
    }  # fmt: skip


# CR-shaped dicts with values of each field's type (some absent, some null), snake_case names and
# unknown fields; the test then puts anything at all at one place of some of them (which the
# models refuse or coerce).
_junk = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([1.0, 2.5, 2**240, 2.0**240])
    | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
_words = ["", "a", "1.2.3", "2.0.0", "1.2", "latest", "ghcr.io/nvidia/x", "ghcr.io/nvidia/x:1.2.3", "bad ref",
          "sha256:" + "ab" * 32, "reboot", "service", "In", "Exists", "x*", "a.sh", "46s", "-1s",
          "nodegate.io/hold", "packages-pending"]  # fmt: skip
_str_ = st.sampled_from(_words)
_opt_str = st.none() | _str_
_strs = st.lists(_str_, max_size=2)
_str_map = st.dictionaries(_str_, _str_, max_size=3)
_interrupt = st.fixed_dictionaries({"type": _str_}, optional={"services": _strs, "extra": _junk})
_quantity = st.none() | st.sampled_from(["100m", "1", "2Gi", "x", "-1", 1, 2.5, 2**240, 2.0**240])
_env = st.fixed_dictionaries(
    {"name": _str_},
    optional={"value": _opt_str, "valueFrom": st.none() | st.dictionaries(_str_, _junk, max_size=2)},
)
_resources = st.fixed_dictionaries(
    {}, optional={k: _quantity for k in ("cpuRequest", "cpuLimit", "memoryRequest")}
)
_package = st.fixed_dictionaries(
    {},
    optional={
        **{k: _opt_str for k in ("name", "version", "image", "containerSHA", "agentImageOverride")},
        "interrupt": st.none() | _interrupt,
        "configInterrupts": st.dictionaries(_str_, _interrupt, max_size=2),
        "configMap": _str_map,
        "dependsOn": st.dictionaries(st.sampled_from(["pkg-a", "pkg-b", "a"]), _str_, max_size=2),
        "env": st.lists(_env, max_size=2),
        "resources": st.none() | _resources,
        "uninstall": st.none()
        | st.fixed_dictionaries({}, optional={"enabled": st.booleans(), "apply": st.booleans()}),
        "gracefulShutdown": _opt_str,
        "stageTimeout": _opt_str,
        "unknown": _junk,
    },
)
_requirement = st.fixed_dictionaries({"key": _str_, "operator": _str_}, optional={"values": _strs})
_selector = st.fixed_dictionaries(
    {}, optional={"matchLabels": _str_map, "matchExpressions": st.lists(_requirement)}
)
_budget = st.fixed_dictionaries(
    {}, optional={"percent": st.none() | st.integers(-5, 120), "count": st.none() | st.integers(-2, 5)}
)
_toleration = st.fixed_dictionaries(
    {}, optional={k: _opt_str for k in ("key", "operator", "value", "effect")}
)
_spec = st.fixed_dictionaries(
    {},
    optional={
        "nodeSelectors": st.none() | _selector,
        "podNonInterruptLabels": st.none() | _selector,
        "drainConfig": st.none()
        | st.fixed_dictionaries({}, optional={"timeout": _opt_str, "gracePeriod": _opt_str}),
        "interruptionBudget": st.none() | _budget,
        "deploymentPolicy": _opt_str,
        "packages": st.dictionaries(
            st.sampled_from(["pkg-a", "pkg-b", "Bad", "a"]), _package, min_size=1, max_size=3
        ),
        "additionalTolerations": st.lists(_toleration, max_size=2),
        "runtimeRequired": st.booleans(),
        "autoTaintNewNodes": st.booleans(),
        "priority": st.integers(0, 1000),
        "unknown": _junk,
    },
)
_kinds = st.sampled_from(
    [("skyhook.nvidia.com/v1alpha1", "Skyhook"), ("nodewright.nvidia.com/v1alpha1", "NodeWright")]
)
_cr = st.tuples(
    _kinds,
    st.fixed_dictionaries(
        {"spec": _spec},
        optional={
            "metadata": st.fixed_dictionaries(
                {}, optional={"name": _str_, "annotations": _str_map, "labels": _junk}
            )
        },
    ),
).map(lambda t: {"apiVersion": t[0][0], "kind": t[0][1], **t[1]})
# Names the models take besides the usual ones (populate_by_name), and some they do not know.
_names = [
    *("container_sha", "config_map", "depends_on", "agent_image_override", "config_interrupts", "value_from"),
    *(
        "cpu_request",
        "match_labels",
        "match_expressions",
        "node_selectors",
        "runtime_required",
        "api_version",
    ),
    *("interruption_budget", "additional_tolerations", "type", "values", "key", "name", "unknown"),
    *("graceful_shutdown", "stage_timeout", "pod_non_interrupt_labels", "drain_config", "grace_period"),
]


def _places(obj: Any) -> list[Any]:
    """Every dict and list inside ``obj`` (and itself)."""
    found = [obj]
    for value in obj.values() if isinstance(obj, dict) else obj if isinstance(obj, list) else ():
        if isinstance(value, dict | list):
            found += _places(value)
    return found


def _spoil(data: st.DataObject, obj: dict[str, Any]) -> None:
    """Anything at all at one place: a value replaced, a key added (maybe a field's other name)."""
    place = data.draw(st.sampled_from(_places(obj)))
    if isinstance(place, list):
        if place:
            place[data.draw(st.integers(0, len(place) - 1))] = data.draw(_junk)
        return
    key = data.draw(st.sampled_from([*place, *_names]) if place else st.sampled_from(_names))
    place[key] = data.draw(_junk | _str_map | st.none())


def _comparable(view: rules.CrView) -> tuple[Any, ...]:
    """All a view holds but the input as given (which differs where defaults are spelled out)."""
    skip = {"raw_spec", "by_key", "packages"}
    packages = [
        tuple(getattr(p, f) for f in type(p).__dataclass_fields__ if f != "raw") for p in view.packages
    ]
    return (*(getattr(view, f) for f in type(view).__dataclass_fields__ if f not in skip), packages)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obj=_cr, data=st.data())
def test_the_reader_takes_exactly_what_the_models_hold(obj: dict[str, Any], data: st.DataObject) -> None:
    """Straight from the dict or through pydantic: the same view, the same refusals."""
    if data.draw(st.booleans()):
        _spoil(data, obj)
    model = rules.parse_package_cr(obj)
    fast: rules.CrView | None = None
    if rules.PACKAGE_GROUPS.get(str(obj.get("apiVersion", "")).split("/", 1)[0]) == obj.get("kind"):
        with contextlib.suppress(reader.NotCanonical):  # read_package_cr's first try
            fast = reader._read(obj, reader._INPUT)
    if isinstance(model, list):
        assert fast is None  # nothing the models refuse is taken as is
        assert rules.read_package_cr(obj) == model
        return
    slow = reader.view_of(model)
    if fast is not None:
        assert _comparable(fast) == _comparable(slow)
    viewed = rules.read_package_cr(obj)
    assert isinstance(viewed, rules.CrView)
    assert _comparable(viewed) == _comparable(slow)
    assert rules.structural_violations(viewed) == rules.structural_violations(model)
    if fast is not None:  # values of exactly their types: the model holds what was given
        assert not rules.spec_changed(viewed, slow)
    for compiled in _compiled_policies():  # the quick pass over a policy finds what all its rules find
        every: list[rules.Violation] = []
        for rule in rules.POLICY_RULES:
            rule(viewed, compiled, every)
        assert rules.compiled_violations(viewed, compiled) == every


@functools.cache
def _compiled_policies() -> list[rules.CompiledPolicy]:
    """The sample policies, validated when a test first asks (functools.cache), not at import: a
    refusal by the installed pydantic or the policy model fails those tests, not the collection."""
    return [
        rules.compile_policy(policy("open", **OPEN)),
        rules.compile_policy(policy("strict")),  # every limit at its default: the strict side
        rules.compile_policy(
            policy(
                "mixed",
                images={"registries": ["ghcr.io"], "requireDigest": True},
                interrupts={"allowed": ["noop", "service"]},
                maxInterruptionBudget={"count": 1},
                allowSecretEnv=True,
                allowAgentImageOverride=True,
                priority={"min": 100, "max": 500},
            )
        ),
        rules.compile_policy(
            policy("lenient", allowRuntimeRequired=True, maxInterruptionBudget={"percent": 50})
        ),
    ]


def test_dependency_chains_longer_than_the_recursion_limit() -> None:
    count = 3000
    packages: dict[str, Any] = {
        f"pkg-{i:04d}x": {
            "version": "1.0.0",
            "image": "ghcr.io/nvidia/x",
            "dependsOn": {f"pkg-{i + 1:04d}x": "1.0.0"},
        }
        for i in range(count - 1)
    }
    packages[f"pkg-{count - 1:04d}x"] = {"version": "1.0.0", "image": "ghcr.io/nvidia/x"}
    doc = {**copy.deepcopy(SIMPLE), "spec": {"packages": packages}}
    assert structural(doc) == []
    packages[f"pkg-{count - 1:04d}x"]["dependsOn"] = {"pkg-0000x": "1.0.0"}
    view = rules.read_package_cr(doc)
    assert isinstance(view, rules.CrView)
    assert rules.structural_violations(view) == []  # NodeWright does not refuse cycles
    assert view.cycle[:2] == ("pkg-0000x", "pkg-0001x")
    assert view.cycle[-2:] == (f"pkg-{count - 1:04d}x", "pkg-0000x")


def test_an_invalid_registry_allowlist_refuses_instead_of_failing() -> None:
    bad = policy(**{**OPEN, "images": {"registries": ["ghcr.io/nvidia", "no-host"]}})
    found = rules.policy_violations(cr(SAMPLE), bad)
    assert [(v.rule, v.path) for v in found] == [("registry", "PackagePolicy gpu")]
    assert "allowlist is invalid" in found[0].message


def test_a_compiled_policy_checks_as_the_policy_does() -> None:
    compiled = rules.compile_policy(policy(**OPEN, maxInterruptionBudget={"percent": 10}))
    view = rules.read_package_cr(SAMPLE)
    assert isinstance(view, rules.CrView)
    assert rules.policy_violations(view, compiled) == rules.policy_violations(cr(SAMPLE), compiled.policy)
    assert [v.rule for v in rules.policy_violations(view, compiled)] == ["budget-cap"]
    foreign = copy.deepcopy(SAMPLE)
    foreign["spec"]["packages"]["node-tuning"]["image"] = "docker.io/x/tuning"
    for _ in range(2):  # the second answer comes from the policy's memo of image verdicts
        found = rules.policy_violations(cr(foreign), compiled)
        assert [(v.rule, v.path) for v in found] == [
            ("registry", "spec.packages.node-tuning.image"),
            ("budget-cap", "spec.interruptionBudget"),
        ]
