"""The pieces that judge as NodeWright's Go code does: versions, label selectors, configInterrupt
patterns, durations, and which specs the operator cannot tell apart."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admission.reading.godecode import DurationError, canonical_spec, parse_duration, same_spec
from admission.syntax import globs, labels, versions
from tests.admission.upstream.corpus import all_cases, behind_mutating_webhook
from tests.admission.upstream.gotypes import encode_skyhook_spec

SKYHOOK, NODEWRIGHT = "skyhook.nvidia.com", "nodewright.nvidia.com"

# -- versions ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "version", ["1", "1.2", "1.2.3", "v1.2.3", "v1.2.3-rc.1+b", "2024.7.6", "0.0.0", "1.0.0-0a.1"]
)
def test_versions_nodewright_accepts(version: str) -> None:
    assert versions.upstream_valid(version)


@pytest.mark.parametrize(
    "version",
    [
        "",
        "v",
        "vv1",
        "01.2.3",
        "1.02",
        "1.2.3.4",
        "1.2-rc1",
        "2024/07/06",
        "1.0.0-01",
        "1.0.0-",
        "1.0.0+",
        "latest",
    ],
)
def test_versions_nodewright_refuses(version: str) -> None:
    assert not versions.upstream_valid(version)


def test_strict_semver_is_semver_orgs_grammar() -> None:
    assert versions.strict_semver("1.2.3-rc.1+build.5")
    assert not versions.strict_semver("1.2")
    assert not versions.strict_semver("v1.2.3")


def test_version_precedence() -> None:
    """semver.org's example chain, then shorthand completed with zeros."""
    chain = [
        "1.0.0-alpha",
        "1.0.0-alpha.1",
        "1.0.0-alpha.beta",
        "1.0.0-beta",
        "1.0.0-beta.2",
        "1.0.0-beta.11",
    ]
    chain += ["1.0.0-rc.1", "1.0.0", "v1.0.1", "1.1", "2"]
    for older, newer in itertools.pairwise(chain):
        assert versions.compare(older, newer) == -1, (older, newer)
        assert versions.compare(newer, older) == 1
    assert versions.compare("1.2", "v1.2.0") == 0
    assert versions.compare("1.0.0+a", "1.0.0+b") == 0  # build metadata does not count
    assert versions.compare("not", "1.0.0") is None


_numbers = st.integers(0, 30).map(str)
_idents = st.one_of(_numbers, st.from_regex(r"\A[a-z-][a-z0-9-]{0,4}\Z"))
_semver = st.builds(
    lambda a, b, c, pre: f"{a}.{b}.{c}" + (f"-{'.'.join(pre)}" if pre else ""),
    _numbers,
    _numbers,
    _numbers,
    st.lists(_idents, max_size=3),
)


@given(a=_semver, b=_semver, c=_semver)
def test_version_comparison_is_an_order(a: str, b: str, c: str) -> None:
    ab, ba = versions.compare(a, b), versions.compare(b, a)
    assert ab is not None
    assert ab == -(ba or 0)
    assert versions.compare(a, a) == 0
    if ab <= 0 and (versions.compare(b, c) or 0) <= 0:
        assert (versions.compare(a, c) or 0) <= 0


# -- label selectors -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key", ["foo", "Foo_bar.1", "example.com/x", "a.b-c.d/X-y_z", "x" * 63, f"{'a' * 253}/{'b' * 63}"]
)
def test_label_keys_kubernetes_accepts(key: str) -> None:
    assert labels.key_problem(key) is None


@pytest.mark.parametrize(
    "key",
    ["", "-foo", "_foo", "foo-", "a/b/c", "/x", "x/", "Example.com/x", "x" * 64, f"{'a' * 254}/b", "a b"],
)
def test_label_keys_kubernetes_refuses(key: str) -> None:
    assert labels.key_problem(key) is not None


@given(value=st.from_regex(r"\A([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?\Z"))
def test_every_label_value_is_accepted(value: str) -> None:
    assert labels.value_problem(value) is None


@pytest.mark.parametrize("value", ["-bar", "bar-", "a b", "x" * 64, "é"])
def test_label_values_kubernetes_refuses(value: str) -> None:
    assert labels.value_problem(value) is not None


def test_selector_requirements_are_checked_in_full() -> None:
    found = labels.selector_problems(
        {}, [("ok", "Gt", ("1",)), ("-k", "In", ("-v",)), ("k", "Exists", ("v",))]
    )
    assert [where for where, _ in found] == [
        "matchExpressions[0].operator",
        "matchExpressions[1].key",
        "matchExpressions[1].values[0]",
        "matchExpressions[2].values",
    ]


