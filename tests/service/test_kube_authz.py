"""SubjectAccessReview and PackagePolicy watching through bootstrap/kube.py, against kmock."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from admission.rbac.evaluator import ResourceAttributes, UserInfo
from admission.webhook import AuthorizerUnavailable
from bootstrap.kube import Kube
from bootstrap.service.webhook.authz import SarAuthorizer
from bootstrap.service.webhook.policywatch import PolicyWatcher
from tests.support.kshim import ShimEmulator

pytestmark = pytest.mark.kmock(cls=ShimEmulator)

ATTRS = ResourceAttributes(verb="deploy", group="nodegate.io", resource="packagepolicies", name="gpu")
ALICE = UserInfo("alice", "uid-1", ("ml-platform", "system:authenticated"), {"scopes": ("a", "b")})


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def kube(kmock: Any) -> Any:
    k = Kube.for_host(str(kmock.url), timeout=2.0)
    yield k
    await k.close()


async def test_sar_passes_the_whole_identity_and_caches_briefly(kmock: Any, kube: Kube) -> None:
    seen: list[dict[str, Any]] = []

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        seen.append(body["spec"])
        return {"allowed": body["spec"]["user"] == "alice"}

    kmock.sar = answer
    clock = Clock()
    authz = SarAuthorizer(kube, ttl=5.0, clock=clock)
    assert await authz.allowed(ALICE, ATTRS)
    assert seen[0] == {
        "user": "alice",
        "uid": "uid-1",
        "groups": ["ml-platform", "system:authenticated"],
        "extra": {"scopes": ["a", "b"]},
        "resourceAttributes": {"verb": "deploy", "group": "nodegate.io", "resource": "packagepolicies",
                               "subresource": "", "name": "gpu"},
    }  # fmt: skip
    assert await authz.allowed(ALICE, ATTRS)
    assert len(seen) == 1  # cached
    clock.now += 6
    assert await authz.allowed(ALICE, ATTRS)
    assert len(seen) == 2  # expired
    other = UserInfo("alice", "uid-1", ("other",))
    await authz.allowed(other, ATTRS)
    assert len(seen) == 3  # other groups are another question


@pytest.mark.parametrize(
    "status",
    [
        {"allowed": False},
        {"allowed": False, "denied": True, "reason": "no"},
        {"allowed": True, "denied": True},
        {},
    ],
)
async def test_no_opinion_and_denial_are_deny(kmock: Any, kube: Kube, status: dict[str, Any]) -> None:
    kmock.sar = lambda _body: status
    assert not await SarAuthorizer(kube).allowed(ALICE, ATTRS)


async def test_unreachable_or_failing_api_is_unavailable_and_not_cached(kmock: Any, kube: Kube) -> None:
    kmock.sar = lambda _body: 500
    authz = SarAuthorizer(kube)
    with pytest.raises(AuthorizerUnavailable, match="HTTP 500"):
        await authz.allowed(ALICE, ATTRS)
    kmock.sar = lambda _body: {"allowed": True}
    assert await authz.allowed(ALICE, ATTRS)  # the failure was not cached
    dead = Kube.for_host("http://127.0.0.1:9", timeout=1.0)
    try:
        with pytest.raises(AuthorizerUnavailable):
            await SarAuthorizer(dead).allowed(ALICE, ATTRS)
    finally:
        await dead.close()


def _policy(name: str, pool: str) -> dict[str, Any]:
    return {
        "apiVersion": "nodegate.io/v1alpha1",
        "kind": "PackagePolicy",
        "metadata": {"name": name},
        "spec": {"nodeSelector": {"matchLabels": {"pool": pool}}},
    }


async def test_policy_watcher_lists_then_follows_the_watch(kmock: Any, kube: Kube) -> None:
    kmock.resources["nodegate.io/v1alpha1/packagepolicies"] = {"kind": "PackagePolicy", "namespaced": False}
    kmock.objects["nodegate.io/v1alpha1/packagepolicies", None, "gpu"] = _policy("gpu", "gpu")
    kmock.objects["nodegate.io/v1alpha1/packagepolicies", None, "bad"] = {
        **_policy("bad", "x"),
        "spec": {"nope": 1},
    }
    watcher = PolicyWatcher(kube)
    assert watcher.policies() is None  # not ready: the webhook fails closed
    await watcher.relist()
    assert [p.name for p in watcher.policies() or []] == ["gpu"]
    assert "bad" in watcher.invalid

    task = asyncio.create_task(watcher.watch_once())
    from kmock._internal import enums
    from kubernetes_asyncio import client as kc

    for _ in range(200):  # kmock replays current objects, not history: mutate once the watch is open
        if len(kmock[enums.action.WATCH]):
            break
        await asyncio.sleep(0.01)

    custom = kc.CustomObjectsApi(kube._api)
    await custom.create_cluster_custom_object(
        "nodegate.io", "v1alpha1", "packagepolicies", _policy("cpu", "cpu")
    )
    await custom.delete_cluster_custom_object("nodegate.io", "v1alpha1", "packagepolicies", "gpu")
    for _ in range(200):  # the stream is asynchronous: wait for the events, bounded
        names = sorted(p.name for p in watcher.policies() or [])
        if names == ["cpu"]:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    assert sorted(p.name for p in watcher.policies() or []) == ["cpu"]


async def test_policy_watcher_relists_on_410(kmock: Any, kube: Kube) -> None:
    from bootstrap.kube import WatchExpired

    kmock.resources["nodegate.io/v1alpha1/packagepolicies"] = {"kind": "PackagePolicy", "namespaced": False}
    kmock.objects["nodegate.io/v1alpha1/packagepolicies", None, "gpu"] = _policy("gpu", "gpu")
    watcher = PolicyWatcher(kube)
    await watcher.relist()
    kmock["watch nodegate.io/v1alpha1/packagepolicies"] << (
        {
            "type": "ERROR",
            "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"},
        },
    )
    with pytest.raises(WatchExpired):
        await watcher.watch_once()
    assert [p.name for p in watcher.policies() or []] == ["gpu"]  # the snapshot stays in force
