"""Kubernetes RBAC evaluated locally: Role / ClusterRole / (Cluster)RoleBinding manifests -> "may
this user do VERB on RESOURCE/NAME?". Pure and synchronous.

Semantics follow the kube-apiserver RBAC authorizer and the ClusterRole aggregation controller:

* a ClusterRoleBinding grants its ClusterRole everywhere; a RoleBinding in namespace N grants its
  Role (looked up in N) or ClusterRole only for requests in N, never for cluster-scoped ones;
* a roleRef to a missing role grants nothing;
* subjects: User (username), Group (in the user's groups), ServiceAccount (username
  ``system:serviceaccount:<ns>:<name>``, namespace defaulting to the RoleBinding's);
* rules: ``*`` or exact apiGroups / verbs; resources ``*``, ``res``, ``res/sub`` or ``*/sub``;
  a non-empty resourceNames needs the request's name in it (so never matches an empty name);
* an aggregated ClusterRole's rules are the union of the rules of the ClusterRoles its selectors
  pick (transitively); like the controller, its own listed ``rules`` are overwritten, not added.

All validation, aggregation and indexing by subject happen in :meth:`RbacEvaluator.from_objects`,
so :meth:`RbacEvaluator.allowed` is a few dictionary lookups and set tests.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

API_VERSION = "rbac.authorization.k8s.io/v1"
RBAC_GROUP = "rbac.authorization.k8s.io"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
KINDS = ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
MAX_MEMO = 16_384


@dataclass(frozen=True, slots=True)
class UserInfo:
    """What the authenticator says about the requester (groups as given, nothing implied)."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    # RBAC ignores extra; kept out of the hash so a UserInfo stays hashable.
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict, hash=False)


@dataclass(frozen=True, slots=True)
class ResourceAttributes:
    verb: str
    group: str  # "" is the core group
    resource: str  # plural, e.g. "packagepolicies"
    subresource: str = ""
    name: str = ""
    namespace: str = ""  # "" for cluster-scoped resources or cluster-wide requests


class RbacError(ValueError):
    """A manifest that is not RBAC, or that the API server would reject."""


# ------------------------------------------------------------------------------------------
# Compiled forms.


@dataclass(frozen=True, slots=True)
class _Rule:
    verbs: frozenset[str]
    groups: frozenset[str]
    resources: frozenset[str]
    names: frozenset[str]  # empty: any name
    any_verb: bool
    any_group: bool
    any_resource: bool

    @classmethod
    def of(
        cls, verbs: Sequence[str], groups: Sequence[str], resources: Sequence[str], names: Sequence[str]
    ) -> _Rule:
        return cls(
            frozenset(verbs),
            frozenset(groups),
            frozenset(resources),
            frozenset(names),
            "*" in verbs,
            "*" in groups,
            "*" in resources,
        )

    def matches(self, verb: str, group: str, combined: str, star_sub: str | None, name: str) -> bool:
        return (
            (self.any_verb or verb in self.verbs)
            and (self.any_group or group in self.groups)
            and (
                self.any_resource
                or combined in self.resources
                or (star_sub is not None and star_sub in self.resources)
            )
            and (not self.names or name in self.names)
        )


@dataclass(frozen=True, slots=True)
class _Requirement:
    key: str
    operator: str
    values: frozenset[str]

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "In":
            return self.key in labels and labels[self.key] in self.values
        if self.operator == "NotIn":
            return self.key not in labels or labels[self.key] not in self.values
        if self.operator == "Exists":
            return self.key in labels
        return self.key not in labels  # DoesNotExist


@dataclass(frozen=True, slots=True)
class _Selector:
    requirements: tuple[_Requirement, ...]  # ANDed; none selects everything

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)


@dataclass(frozen=True, slots=True)
class _Role:
    kind: str
    namespace: str  # "" for ClusterRoles
    name: str
    labels: Mapping[str, str]
    rules: tuple[_Rule, ...]
    selectors: tuple[_Selector, ...] | None  # None: not aggregated

    def selects(self, other: _Role) -> bool:
        return any(s.matches(other.labels) for s in self.selectors or ())


@dataclass(frozen=True, slots=True)
class _Binding:
    kind: str
    namespace: str  # "" for ClusterRoleBindings
    name: str
    role_kind: str
    role_name: str
    usernames: tuple[str, ...]  # User subjects and ServiceAccount usernames
    groups: tuple[str, ...]

    @property
    def role_key(self) -> tuple[str, str, str]:
        return (self.role_kind, self.namespace if self.role_kind == "Role" else "", self.role_name)

    def describe(self) -> str:
        return f"{_title(self.kind, self.namespace, self.name)} ({_title(*self.role_key)})"


