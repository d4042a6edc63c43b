"""Two service replicas on one Kubernetes store (kmock through the shim): a join started on one
finishes on the other, a session finishes once across both, kubelet credentials come from the
CSR API, the Node is pre-created with the hold taint, admin bearer tokens go through TokenReview
and SubjectAccessReview, and refusals become Events."""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from bootstrap.kube import Kube
from tests.support.kshim import ShimEmulator, cluster_signer
from tests.support.service import EkCa, Running, running, settings_for
from tests.support.softnode import join, post

pytestmark = pytest.mark.kmock(cls=ShimEmulator)
CSRS = "certificates.k8s.io/v1/certificatesigningrequests"


@pytest.fixture(scope="module")
def ek_ca() -> EkCa:
    return EkCa.create()


@pytest.fixture
async def replicas(kmock: Any, tmp_path: Path, ek_ca: EkCa) -> AsyncIterator[tuple[Running, Running]]:
    kmock.resources["nodegate.io/v1alpha1/nodeattestations"] = {
        "kind": "NodeAttestation",
        "namespaced": False,
    }
    kmock.signer = cluster_signer()
    settings = settings_for(tmp_path, ek_ca, store="kubernetes", admission={"policy_files": []})
    async with contextlib.AsyncExitStack() as stack:
        a = await stack.enter_async_context(running(settings, kube=Kube.for_host(str(kmock.url))))
        b = await stack.enter_async_context(running(settings, kube=Kube.for_host(str(kmock.url))))
        yield a, b


async def test_start_on_one_finish_on_the_other(
    kmock: Any, replicas: tuple[Running, Running], ek_ca: EkCa
) -> None:
    a, b = replicas
    node = ek_ca.node("gpu-k1")
    async with a.http() as ha, b.http() as hb:
        status, start = await post(ha, f"{a.base}/v1/join/start", node.start_body())
        assert status == 200, start
        body = node.finish_body(start)
        status, out = await post(hb, f"{b.base}/v1/join/finish", body)
        assert status == 200, out
        for http, r in ((ha, a), (hb, b)):
            status, again = await post(http, f"{r.base}/v1/join/finish", body)
            assert (status, again["code"]) == (403, "session_reused")
    config = yaml.safe_load(out["kubeconfig"])
    user = config["users"][0]["user"]
    assert "client-key-data" not in user  # the node adds its own key
    cert = x509.load_pem_x509_certificate(base64.b64decode(user["client-certificate-data"]))
    assert cert.public_key() == node.key.public_key()
    assert cert.subject.rfc4514_string() == "CN=system:node:gpu-k1,O=system:nodes"
    assert config["clusters"][0]["cluster"]["server"] == str(kmock.url).rstrip("/")
    nodes = {k: v for k, v in kmock.objects.items() if k[0] == "v1/nodes"}
    (obj,) = nodes.values()
    assert obj["spec"]["taints"] == [
        {"key": "nodegate.io/hold", "value": "packages-pending", "effect": "NoSchedule"}
    ]
    labels = obj["metadata"]["labels"]
    assert labels["node-restriction.kubernetes.io/nodegate.io-attested"] == "true"
    assert labels["node-restriction.kubernetes.io/nodegate.io-ek-sha256"] == node.tpm.ek_sha256[:63]
    csrs = [
        v for k, v in kmock.objects.items() if k[0] == "certificates.k8s.io/v1/certificatesigningrequests"
    ]
    assert len(csrs) == 1
    spec = csrs[0]["spec"]
    assert spec["signerName"] == "kubernetes.io/kube-apiserver-client-kubelet"
    assert sorted(spec["usages"]) == ["client auth", "digital signature"]
    assert [c["type"] for c in csrs[0]["status"]["conditions"]] == ["Approved"]
    record = await b.service.store.get("gpu-k1")
    assert record is not None
    assert record.ek_sha256 == node.tpm.ek_sha256


async def test_concurrent_finishes_of_one_session(replicas: tuple[Running, Running], ek_ca: EkCa) -> None:
    a, b = replicas
    node = ek_ca.node("gpu-k2")
    async with a.http() as ha, b.http() as hb:
        _, start = await post(ha, f"{a.base}/v1/join/start", node.start_body())
        body = node.finish_body(start)
        results = await asyncio.gather(
            post(ha, f"{a.base}/v1/join/finish", body), post(hb, f"{b.base}/v1/join/finish", body)
        )
    statuses = sorted(s for s, _ in results)
    assert statuses == [200, 403], results
    assert [o["code"] for s, o in results if s == 403] == ["session_reused"]


