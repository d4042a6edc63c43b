"""pydantic's validation errors in nodegate's words: the one place they are translated.

Every boundary that validates with pydantic (the service config, the join protocol, PackagePolicy
files, measured-boot and PCR policies) reports through ``problems``: one line per error, naming the
key path (``admission.listen``, ``spec.images.registries[0]``), what was expected, and for an
unknown key the nearest known one. The input's value is never echoed (it may be large or secret);
only its type is named.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel, ValidationError

_SHORT_WORD = re.compile(r"[A-Za-z0-9._/-]{1,64}")

_TYPE_NAMES = {
    "str": "text",
    "int": "a whole number",
    "float": "a number",
    "bool": "true or false",
    "NoneType": "nothing (null)",
    "dict": "a mapping",
    "list": "a list",
    "tuple": "a list",
    "bytes": "bytes",
}

# error type -> what was expected (the input's kind is appended where it helps)
_EXPECTED = {
    "tuple_type": "a list",
    "list_type": "a list",
    "set_type": "a list",
    "frozen_set_type": "a list",
    "dict_type": "a mapping (key: value)",
    "model_type": "a mapping (key: value)",
    "model_attributes_type": "a mapping (key: value)",
    "string_type": "text",
    "int_type": "a whole number",
    "int_parsing": "a whole number",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "path_type": "a file path",
}


def problems(exc: ValidationError, model: type[BaseModel] | None = None, limit: int = 20) -> list[str]:
    """One line per error (at most ``limit``, duplicates dropped): ``path: what was wrong``.
    ``model`` is the model validated, for did-you-mean on unknown keys."""
    return [f"{where}: {what}" if where else what for where, what in pairs(exc, model, limit)]


def pairs(
    exc: ValidationError, model: type[BaseModel] | None = None, limit: int = 20
) -> list[tuple[str, str]]:
    """(key path, what was wrong) per error, for callers that report the two apart; the path is
    "" for a rule about the whole object."""
    out: list[tuple[str, str]] = []
    for err in exc.errors(include_url=False):
        loc = tuple(p for p in err.get("loc", ()) if not _is_tag(p))
        pair = (key_path(loc), _what(err, model, loc))
        if pair not in out:
            out.append(pair)
        if len(out) >= limit:
            break
    return out


def summary(exc: ValidationError, model: type[BaseModel] | None = None, limit: int = 5) -> str:
    """The problems on one line, ``; `` between them."""
    return "; ".join(problems(exc, model, limit))


def key_path(loc: tuple[int | str, ...]) -> str:
    """``('spec', 'images', 'registries', 0)`` -> ``spec.images.registries[0]``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            name = _shown(part)
            out += f".{name}" if out else name
    return out


def _shown(key: str) -> str:
    """A key as sent (an unknown one comes from the input): printable, and at most 64 characters."""
    text = "".join(c if c.isprintable() else "?" for c in key)
    return text if len(text) <= 64 else text[:61] + "..."


_TAG = re.compile(
    r"(function-(after|before|wrap|plain)|list|tuple|dict|set|frozenset|union|tagged-union"
    r"|lax-or-strict|json-or-python|nullable|chain|model|is-instance|literal|constrained-\w+)\[.*\]",
    re.S,
)


def _is_tag(part: object) -> bool:
    # union members and wrapped validators appear in loc as "function-after[...]", "str", "list[...]"
    return isinstance(part, str) and (
        _TAG.fullmatch(part) is not None or part in ("str", "int", "float", "bool", "none")
    )


def _what(err: Any, model: type[BaseModel] | None, loc: tuple[int | str, ...]) -> str:
    kind = str(err.get("type", ""))
    ctx = err.get("ctx") or {}
    if kind == "extra_forbidden":
        name = str(loc[-1]) if loc else "?"
        known = _known_keys(model, loc[:-1]) if model is not None else []
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        return f"unknown key{hint}"
    if kind == "missing":
        return "required, but missing"
    if kind in ("value_error", "assertion_error") and "error" in ctx:
        return str(ctx["error"])
    if kind in _EXPECTED:
        text = f"expected {_EXPECTED[kind]}, got {_kind_of(err)}"
        word = err.get("input")
        if _EXPECTED[kind] == "a list" and isinstance(word, str) and _SHORT_WORD.fullmatch(word):
            text += f" (write [{word}])"  # ek_roots: vendors -> ek_roots: [vendors]
        return text
    if kind == "literal_error" and "expected" in ctx:
        return f"expected one of {ctx['expected']}"
    if kind == "json_invalid":
        return f"not JSON ({ctx.get('error', 'invalid')})"
    msg = str(err.get("msg", "invalid"))
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    return msg.replace("Input should be", "must be").replace("String should", "text should")


def _kind_of(err: Any) -> str:
    if "input" not in err:
        return "something else"
    return _TYPE_NAMES.get(type(err["input"]).__name__, type(err["input"]).__name__)


def _known_keys(model: type[BaseModel], parents: tuple[int | str, ...]) -> list[str]:
    """The keys (names and aliases) the model at ``parents`` takes; [] when the path leaves models."""
    current: type[BaseModel] | None = model
    for part in parents:
        if current is None:
            return []
        if isinstance(part, int):
            continue  # an item of a list: the item's model is already current
        current = _field_model(current, str(part))
    if current is None:
        return []
    names: list[str] = []
    for name, info in current.model_fields.items():
        names.append(info.alias or name)
        if info.alias and current.model_config.get("populate_by_name"):
            names.append(name)
    return names


def _field_model(model: type[BaseModel], key: str) -> type[BaseModel] | None:
    for name, info in model.model_fields.items():
        if key in (name, info.alias):
            return next(_models_in(info.annotation), None)
    return None


def _models_in(annotation: object) -> Iterator[type[BaseModel]]:
    """The BaseModel classes inside ``X``, ``X | None``, ``tuple[X, ...]``, ``dict[str, X]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) or typing.get_args(annotation):
        for arg in typing.get_args(annotation):
            yield from _models_in(arg)
