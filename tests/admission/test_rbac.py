"""Local RBAC evaluator: subjects, scoping, rule matching, aggregation, explain, validation."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from admission.rbac import evaluator as rbac
from admission.rbac.evaluator import RbacError, RbacEvaluator, ResourceAttributes, UserInfo

API = "rbac.authorization.k8s.io/v1"
GROUP = "rbac.authorization.k8s.io"


def rule(
    verbs: list[str], groups: list[str], resources: list[str], names: list[str] | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {"verbs": verbs, "apiGroups": groups, "resources": resources}
    if names is not None:
        out["resourceNames"] = names
    return out


def cluster_role(
    name: str,
    rules: list[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = None,
    selectors: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": API, "kind": "ClusterRole", "metadata": {"name": name}}
    if labels:
        obj["metadata"]["labels"] = labels
    if rules is not None:
        obj["rules"] = rules
    if selectors is not None:
        obj["aggregationRule"] = {"clusterRoleSelectors": selectors}
    return obj


def role(namespace: str, name: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    meta = {"name": name, "namespace": namespace}
    return {"apiVersion": API, "kind": "Role", "metadata": meta, "rules": rules}


def user(name: str) -> dict[str, str]:
    return {"kind": "User", "apiGroup": GROUP, "name": name}


def group(name: str) -> dict[str, str]:
    return {"kind": "Group", "apiGroup": GROUP, "name": name}


def sa(name: str, namespace: str | None = None) -> dict[str, str]:
    out = {"kind": "ServiceAccount", "name": name}
    if namespace is not None:
        out["namespace"] = namespace
    return out


def crb(name: str, role_name: str, subjects: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": role_name},
        "subjects": subjects,
    }


def rb(
    namespace: str, name: str, kind: str, role_name: str, subjects: list[dict[str, str]]
) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": namespace},
        "roleRef": {"apiGroup": GROUP, "kind": kind, "name": role_name},
        "subjects": subjects,
    }


def req(
    verb: str, grp: str, resource: str, sub: str = "", name: str = "", namespace: str = ""
) -> ResourceAttributes:
    return ResourceAttributes(verb, grp, resource, subresource=sub, name=name, namespace=namespace)


ALICE = UserInfo("alice", groups=("system:authenticated",))
BOB = UserInfo("bob", groups=("system:authenticated", "devs"))
READ_PODS = [rule(["get", "list"], [""], ["pods"])]


# ------------------------------------------------------------------------------------------
# Subjects


def test_user_binding() -> None:
    ev = RbacEvaluator.from_objects([cluster_role("pods", READ_PODS), crb("x", "pods", [user("alice")])])
    assert ev.allowed(ALICE, req("get", "", "pods", namespace="ns"))
    assert ev.allowed(ALICE, req("list", "", "pods"))
    assert not ev.allowed(ALICE, req("delete", "", "pods", namespace="ns"))
    assert not ev.allowed(BOB, req("get", "", "pods", namespace="ns"))


def test_group_binding() -> None:
    ev = RbacEvaluator.from_objects([cluster_role("pods", READ_PODS), crb("x", "pods", [group("devs")])])
    assert ev.allowed(BOB, req("get", "", "pods"))
    assert not ev.allowed(ALICE, req("get", "", "pods"))
    # A user named like the group is not in it.
    assert not ev.allowed(UserInfo("devs"), req("get", "", "pods"))


def test_no_implicit_groups() -> None:
    ev = RbacEvaluator.from_objects(
        [cluster_role("pods", READ_PODS), crb("x", "pods", [group("system:authenticated")])]
    )
    assert ev.allowed(ALICE, req("get", "", "pods"))
    assert not ev.allowed(UserInfo("alice"), req("get", "", "pods"))


def test_service_account_subjects() -> None:
    ev = RbacEvaluator.from_objects(
        [
            cluster_role("pods", READ_PODS),
            rb("ns1", "explicit", "ClusterRole", "pods", [sa("builder", "ci")]),
            rb("ns2", "defaulted", "ClusterRole", "pods", [sa("builder")]),
            crb("cluster-no-ns", "pods", [sa("lost")]),
            crb("cluster-ns", "pods", [sa("watcher", "mon")]),
        ]
    )
    ci = UserInfo("system:serviceaccount:ci:builder")
    local = UserInfo("system:serviceaccount:ns2:builder")
    assert ev.allowed(ci, req("get", "", "pods", namespace="ns1"))
    assert not ev.allowed(ci, req("get", "", "pods", namespace="ns2"))
    assert ev.allowed(local, req("get", "", "pods", namespace="ns2"))
    assert not ev.allowed(local, req("get", "", "pods", namespace="ns1"))
    # The subject namespace defaults to the binding's, not to any namespace.
    assert not ev.allowed(
        UserInfo("system:serviceaccount:ns1:builder"), req("get", "", "pods", namespace="ns2")
    )
    assert ev.allowed(UserInfo("system:serviceaccount:mon:watcher"), req("list", "", "pods"))
    for ns in ("", "default", "kube-system"):
        for who in ("lost", "system:serviceaccount::lost", "system:serviceaccount:default:lost"):
            assert not ev.allowed(UserInfo(who), req("get", "", "pods", namespace=ns))


def test_user_subject_matches_service_account_username() -> None:
    # Kubernetes compares usernames: a User subject with an SA's username matches that SA.
    ev = RbacEvaluator.from_objects(
        [cluster_role("pods", READ_PODS), crb("x", "pods", [user("system:serviceaccount:ci:builder")])]
    )
    assert ev.allowed(UserInfo("system:serviceaccount:ci:builder"), req("get", "", "pods"))


# ------------------------------------------------------------------------------------------
# Scoping and role lookup


def test_cluster_role_binding_grants_everywhere() -> None:
    ev = RbacEvaluator.from_objects([cluster_role("pods", READ_PODS), crb("x", "pods", [user("alice")])])
    for ns in ("", "a", "kube-system"):
        assert ev.allowed(ALICE, req("get", "", "pods", namespace=ns))


def test_role_binding_to_cluster_role_is_namespaced() -> None:
    ev = RbacEvaluator.from_objects(
        [cluster_role("pods", READ_PODS), rb("team-a", "x", "ClusterRole", "pods", [user("alice")])]
    )
    assert ev.allowed(ALICE, req("get", "", "pods", namespace="team-a"))
    assert not ev.allowed(ALICE, req("get", "", "pods", namespace="team-b"))
    assert not ev.allowed(ALICE, req("list", "", "pods"))  # cluster-wide list
    # Cluster-scoped resources are never granted by a RoleBinding.
    nodes = RbacEvaluator.from_objects(
        [
            cluster_role("nodes", [rule(["get"], [""], ["nodes"])]),
            rb("team-a", "x", "ClusterRole", "nodes", [user("alice")]),
        ]
    )
    assert not nodes.allowed(ALICE, req("get", "", "nodes", name="n1"))


def test_role_looked_up_in_binding_namespace() -> None:
    ev = RbacEvaluator.from_objects(
        [
            role("other", "reader", READ_PODS),
            rb("team-a", "x", "Role", "reader", [user("alice")]),
            role("team-b", "reader", READ_PODS),
            rb("team-b", "x", "Role", "reader", [user("alice")]),
        ]
    )
    assert not ev.allowed(ALICE, req("get", "", "pods", namespace="team-a"))
    assert not ev.allowed(ALICE, req("get", "", "pods", namespace="other"))
    assert ev.allowed(ALICE, req("get", "", "pods", namespace="team-b"))
    assert not ev.allowed(ALICE, req("get", "", "pods"))


def test_role_kind_and_cluster_role_kind_are_distinct() -> None:
    # roleRef kind Role never resolves to a ClusterRole of that name, and the reverse.
    ev = RbacEvaluator.from_objects(
        [
            cluster_role("only-cluster", READ_PODS),
            role("ns", "only-ns", READ_PODS),
            rb("ns", "a", "Role", "only-cluster", [user("alice")]),
            rb("ns", "b", "ClusterRole", "only-ns", [user("alice")]),
        ]
    )
    assert not ev.allowed(ALICE, req("get", "", "pods", namespace="ns"))


def test_missing_role_grants_nothing() -> None:
    ev = RbacEvaluator.from_objects(
        [crb("x", "nope", [user("alice")]), rb("ns", "y", "Role", "nope", [user("alice")])]
    )
    assert not ev.allowed(ALICE, req("get", "", "pods", namespace="ns"))
    assert ev.explain(ALICE, req("get", "", "pods", namespace="ns")).startswith("no RBAC rule")


def test_binding_without_subjects_grants_nothing() -> None:
    binding = crb("x", "pods", [])
    del binding["subjects"]
    ev = RbacEvaluator.from_objects([cluster_role("pods", READ_PODS), binding])
    assert not ev.allowed(ALICE, req("get", "", "pods"))


def test_deny_by_default() -> None:
    ev = RbacEvaluator.from_objects([])
    assert not ev.allowed(ALICE, req("get", "", "pods"))
    assert not ev.allowed(UserInfo("system:admin", groups=("system:masters",)), req("get", "", "pods"))


# ------------------------------------------------------------------------------------------
# Rule matching


def one_rule(*rules: dict[str, Any]) -> RbacEvaluator:
    return RbacEvaluator.from_objects([cluster_role("r", list(rules)), crb("x", "r", [user("alice")])])


def test_wildcard_api_groups() -> None:
    ev = one_rule(rule(["get"], ["*"], ["deployments"]))
    assert ev.allowed(ALICE, req("get", "apps", "deployments"))
    assert ev.allowed(ALICE, req("get", "", "deployments"))
    assert not ev.allowed(ALICE, req("get", "apps", "replicasets"))


def test_core_group_is_empty_string() -> None:
    ev = one_rule(rule(["get"], [""], ["pods"]))
    assert ev.allowed(ALICE, req("get", "", "pods"))
    assert not ev.allowed(ALICE, req("get", "metrics.k8s.io", "pods"))
    listed = one_rule(rule(["get"], ["apps", "batch"], ["*"]))
    assert listed.allowed(ALICE, req("get", "batch", "jobs"))
    assert not listed.allowed(ALICE, req("get", "", "pods"))


def test_wildcard_verbs() -> None:
    ev = one_rule(rule(["*"], ["apps"], ["deployments"]))
    for verb in ("get", "delete", "deploy", "escalate"):
        assert ev.allowed(ALICE, req(verb, "apps", "deployments"))
    assert not ev.allowed(ALICE, req("get", "apps", "statefulsets"))


def test_verbs_are_exact_and_case_sensitive() -> None:
    ev = one_rule(rule(["get"], [""], ["pods"]))
    assert not ev.allowed(ALICE, req("GET", "", "pods"))
    assert not ev.allowed(ALICE, req("list", "", "pods"))
    assert not ev.allowed(ALICE, req("get", "", "Pods"))


def test_wildcard_resources_cover_subresources() -> None:
    ev = one_rule(rule(["get"], [""], ["*"]))
    assert ev.allowed(ALICE, req("get", "", "pods"))
    assert ev.allowed(ALICE, req("get", "", "pods", sub="log"))
    assert ev.allowed(ALICE, req("get", "", "services", sub="proxy"))


def test_resource_without_subresource() -> None:
    ev = one_rule(rule(["get"], [""], ["pods"]))
    assert ev.allowed(ALICE, req("get", "", "pods"))
    assert not ev.allowed(ALICE, req("get", "", "pods", sub="log"))
    assert not ev.allowed(ALICE, req("get", "", "pods", sub="exec"))


def test_named_subresource() -> None:
    ev = one_rule(rule(["get"], [""], ["pods/log"]))
    assert ev.allowed(ALICE, req("get", "", "pods", sub="log"))
    assert not ev.allowed(ALICE, req("get", "", "pods"))
    assert not ev.allowed(ALICE, req("get", "", "pods", sub="exec"))
    assert not ev.allowed(ALICE, req("get", "", "services", sub="log"))


def test_star_slash_subresource() -> None:
    ev = one_rule(rule(["update"], ["*"], ["*/status"]))
    assert ev.allowed(ALICE, req("update", "apps", "deployments", sub="status"))
    assert ev.allowed(ALICE, req("update", "", "pods", sub="status"))
    assert not ev.allowed(ALICE, req("update", "apps", "deployments"))
    assert not ev.allowed(ALICE, req("update", "", "pods", sub="statuses"))
    assert not ev.allowed(ALICE, req("update", "", "pods", sub="scale"))


def test_resource_slash_star_is_literal() -> None:
    # Kubernetes has no "res/*" wildcard; it only matches a subresource literally named "*".
    ev = one_rule(rule(["get"], [""], ["pods/*"]))
    assert not ev.allowed(ALICE, req("get", "", "pods", sub="log"))
    assert not ev.allowed(ALICE, req("get", "", "pods"))


def test_resource_names() -> None:
    ev = one_rule(rule(["get", "update", "list", "create"], [""], ["configmaps"], ["cfg-a", "cfg-b"]))
    assert ev.allowed(ALICE, req("get", "", "configmaps", name="cfg-a", namespace="ns"))
    assert ev.allowed(ALICE, req("update", "", "configmaps", name="cfg-b"))
    assert not ev.allowed(ALICE, req("get", "", "configmaps", name="cfg-c"))
    assert not ev.allowed(ALICE, req("list", "", "configmaps"))
    assert not ev.allowed(ALICE, req("create", "", "configmaps"))


def test_empty_resource_names_means_any() -> None:
    ev = one_rule(rule(["get", "list"], [""], ["configmaps"], []))
    assert ev.allowed(ALICE, req("get", "", "configmaps", name="anything"))
    assert ev.allowed(ALICE, req("list", "", "configmaps"))


def test_rules_are_ored_but_fields_within_a_rule_are_anded() -> None:
    ev = one_rule(rule(["get"], [""], ["pods"]), rule(["delete"], ["apps"], ["deployments"]))
    assert ev.allowed(ALICE, req("get", "", "pods"))
    assert ev.allowed(ALICE, req("delete", "apps", "deployments"))
    assert not ev.allowed(ALICE, req("delete", "", "pods"))
    assert not ev.allowed(ALICE, req("get", "apps", "deployments"))


def test_non_resource_rules_never_match_resource_requests() -> None:
    ev = one_rule({"verbs": ["*"], "nonResourceURLs": ["*"]})
    assert not ev.allowed(ALICE, req("get", "", "pods"))
    assert not ev.allowed(ALICE, req("get", "", "healthz"))


# ------------------------------------------------------------------------------------------
# Aggregation


def test_aggregation_by_match_labels() -> None:
    ev = RbacEvaluator.from_objects(
        [
            cluster_role("agg", [], selectors=[{"matchLabels": {"example.com/aggregate-to-agg": "true"}}]),
            cluster_role("piece", READ_PODS, labels={"example.com/aggregate-to-agg": "true"}),
            cluster_role(
                "other", [rule(["delete"], [""], ["pods"])], labels={"example.com/aggregate-to-agg": "no"}
            ),
            crb("x", "agg", [user("alice")]),
        ]
    )
    assert ev.allowed(ALICE, req("get", "", "pods"))
    assert not ev.allowed(ALICE, req("delete", "", "pods"))


def test_aggregation_by_match_expressions() -> None:
    ev = RbacEvaluator.from_objects(
        [
            cluster_role(
                "agg",
                selectors=[
                    {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]},
                    {
                        "matchExpressions": [
                            {"key": "extra", "operator": "Exists"},
                            {"key": "legacy", "operator": "DoesNotExist"},
                            {"key": "env", "operator": "NotIn", "values": ["prod"]},
                        ]
                    },
                ],
            ),
            cluster_role("in-a", [rule(["get"], [""], ["pods"])], labels={"tier": "a"}),
            cluster_role("in-c", [rule(["get"], [""], ["secrets"])], labels={"tier": "c"}),
            cluster_role("extra", [rule(["get"], [""], ["services"])], labels={"extra": ""}),
            cluster_role(
                "extra-legacy", [rule(["get"], [""], ["nodes"])], labels={"extra": "", "legacy": "1"}
            ),
            cluster_role(
                "extra-prod", [rule(["get"], [""], ["events"])], labels={"extra": "", "env": "prod"}
            ),
            cluster_role(
                "extra-dev", [rule(["get"], [""], ["endpoints"])], labels={"extra": "", "env": "dev"}
            ),
            crb("x", "agg", [user("alice")]),
        ]
    )
    allowed = {
        r
        for r in ("pods", "secrets", "services", "nodes", "events", "endpoints")
        if ev.allowed(ALICE, req("get", "", r))
    }
    assert allowed == {"pods", "services", "endpoints"}


def test_selector_combines_match_labels_and_expressions() -> None:
    selector = {"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "Exists"}]}
    ev = RbacEvaluator.from_objects(
        [
            cluster_role("agg", selectors=[selector]),
            cluster_role("both", [rule(["get"], [""], ["pods"])], labels={"a": "1", "b": "x"}),
            cluster_role("only-a", [rule(["get"], [""], ["secrets"])], labels={"a": "1"}),
            crb("x", "agg", [user("alice")]),
        ]
    )
    assert ev.allowed(ALICE, req("get", "", "pods"))
    assert not ev.allowed(ALICE, req("get", "", "secrets"))


def test_aggregation_is_transitive() -> None:
    ev = RbacEvaluator.from_objects(
        [
            cluster_role("top", selectors=[{"matchLabels": {"to": "top"}}]),
            cluster_role("middle", labels={"to": "top"}, selectors=[{"matchLabels": {"to": "middle"}}]),
            cluster_role("leaf", [rule(["get"], [""], ["pods"])], labels={"to": "middle"}),
            cluster_role("direct", [rule(["get"], [""], ["secrets"])], labels={"to": "top"}),
            crb("x", "top", [user("alice")]),
            crb("y", "middle", [user("bob")]),
        ]
    )
    assert ev.allowed(ALICE, req("get", "", "pods"))
    assert ev.allowed(ALICE, req("get", "", "secrets"))
    assert ev.allowed(BOB, req("get", "", "pods"))
    assert not ev.allowed(BOB, req("get", "", "secrets"))


def test_aggregation_cycle_terminates() -> None:
    ev = RbacEvaluator.from_objects(
        [
            cluster_role("a", labels={"ring": "b"}, selectors=[{"matchLabels": {"ring": "a"}}]),
            cluster_role("b", labels={"ring": "a"}, selectors=[{"matchLabels": {"ring": "b"}}]),
            cluster_role("self", labels={"me": "1"}, selectors=[{"matchLabels": {"me": "1"}}]),
            cluster_role("leaf", [rule(["get"], [""], ["pods"])], labels={"ring": "a"}),
            crb("x", "b", [user("alice")]),
            crb("y", "self", [user("bob")]),
        ]
    )
    assert ev.allowed(ALICE, req("get", "", "pods"))  # b -> a -> leaf
    assert not ev.allowed(BOB, req("get", "", "pods"))


def test_aggregated_role_own_rules_are_overwritten() -> None:
    # The aggregation controller replaces an aggregated role's rules with the selected roles' rules.
    ev = RbacEvaluator.from_objects(
        [
            cluster_role(
                "agg", [rule(["get"], [""], ["secrets"])], selectors=[{"matchLabels": {"to": "agg"}}]
            ),
            cluster_role("piece", READ_PODS, labels={"to": "agg"}),
            crb("x", "agg", [user("alice")]),
        ]
    )
    assert ev.allowed(ALICE, req("get", "", "pods"))
    assert not ev.allowed(ALICE, req("get", "", "secrets"))


def test_aggregate_labels_alone_grant_nothing() -> None:
    ev = RbacEvaluator.from_objects(
        [
            cluster_role("piece", READ_PODS, labels={"rbac.authorization.k8s.io/aggregate-to-admin": "true"}),
            rb("ns", "x", "ClusterRole", "admin", [user("alice")]),  # no "admin" ClusterRole loaded
        ]
    )
    assert not ev.allowed(ALICE, req("get", "", "pods", namespace="ns"))


def test_aggregation_ignores_namespaced_roles() -> None:
    ns_role = role("ns", "piece", READ_PODS)
    ns_role["metadata"]["labels"] = {"to": "agg"}
    ev = RbacEvaluator.from_objects(
        [
            cluster_role("agg", selectors=[{"matchLabels": {"to": "agg"}}]),
            ns_role,
            crb("x", "agg", [user("alice")]),
        ]
    )
    assert not ev.allowed(ALICE, req("get", "", "pods", namespace="ns"))


def test_aggregated_role_through_role_binding() -> None:
    ev = RbacEvaluator.from_objects(
        [
            cluster_role("edit", selectors=[{"matchLabels": {"aggregate-to-edit": "true"}}]),
            cluster_role("piece", READ_PODS, labels={"aggregate-to-edit": "true"}),
            rb("ns", "x", "ClusterRole", "edit", [group("devs")]),
        ]
    )
    assert ev.allowed(BOB, req("get", "", "pods", namespace="ns"))
    assert not ev.allowed(BOB, req("get", "", "pods", namespace="other"))


# ------------------------------------------------------------------------------------------
# explain()


def test_explain_allowed() -> None:
    ev = RbacEvaluator.from_objects(
        [
            cluster_role("reader", READ_PODS),
            role("ns", "local", [rule(["delete"], [""], ["pods"])]),
            crb("readers", "reader", [user("alice")]),
            rb("ns", "deleters", "Role", "local", [user("alice")]),
            rb("ns", "via-cluster", "ClusterRole", "reader", [user("bob")]),
        ]
    )
    assert (
        ev.explain(ALICE, req("get", "", "pods"))
        == "allowed by ClusterRoleBinding readers (ClusterRole reader)"
    )
    assert ev.explain(ALICE, req("delete", "", "pods", namespace="ns")) == (
        "allowed by RoleBinding ns/deleters (Role ns/local)"
    )
    assert ev.explain(BOB, req("get", "", "pods", namespace="ns")) == (
        "allowed by RoleBinding ns/via-cluster (ClusterRole reader)"
    )


def test_explain_denied() -> None:
    ev = RbacEvaluator.from_objects([])
    assert ev.explain(ALICE, req("deploy", "nodegate.io", "packagepolicies", name="gpu-pool")) == (
        "no RBAC rule allows user alice to deploy nodegate.io/packagepolicies gpu-pool"
    )
    assert ev.explain(ALICE, req("get", "", "pods", sub="log", name="web-1", namespace="shop")) == (
        "no RBAC rule allows user alice to get pods/log web-1 in namespace shop"
    )
    assert ev.explain(ALICE, req("list", "apps", "deployments")) == (
        "no RBAC rule allows user alice to list apps/deployments"
    )


# ------------------------------------------------------------------------------------------
# Input forms and validation


def test_yaml_stream_and_lists() -> None:
    docs = yaml.safe_load_all(
        """
