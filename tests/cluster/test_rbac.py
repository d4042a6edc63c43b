"""RBAC for real (issue 36 point 2): nodegate's SubjectAccessReviews answered by kube-apiserver's
RBAC authorizer, with the chart's least-privilege ClusterRole for nodegate itself; test users
with and without PackagePolicy rights (tokens and client certificates); a denied user sees why."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from admission.rbac.evaluator import ResourceAttributes, UserInfo
from bootstrap.kube import Kube
from tests.cluster import nodegate as ng
from tests.cluster.plane import ControlPlane
from tests.cluster.test_webhooks import SIMPLE, sample, stored


def deploy(policy: str) -> ResourceAttributes:
    return ResourceAttributes("deploy", "nodegate.io", "packagepolicies", name=policy)


@pytest.fixture
async def kube(installed: ng.Installed) -> AsyncIterator[Kube]:
    """The Kube adapter as nodegate runs it: its service account's token, the chart's RBAC."""
    k = await Kube.from_config(str(installed.kubeconfig))
    assert k is not None
    try:
        yield k
    finally:
        await k.close()


async def test_access_reviews_are_answered_by_rbac(kube: Kube) -> None:
    alice = UserInfo("alice", "uid-alice", ("team-gpu", "system:authenticated"))
    carol = UserInfo("carol", "uid-carol", ("team-gpu", "gpu-admins", "system:authenticated"))
    bob = UserInfo("bob", "uid-bob", ("team-web", "system:authenticated"))
    reboot = ResourceAttributes("reboot", "nodegate.io", "packagepolicies", name="gpu")
    assert (await kube.subject_access_review(alice, deploy("gpu"))).allowed
    assert (await kube.subject_access_review(alice, deploy("e2e"))).allowed
    assert not (await kube.subject_access_review(alice, reboot)).allowed
    assert (await kube.subject_access_review(carol, reboot)).allowed
    assert not (await kube.subject_access_review(bob, deploy("gpu"))).allowed
    # The rights come through the group: the same name without it has none.
    assert not (await kube.subject_access_review(UserInfo("alice", "uid-alice"), deploy("gpu"))).allowed
    # resourceNames count: a policy nobody was granted.
    assert not (await kube.subject_access_review(alice, deploy("other"))).allowed


async def test_nodegate_may_not_do_more_than_the_chart_grants(kube: Kube) -> None:
    """nodegate's own identity is the chart's service account: it may ask about access but does
    not itself hold the rights it checks for."""
    me = UserInfo(ng.USERNAME, "", ("system:serviceaccounts", f"system:serviceaccounts:{ng.NAMESPACE}"))
    assert not (await kube.subject_access_review(me, deploy("gpu"))).allowed
    secrets = ResourceAttributes("list", "", "secrets", namespace="kube-system")
    assert not (await kube.subject_access_review(me, secrets)).allowed


def test_denied_user_sees_the_reason(plane: ControlPlane, webhook_server: ng.Nodegate) -> None:
    bob = plane.token_kubeconfig("outsider")
    out = plane.kubectl(
        "apply", "--dry-run=server", "-f", "-", kubeconfig=bob, stdin=sample(SIMPLE), check=False
    )
    assert out.returncode != 0
    message = out.stderr
    assert 'admission webhook "packages.nodegate.io" denied the request' in message, message
    # nodegate names the user, the verb and the policy it would have needed.
    for word in ("bob", "deploy", "e2e"):
        assert word in message, message


def test_a_grant_takes_effect_without_restarting_nodegate(
    plane: ControlPlane, webhook_server: ng.Nodegate
) -> None:
    """A client-certificate user (group team-web can author CRs) is refused, then bound to the
    deploy role: nodegate's short SAR cache (5 s) lets the new answer through."""
    dave = plane.cert_kubeconfig("dave", ("team-web",))
    denied = plane.kubectl("apply", "-f", "-", kubeconfig=dave, stdin=sample(SIMPLE), check=False)
    assert denied.returncode != 0
    assert "dave" in denied.stderr, denied.stderr
    plane.kubectl("create", "clusterrolebinding", "dave-deploys", "--clusterrole=deploy-pools", "--user=dave")
    try:
        deadline = time.monotonic() + 30
        while True:
            out = plane.kubectl("apply", "-f", "-", kubeconfig=dave, stdin=sample(SIMPLE), check=False)
            if out.returncode == 0 or time.monotonic() > deadline:
                break
        assert out.returncode == 0, out.stderr
        assert stored(plane, "skyhooks.skyhook.nvidia.com", "demo") is not None
    finally:
        plane.kubectl("delete", "clusterrolebinding", "dave-deploys", check=False)
        plane.kubectl("delete", "skyhooks.skyhook.nvidia.com", "demo", "--wait=false", check=False)


async def test_the_gate_lists_a_nodes_pods_and_can_do_nothing_else_with_them(
    plane: ControlPlane, kube: Kube
) -> None:
    """The chart grants pods list only (the gate names a failing package pod, issue 45): the
    API server filters by spec.nodeName, and a get or a delete is refused."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "pkg-pod", "namespace": "default", "labels": {"skyhook.nvidia.com/name": "x"}},
        "spec": {
            "nodeName": "rbac-pods-node",
            "automountServiceAccountToken": False,
            "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.9"}],
        },
    }
    status, out = plane.request("POST", "/api/v1/namespaces/default/pods", pod)
    assert status == 201, out
    try:
        listed = await kube.list_node_pods("rbac-pods-node")
        assert [p["metadata"]["name"] for p in listed] == ["pkg-pod"]
        assert await kube.list_node_pods("another-node") == []
        token = installed_token(plane)
        for method, path in (
            ("GET", "/api/v1/namespaces/default/pods/pkg-pod"),
            ("DELETE", "/api/v1/namespaces/default/pods/pkg-pod"),
            ("GET", "/api/v1/namespaces/default/pods/pkg-pod/log"),
        ):
            status, _ = plane.request(
                method, path, ctx=plane.ssl_context(), headers={"Authorization": f"Bearer {token}"}
            )
            assert status == 403, (method, path, status)
    finally:
        plane.request("DELETE", "/api/v1/namespaces/default/pods/pkg-pod?gracePeriodSeconds=0")


def installed_token(plane: ControlPlane) -> str:
    return plane.kubectl("create", "token", "nodegate", "-n", ng.NAMESPACE, "--duration=10m").stdout.strip()
