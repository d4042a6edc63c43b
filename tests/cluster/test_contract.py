"""kmock's fidelity (issue 36 point 5): one contract suite, run against kmock (through the shim the
unit tests use) and against the real kube-apiserver. What nodegate's Kubernetes code relies on:
watches from a resourceVersion, bookmarks, 410 Gone, conflicts, merge and JSON patches, the
status subresource, label and field selectors, CRD validation.

Where kmock differs, the kmock case is ``xfail(strict=True)`` with the reason, so the list in
docs/development.md ("kmock and the real API server") stays true: a kmock that starts to behave
like the API server turns that case into a failure until the list is updated."""

from __future__ import annotations

import asyncio
import json
import ssl
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import pytest

from attest.bootrecord.model import BootRecord
from bootstrap.kube import Conflict, Kube, WatchExpired
from bootstrap.store.kube import KubeStore
from tests.cluster.plane import ControlPlane
from tests.store.common import commit, make_att
from tests.support import bootrecords
from tests.support import eventlogs as el
from tests.support.kshim import ShimEmulator

pytestmark = pytest.mark.kmock(cls=ShimEmulator)

G, V, P = "nodegate.io", "v1alpha1", "nodeattestations"
ATT = f"/apis/{G}/{V}/{P}"
NODES = "/api/v1/nodes"
EK = "ab" * 32


@dataclass
class Api:
    name: str
    base: str
    http: aiohttp.ClientSession
    kube: Kube

    async def call(
        self, method: str, path: str, body: Any = None, *, ctype: str = "application/json", **params: str
    ) -> tuple[int, dict[str, Any]]:
        data = None if body is None else json.dumps(body)
        async with self.http.request(
            method, f"{self.base}{path}", data=data, params=params, headers={"Content-Type": ctype}
        ) as resp:
            text = await resp.text()
            return resp.status, (json.loads(text) if text else {})

    async def watch(self, path: str, *, limit: int, seconds: float, **params: str) -> list[dict[str, Any]]:
        """Up to ``limit`` events of a watch, or what came within ``seconds``."""
        events: list[dict[str, Any]] = []
        try:
            async with asyncio.timeout(seconds):
                async with self.http.get(f"{self.base}{path}", params={"watch": "true", **params}) as resp:
                    if resp.status != 200:
                        return [{"type": "HTTP", "object": {"code": resp.status, **(await resp.json())}}]
                    async for line in resp.content:
                        if line.strip():
                            events.append(json.loads(line))
                        if len(events) >= limit:
                            break
        except TimeoutError:
            pass
        return events


def kmock_differs(reason: str) -> pytest.MarkDecorator:
    return pytest.mark.parametrize(
        "api",
        [pytest.param("kmock", marks=pytest.mark.xfail(strict=True, reason=reason)), "real"],
        indirect=True,
    )


BOTH = pytest.mark.parametrize("api", ["kmock", "real"], indirect=True)


@pytest.fixture
def api(request: pytest.FixtureRequest) -> Api:
    """The same Api over kmock or the real API server (``getfixturevalue`` from a plain fixture:
    the async fixtures behind it each run in pytest-asyncio's loop)."""
    got: Api = request.getfixturevalue(f"{request.param}_api")
    return got


@pytest.fixture
async def kmock_api(kmock: Any) -> AsyncIterator[Api]:
    kmock.resources[f"{G}/{V}/{P}"] = {"kind": "NodeAttestation", "namespaced": False}
    kmock.resources["v1/nodes"] = {"kind": "Node", "namespaced": False}
    base = str(kmock.url).rstrip("/")
    async with aiohttp.ClientSession() as http:
        kube = Kube.for_host(base)
        try:
            yield Api("kmock", base, http, kube)
        finally:
            await kube.close()


@pytest.fixture
async def real_api(plane: ControlPlane, installed: object) -> AsyncIterator[Api]:
    admin = (plane.folder / "pki" / "admin.crt", plane.folder / "pki" / "admin.key")
    ctx: ssl.SSLContext = plane.ssl_context(admin)
    kube = await Kube.from_config(str(plane.admin_kubeconfig))
    assert kube is not None
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as http:
        try:
            yield Api("real", plane.url, http, kube)
        finally:
            await kube.close()
            # The session's other tests share this API server: a NodeAttestation left here would
            # be a node in the kubernetes store of test_store.py's replicas.
            plane.kubectl("delete", "nodeattestations,nodes", "-l", "contract=yes", "--wait=false")


def attestation(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{G}/{V}",
        "kind": "NodeAttestation",
        "metadata": {"name": name, "labels": {"contract": "yes"}},
        "spec": {"ekSha256": EK, "revoked": False, **spec},
    }


def node(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"contract": "yes", **labels}},
    }


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def rv(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["resourceVersion"])


@BOTH
async def test_create_answers_201_with_the_stored_object(api: Api) -> None:
    name = unique("create")
    status, obj = await api.call("POST", ATT, attestation(name))
    assert status == 201, obj
    assert obj["metadata"]["uid"]
    assert rv(obj)
    assert obj["metadata"]["creationTimestamp"]
    status, again = await api.call("POST", ATT, attestation(name))
    assert (status, again["reason"]) == (409, "AlreadyExists"), again