apiVersion: v1
kind: List
items:
- apiVersion: rbac.authorization.k8s.io/v1
  kind: ClusterRole
  metadata: {name: reader}
  rules:
  - {apiGroups: [""], resources: [pods], verbs: [get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBindingList
items:
- metadata: {name: readers}
  roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: reader}
  subjects: [{kind: User, apiGroup: rbac.authorization.k8s.io, name: alice}]
---
"""
    )
    ev = RbacEvaluator.from_objects(docs)
    assert ev.allowed(ALICE, req("get", "", "pods"))


def test_nested_and_empty_lists() -> None:
    inner = {"apiVersion": "v1", "kind": "List", "items": [cluster_role("reader", READ_PODS)]}
    outer = {"apiVersion": "v1", "kind": "List", "items": [inner, crb("x", "reader", [user("alice")])]}
    empty = {"apiVersion": API, "kind": "RoleList", "items": []}
    assert RbacEvaluator.from_objects([outer, empty]).allowed(ALICE, req("get", "", "pods"))


def test_role_ref_api_group_defaults() -> None:
    binding = crb("x", "reader", [{"kind": "User", "name": "alice"}])
    del binding["roleRef"]["apiGroup"]
    assert RbacEvaluator.from_objects([cluster_role("reader", READ_PODS), binding]).allowed(
        ALICE, req("get", "", "pods")
    )


def test_unknown_fields_tolerated() -> None:
    obj = cluster_role("reader", [{**READ_PODS[0], "futureField": 1}])
    obj["metadata"].update(uid="123", resourceVersion="9", annotations={"a": "b"})
    obj["status"] = {"whatever": True}
    ev = RbacEvaluator.from_objects([obj, crb("x", "reader", [user("alice")])])
    assert ev.allowed(ALICE, req("get", "", "pods"))


def test_unknown_kinds_rejected() -> None:
    with pytest.raises(RbacError, match="'ConfigMap'"):
        RbacEvaluator.from_objects([{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}])
    with pytest.raises(RbacError, match="'PodList'"):
        RbacEvaluator.from_objects([{"apiVersion": "v1", "kind": "PodList", "items": []}])
    with pytest.raises(RbacError, match="'Secret'"):
        RbacEvaluator.from_objects(
            [{"apiVersion": "v1", "kind": "List", "items": [{"apiVersion": "v1", "kind": "Secret"}]}]
        )
    with pytest.raises(RbacError, match="kind is required"):
        RbacEvaluator.from_objects([{"apiVersion": API, "metadata": {"name": "x"}}])


def bad(obj: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    """A copy of obj with the value at path replaced (or deleted when value is DELETE)."""
    out: Any = yaml.safe_load(yaml.safe_dump(obj))
    target = out
    for key in path[:-1]:
        target = target[key]
    if value is DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    assert isinstance(out, dict)
    return out


DELETE = object()
GOOD_ROLE = cluster_role("reader", READ_PODS)
GOOD_BINDING = rb("ns", "x", "ClusterRole", "reader", [user("alice")])


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (bad(GOOD_ROLE, ("apiVersion",), "rbac.authorization.k8s.io/v1beta1"), "apiVersion must be"),
        (bad(GOOD_ROLE, ("metadata",), DELETE), "needs metadata"),
        (bad(GOOD_ROLE, ("metadata", "name"), DELETE), r"metadata\.name must be a non-empty string"),
        (bad(GOOD_ROLE, ("metadata", "name"), ""), r"metadata\.name must be a non-empty string"),
        (bad(GOOD_ROLE, ("metadata", "labels"), {"a": True}), "labels must map strings"),
        (bad(GOOD_ROLE, ("rules",), {"verbs": ["get"]}), "rules must be a list"),
        (bad(GOOD_ROLE, ("rules", 0), "get pods"), r"rules\[0\] must be a mapping"),
        (bad(GOOD_ROLE, ("rules", 0, "verbs"), "get"), r"rules\[0\]\.verbs must be a list of strings"),
        (bad(GOOD_ROLE, ("rules", 0, "verbs"), [1]), r"verbs must be a list of strings"),
        (bad(GOOD_ROLE, ("rules", 0, "verbs"), []), r"verbs must contain at least one verb"),
        (bad(GOOD_ROLE, ("rules", 0, "apiGroups"), DELETE), "apiGroups must list at least one group"),
        (bad(GOOD_ROLE, ("rules", 0, "resources"), []), "resources must list at least one resource"),
        (bad(GOOD_ROLE, ("rules", 0, "resourceNames"), "x"), "resourceNames must be a list of strings"),
        (bad(GOOD_ROLE, ("rules", 0, "nonResourceURLs"), ["/healthz"]), "both resources and nonResourceURLs"),
        (bad(GOOD_ROLE, ("aggregationRule",), {"clusterRoleSelectors": []}), "must be a non-empty list"),
        (bad(GOOD_ROLE, ("aggregationRule",), []), "aggregationRule must be a mapping"),
        (
            bad(GOOD_ROLE, ("aggregationRule",), {"clusterRoleSelectors": [{"matchLabels": {"a": 1}}]}),
            "matchLabels must map strings to strings",
        ),
        (
            bad(
                GOOD_ROLE,
                ("aggregationRule",),
                {"clusterRoleSelectors": [{"matchExpressions": [{"key": "a", "operator": "Is"}]}]},
            ),
            "operator must be one of",
        ),
        (
            bad(
                GOOD_ROLE,
                ("aggregationRule",),
                {"clusterRoleSelectors": [{"matchExpressions": [{"key": "a", "operator": "In"}]}]},
            ),
            "needs at least one value",
        ),
        (
            bad(
                GOOD_ROLE,
                ("aggregationRule",),
                {
                    "clusterRoleSelectors": [
                        {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}
                    ]
                },
            ),
            "takes no values",
        ),
        (bad(GOOD_BINDING, ("metadata", "namespace"), DELETE), r"needs metadata\.namespace"),
        (bad(GOOD_BINDING, ("roleRef",), DELETE), "roleRef is required"),
        (bad(GOOD_BINDING, ("roleRef", "name"), DELETE), r"roleRef\.name must be a non-empty string"),
        (bad(GOOD_BINDING, ("roleRef", "kind"), "Group"), r"roleRef\.kind must be Role or ClusterRole"),
        (bad(GOOD_BINDING, ("roleRef", "apiGroup"), "example.com"), r"roleRef\.apiGroup must be"),
        (bad(GOOD_BINDING, ("subjects",), {"kind": "User"}), "subjects must be a list"),
        (
            bad(GOOD_BINDING, ("subjects", 0, "kind"), "user"),
            r"subjects\[0\]\.kind must be User, Group or ServiceAccount",
        ),
        (
            bad(GOOD_BINDING, ("subjects", 0, "name"), DELETE),
            r"subjects\[0\]\.name must be a non-empty string",
        ),
        (
            bad(crb("x", "reader", [user("a")]), ("roleRef", "kind"), "Role"),
            r"roleRef\.kind must be ClusterRole",
        ),
        (bad(role("ns", "r", READ_PODS), ("metadata", "namespace"), DELETE), r"needs metadata\.namespace"),
        (
            bad(role("ns", "r", READ_PODS), ("rules", 0), {"verbs": ["get"], "nonResourceURLs": ["/x"]}),
            "Role cannot have nonResourceURLs",
        ),
        ({"apiVersion": "v1", "kind": "List"}, r"items must be a list"),
    ],
)
def test_malformed_objects_rejected(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(RbacError, match=message):
        RbacEvaluator.from_objects([obj])


def test_error_names_the_object() -> None:
    with pytest.raises(RbacError, match=r"objects\[1\] \(ClusterRole reader\): rules\[0\]\.verbs"):
        RbacEvaluator.from_objects([GOOD_BINDING, bad(GOOD_ROLE, ("rules", 0, "verbs"), "get")])
    with pytest.raises(RbacError, match=r"objects\[0\]\.items\[1\]: expected a mapping"):
        RbacEvaluator.from_objects([{"apiVersion": "v1", "kind": "List", "items": [GOOD_ROLE, "oops"]}])


def test_non_mapping_rejected() -> None:
    with pytest.raises(RbacError, match="expected a mapping, got str"):
        RbacEvaluator.from_objects(["kind: Role"])  # type: ignore[list-item]


def test_duplicates_rejected() -> None:
    with pytest.raises(RbacError, match="duplicate ClusterRole reader"):
        RbacEvaluator.from_objects([GOOD_ROLE, GOOD_ROLE])
    with pytest.raises(RbacError, match="duplicate RoleBinding ns/x"):
        RbacEvaluator.from_objects([GOOD_BINDING, GOOD_BINDING])
    # Same name in different namespaces or kinds is fine.
    RbacEvaluator.from_objects(
        [role("a", "r", READ_PODS), role("b", "r", READ_PODS), cluster_role("r", READ_PODS)]
    )


# ------------------------------------------------------------------------------------------
# The nodegate use case


NODEGATE = """
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: nodegate-deploy-gpu-pool}
rules:
- apiGroups: [nodegate.io]
  resources: [packagepolicies]
  resourceNames: [gpu-pool]
  verbs: [deploy]