# -- configInterrupt patterns --------------------------------------------------------------------

_KEYS = ["config.sh", "upgrade.sh", "a/b.sh", "game.properties", "*x", "v1", "v2", "[x]"]


@pytest.mark.parametrize(
    ("pattern", "matched"),
    [
        ("config.sh", True),  # a key
        ("*.sh", True),
        ("*/*.sh", True),
        ("*.properties", True),
        ("*.conf", False),
        ("v[0-9]*", True),
        ("v[^0-9]*", False),
        ("v[!0-9]*", True),  # "!" is no negation in Go: a class of "!" and 0-9
        ("\\**", True),  # an escaped '*' then any
        ("?1*", True),
        ("[x]", True),  # a key, exactly
        ("[", False),  # no '*': must be a key
        ("[*", False),  # malformed
        ("[]*", False),  # an empty class is malformed
        ("*\\", False),  # a dangling escape
        ("[a-]*", False),  # a range without its end
        ("[z-a]*", False),  # a reversed range is well-formed and matches nothing
        ("v?", False),  # '?' alone does not make a pattern
    ],
)
def test_config_interrupt_patterns(pattern: str, matched: bool) -> None:
    assert globs.matches_some(pattern, _KEYS) is matched


_key_chars = st.sampled_from(list("abcxyz019._-"))


@given(key=st.text(_key_chars, min_size=1, max_size=12), data=st.data())
def test_a_key_with_any_part_starred_matches_it(key: str, data: st.DataObject) -> None:
    start = data.draw(st.integers(0, len(key)))
    end = data.draw(st.integers(start, len(key)))
    assert globs.matches_some(key[:start] + "*" + key[end:], [key])


# -- durations -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "nanos"),
    [
        ("46s", 46_000_000_000),
        ("1h30m", 5_400_000_000_000),
        ("1m30s", 90_000_000_000),
        ("1.5ms", 1_500_000),
        (".5s", 500_000_000),
        ("-1s", -1_000_000_000),
        ("+5m", 300_000_000_000),
        ("0", 0),
        ("1us", 1_000),
        ("1\u00b5s", 1_000),
        ("2h45m0.5s", 9_900_500_000_000),
    ],
)
def test_go_durations(text: str, nanos: int) -> None:
    assert parse_duration(text) == nanos


@pytest.mark.parametrize("text", ["", "5", "5 s", "s", "1d", ".s", "-", "1e3s", "1.5.5s", "9999999999h"])
def test_not_go_durations(text: str) -> None:
    with pytest.raises(DurationError):
        parse_duration(text)


# -- the same spec to the operator ---------------------------------------------------------------

BASE: dict[str, Any] = {
    "nodeSelectors": {"matchLabels": {"pool": "gpu"}},
    "interruptionBudget": {"count": 1},
    "priority": 200,
    "packages": {
        "tool": {
            "version": "1.2.3",
            "image": "ghcr.io/nvidia/tool",
            "env": [{"name": "A", "value": "1"}],
            "resources": {"cpuRequest": "1", "cpuLimit": "2", "memoryRequest": "1Gi", "memoryLimit": "2Gi"},
            "gracefulShutdown": "90s",
            "interrupt": {"type": "service", "services": ["cron"]},
        }
    },
}


def _changed(edit: Any) -> dict[str, Any]:
    spec = copy.deepcopy(BASE)
    edit(spec)
    return spec


def _tool(spec: dict[str, Any]) -> dict[str, Any]:
    tool: dict[str, Any] = spec["packages"]["tool"]
    return tool


@pytest.mark.parametrize(
    "edit",
    [
        lambda s: s.update(interruptionBudget={"count": 1, "percent": None}),
        lambda s: s.update(podNonInterruptLabels={}, serial=False, deploymentPolicy=""),
        lambda s: s["nodeSelectors"].update(matchExpressions=[]),
        lambda s: s.pop("priority"),  # the CRD's default
        lambda s: _tool(s).update(name="tool"),
        lambda s: _tool(s).update(name=""),
        lambda s: _tool(s).update(configMap={}, dependsOn={}, containerSHA="", agentImageOverride=""),
        lambda s: _tool(s)["env"][0].update(valueFrom=None),
        lambda s: _tool(s).update(env=[{"name": "A", "value": "1"}]),
        lambda s: _tool(s)["resources"].update(cpuRequest="1000m", memoryLimit=str(2 * 2**30)),
        lambda s: _tool(s).update(gracefulShutdown="1m30s"),
        lambda s: _tool(s)["interrupt"].update(services=["cron"]),
    ],
)
def test_what_go_decoding_makes_the_same(edit: Any) -> None:
    assert same_spec(BASE, _changed(edit), SKYHOOK)
    assert same_spec(BASE, _changed(edit), NODEWRIGHT)