@BOTH
async def test_a_stale_resource_version_conflicts(api: Api) -> None:
    name = unique("conflict")
    _, obj = await api.call("POST", ATT, attestation(name))
    old = rv(obj)
    status, newer = await api.call(
        "PATCH", f"{ATT}/{name}", {"spec": {"revoked": True}}, ctype="application/merge-patch+json"
    )
    assert status == 200
    assert rv(newer) != old
    status, body = await api.call(
        "PATCH",
        f"{ATT}/{name}",
        {"metadata": {"resourceVersion": old}, "spec": {"revoked": False}},
        ctype="application/merge-patch+json",
    )
    assert (status, body.get("reason")) == (409, "Conflict"), body
    # Through nodegate's adapter: the Conflict it retries on.
    with pytest.raises(Conflict):
        await api.kube.patch_cluster_object(G, V, P, name, {"metadata": {"resourceVersion": old}, "spec": {}})


@BOTH
async def test_merge_patch_replaces_lists_and_deletes_with_null(api: Api) -> None:
    name = unique("merge")
    body = node(name)
    body["spec"] = {"taints": [{"key": "a", "effect": "NoSchedule"}, {"key": "b", "effect": "NoSchedule"}]}
    body["metadata"]["annotations"] = {"x": "1", "y": "2"}
    status, _ = await api.call("POST", NODES, body)
    assert status == 201
    patch = {
        "spec": {"taints": [{"key": "c", "effect": "NoSchedule"}]},
        "metadata": {"annotations": {"x": None}},
    }
    status, out = await api.call("PATCH", f"{NODES}/{name}", patch, ctype="application/merge-patch+json")
    assert status == 200, out
    assert out["spec"]["taints"] == [{"key": "c", "effect": "NoSchedule"}]
    assert out["metadata"]["annotations"] == {"y": "2"}


@kmock_differs("kmock accepts only JSON merge patches (application/json-patch+json is not applied)")
async def test_json_patch_applies_operations_and_its_test_op_guards(api: Api) -> None:
    name = unique("jsonpatch")
    await api.call("POST", ATT, attestation(name))
    ops = [
        {"op": "replace", "path": "/spec/revoked", "value": True},
        {"op": "add", "path": "/metadata/labels/k", "value": "v"},
    ]
    status, out = await api.call("PATCH", f"{ATT}/{name}", ops, ctype="application/json-patch+json")
    assert status == 200, out
    assert out["spec"]["revoked"] is True
    assert out["metadata"]["labels"]["k"] == "v"
    guard = [
        {"op": "test", "path": "/spec/revoked", "value": False},
        {"op": "remove", "path": "/spec/ekSha256"},
    ]
    status, out = await api.call("PATCH", f"{ATT}/{name}", guard, ctype="application/json-patch+json")
    assert status == 422, out


@kmock_differs(
    "kmock stores status sent to the main resource and spec sent to /status (no subresource split)"
)
async def test_status_is_a_subresource(api: Api) -> None:
    name = unique("status")
    await api.call("POST", ATT, attestation(name))
    status, out = await api.call(
        "PATCH", f"{ATT}/{name}", {"status": {"phase": "Ready"}}, ctype="application/merge-patch+json"
    )
    assert status == 200, out
    assert "status" not in out, out  # ignored on the main resource
    status, out = await api.call(
        "PATCH",
        f"{ATT}/{name}/status",
        {"spec": {"revoked": True}, "status": {"phase": "Held"}},
        ctype="application/merge-patch+json",
    )
    assert status == 200, out
    assert out["status"]["phase"] == "Held"
    assert out["spec"]["revoked"] is False


@BOTH
async def test_status_patch_through_the_adapter_lands(api: Api) -> None:
    name = unique("status2")
    await api.kube.create_cluster_object(G, V, P, attestation(name))
    out = await api.kube.patch_cluster_object(G, V, P, name, {"status": {"phase": "Held"}}, status=True)
    assert out["status"]["phase"] == "Held"
    got = await api.kube.get_cluster_object(G, V, P, name)
    assert got is not None
    assert got["status"]["phase"] == "Held"


@BOTH
async def test_equality_label_selectors(api: Api) -> None:
    tag = uuid.uuid4().hex[:8]
    for i, pool in enumerate(("a", "a", "b")):
        await api.call("POST", NODES, node(f"sel-{tag}-{i}", pool=pool, tag=tag))
    for selector, want in ((f"tag={tag},pool=a", 2), (f"tag={tag},pool!=a", 1), (f"tag={tag},pool=c", 0)):
        status, out = await api.call("GET", NODES, labelSelector=selector)
        assert status == 200
        assert len(out["items"]) == want, (selector, [i["metadata"]["name"] for i in out["items"]])
    nodes, _ = await api.kube.list_nodes(f"tag={tag},pool=b")
    assert [n["metadata"]["name"] for n in nodes] == [f"sel-{tag}-2"]