- apiGroups: [nodegate.io]
  resources: [packagepolicies]
  resourceNames: [gpu-pool, cpu-pool]
  verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: nodegate-reboot}
rules:
- {apiGroups: [nodegate.io], resources: [packagepolicies], verbs: [reboot]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: ml-platform-deploy}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: nodegate-deploy-gpu-pool}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: Group, name: ml-platform}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: sre-reboot}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: nodegate-reboot}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: Group, name: sre}]
"""


def test_nodegate_deploy_and_reboot() -> None:
    ev = RbacEvaluator.from_objects(yaml.safe_load_all(NODEGATE))
    member = UserInfo("carol", groups=("system:authenticated", "ml-platform"))
    outsider = UserInfo("dave", groups=("system:authenticated",))
    sre = UserInfo("erin", groups=("system:authenticated", "sre"))

    def deploy(pool: str, verb: str = "deploy") -> ResourceAttributes:
        return req(verb, "nodegate.io", "packagepolicies", name=pool)

    assert ev.allowed(member, deploy("gpu-pool"))
    assert ev.explain(member, deploy("gpu-pool")) == (
        "allowed by ClusterRoleBinding ml-platform-deploy (ClusterRole nodegate-deploy-gpu-pool)"
    )
    assert not ev.allowed(member, deploy("cpu-pool"))
    assert ev.allowed(member, deploy("cpu-pool", "get"))
    assert not ev.allowed(member, deploy(""))
    assert not ev.allowed(
        member, req("deploy", "nodegate.io", "packagepolicies", sub="status", name="gpu-pool")
    )
    assert not ev.allowed(member, req("deploy", "other.io", "packagepolicies", name="gpu-pool"))
    assert not ev.allowed(outsider, deploy("gpu-pool"))
    assert ev.explain(outsider, deploy("gpu-pool")) == (
        "no RBAC rule allows user dave to deploy nodegate.io/packagepolicies gpu-pool"
    )
    # Reboot is a separate verb: deploy rights do not imply it, and reboot rights cover any pool.
    assert not ev.allowed(member, deploy("gpu-pool", "reboot"))
    assert ev.allowed(sre, deploy("gpu-pool", "reboot"))
    assert ev.allowed(sre, deploy("cpu-pool", "reboot"))
    assert not ev.allowed(sre, deploy("gpu-pool"))


# ------------------------------------------------------------------------------------------
# Properties


VERBS = ["get", "deploy", "*"]
GROUPS = ["", "apps", "*"]
RESOURCES = ["pods", "pods/log", "*/log", "*", "deployments"]
NAMESPACES = ["a", "b"]
USERS = ["alice", "bob", "system:serviceaccount:a:sa"]
GROUP_NAMES = ["devs", "ops"]

rules_st = st.builds(
    rule,
    st.lists(st.sampled_from(VERBS), min_size=1, max_size=2),
    st.lists(st.sampled_from(GROUPS), min_size=1, max_size=2),
    st.lists(st.sampled_from(RESOURCES), min_size=1, max_size=2),
    st.one_of(st.none(), st.lists(st.sampled_from(["n1", "n2"]), max_size=2)),
)
subjects_st = st.lists(
    st.one_of(
        st.sampled_from(USERS[:2]).map(user),
        st.sampled_from(GROUP_NAMES).map(group),
        st.sampled_from([sa("sa"), sa("sa", "a"), sa("sa", "b")]),
    ),
    max_size=3,
)


@st.composite
def roles_st(draw: st.DrawFn) -> list[dict[str, Any]]:
    out = [cluster_role(f"c{i}", draw(st.lists(rules_st, max_size=3))) for i in range(2)]
    out.append(cluster_role("agg", selectors=[{"matchLabels": {"agg": "yes"}}]))
    out[0]["metadata"]["labels"] = {"agg": "yes"}
    out += [role(ns, "r", draw(st.lists(rules_st, max_size=3))) for ns in NAMESPACES]
    return out


@st.composite
def binding_st(draw: st.DrawFn, index: int) -> dict[str, Any]:
    subjects = draw(subjects_st)
    if draw(st.booleans()):
        return crb(f"b{index}", draw(st.sampled_from(["c0", "c1", "agg", "missing"])), subjects)
    kind, name = draw(
        st.sampled_from([("ClusterRole", "c0"), ("ClusterRole", "c1"), ("ClusterRole", "agg"), ("Role", "r")])
    )
    return rb(draw(st.sampled_from(NAMESPACES)), f"b{index}", kind, name, subjects)


requests_st = st.builds(
    req,
    st.sampled_from(["get", "deploy", "list"]),
    st.sampled_from(["", "apps"]),
    st.sampled_from(["pods", "deployments"]),
    st.sampled_from(["", "log", "status"]),
    st.sampled_from(["", "n1", "n3"]),
    st.sampled_from(["", *NAMESPACES]),
)
users_st = st.builds(
    UserInfo,
    st.sampled_from(USERS),
    groups=st.lists(st.sampled_from(GROUP_NAMES), max_size=2).map(tuple),
)


@settings(max_examples=200, deadline=None)
@given(
    roles=roles_st(),
    bindings=st.integers(0, 4).flatmap(lambda n: st.tuples(*(binding_st(i) for i in range(n)))),
    extra=binding_st(99),
    requests=st.lists(st.tuples(users_st, requests_st), min_size=1, max_size=20),
)
def test_adding_a_binding_never_removes_a_permission(
    roles: list[dict[str, Any]],
    bindings: tuple[dict[str, Any], ...],
    extra: dict[str, Any],
    requests: list[tuple[UserInfo, ResourceAttributes]],
) -> None:
    before = RbacEvaluator.from_objects([*roles, *bindings])
    after = RbacEvaluator.from_objects([*roles, *bindings, extra])
    for who, attrs in requests:
        if before.allowed(who, attrs):
            assert after.allowed(who, attrs)
            assert after.explain(who, attrs).startswith("allowed by ")
        else:
            assert before.explain(who, attrs).startswith("no RBAC rule allows")


@settings(max_examples=100, deadline=None)
@given(roles=roles_st(), requests=st.lists(st.tuples(users_st, requests_st), min_size=1, max_size=20))
def test_without_bindings_nothing_is_allowed(
    roles: list[dict[str, Any]], requests: list[tuple[UserInfo, ResourceAttributes]]
) -> None:
    ev = RbacEvaluator.from_objects(roles)
    assert not any(ev.allowed(who, attrs) for who, attrs in requests)


def reference_allowed(objects: list[dict[str, Any]], who: UserInfo, attrs: ResourceAttributes) -> bool:
    """Kubernetes' RBAC authorizer, transliterated without indexes (one level of aggregation)."""

    def rules_of(kind: str, namespace: str, name: str) -> list[dict[str, Any]]:
        for obj in objects:
            meta = obj["metadata"]
            if obj["kind"] == kind and meta["name"] == name and meta.get("namespace", "") == namespace:
                if "aggregationRule" not in obj:
                    return list(obj.get("rules") or [])
                wanted = obj["aggregationRule"]["clusterRoleSelectors"][0]["matchLabels"].items()
                picked = [o for o in objects if o["kind"] == "ClusterRole" and o is not obj]
                picked = [o for o in picked if wanted <= o["metadata"].get("labels", {}).items()]
                return [r for o in picked for r in o.get("rules") or []]
        return []

    def applies(subject: dict[str, str], namespace: str) -> bool:
        if subject["kind"] == "User":
            return who.username == subject["name"]
        if subject["kind"] == "Group":
            return subject["name"] in who.groups
        sa_ns = subject.get("namespace") or namespace
        return bool(sa_ns) and who.username == f"system:serviceaccount:{sa_ns}:{subject['name']}"

    def rule_allows(r: dict[str, Any]) -> bool:
        combined = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
        resources = r["resources"]
        return (
            ("*" in r["verbs"] or attrs.verb in r["verbs"])
            and ("*" in r["apiGroups"] or attrs.group in r["apiGroups"])
            and (
                "*" in resources
                or combined in resources
                or (attrs.subresource != "" and f"*/{attrs.subresource}" in resources)
            )
            and (not r.get("resourceNames") or attrs.name in r["resourceNames"])
        )

    for obj in objects:
        if obj["kind"] == "ClusterRoleBinding":
            scope = ""
        elif obj["kind"] == "RoleBinding" and attrs.namespace == obj["metadata"]["namespace"]:
            scope = attrs.namespace
        else:
            continue
        if not any(applies(s, scope) for s in obj["subjects"]):
            continue
        ref = obj["roleRef"]
        if any(
            rule_allows(r) for r in rules_of(ref["kind"], scope if ref["kind"] == "Role" else "", ref["name"])
        ):
            return True
    return False


