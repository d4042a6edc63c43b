"""RBAC objects as the evaluator holds them, validated and compiled from their manifests
(:mod:`admission.rbac.manifests`): rules, label selectors, roles, bindings, and the grants that
tie a binding to its role's rules."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


def title(kind: str, namespace: str, name: str) -> str:
    """How messages name an object: ``Kind namespace/name``, or ``Kind name`` when cluster-wide."""
    return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"


@dataclass(frozen=True, slots=True)
class Rule:
    """A resource rule: ``*`` or exact apiGroups / verbs; resources ``*``, ``res``, ``res/sub`` or
    ``*/sub``; a non-empty resourceNames needs the request's name in it."""

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
    ) -> Rule:
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
class Requirement:
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
class LabelSelector:
    """A clusterRoleSelector of an aggregation rule."""

    requirements: tuple[Requirement, ...]  # ANDed; none selects everything

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)


@dataclass(frozen=True, slots=True)
class Role:
    """A Role or ClusterRole."""

    kind: str
    namespace: str  # "" for ClusterRoles
    name: str
    labels: Mapping[str, str]
    rules: tuple[Rule, ...]
    selectors: tuple[LabelSelector, ...] | None  # None: not aggregated

    def selects(self, other: Role) -> bool:
        return any(s.matches(other.labels) for s in self.selectors or ())


@dataclass(frozen=True, slots=True)
class Binding:
    """A RoleBinding or ClusterRoleBinding, its subjects as the usernames and groups they match."""

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
        return f"{title(self.kind, self.namespace, self.name)} ({title(*self.role_key)})"


@dataclass(frozen=True, slots=True)
class Grant:
    """The rules a binding grants its subjects."""

    source: str  # the binding and role, for explain()
    rules: tuple[Rule, ...]

    def allows(self, verb: str, group: str, combined: str, star_sub: str | None, name: str) -> bool:
        for rule in self.rules:  # noqa: SIM110 - hot path; any() over a generator is slower
            if rule.matches(verb, group, combined, star_sub, name):
                return True
        return False