@dataclass(frozen=True, slots=True)
class _Grant:
    source: str  # the binding and role, for explain()
    rules: tuple[_Rule, ...]

    def allows(self, verb: str, group: str, combined: str, star_sub: str | None, name: str) -> bool:
        for rule in self.rules:  # noqa: SIM110 - hot path; any() over a generator is slower
            if rule.matches(verb, group, combined, star_sub, name):
                return True
        return False


@dataclass(slots=True)
class _Index:
    """Grants of one scope (the cluster, or one namespace) by subject."""

    users: dict[str, list[_Grant]] = field(default_factory=dict)
    groups: dict[str, list[_Grant]] = field(default_factory=dict)

    def add(self, binding: _Binding, grant: _Grant) -> None:
        for username in binding.usernames:
            self.users.setdefault(username, []).append(grant)
        for group in binding.groups:
            self.groups.setdefault(group, []).append(grant)

    def find(
        self, user: UserInfo, verb: str, group: str, combined: str, star_sub: str | None, name: str
    ) -> _Grant | None:
        for grant in self.users.get(user.username, ()):
            if grant.allows(verb, group, combined, star_sub, name):
                return grant
        for user_group in user.groups:
            for grant in self.groups.get(user_group, ()):
                if grant.allows(verb, group, combined, star_sub, name):
                    return grant
        return None


# ------------------------------------------------------------------------------------------
# The evaluator.


class RbacEvaluator:
    """RBAC decisions over a fixed set of manifests; build with :meth:`from_objects`."""

    __slots__ = ("_cluster", "_memo", "_namespaces")

    def __init__(self, cluster: _Index | None = None, namespaces: Mapping[str, _Index] | None = None) -> None:
        self._cluster = cluster or _Index()
        self._namespaces: Mapping[str, _Index] = namespaces or {}
        # Answers by (username, groups, request): the manifests never change after construction,
        # and a webhook asks the same few questions over and over. Bounded; cleared when full.
        self._memo: dict[tuple[str, tuple[str, ...], str, str, str, str, str, str], bool] = {}

    @classmethod
    def from_objects(cls, objects: Iterable[Mapping[str, Any]]) -> RbacEvaluator:
        """Manifests (RBAC kinds, ``List`` / ``*List`` of them) -> evaluator; RbacError if malformed.

        ``None`` entries (empty documents of a YAML stream) are skipped.
        """
        roles: dict[tuple[str, str, str], _Role] = {}
        bindings: dict[tuple[str, str, str], _Binding] = {}
        for where, obj in _flatten(objects):
            parsed = _parse(where, obj)
            key = (parsed.kind, parsed.namespace, parsed.name)
            if key in roles or key in bindings:
                raise RbacError(f"{where}: duplicate {_title(*key)}")
            if isinstance(parsed, _Role):
                roles[key] = parsed
            else:
                bindings[key] = parsed
        rules = _effective_rules(roles)
        cluster = _Index()
        namespaces: dict[str, _Index] = {}
        for binding in bindings.values():
            granted = rules.get(binding.role_key, ())
            if not granted:
                continue  # missing or empty role: grants nothing
            index = namespaces.setdefault(binding.namespace, _Index()) if binding.namespace else cluster
            index.add(binding, _Grant(binding.describe(), granted))
        return cls(cluster, namespaces)

    def allowed(self, user: UserInfo, attrs: ResourceAttributes) -> bool:
        groups = user.groups if type(user.groups) is tuple else tuple(user.groups)  # hashable
        key = (
            user.username,
            groups,
            attrs.verb,
            attrs.group,
            attrs.resource,
            attrs.subresource,
            attrs.name,
            attrs.namespace,
        )
        memo = self._memo
        answer = memo.get(key)
        if answer is None:
            answer = self._grant(user, attrs) is not None
            if len(memo) >= MAX_MEMO:
                memo.clear()
            memo[key] = answer
        return answer

    def explain(self, user: UserInfo, attrs: ResourceAttributes) -> str:
        """One line: the binding and role that allow the request, or what is not allowed."""
        grant = self._grant(user, attrs)
        if grant is not None:
            return f"allowed by {grant.source}"
        target = f"{attrs.group}/{attrs.resource}" if attrs.group else attrs.resource
        if attrs.subresource:
            target += f"/{attrs.subresource}"
        if attrs.name:
            target += f" {attrs.name}"
        where = f" in namespace {attrs.namespace}" if attrs.namespace else ""
        return f"no RBAC rule allows user {user.username} to {attrs.verb} {target}{where}"

    def _grant(self, user: UserInfo, attrs: ResourceAttributes) -> _Grant | None:
        sub = attrs.subresource
        combined = f"{attrs.resource}/{sub}" if sub else attrs.resource
        star_sub = f"*/{sub}" if sub else None
        args = (user, attrs.verb, attrs.group, combined, star_sub, attrs.name)
        grant = self._cluster.find(*args)
        if grant is None and attrs.namespace:
            index = self._namespaces.get(attrs.namespace)
            if index is not None:
                grant = index.find(*args)
        return grant


