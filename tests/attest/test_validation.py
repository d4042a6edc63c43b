"""attest.validation, the one place pydantic's errors become nodegate's words: whatever the input,
each problem is one printable line with the key path, no library wording, no input value."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from attest.validation import key_path
from bootstrap.config import ConfigError, settings_from_obj

LIBRARY_WORDS = ("Input should", "Extra inputs", "Value error", "instance of", "errors.pydantic.dev", "(top)")

_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20))
_values: Any = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=12), inner, max_size=3)
    ),
    max_leaves=8,
)
_keys = st.sampled_from(
    ["trust_domain", "listen", "tls", "ek_roots", "svid_ttl", "gate", "admission", "inventory", "limits"]
)


@given(st.dictionaries(st.one_of(_keys, st.text(max_size=12)), _values, max_size=4))
@settings(max_examples=300, deadline=None)
def test_every_config_problem_is_one_printable_line_in_our_words(data: dict[str, Any]) -> None:
    for line in _problems(data):
        assert line.isprintable(), line
        assert "\n" not in line
        assert not any(words in line for words in LIBRARY_WORDS), line


def _problems(data: dict[str, Any]) -> tuple[str, ...]:
    try:
        settings_from_obj(data)
    except ConfigError as exc:
        return exc.problems
    return ()


def test_key_paths_are_readable_and_bounded() -> None:
    assert key_path(("spec", "images", "registries", 0)) == "spec.images.registries[0]"
    assert key_path(("inventory", 2, "label")) == "inventory[2].label"
    shown = key_path(("bad\x1b[31m" + "k" * 100,))
    assert shown.isprintable()
    assert len(shown) == 64
