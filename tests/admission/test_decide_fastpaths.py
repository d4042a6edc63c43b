"""The decision path's fast forms agree with the plain ones they replace: the whitespace test of
NodeWright's image rule, and the memo of a package's rules (keyed by exactly what they read)."""

from __future__ import annotations

import sys
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from admission.checks.images import has_whitespace
from admission.structural import read_package_cr


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
