"""The decision path's fast forms agree with the plain ones they replace: the whitespace test of
NodeWright's image rule, and the memo of a package's rules (keyed by exactly what they read)."""

from __future__ import annotations

import sys
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from admission.decision.decider import Decider, _compile
from admission.hold.holdtolerations import (
    PACKAGE_HOLD_VALUES,
    hold_tolerations,
    missing_hold_tolerations,
    tolerates,
)
from admission.policies.pools import required_labels_of
from admission.reading.checks.images import has_whitespace
from admission.reading.policy import PackagePolicy
from admission.reading.structural import read_package_cr


def _slow(text: str) -> bool:
    return any(c.isspace() for c in text)


def test_whitespace_agrees_with_isspace_on_every_code_point() -> None:
    # ASCII and wider strings take different paths in CPython's str.split: both, every character.
    for i in range(sys.maxunicode + 1):
        c = chr(i)
        for text in (c, f"a{c}b", f"\u00e9{c}"):
            assert has_whitespace(text) is _slow(text), (hex(i), text)


@given(st.text())
def test_whitespace_agrees_with_isspace(text: str) -> None:
    assert has_whitespace(text) is _slow(text)


def _nodewright(packages: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "nodewright.nvidia.com/v1alpha1",
        "kind": "NodeWright",
        "metadata": {"name": "x"},
        "spec": {"packages": packages},
    }


def _rules_of(obj: dict[str, Any]) -> list[tuple[str, str, str]]:
    view = read_package_cr(obj)
    assert not isinstance(view, list)
    return [(v.rule, v.path, v.message) for _, v in view.found]


def _pkg(config_map: dict[str, str], **extra: Any) -> dict[str, Any]:
    return {
        "version": "1.0.0",
        "image": "registry.example.com/team/pkg",
        "configMap": config_map,
        "configInterrupts": {"a*.conf": {"type": "service", "services": ["x"]}},
        **extra,
    }


def test_memoised_package_rules_follow_the_configmap_keys() -> None:
    # The same package judged after a configMap without a matching key: the memo must not answer
    # for the first one.
    assert _rules_of(_nodewright({"tuning": _pkg({"a1.conf": "x"})})) == []
    assert _rules_of(_nodewright({"tuning": _pkg({"b.conf": "x"})})) == [
        ("config-interrupt", "spec.packages.tuning.configInterrupts.a*.conf", "matches no configMap key")
    ]


def test_memoised_package_rules_follow_the_group_and_the_key() -> None:
    tagged = {"version": "1.0.0", "image": "registry.example.com/team/pkg:2"}
    nodewright = _rules_of(_nodewright({"tagged": tagged}))
    assert nodewright == [("image", "spec.packages.tagged.image", "image contains an inline tag '2'")]
    skyhook = {
        **_nodewright({"tagged": tagged}),
        "apiVersion": "skyhook.nvidia.com/v1alpha1",
        "kind": "Skyhook",
    }
    assert _rules_of(skyhook) == []  # Skyhook's webhook never judged images
    assert _rules_of(_nodewright({"other": tagged})) == [
        ("image", "spec.packages.other.image", "image contains an inline tag '2'")
    ]


def test_numeric_quantities_are_judged_afresh() -> None:
    # 1 == 1.0 as memo keys; numbers are not memoised, each is judged as given.
    for cpu in (1, 1.0, "1"):
        res = {"cpuRequest": cpu, "cpuLimit": cpu, "memoryRequest": "1Mi", "memoryLimit": "1Mi"}
        pkg = {"version": "1.0.0", "image": "registry.example.com/team/pkg", "resources": res}
        assert _rules_of(_nodewright({"pkg": pkg})) == []
    res = {"cpuRequest": 2, "cpuLimit": 1.0, "memoryRequest": "1Mi", "memoryLimit": "1Mi"}
    pkg = {"version": "1.0.0", "image": "registry.example.com/team/pkg", "resources": res}
    assert _rules_of(_nodewright({"pkg": pkg})) == [
        ("resources", "spec.packages.pkg.resources.cpuLimit", "cpu limit is below its request")
    ]


_HOLD = "nodegate.io/hold"
_scalar = (
    st.none() | st.booleans() | st.integers() | st.sampled_from(["", "Exists", "Equal", "Lt", "NoSchedule"])
)
_toleration = st.fixed_dictionaries(
    {},
    optional={
        "key": _scalar | st.sampled_from([_HOLD, "nvidia.com/gpu"]),
        "operator": _scalar,
        "value": _scalar | st.sampled_from(PACKAGE_HOLD_VALUES),
        "effect": _scalar | st.sampled_from(["NoExecute"]),
    },
)


def _reference_missing(tolerations: object, key: str) -> list[dict[str, str]]:
    """Every hold toleration that no given toleration tolerates, asked one by one."""
    if not isinstance(tolerations, list):
        return hold_tolerations(key)
    have = [t for t in tolerations if isinstance(t, dict)]
    return [
        wanted
        for wanted in hold_tolerations(key)
        if not any(tolerates(t, {k: wanted[k] for k in ("key", "value", "effect")}) for t in have)
    ]


@given(
    st.none()
    | st.lists(_toleration | _scalar, max_size=4)
    | st.lists(st.sampled_from(hold_tolerations(_HOLD)))
)
def test_missing_hold_tolerations_agree_with_asking_each(tolerations: object) -> None:
    assert missing_hold_tolerations(tolerations, _HOLD) == _reference_missing(tolerations, _HOLD)


_label = st.sampled_from(["a", "b", "pool"])
_selector = st.fixed_dictionaries(
    {},
    optional={
        "matchLabels": st.dictionaries(_label, st.sampled_from(["x", "y"]), max_size=2),
        "matchExpressions": st.lists(
            st.fixed_dictionaries(
                {"key": _label, "operator": st.sampled_from(["In", "NotIn", "Exists"])},
                optional={"values": st.lists(st.sampled_from(["x", "y"]), max_size=2)},
            ),
            max_size=2,
        ),
    },
)
_pools = st.lists(st.dictionaries(_label, st.sampled_from(["x", "y"]), max_size=2), min_size=1, max_size=4)


@given(_selector, _pools)
def test_candidates_are_the_policies_whose_pool_contains_the_cr(
    selector: dict[str, Any], pools: list[dict[str, str]]
) -> None:
    obj = {**_nodewright({}), "spec": {"nodeSelectors": selector}}
    view = read_package_cr(obj)
    if isinstance(view, list):
        return
    compiled = tuple(
        _compile(
            PackagePolicy.model_validate(
                {
                    **_POLICY,
                    "metadata": {"name": f"p{i}"},
                    "spec": {**_POLICY["spec"], "nodeSelector": {"matchLabels": pool}},
                }
            )
        )
        for i, pool in enumerate(pools)
    )
    labels = view.match_labels if not view.match_expressions else required_labels_of(view)
    assert Decider._candidates(view, compiled) == [c for c in compiled if c.rules.contains(view, labels)]


_POLICY: dict[str, Any] = {
    "apiVersion": "nodegate.io/v1alpha1",
    "kind": "PackagePolicy",
    "metadata": {"name": "p"},
    "spec": {"images": {"registries": ["ghcr.io/nvidia"]}},
}
