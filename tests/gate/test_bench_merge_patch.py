"""The gate benchmark's double answers merge patches with its own copy of kmock's merge
(tests/bench/gate.py ``merge_patch``, cheaper on wide objects): it must give kmock's answer."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kmock._internal import dicts

from tests.bench.gate import merge_patch

KEYS = st.sampled_from(["a", "b", "c", "d", "status", "nodeState"])
SCALARS = st.one_of(st.integers(-3, 3), st.text(max_size=3), st.booleans())
VALUES = st.recursive(
    SCALARS | st.lists(SCALARS, max_size=3),
    lambda inner: st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=12,
)
DOCS = st.dictionaries(KEYS, VALUES, max_size=5)
PATCHES = st.recursive(
    st.one_of(st.none(), SCALARS),
    lambda inner: st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=12,
).filter(lambda p: isinstance(p, dict))


def _kmock(value: dict[str, Any], patch: dict[str, Any]) -> Any:
    try:
        return ("ok", dicts.merge_patch_dict(value, patch))
    except ValueError as exc:
        return ("error", str(exc))


def _ours(value: dict[str, Any], patch: dict[str, Any]) -> Any:
    try:
        return ("ok", merge_patch(value, patch))
    except ValueError as exc:
        return ("error", str(exc))


def _ordered(x: Any) -> Any:
    """Key order too: the rendered JSON must be the same bytes."""
    if isinstance(x, dict):
        return [(k, _ordered(v)) for k, v in x.items()]
    if isinstance(x, (list, tuple)):
        return [_ordered(v) for v in x]
    return x


@given(DOCS, PATCHES)
def test_same_result_order_and_errors_as_kmock(value: dict[str, Any], patch: dict[str, Any]) -> None:
    assert _ordered(_ours(value, patch)) == _ordered(_kmock(value, patch))


def test_the_stored_version_is_not_changed() -> None:
    stored = {"status": {"nodeState": {"n1": {"p": 1}, "n2": {"p": 2}}}}
    out = merge_patch(stored, {"status": {"nodeState": {"n1": {"p": 3}, "n2": None, "n3": {"q": None}}}})
    assert out == {"status": {"nodeState": {"n1": {"p": 3}, "n3": {}}}}
    assert stored == {"status": {"nodeState": {"n1": {"p": 1}, "n2": {"p": 2}}}}


def test_a_dict_patched_by_a_scalar_is_refused_as_kmock_does() -> None:
    with pytest.raises(ValueError, match="Cannot patch a dict by a scalar"):
        merge_patch({"status": {"a": 1}}, {"status": 3})