async def test_refusal_is_an_event_and_audited(
    kmock: Any, replicas: tuple[Running, Running], ek_ca: EkCa
) -> None:
    a, _ = replicas
    node = ek_ca.node("gpu-k3")
    async with a.http() as http:
        _, start = await post(http, f"{a.base}/v1/join/start", node.start_body())
        body = node.finish_body(start)
        body["pcrs"]["sha256"]["0"] = "22" * 32
        status, out = await post(http, f"{a.base}/v1/join/finish", body)
    assert (status, out["code"]) == (403, "pcr_digest_mismatch")
    for _ in range(100):  # the Event is sent in the background; wait for the task, not for time
        if not a.service._events:
            break
        await asyncio.gather(*a.service._events, return_exceptions=True)
    events = [v for k, v in kmock.objects.items() if k[0] == "v1/events"]
    assert len(events) == 1
    assert events[0]["involvedObject"]["name"] == "gpu-k3"
    assert events[0]["reason"] == "AttestationFailed"
    assert "pcr_digest_mismatch" in events[0]["message"]


async def test_admin_bearer_token(kmock: Any, replicas: tuple[Running, Running]) -> None:
    a, _ = replicas
    asked: list[dict[str, Any]] = []

    def review(body: dict[str, Any]) -> dict[str, Any]:
        if body["spec"]["token"] != "ops-token":
            return {"authenticated": False}
        return {"authenticated": True, "user": {"username": "ops", "uid": "1", "groups": ["sre"]}}

    def sar(body: dict[str, Any]) -> dict[str, Any]:
        asked.append(body["spec"]["resourceAttributes"])
        return {"allowed": body["spec"]["resourceAttributes"]["verb"] == "list"}

    kmock.token_review, kmock.sar = review, sar
    async with a.http() as http:
        async with http.get(
            f"{a.base}/v1/admin/nodes", headers={"Authorization": "Bearer ops-token"}
        ) as resp:
            assert resp.status == 200, await resp.text()
        async with http.get(f"{a.base}/v1/admin/nodes", headers={"Authorization": "Bearer nope"}) as resp:
            assert (resp.status, (await resp.json())["code"]) == (401, "unauthenticated")
        async with http.post(
            f"{a.base}/v1/admin/ca/rotate", json={}, headers={"Authorization": "Bearer ops-token"}
        ) as resp:
            assert (resp.status, (await resp.json())["code"]) == (403, "forbidden")
    assert asked[0] == {
        "verb": "list",
        "group": "nodegate.io",
        "resource": "nodeattestations",
        "subresource": "",
        "name": "",
    }
    assert asked[1]["verb"] == "rotate"
    assert asked[1]["resource"] == "authorities"


async def test_kubelet_kubeconfig_names_the_external_api_server(
    kmock: Any, tmp_path: Path, ek_ca: EkCa
) -> None:
    """In a pod nodegate reaches the API at a ClusterIP; the kubeconfig it hands a joining node
    names kubernetes.kubelet_api_server (and its CA) instead."""
    kmock.resources["nodegate.io/v1alpha1/nodeattestations"] = {
        "kind": "NodeAttestation",
        "namespaced": False,
    }
    kmock.signer = cluster_signer()
    ca_file = ek_ca.write(tmp_path / "api-ca.pem")  # any PEM certificate stands in for the cluster CA
    kubernetes = {"kubelet_api_server": "https://api.fleet.example:6443", "kubelet_api_ca_file": str(ca_file)}
    settings = settings_for(
        tmp_path, ek_ca, store="kubernetes", admission={"policy_files": []}, kubernetes=kubernetes
    )
    async with running(settings, kube=Kube.for_host(str(kmock.url))) as r, r.http() as http:
        status, out = await join(http, r.base, ek_ca.node("gpu-ext"))
    assert status == 200, out
    cluster = yaml.safe_load(out["kubeconfig"])["clusters"][0]["cluster"]
    assert cluster["server"] == "https://api.fleet.example:6443"
    assert base64.b64decode(cluster["certificate-authority-data"]) == ca_file.read_bytes()


def test_kubelet_api_server_must_be_https(tmp_path: Path, ek_ca: EkCa) -> None:
    with pytest.raises(ValueError, match="https"):
        settings_for(tmp_path, ek_ca, kubernetes={"kubelet_api_server": "http://api:6443"})
