"""A test model of how NodeWright's operator chooses nodes for a package CR and which tolerations
its pods get, read from upstream's code and written out again (not copied):

- NVIDIA/nodewright 71ca22b89874a282e52a5a80856a5f1143f5e55c,
  ``operator/internal/controller/cluster_state_v2.go``: ``NodePicker.SelectNodes`` builds the list
  ``[{node.kubernetes.io/unschedulable Exists NoSchedule}, *spec.additionalTolerations]`` plus, for
  a ``runtimeRequired`` CR, the runtime-required toleration; ``selectNodesWithCompartments`` skips
  (status ``blocked``) a node with label ``skyhook.nvidia.com/ignore=true`` (``CheckNodeIgnoreLabel``)
  and a node whose taints are not all tolerated (``CheckTaintToleration``: *every* taint, whatever
  its effect, must be tolerated by some toleration; condition ``TaintNotTolerable``).
- the same commit, ``operator/vendor/k8s.io/api/core/v1/toleration.go``: ``ToleratesTaint``, called
  with comparison operators off (an empty effect or key matches any; "" is Equal; Lt/Gt never).
- ``operator/internal/controller/skyhook_controller.go``: ``createPodFromPackage`` and
  ``createInterruptPodForPackage`` give every package and interrupt pod
  ``[{node.kubernetes.io/unschedulable Exists}, GetRuntimeRequiredToleration(), *additionalTolerations]``
  and pin it with ``nodeName`` (no scheduler); ``RUNTIME_REQUIRED_TAINT`` defaults to
  ``skyhook.nvidia.com=runtime-required:NoSchedule``, made an Equal toleration.
- v0.18 (``nodewright.nvidia.com``): the default key becomes ``nodewright.nvidia.com`` and, during
  the deprecation window, the operator tolerates both that and the legacy ``skyhook.nvidia.com``
  runtime-required taint (PR NVIDIA/nodewright#452; ``docs/user-guide/runtime-required.md`` at
  01cc2f2). Modelled as a second operator whose runtime-required tolerations are both keys.
- the kubelet admits a pod bound by ``nodeName`` unless it does not tolerate a ``NoExecute`` taint
  (NoSchedule taints are the scheduler's, which such a pod bypasses).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

CORDON_KEY = "node.kubernetes.io/unschedulable"
PICKER_CORDON = {"key": CORDON_KEY, "operator": "Exists", "effect": "NoSchedule"}
POD_CORDON = {"key": CORDON_KEY, "operator": "Exists"}
IGNORE_LABEL = "skyhook.nvidia.com/ignore"


def runtime_required_toleration(key: str) -> dict[str, str]:
    return {"key": key, "operator": "Equal", "value": "runtime-required", "effect": "NoSchedule"}


@dataclass(frozen=True)
class Operator:
    """One release of the operator: the runtime-required tolerations it adds."""

    name: str
    runtime_keys: tuple[str, ...]

    @property
    def runtime_tolerations(self) -> list[dict[str, str]]:
        return [runtime_required_toleration(k) for k in self.runtime_keys]


V0_15 = Operator("v0.15 (skyhook.nvidia.com)", ("skyhook.nvidia.com",))
V0_18 = Operator("v0.18 (nodewright.nvidia.com)", ("nodewright.nvidia.com", "skyhook.nvidia.com"))
OPERATORS = (V0_15, V0_18)


def _s(value: object) -> str:
    return value if isinstance(value, str) else ""


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """``Toleration.ToleratesTaint(logger, taint, false)``."""
    if _s(toleration.get("effect")) and toleration.get("effect") != taint.get("effect"):
        return False
    if _s(toleration.get("key")) and toleration.get("key") != taint.get("key"):
        return False
    operator = _s(toleration.get("operator"))
    if operator in ("", "Equal"):
        return _s(toleration.get("value")) == _s(taint.get("value"))
    return operator == "Exists"  # Lt, Gt (comparison off) and anything else: False


def tolerate_all(tolerations: Sequence[Mapping[str, Any]], taints: Sequence[Mapping[str, Any]]) -> bool:
    """``CheckTaintToleration``: every taint is tolerated by some toleration."""
    return all(any(tolerates(t, taint) for t in tolerations) for taint in taints)


def _spec(cr: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = cr.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _additional(cr: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(_spec(cr).get("additionalTolerations") or [])


def picker_tolerations(cr: Mapping[str, Any], operator: Operator = V0_15) -> list[Mapping[str, Any]]:
    out: list[Mapping[str, Any]] = [PICKER_CORDON, *_additional(cr)]
    if _spec(cr).get("runtimeRequired") is True:
        out += operator.runtime_tolerations
    return out


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """``metav1.LabelSelectorAsSelector`` on the CR's ``nodeSelectors`` (empty: every node)."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        present = key in labels
        ok = {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels.get(key) not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }[op]
        if not ok:
            return False
    return True


def node_labels(cr: Mapping[str, Any]) -> dict[str, str]:
    """Labels of a node the CR's selector selects."""
    selector = _spec(cr).get("nodeSelectors") or {}
    labels = dict(selector.get("matchLabels") or {})
    for expr in selector.get("matchExpressions") or []:
        if expr["operator"] in ("In", "Exists"):
            labels[expr["key"]] = (expr.get("values") or ["x"])[0]
        elif expr["operator"] == "NotIn":
            labels[expr["key"]] = "not-" + "-".join(expr.get("values") or [])
    return labels


def node(name: str, labels: Mapping[str, str], *taints: Mapping[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": dict(labels)}, "spec": {"taints": [dict(t) for t in taints]}}


def _taints(n: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list((n.get("spec") or {}).get("taints") or [])


def selects(cr: Mapping[str, Any], n: Mapping[str, Any], operator: Operator = V0_15) -> bool:
    """Whether the picker puts the node in a batch for the CR (rather than skipping it blocked)."""
    labels = (n.get("metadata") or {}).get("labels") or {}
    if not selector_matches(_spec(cr).get("nodeSelectors"), labels):
        return False
    if labels.get(IGNORE_LABEL) == "true":
        return False
    return tolerate_all(picker_tolerations(cr, operator), _taints(n))


def package_pod_tolerations(cr: Mapping[str, Any], operator: Operator = V0_15) -> list[Mapping[str, Any]]:
    """The ``spec.tolerations`` of the CR's package and interrupt pods."""
    return [POD_CORDON, *operator.runtime_tolerations, *_additional(cr)]


def kubelet_admits(pod_tolerations: Sequence[Mapping[str, Any]], n: Mapping[str, Any]) -> bool:
    return tolerate_all(pod_tolerations, [t for t in _taints(n) if t.get("effect") == "NoExecute"])


def runs_on(cr: Mapping[str, Any], n: Mapping[str, Any], operator: Operator = V0_15) -> bool:
    """The CR's package pods run on the node: picked, and the pod bound there is admitted."""
    return selects(cr, n, operator) and kubelet_admits(package_pod_tolerations(cr, operator), n)