# ------------------------------------------------------------------------------------------
# Aggregation.


def _effective_rules(
    roles: Mapping[tuple[str, str, str], _Role],
) -> dict[tuple[str, str, str], tuple[_Rule, ...]]:
    cluster_roles = sorted((r for r in roles.values() if r.kind == "ClusterRole"), key=lambda r: r.name)
    return {
        key: role.rules if role.selectors is None else _aggregate(role, cluster_roles)
        for key, role in roles.items()
    }


def _aggregate(root: _Role, cluster_roles: Sequence[_Role]) -> tuple[_Rule, ...]:
    # The controller sets an aggregated role's rules to the union of the selected roles' rules, which
    # for aggregated roles are their own unions: the least fixpoint is the rules of every
    # non-aggregated ClusterRole reachable through selectors. Cycles then add nothing.
    rules: dict[_Rule, None] = {}
    seen = {root.name}
    todo = [root]
    while todo:
        role = todo.pop()
        for other in cluster_roles:
            if other.name in seen or not role.selects(other):
                continue
            seen.add(other.name)
            if other.selectors is None:
                rules.update(dict.fromkeys(other.rules))
            else:
                todo.append(other)
    return tuple(rules)


# ------------------------------------------------------------------------------------------
# Parsing and validation.


def _title(kind: str, namespace: str, name: str) -> str:
    return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"


def _flatten(objects: Iterable[Mapping[str, Any]]) -> Iterator[tuple[str, Mapping[str, Any]]]:
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


def _parse(where: str, obj: Mapping[str, Any]) -> _Role | _Binding:
    kind: str = obj["kind"]
    if obj.get("apiVersion") != API_VERSION:
        raise RbacError(f"{where}: {kind} apiVersion must be {API_VERSION}, got {obj.get('apiVersion')!r}")
    namespaced = kind in ("Role", "RoleBinding")
    name, namespace, labels = _metadata(where, kind, obj.get("metadata"), namespaced)
    where = f"{where} ({_title(kind, namespace, name)})"
    if kind.endswith("Binding"):
        return _parse_binding(where, kind, namespace, name, obj)
    rules = _parse_rules(where, obj.get("rules"), namespaced)
    aggregation = obj.get("aggregationRule") if kind == "ClusterRole" else None
    return _Role(kind, namespace, name, labels, rules, _parse_aggregation(where, aggregation))


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


def _parse_rules(where: str, raw: Any, namespaced: bool) -> tuple[_Rule, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise RbacError(f"{where}: rules must be a list")
    parsed = (_parse_rule(f"{where}: rules[{i}]", rule, namespaced) for i, rule in enumerate(raw))
    return tuple(dict.fromkeys(rule for rule in parsed if rule is not None))


def _parse_rule(where: str, raw: Any, namespaced: bool) -> _Rule | None:
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
    return _Rule.of(verbs, groups, resources, names)


def _parse_aggregation(where: str, raw: Any) -> tuple[_Selector, ...] | None:
    if raw is None:
        return None
    where = f"{where}: aggregationRule"
    if not isinstance(raw, Mapping):
        raise RbacError(f"{where} must be a mapping")
    selectors = raw.get("clusterRoleSelectors")
    if not isinstance(selectors, list) or not selectors:
        raise RbacError(f"{where}.clusterRoleSelectors must be a non-empty list")
    return tuple(_parse_selector(f"{where}.clusterRoleSelectors[{i}]", s) for i, s in enumerate(selectors))


def _parse_selector(where: str, raw: Any) -> _Selector:
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
    requirements = [_Requirement(k, "In", frozenset((v,))) for k, v in labels.items()]
    requirements += [_parse_requirement(f"{where}.matchExpressions[{i}]", e) for i, e in enumerate(exprs)]
    return _Selector(tuple(requirements))


def _parse_requirement(where: str, raw: Any) -> _Requirement:
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
    return _Requirement(key, operator, frozenset(values))


def _parse_binding(where: str, kind: str, namespace: str, name: str, obj: Mapping[str, Any]) -> _Binding:
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
    return _Binding(kind, namespace, name, role_kind, role_name, usernames, groups)


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
