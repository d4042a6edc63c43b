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
