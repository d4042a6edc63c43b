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

All validation (:mod:`admission.rbac.manifests`), aggregation and indexing by subject happen in
:meth:`RbacEvaluator.from_objects`, so :meth:`RbacEvaluator.allowed` is a few dictionary lookups
and set tests.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from admission.rbac.manifests import (
    API_VERSION,
    KINDS,
    RBAC_GROUP,
    SERVICE_ACCOUNT_PREFIX,
    RbacError,
    flatten,
    parse_object,
)
from admission.rbac.objects import Binding, Grant, Role, Rule, title

__all__ = [  # re-exported
    "API_VERSION",
    "KINDS",
    "MAX_MEMO",
    "RBAC_GROUP",
    "SERVICE_ACCOUNT_PREFIX",
    "RbacError",
    "RbacEvaluator",
    "ResourceAttributes",
    "UserInfo",
]

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


@dataclass(slots=True)
class _Index:
    """Grants of one scope (the cluster, or one namespace) by subject."""

    users: dict[str, list[Grant]] = field(default_factory=dict)
    groups: dict[str, list[Grant]] = field(default_factory=dict)

    def add(self, binding: Binding, grant: Grant) -> None:
        for username in binding.usernames:
            self.users.setdefault(username, []).append(grant)
        for group in binding.groups:
            self.groups.setdefault(group, []).append(grant)

    def find(
        self, user: UserInfo, verb: str, group: str, combined: str, star_sub: str | None, name: str
    ) -> Grant | None:
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
        roles: dict[tuple[str, str, str], Role] = {}
        bindings: dict[tuple[str, str, str], Binding] = {}
        for where, obj in flatten(objects):
            parsed = parse_object(where, obj)
            key = (parsed.kind, parsed.namespace, parsed.name)
            if key in roles or key in bindings:
                raise RbacError(f"{where}: duplicate {title(*key)}")
            if isinstance(parsed, Role):
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
            index.add(binding, Grant(binding.describe(), granted))
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

    def _grant(self, user: UserInfo, attrs: ResourceAttributes) -> Grant | None:
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
    roles: Mapping[tuple[str, str, str], Role],
) -> dict[tuple[str, str, str], tuple[Rule, ...]]:
    cluster_roles = sorted((r for r in roles.values() if r.kind == "ClusterRole"), key=lambda r: r.name)
    return {
        key: role.rules if role.selectors is None else _aggregate(role, cluster_roles)
        for key, role in roles.items()
    }


def _aggregate(root: Role, cluster_roles: Sequence[Role]) -> tuple[Rule, ...]:
    # The controller sets an aggregated role's rules to the union of the selected roles' rules, which
    # for aggregated roles are their own unions: the least fixpoint is the rules of every
    # non-aggregated ClusterRole reachable through selectors. Cycles then add nothing.
    rules: dict[Rule, None] = {}
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