@settings(max_examples=300, deadline=None)
@given(
    roles=roles_st(),
    bindings=st.integers(0, 5).flatmap(lambda n: st.tuples(*(binding_st(i) for i in range(n)))),
    requests=st.lists(st.tuples(users_st, requests_st), min_size=1, max_size=20),
)
def test_matches_reference_authorizer(
    roles: list[dict[str, Any]],
    bindings: tuple[dict[str, Any], ...],
    requests: list[tuple[UserInfo, ResourceAttributes]],
) -> None:
    objects = [*roles, *bindings]
    ev = RbacEvaluator.from_objects(objects)
    for who, attrs in requests + requests:  # asked again: the memoised answers are the same
        assert ev.allowed(who, attrs) == reference_allowed(objects, who, attrs), (who, attrs)


def test_answers_are_memoised_boundedly_and_by_everything_that_decides_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(rbac, "MAX_MEMO", 4)
    ev = RbacEvaluator.from_objects(
        [cluster_role("reader", READ_PODS), crb("devs-read", "reader", [group("devs")])]
    )
    pods = req("get", "", "pods")
    assert ev.allowed(BOB, pods)
    assert not ev.allowed(ALICE, pods)
    assert not ev.allowed(UserInfo("bob"), pods)  # the same name without the group
    assert ev.allowed(UserInfo("carol", groups=["devs"]), pods)  # type: ignore[arg-type]  # a list, as JSON gives
    for i in range(10):
        assert not ev.allowed(UserInfo(f"user-{i}"), pods)
    assert len(ev._memo) <= 4
    assert ev.allowed(BOB, pods)
    assert not ev.allowed(BOB, req("delete", "", "pods"))