def test_an_image_tag_is_cut_for_skyhook_only() -> None:
    tagged = _changed(lambda s: _tool(s).update(image="ghcr.io/nvidia/tool:9.9.9"))
    assert same_spec(BASE, tagged, SKYHOOK)
    assert not same_spec(BASE, tagged, NODEWRIGHT)


@pytest.mark.parametrize(
    "edit",
    [
        lambda s: s.update(interruptionBudget={"count": 0}),  # a pointer to zero is not an absent one
        lambda s: s.update(interruptionBudget={}),
        lambda s: s.update(deploymentPolicyOptions={}),
        lambda s: s.update(priority=100),
        lambda s: s.update(unknownField="x"),  # unknown to these types: any difference counts
        lambda s: s["nodeSelectors"].update(matchLabels={"pool": "cpu"}),
        lambda s: _tool(s).update(version="1.2.4"),
        lambda s: _tool(s).update(image="ghcr.io/evil/tool"),
        lambda s: _tool(s).update(uninstall={}),
        lambda s: _tool(s).update(resources={}),
        lambda s: _tool(s).update(gracefulShutdown="0s"),
        lambda s: _tool(s).update(name="other"),
        lambda s: _tool(s)["env"][0].update(valueFrom={"secretKeyRef": {"name": "s", "key": "k"}}),
        lambda s: _tool(s)["resources"].update(cpuRequest="1001m"),
        lambda s: _tool(s)["interrupt"].update(type="reboot"),
        lambda s: _tool(s).update(interrupt=None),
        lambda s: s["packages"].update(more={"version": "1", "image": "x"}),
    ],
)
def test_what_the_operator_tells_apart(edit: Any) -> None:
    assert not same_spec(BASE, _changed(edit), SKYHOOK)
    assert not same_spec(BASE, _changed(edit), NODEWRIGHT)


def _specs() -> list[dict[str, Any]]:
    """The Skyhook specs of the upstream corpus (it reads the public test data: built at run time,
    so that without the data only the tests that need it skip)."""
    return [c.obj["spec"] for c in all_cases() if c.obj is not None and c.kind == "Skyhook"]


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_the_operators_re_encoding_is_the_same_spec(data: st.DataObject) -> None:
    """Our model of the Go encoder and our model of Go decoding agree: re-encoding changes nothing."""
    spec = data.draw(st.sampled_from(_specs()))
    encoded = encode_skyhook_spec(spec, decode=True, skyhook_repo="pause" in spec)
    assert canonical_spec(encoded, SKYHOOK) == canonical_spec(spec, SKYHOOK)


def _string_leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _string_leaves(v, (*path, k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _string_leaves(v, (*path, i))]
    return [path] if isinstance(value, str) else []


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_changing_any_value_is_a_change(data: st.DataObject) -> None:
    """Any string of a spec changed (except an image and a package's name, which Go decoding may
    rewrite) is a change, whichever API group: the unchanged-spec path lets nobody through with one."""
    spec = data.draw(st.sampled_from(_specs()))
    leaves = [p for p in _string_leaves(spec) if p[-1] not in ("image", "name")]
    if not leaves:
        return
    path = data.draw(st.sampled_from(leaves))
    changed = copy.deepcopy(spec)
    place: Any = changed
    for part in path[:-1]:
        place = place[part]
    # (not a digit: "0" and "00" are the same quantity)
    place[path[-1]] = place[path[-1]] + data.draw(st.sampled_from(["x", "-", " ", "é"]))
    for group in (SKYHOOK, NODEWRIGHT):
        assert not same_spec(spec, changed, group)
        assert canonical_spec(spec, group) != canonical_spec(changed, group)


def test_comparing_field_by_field_is_comparing_the_whole() -> None:
    """same_spec compares only where two specs differ as given: the same answer as comparing their
    canonical forms whole, on every UPDATE of the corpus (as sent and behind the mutating webhook)."""
    pairs = 0
    for case in all_cases():
        for c in (case, behind_mutating_webhook(case)):
            if c.operation != "UPDATE" or c.obj is None or c.old is None:
                continue
            for group in (SKYHOOK, NODEWRIGHT):
                old, new = c.old.get("spec"), c.obj.get("spec")
                whole = canonical_spec(old, group) == canonical_spec(new, group)
                assert same_spec(old, new, group) is whole, str(c.provenance)
                pairs += 1
    assert pairs > 300