@kmock_differs("kmock's selectors are equality-only: set-based ones (in, notin, exists) are not evaluated")
async def test_set_based_label_selectors(api: Api) -> None:
    tag = uuid.uuid4().hex[:8]
    for i, pool in enumerate(("a", "b", "c")):
        await api.call("POST", NODES, node(f"set-{tag}-{i}", pool=pool, tag=tag))
    status, out = await api.call("GET", NODES, labelSelector=f"tag={tag},pool in (a,b)")
    assert status == 200
    assert sorted(i["metadata"]["labels"]["pool"] for i in out["items"]) == ["a", "b"]


@BOTH
async def test_field_selector_on_name(api: Api) -> None:
    name = unique("field")
    await api.call("POST", NODES, node(name))
    status, out = await api.call("GET", NODES, fieldSelector=f"metadata.name={name}")
    assert status == 200
    assert [i["metadata"]["name"] for i in out["items"]] == [name]


@kmock_differs("kmock replays the current object as ADDED to a watch from an older resourceVersion")
async def test_watch_from_a_resource_version_sees_only_later_changes(api: Api) -> None:
    name = unique("watch")
    _, created = await api.call("POST", ATT, attestation(name))
    _, patched = await api.call(
        "PATCH", f"{ATT}/{name}", {"spec": {"revoked": True}}, ctype="application/merge-patch+json"
    )
    events = await api.watch(
        ATT, limit=1, seconds=10, resourceVersion=rv(created), fieldSelector=f"metadata.name={name}"
    )
    assert [(e["type"], rv(e["object"])) for e in events] == [("MODIFIED", rv(patched))]


@BOTH
async def test_watch_list_ends_its_initial_events_with_a_bookmark(api: Api) -> None:
    """A watch that asks for the current state first (sendInitialEvents, the streaming list) gets
    the objects as ADDED, then a BOOKMARK annotated ``k8s.io/initial-events-end``. (A plain watch
    from a resourceVersion gets periodic bookmarks only once the server's cache has moved past
    that version, which a test cannot time: not asserted.)"""
    name = unique("bookmark")
    await api.call("POST", ATT, attestation(name))
    events = await api.watch(
        ATT,
        limit=2,
        seconds=15,
        allowWatchBookmarks="true",
        sendInitialEvents="true",
        resourceVersionMatch="NotOlderThan",
        fieldSelector=f"metadata.name={name}",
    )
    assert [e["type"] for e in events] == ["ADDED", "BOOKMARK"], events
    marks = events[1]["object"]["metadata"].get("annotations", {})
    assert marks.get("k8s.io/initial-events-end") == "true", events[1]
    assert int(rv(events[1]["object"])) >= int(rv(events[0]["object"]))


@kmock_differs("kmock keeps no history window: an old resourceVersion never expires (410 is scripted)")
async def test_an_expired_resource_version_is_410_gone(api: Api) -> None:
    await api.call("POST", ATT, attestation(unique("gone")))

    async def drain() -> None:
        async with asyncio.timeout(15):
            async for _ in api.kube.watch_cluster_objects(G, V, P, "1"):
                pass

    with pytest.raises(WatchExpired):
        await drain()


@kmock_differs("kmock has no CRD schemas: a wrong type or pattern is stored (201), not refused (422)")
async def test_crd_validation_errors_name_the_field(api: Api) -> None:
    bad = attestation(unique("invalid"), ekSha256="not-hex")
    bad["spec"]["revoked"] = "yes"
    status, out = await api.call("POST", ATT, bad)
    assert (status, out.get("reason")) == (422, "Invalid"), out
    fields = sorted(c["field"] for c in out["details"]["causes"])
    assert fields == ["spec.ekSha256", "spec.revoked"], out


@BOTH
async def test_a_boot_record_is_stored_and_replaced_whole_under_the_crd_schema(api: Api) -> None:
    """Issue 43: the kubernetes store writes the boot record in an annotation and publishes it as
    status.boot; the CRD's schema admits it as is (the real API server validates and prunes
    nothing of it), and a smaller record replaces a larger one without leftovers."""
    store = KubeStore(api.kube, backoff=0.0)
    name = unique("boot")
    try:
        big = bootrecords.synthetic()
        att = replace(make_att(name, "cd" * 32), boot_record=big.record, dbx=tuple(big.dbx.items()))
        await commit(store, att, unique("s"))
        got = await api.kube.get_cluster_object(G, V, P, name)
        assert got is not None
        assert BootRecord.model_validate(got["status"]["boot"]) == big.record
        small = bootrecords.synthetic(el.boot(secure=False), ek=False)
        later = replace(make_att(name, "cd" * 32, serial="02"), boot_record=small.record)
        await commit(store, later, unique("s"), "renew")
        got = await api.kube.get_cluster_object(G, V, P, name)
        assert got is not None
        assert "ek" not in got["status"]["boot"]
        assert BootRecord.model_validate(got["status"]["boot"]) == small.record
        assert (await store.get(name)) is not None
        assert await store.dbx_digests(big.dbx) == big.dbx
    finally:
        await api.kube.delete_cluster_object(G, V, P, name)
