"""Which package CRs select a Node, and a node's own label changes that would take it out of a
CR's selection (issue 33, finding 4). Pure: the CRs' selectors are an input, supplied by the
service from its watch of NodeWright and Skyhook CRs.

The gate holds a node until every CR that selects it is complete there, and decides "selects" from
the Node's labels. NodeRestriction leaves most labels to the node's own kubelet, so a node could
drop the label a CR selects it by (or add one a ``NotIn``/``DoesNotExist`` excludes) and be
released without that CR's packages. A label change by ``system:node:*`` that leaves some CR no
longer selecting the node is therefore refused; changes that only add CRs (the kubelet's own
well-known labels on a Node nodegate pre-created) hold the node longer and pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from admission.hold.nodes import NODE_USER_PREFIX
from admission.violations import Violation

RULE = "node-package-selection"


@dataclass(frozen=True, slots=True)
class PackageSelector:
    """One package CR's ``spec.nodeSelectors`` as stored (``ref``: ``<group>/<name>``)."""

    ref: str
    selector: Mapping[str, Any] | None


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Kubernetes LabelSelector semantics; a selector that cannot be read matches (fail closed:
    the gate holds a node rather than release it by a CR nobody can interpret, and a node can
    never leave such a CR's selection)."""
    if not selector:
        return True
    match_labels = selector.get("matchLabels") or {}
    expressions = selector.get("matchExpressions") or []
    if not isinstance(match_labels, Mapping) or not isinstance(expressions, list):
        return True
    for key, value in match_labels.items():
        if labels.get(str(key)) != value:
            return False
    for expr in expressions:
        if not isinstance(expr, Mapping):
            return True
        key, op = expr.get("key"), expr.get("operator")
        values = expr.get("values") or []
        if not isinstance(key, str) or not isinstance(values, list):
            return True
        present = key in labels
        if op == "In":
            ok = present and labels[key] in values
        elif op == "NotIn":
            ok = not present or labels[key] not in values
        elif op == "Exists":
            ok = present
        elif op == "DoesNotExist":
            ok = not present
        else:
            return True
        if not ok:
            return False
    return True


def node_labels(node: Mapping[str, Any] | None) -> dict[str, str]:
    """The Node's labels (string values only; anything else is not a label the API stores)."""
    meta = node.get("metadata") if isinstance(node, Mapping) else None
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    if not isinstance(labels, Mapping):
        return {}
    return {k: v for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)}


def unselected_by(
    before: Mapping[str, str], after: Mapping[str, str], selectors: Sequence[PackageSelector]
) -> list[str]:
    """The CRs (refs, sorted) that select a node labelled ``before`` and not one labelled ``after``."""
    gone = []
    for s in selectors:
        if selector_matches(s.selector, before) and not selector_matches(s.selector, after):
            gone.append(s.ref)
    return sorted(gone)


def selection_violations(
    operation: str,
    new: Mapping[str, Any] | None,
    old: Mapping[str, Any] | None,
    *,
    username: str,
    selectors: Sequence[PackageSelector] | None,
) -> list[Violation]:
    """A Node UPDATE by the node's own credentials (``system:node:*``, through ``nodes`` or
    ``nodes/status``) whose label change leaves a package CR no longer selecting the node.
    ``selectors`` None (the CRs are not listed yet): any label change of theirs is refused (fail
    closed). Other users, other operations and writes that keep the labels are not judged here."""
    if operation != "UPDATE" or not username.startswith(NODE_USER_PREFIX):
        return []
    before, after = node_labels(old), node_labels(new)
    if before == after:
        return []
    if selectors is None:
        return [
            Violation(
                RULE,
                "metadata.labels",
                "nodegate has not listed the NodeWright/Skyhook CRs yet, so it cannot tell whether "
                "this label change takes the node out of a CR's selection (fail closed)",
                "retry once nodegate is ready (kubectl -n <nodegate namespace> get pods)",
            )
        ]
    gone = unselected_by(before, after, selectors)
    if not gone:
        return []
    shown = ", ".join(gone[:5]) + (f" and {len(gone) - 5} more" if len(gone) > 5 else "")
    return [
        Violation(
            RULE,
            "metadata.labels",
            f"a node may not change its own labels so that package CRs no longer select it: {shown}",
            "change a node's pool labels as an administrator, or change the CR's nodeSelectors",
        )
    ]
