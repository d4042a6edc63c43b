"""The one YAML loader for everything nodegate reads (config, PCR policy, PackagePolicies, RBAC).

Safe YAML without anchors or aliases: none of these documents needs them, and nested aliases
expand exponentially ("billion laughs": a few hundred bytes become gigabytes). Pure: text in,
Python objects out.
"""

from __future__ import annotations

from collections.abc import Iterator

import yaml


class _NoAliasLoader(yaml.SafeLoader):
    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            raise yaml.YAMLError("YAML anchors and aliases are not allowed here")
        return super().compose_node(parent, index)


def load(text: str | bytes) -> object:
    """One document. Raises ``yaml.YAMLError`` (or ``RecursionError`` for absurd nesting)."""
    return yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506  (a SafeLoader subclass)


def load_all(text: str | bytes) -> Iterator[object]:
    """Every document of a multi-document stream, lazily; same errors as :func:`load`."""
    return yaml.load_all(text, Loader=_NoAliasLoader)


def describe(exc: yaml.YAMLError) -> str:
    """One line with the line and column: ``line 3, column 1: expected ',' or ']', but got
    '<stream end>' (in the flow sequence begun at line 1, column 4)``; the caller names the file.
    PyYAML's own text spans several lines and names ``"<byte string>"``."""
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem_mark is None:
        return " ".join(str(exc).split())
    mark = exc.problem_mark
    text = f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem or 'invalid YAML'}"
    if exc.context and exc.context_mark is not None:
        ctx = exc.context_mark
        text += f" ({exc.context} begun at line {ctx.line + 1}, column {ctx.column + 1})"
        text = text.replace("while parsing a ", "in the ").replace("while scanning a ", "in the ")
    return " ".join(text.split())
