"""Pools: whether a PackagePolicy's pool (its node labels) contains a CR's node selector."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from admission.reading.crs import CrView, Selector


def required_labels(selector: Selector) -> dict[str, str] | None:
    """The labels every selected node must carry (matchLabels and single-value In), or None when
    the selector contradicts itself and selects nothing."""
    found = _required(
        selector.match_labels, ((r.key, r.operator, r.values) for r in selector.match_expressions)
    )
    return None if found is None else dict(found)


def required_labels_of(cr: CrView) -> Mapping[str, str] | None:
    """:func:`required_labels` of the CR's selector (for
    :meth:`~admission.policies.compiled.CompiledPolicy.contains`)."""
    return None if cr.selector_empty else _required(cr.match_labels, cr.match_expressions)


def pool_contains(pool: Mapping[str, str], selector: Selector) -> bool:
    """Every node the selector can match carries all the pool's labels. An empty selector (every
    node) is only inside the pool of every node."""
    if not selector.match_labels and not selector.match_expressions:
        return not pool
    labels = required_labels(selector)
    if labels is None:
        return True  # selects nothing; structural checks do not need to care
    return pool.items() <= labels.items()  # every label of the pool, with its value


def _required(
    labels: Mapping[str, str], expressions: Iterable[tuple[str, str, Iterable[str]]]
) -> Mapping[str, str] | None:
    out: dict[str, str] | None = None
    for key, operator, values in expressions:
        if operator == "In":
            single = tuple(values)
            if len(single) == 1:
                value = single[0]
                if out is None:
                    out = dict(labels)
                if out.get(key, value) != value:
                    return None
                out[key] = value
    return labels if out is None else out
