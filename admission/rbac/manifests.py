"""RBAC manifests -> RBAC objects (:mod:`admission.rbac.objects`), refused where the API server
would refuse them: Role / ClusterRole / RoleBinding / ClusterRoleBinding, and ``List`` /
``*List`` of them.

* subjects: User (username), Group (in the user's groups), ServiceAccount (username
  ``system:serviceaccount:<ns>:<name>``, namespace defaulting to the RoleBinding's);
* rules that cover only nonResourceURLs never match resource requests and are dropped;
* an aggregationRule's clusterRoleSelectors become label selectors.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from admission.rbac.objects import Binding, LabelSelector, Requirement, Role, Rule, title

API_VERSION = "rbac.authorization.k8s.io/v1"
RBAC_GROUP = "rbac.authorization.k8s.io"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
KINDS = ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


class RbacError(ValueError):
    """A manifest that is not RBAC, or that the API server would reject."""


def flatten(objects: Iterable[Mapping[str, Any]]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(where, manifest) for every RBAC object, lists expanded; ``None`` entries skipped."""
    for i, obj in enumerate(objects):
        yield from _expand(f"objects[{i}]", obj, None)


def _expand(
    where: str, obj: Any, defaults: Mapping[str, Any] | None
) -> Iterator[tuple[str, Mapping[str, Any]]]:
    if obj is None:
        return
    if not isinstance(obj, Mapping):
        raise RbacError(f"{where}: expected a mapping, got {type(obj).__name__}")
    if defaults:
        obj = {**defaults, **obj}  # typed-list items may omit apiVersion and kind
    kind = obj.get("kind")
    if not isinstance(kind, str) or not kind:
        raise RbacError(f"{where}: kind is required")
    if kind.endswith("List"):
        yield from _expand_list(where, kind, obj)
        return
    if kind not in KINDS:
        raise RbacError(f"{where}: unsupported kind {kind!r} (expected {', '.join(KINDS)} or a List of them)")
    yield where, obj


def _expand_list(where: str, kind: str, obj: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    item_kind = kind.removesuffix("List")
    if item_kind and item_kind not in KINDS:
        raise RbacError(f"{where}: unsupported kind {kind!r}")
    items = obj.get("items")
    if not isinstance(items, list):
        raise RbacError(f"{where}: {kind}.items must be a list")
    defaults = {"apiVersion": obj.get("apiVersion"), "kind": item_kind} if item_kind else None
    for j, item in enumerate(items):
        yield from _expand(f"{where}.items[{j}]", item, defaults)


def parse_object(where: str, obj: Mapping[str, Any]) -> Role | Binding:
    """One manifest of a kind in KINDS (as :func:`flatten` gives them)."""
    kind: str = obj["kind"]
    if obj.get("apiVersion") != API_VERSION:
        raise RbacError(f"{where}: {kind} apiVersion must be {API_VERSION}, got {obj.get('apiVersion')!r}")
    namespaced = kind in ("Role", "RoleBinding")
    name, namespace, labels = _metadata(where, kind, obj.get("metadata"), namespaced)
    where = f"{where} ({title(kind, namespace, name)})"
    if kind.endswith("Binding"):
        return _parse_binding(where, kind, namespace, name, obj)
    rules = _parse_rules(where, obj.get("rules"), namespaced)
    aggregation = obj.get("aggregationRule") if kind == "ClusterRole" else None
    return Role(kind, namespace, name, labels, rules, _parse_aggregation(where, aggregation))


def _metadata(where: str, kind: str, meta: Any, namespaced: bool) -> tuple[str, str, Mapping[str, str]]:
    if not isinstance(meta, Mapping):
        raise RbacError(f"{where}: {kind} needs metadata with a name")
    name = _string(meta, "name", f"{where}.metadata", required=True)
    namespace = _string(meta, "namespace", f"{where}.metadata") if namespaced else ""
    if namespaced and not namespace:
        raise RbacError(f"{where}: {kind} {name} needs metadata.namespace")
    labels = meta.get("labels") or {}
    if not isinstance(labels, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise RbacError(f"{where}: metadata.labels must map strings to strings")
    return name, namespace, labels


def _string(obj: Mapping[str, Any], key: str, where: str, *, required: bool = False) -> str:
    value = obj.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise RbacError(
            f"{where}.{key} must be a non-empty string" if required else f"{where}.{key} must be a string"
        )
    return value


def _strings(obj: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = obj.get(key)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RbacError(f"{where}.{key} must be a list of strings")
    return tuple(value)


def _parse_rules(where: str, raw: Any, namespaced: bool) -> tuple[Rule, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise RbacError(f"{where}: rules must be a list")
    parsed = (_parse_rule(f"{where}: rules[{i}]", rule, namespaced) for i, rule in enumerate(raw))
    return tuple(dict.fromkeys(rule for rule in parsed if rule is not None))


def _parse_rule(where: str, raw: Any, namespaced: bool) -> Rule | None:
    if not isinstance(raw, Mapping):
        raise RbacError(f"{where} must be a mapping")
    verbs = _strings(raw, "verbs", where)
    groups = _strings(raw, "apiGroups", where)
    resources = _strings(raw, "resources", where)
    names = _strings(raw, "resourceNames", where)
    urls = _strings(raw, "nonResourceURLs", where)
    if not verbs:
        raise RbacError(f"{where}.verbs must contain at least one verb")
    if urls:
        if namespaced:
            raise RbacError(f"{where}: a Role cannot have nonResourceURLs")
        if groups or resources or names:
            raise RbacError(f"{where}: a rule cannot cover both resources and nonResourceURLs")
        return None  # non-resource rules never match resource requests
    if not groups:
        raise RbacError(f'{where}.apiGroups must list at least one group ("" is the core group)')
    if not resources:
        raise RbacError(f"{where}.resources must list at least one resource")
    return Rule.of(verbs, groups, resources, names)


def _parse_aggregation(where: str, raw: Any) -> tuple[LabelSelector, ...] | None:
    if raw is None:
        return None
    where = f"{where}: aggregationRule"
    if not isinstance(raw, Mapping):
        raise RbacError(f"{where} must be a mapping")
    selectors = raw.get("clusterRoleSelectors")
    if not isinstance(selectors, list) or not selectors:
        raise RbacError(f"{where}.clusterRoleSelectors must be a non-empty list")
    return tuple(_parse_selector(f"{where}.clusterRoleSelectors[{i}]", s) for i, s in enumerate(selectors))


def _parse_selector(where: str, raw: Any) -> LabelSelector:
    if not isinstance(raw, Mapping):
        raise RbacError(f"{where} must be a mapping")
    labels = raw.get("matchLabels") or {}
    if not isinstance(labels, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise RbacError(f"{where}.matchLabels must map strings to strings")
    exprs = raw.get("matchExpressions") or []
    if not isinstance(exprs, list):
        raise RbacError(f"{where}.matchExpressions must be a list")
    requirements = [Requirement(k, "In", frozenset((v,))) for k, v in labels.items()]
    requirements += [_parse_requirement(f"{where}.matchExpressions[{i}]", e) for i, e in enumerate(exprs)]
    return LabelSelector(tuple(requirements))


def _parse_requirement(where: str, raw: Any) -> Requirement:
    if not isinstance(raw, Mapping):
        raise RbacError(f"{where} must be a mapping")
    key = _string(raw, "key", where, required=True)
    operator = _string(raw, "operator", where, required=True)
    values = _strings(raw, "values", where)
    if operator not in _OPERATORS:
        raise RbacError(f"{where}.operator must be one of {', '.join(_OPERATORS)}, got {operator!r}")
    if operator in ("In", "NotIn") and not values:
        raise RbacError(f"{where}: operator {operator} needs at least one value")
    if operator in ("Exists", "DoesNotExist") and values:
        raise RbacError(f"{where}: operator {operator} takes no values")
    return Requirement(key, operator, frozenset(values))


def _parse_binding(where: str, kind: str, namespace: str, name: str, obj: Mapping[str, Any]) -> Binding:
    ref = obj.get("roleRef")
    if not isinstance(ref, Mapping):
        raise RbacError(f"{where}: roleRef is required")
    role_kind = _string(ref, "kind", f"{where}: roleRef", required=True)
    role_name = _string(ref, "name", f"{where}: roleRef", required=True)
    if _string(ref, "apiGroup", f"{where}: roleRef") not in ("", RBAC_GROUP):
        raise RbacError(f"{where}: roleRef.apiGroup must be {RBAC_GROUP}")
    allowed_kinds = ("Role", "ClusterRole") if kind == "RoleBinding" else ("ClusterRole",)
    if role_kind not in allowed_kinds:
        raise RbacError(f"{where}: roleRef.kind must be {' or '.join(allowed_kinds)}, got {role_kind!r}")
    usernames, groups = _parse_subjects(where, obj.get("subjects"), namespace)
    return Binding(kind, namespace, name, role_kind, role_name, usernames, groups)


def _parse_subjects(where: str, raw: Any, namespace: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if raw is None:
        return (), ()
    if not isinstance(raw, list):
        raise RbacError(f"{where}: subjects must be a list")
    usernames: list[str] = []
    groups: list[str] = []
    for i, subject in enumerate(raw):
        at = f"{where}: subjects[{i}]"
        if not isinstance(subject, Mapping):
            raise RbacError(f"{at} must be a mapping")
        kind = _string(subject, "kind", at, required=True)
        name = _string(subject, "name", at, required=True)
        if kind == "User":
            usernames.append(name)
        elif kind == "Group":
            groups.append(name)
        elif kind == "ServiceAccount":
            # Defaults to the RoleBinding's namespace; a ClusterRoleBinding has none to give.
            sa_namespace = _string(subject, "namespace", at) or namespace
            if sa_namespace:
                usernames.append(f"{SERVICE_ACCOUNT_PREFIX}{sa_namespace}:{name}")
        else:
            raise RbacError(f"{at}.kind must be User, Group or ServiceAccount, got {kind!r}")
    return tuple(dict.fromkeys(usernames)), tuple(dict.fromkeys(groups))
