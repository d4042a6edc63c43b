"""bootstrap/kube/ against kmock (through tests/support/kshim.py): custom objects, nodes, CSRs, events,
TokenReview, errors, timeouts and kubeconfig loading."""

from __future__ import annotations

import asyncio
import base64
import copy
import datetime
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kmock._internal import enums

from admission.rbac.evaluator import UserInfo
from bootstrap.kube import Conflict, CsrDenied, Kube, KubeConfigError, KubeUnavailable, NotFound
from bootstrap.kube import configuration as kube_mod
from tests.support import certs
from tests.support.kshim import ShimEmulator

pytestmark = pytest.mark.kmock(cls=ShimEmulator)

G, V, P = "nodegate.io", "v1alpha1", "nodeattestations"
RES = f"{G}/{V}/{P}"
CSRS = "certificates.k8s.io/v1/certificatesigningrequests"
CSR_PATH = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
KUBELET_SIGNER = "kubernetes.io/kube-apiserver-client-kubelet"
USAGES = ("digital signature", "client auth")
TAINT = {"key": "nodegate.io/hold", "value": "unattested", "effect": "NoSchedule"}


@pytest.fixture
async def kube(kmock: Any) -> AsyncIterator[Kube]:
    k = Kube.for_host(str(kmock.url), timeout=2.0)
    yield k
    await k.close()


def _attestation(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{G}/{V}",
        "kind": "NodeAttestation",
        "metadata": {"name": name, "labels": labels},
        "spec": {"ekSha256": "ab" * 32, "revoked": False},
    }


def _writes(kmock: Any, method: enums.method) -> list[Any]:
    return list(kmock[method])


def _sent(request: Any) -> Any:
    """The body as sent (the shim rewrites a write's ``.data`` into a whole-object replace)."""
    return json.loads(request.body)


# -- custom objects ---------------------------------------------------------------------------


async def test_custom_object_create_get_patch_with_resource_version(kmock: Any, kube: Kube) -> None:
    created = await kube.create_cluster_object(G, V, P, _attestation("w1"))
    assert created["metadata"]["uid"]
    assert created["metadata"]["resourceVersion"]
    assert await kube.get_cluster_object(G, V, P, "w1") == created

    rv = created["metadata"]["resourceVersion"]
    patched = await kube.patch_cluster_object(
        G, V, P, "w1", {"metadata": {"resourceVersion": rv}, "spec": {"revoked": True}}
    )
    assert patched["spec"] == {"ekSha256": "ab" * 32, "revoked": True}
    assert patched["metadata"]["resourceVersion"] != rv
    assert patched["metadata"]["uid"] == created["metadata"]["uid"]

    with pytest.raises(Conflict, match="409"):  # the same, now stale, resourceVersion
        await kube.patch_cluster_object(
            G, V, P, "w1", {"metadata": {"resourceVersion": rv}, "spec": {"x": 1}}
        )
    assert (await kube.get_cluster_object(G, V, P, "w1") or {})["spec"] == patched["spec"]

    # Without a resourceVersion the write is unconditional.
    again = await kube.patch_cluster_object(G, V, P, "w1", {"spec": {"revoked": False}})
    assert again["spec"]["revoked"] is False


async def test_merge_patch_content_type_is_sent(kmock: Any, kube: Kube) -> None:
    await kube.create_cluster_object(G, V, P, _attestation("w1"))
    await kube.patch_cluster_object(G, V, P, "w1", {"spec": {"revoked": True}})
    await kube.patch_cluster_object(G, V, P, "w1", {"status": {"phase": "Held"}}, status=True)
    kmock.objects["v1/nodes", None, "n1"] = {"metadata": {"name": "n1"}}
    await kube.patch_node("n1", {"spec": {"taints": None}})
    patches = _writes(kmock, enums.method.PATCH)
    assert [r.url.path for r in patches] == [
        f"/apis/{G}/{V}/{P}/w1",
        f"/apis/{G}/{V}/{P}/w1/status",
        "/api/v1/nodes/n1",
    ]
    assert {r.headers["Content-Type"] for r in patches} == {"application/merge-patch+json"}


async def test_create_twice_conflicts_and_missing_objects(kmock: Any, kube: Kube) -> None:
    await kube.create_cluster_object(G, V, P, _attestation("w1"))
    with pytest.raises(Conflict):
        await kube.create_cluster_object(G, V, P, _attestation("w1"))
    assert await kube.get_cluster_object(G, V, P, "nope") is None
    with pytest.raises(NotFound):
        await kube.patch_cluster_object(G, V, P, "nope", {"spec": {}})
    await kube.delete_cluster_object(G, V, P, "w1")
    assert await kube.get_cluster_object(G, V, P, "w1") is None
    await kube.delete_cluster_object(G, V, P, "w1")  # already gone: fine


async def test_status_patch_keeps_spec(kmock: Any, kube: Kube) -> None:
    created = await kube.create_cluster_object(G, V, P, _attestation("w1"))
    rv = created["metadata"]["resourceVersion"]
    out = await kube.patch_cluster_object(
        G, V, P, "w1", {"metadata": {"resourceVersion": rv}, "status": {"phase": "Held"}}, status=True
    )
    assert out["status"] == {"phase": "Held"}
    assert out["spec"] == created["spec"]
    with pytest.raises(Conflict):
        await kube.patch_cluster_object(
            G, V, P, "w1", {"metadata": {"resourceVersion": rv}, "status": {"phase": "Ready"}}, status=True
        )


async def test_list_with_label_selector(kmock: Any, kube: Kube) -> None:
    kmock.resources[RES] = {"kind": "NodeAttestation", "namespaced": False}
    assert await kube.list_cluster_objects(G, V, P) == ([], "...")  # kmock's list resourceVersion
    await kube.create_cluster_object(G, V, P, _attestation("a", pool="gpu", zone="1"))
    await kube.create_cluster_object(G, V, P, _attestation("b", pool="gpu", zone="2"))
    await kube.create_cluster_object(G, V, P, _attestation("c", pool="cpu"))
    items, rv = await kube.list_cluster_objects(G, V, P)  # positional use keeps working
    assert sorted(i["metadata"]["name"] for i in items) == ["a", "b", "c"]
    assert isinstance(rv, str)
    gpu, _ = await kube.list_cluster_objects(G, V, P, label_selector="pool=gpu")
    assert sorted(i["metadata"]["name"] for i in gpu) == ["a", "b"]
    one, _ = await kube.list_cluster_objects(G, V, P, label_selector="pool=gpu,zone=2")
    assert [i["metadata"]["name"] for i in one] == ["b"]
    assert kmock[enums.action.LIST][-1].params["labelSelector"] == "pool=gpu,zone=2"


async def test_the_shim_filters_watches_by_label_and_field(kmock: Any, kube: Kube) -> None:
    from kubernetes_asyncio import client as kc
    from kubernetes_asyncio import watch as kw

    for name, pool in (("a", "cpu"), ("b", "gpu"), ("c", "gpu")):
        kmock.objects[RES, None, name] = _attestation(name, pool=pool)
    custom = kc.CustomObjectsApi(kube._api)
    # kmock replays the stored objects in order, so the first event shows what was filtered out.
    for selectors, first in (
        ({"label_selector": "pool=gpu"}, "b"),
        ({"field_selector": "metadata.name=c"}, "c"),
    ):
        watcher = kw.Watch(return_type="object")
        async for event in watcher.stream(custom.list_cluster_custom_object, G, V, P, **selectors):
            assert event["raw_object"]["metadata"]["name"] == first
            break
        await watcher.close()


async def test_list_of_an_unserved_resource_is_unavailable(kube: Kube) -> None:
    with pytest.raises(KubeUnavailable, match="404"):
        await kube.list_cluster_objects(G, V, "unknowns")


# -- nodes ------------------------------------------------------------------------------------


async def test_node_create_get_and_optimistic_untaint(kmock: Any, kube: Kube) -> None:
    other = {"key": "example.com/keep", "effect": "NoSchedule"}
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "w1"},
        "spec": {"taints": [TAINT, other]},
    }
    created = await kube.create_node(body)
    with pytest.raises(Conflict):
        await kube.create_node(body)
    assert await kube.get_node("w2") is None
    node = await kube.get_node("w1")
    assert node == created
    rv = node["metadata"]["resourceVersion"]
    out = await kube.patch_node("w1", {"metadata": {"resourceVersion": rv}, "spec": {"taints": [other]}})
    assert out["spec"]["taints"] == [other]  # merge patch replaces the whole list
    with pytest.raises(Conflict):
        await kube.patch_node("w1", {"metadata": {"resourceVersion": rv}, "spec": {"taints": None}})
    assert (await kube.get_node("w1") or {})["spec"]["taints"] == [other]
    with pytest.raises(NotFound):
        await kube.patch_node("w2", {"spec": {}})


# -- CSRs -------------------------------------------------------------------------------------


def _csr_pem(node: str) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node}"),
        ]
    )
    return (
        x509.CertificateSigningRequestBuilder()
        .subject_name(subject)
        .sign(key, hashes.SHA256())
        .public_bytes(serialization.Encoding.PEM)
    )


def _signer() -> tuple[Callable[[dict[str, Any]], bytes | None], list[str]]:
    """A tiny kube-controller-manager: signs the CSR's request with a throwaway CA."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes")])
    signed: list[str] = []

    def sign(csr: dict[str, Any]) -> bytes | None:
        request = x509.load_pem_x509_csr(base64.b64decode(csr["spec"]["request"]))
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(request.subject)
            .issuer_name(ca_name)
            .public_key(request.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(hours=1))
            .sign(ca_key, hashes.SHA256())
        )
        signed.append(csr["metadata"]["name"])
        return cert.public_bytes(serialization.Encoding.PEM)

    return sign, signed


async def test_csr_create_approve_and_wait_for_the_certificate(kmock: Any, kube: Kube) -> None:
    kmock.signer, signed = _signer()
    request = _csr_pem("w1")
    created = await kube.create_csr(
        "node-w1",
        request,
        signer=KUBELET_SIGNER,
        usages=USAGES,
        expiration_seconds=3600,
        labels={"nodegate.io/node": "w1"},
    )
    assert created["spec"] == {
        "request": base64.b64encode(request).decode(),
        "signerName": KUBELET_SIGNER,
        "usages": list(USAGES),
        "expirationSeconds": 3600,
    }
    assert created["metadata"]["labels"] == {"nodegate.io/node": "w1"}
    assert (await kube.get_csr("node-w1") or {})["spec"] == created["spec"]

    await kube.approve_csr("node-w1", reason="NodegateAttested", message="TPM quote verified")
    assert signed == ["node-w1"]
    (put,) = _writes(kmock, enums.method.PUT)
    assert put.url.path == f"{CSR_PATH}/node-w1/approval"
    assert _sent(put)["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    (condition,) = _sent(put)["status"]["conditions"]
    assert condition["type"] == "Approved"
    assert condition["status"] == "True"
    assert (condition["reason"], condition["message"]) == ("NodegateAttested", "TPM quote verified")
    assert condition["lastUpdateTime"].endswith("Z")

    pem = await kube.wait_csr_certificate("node-w1", timeout=2.0)
    cert = x509.load_pem_x509_certificate(pem)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:node:w1"
    assert cert.public_key() == x509.load_pem_x509_csr(request).public_key()

    await kube.approve_csr("node-w1", reason="again", message="again")  # already approved: no write
    assert len(_writes(kmock, enums.method.PUT)) == 1
    await kube.delete_csr("node-w1")
    assert await kube.get_csr("node-w1") is None
    await kube.delete_csr("node-w1")


async def test_create_csr_refuses_a_too_short_expiration(kube: Kube) -> None:
    with pytest.raises(ValueError, match="600"):
        await kube.create_csr("x", _csr_pem("x"), signer=KUBELET_SIGNER, usages=USAGES, expiration_seconds=60)


def _csr_object(name: str, *conditions: dict[str, Any], certificate: bytes | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": list(conditions)}
    if certificate is not None:
        status["certificate"] = base64.b64encode(certificate).decode()
    return {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name, "resourceVersion": "5"},
        "spec": {"request": "", "signerName": KUBELET_SIGNER, "usages": list(USAGES)},
        "status": status,
    }


@pytest.mark.parametrize("kind", ["Denied", "Failed"])
async def test_approve_a_denied_or_failed_csr_raises(kmock: Any, kube: Kube, kind: str) -> None:
    cond = {"type": kind, "status": "True", "reason": "Nope", "message": "not this one"}
    kmock.objects[CSRS, None, "n1"] = _csr_object("n1", cond)
    with pytest.raises(CsrDenied, match=f"{kind}.*Nope"):
        await kube.approve_csr("n1", reason="r", message="m")
    assert not _writes(kmock, enums.method.PUT)
    with pytest.raises(CsrDenied):
        await kube.wait_csr_certificate("n1", timeout=2.0)


async def test_approve_missing_csr_is_not_found(kube: Kube) -> None:
    with pytest.raises(NotFound):
        await kube.approve_csr("nope", reason="r", message="m")


def _stale_reads(kmock: Any, key: tuple[str, None, str], times: int) -> Callable[[], Any]:
    """Answer the next ``times`` reads with the object as it was, while a concurrent writer
    changes it behind the reader's back; later reads fall through to the emulator."""
    left = [times]

    def read() -> Any:
        if left[0] <= 0:
            return None  # no content: kmock moves on to the next reaction
        left[0] -= 1
        before = copy.deepcopy(kmock.objects[key].raw)
        kmock.objects[key].patch({"metadata": {"resourceVersion": f"other-{left[0]}"}})
        return before

    return read


async def test_approve_retries_after_a_conflict(kmock: Any, kube: Kube) -> None:
    kmock.objects[CSRS, None, "n1"] = _csr_object("n1")
    kmock[f"get {CSR_PATH}/n1"] << _stale_reads(kmock, (CSRS, None, "n1"), times=1)
    await kube.approve_csr("n1", reason="r", message="m")
    puts = _writes(kmock, enums.method.PUT)
    assert len(puts) == 2  # the first carried the stale version and got 409
    assert _sent(puts[0])["metadata"]["resourceVersion"] == "5"
    assert _sent(puts[1])["metadata"]["resourceVersion"] == "other-0"
    stored = kmock.objects[CSRS, None, "n1"].raw
    assert [c["type"] for c in stored["status"]["conditions"]] == ["Approved"]


async def test_approve_gives_up_after_the_attempts(kmock: Any, kube: Kube) -> None:
    kmock.objects[CSRS, None, "n1"] = _csr_object("n1")
    kmock[f"get {CSR_PATH}/n1"] << _stale_reads(kmock, (CSRS, None, "n1"), times=10)
    with pytest.raises(Conflict):
        await kube.approve_csr("n1", reason="r", message="m", attempts=3)
    assert len(_writes(kmock, enums.method.PUT)) == 3


async def test_wait_follows_the_watch_and_filters_other_csrs(kmock: Any, kube: Kube) -> None:
    kmock.objects[CSRS, None, "n1"] = _csr_object("n1")
    sign, _ = _signer()
    pem = sign({"metadata": {"name": "x"}, "spec": {"request": base64.b64encode(_csr_pem("n1")).decode()}})
    approved = {"type": "Approved", "status": "True"}
    kmock[f"watch {CSRS}"] << (
        {"type": "MODIFIED", "object": _csr_object("other", approved, certificate=b"not for us")},
        {"type": "MODIFIED", "object": _csr_object("n1", approved)},
        {"type": "MODIFIED", "object": _csr_object("n1", approved, certificate=pem)},
    )
    assert await kube.wait_csr_certificate("n1", timeout=2.0) == pem
    watch = kmock[enums.action.WATCH][-1]
    assert watch.params["fieldSelector"] == "metadata.name=n1"
    assert watch.params["resourceVersion"] == "5"


async def test_wait_rereads_when_the_stream_ends_and_sees_a_denial(kmock: Any, kube: Kube) -> None:
    kmock.objects[CSRS, None, "n1"] = _csr_object("n1")

    def deny() -> Any:
        kmock.objects[CSRS, None, "n1"].patch(
            {"status": {"conditions": [{"type": "Denied", "status": "True"}]}}
        )
        return None

    # The stream carries only a bookmark and ends (after the direct edit): the re-read sees the denial.
    kmock[f"watch {CSRS}"] << (deny, {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "6"}}})
    with pytest.raises(CsrDenied, match="Denied"):
        await kube.wait_csr_certificate("n1", timeout=2.0)
    assert len(kmock[f"get {CSR_PATH}/n1"]) == 2


async def test_wait_times_out_as_unavailable(kmock: Any, kube: Kube) -> None:
    await kube.create_csr("n1", _csr_pem("n1"), signer=KUBELET_SIGNER, usages=USAGES)
    with pytest.raises(KubeUnavailable, match="no certificate within"):
        await kube.wait_csr_certificate("n1", timeout=0.05)  # nobody approves it


async def test_wait_for_a_missing_csr_is_not_found(kube: Kube) -> None:
    with pytest.raises(NotFound):
        await kube.wait_csr_certificate("nope", timeout=2.0)


# -- events and TokenReview -------------------------------------------------------------------


async def test_create_event(kmock: Any, kube: Kube) -> None:
    involved = {"kind": "Node", "name": "w1", "uid": "u-1", "apiVersion": "v1"}
    await kube.create_event(involved=involved, reason="AttestationFailed", message="é" * 1000)
    ((_, namespace, name),) = [k for k in kmock.objects if k[0] == "v1/events"]
    assert namespace == "default"
    assert name.startswith("w1.")
    assert len(name) == len("w1.") + 16
    event = kmock.objects["v1/events", "default", name].raw
    assert event["involvedObject"] == involved
    assert (event["reason"], event["type"], event["source"]) == (
        "AttestationFailed",
        "Warning",
        {"component": "nodegate"},
    )
    assert len(event["message"].encode()) <= 1024
    assert event["message"] == "é" * 512
    await kube.create_event(involved=involved, reason="Joined", message="ok", type_="Normal", namespace="ng")
    # A Node is cluster-scoped: its Events live in default whatever namespace is asked for (the real
    # API server refuses them elsewhere with 422, tests/cluster/test_store.py).
    assert sorted(k[1] for k in kmock.objects if k[0] == "v1/events") == ["default", "default"]
    pod = {"kind": "Pod", "name": "p", "uid": "u-2", "apiVersion": "v1", "namespace": "team"}
    await kube.create_event(involved=pod, reason="Seen", message="ok", namespace="ng")
    assert sorted(k[1] for k in kmock.objects if k[0] == "v1/events") == ["default", "default", "team"]


async def test_token_review(kmock: Any, kube: Kube) -> None:
    seen: list[dict[str, Any]] = []

    def review(body: dict[str, Any]) -> dict[str, Any]:
        seen.append(body["spec"])
        if body["spec"]["token"] != "good":
            return {"authenticated": False, "error": "invalid bearer token"}
        return {
            "authenticated": True,
            "audiences": ["nodegate"],
            "user": {"username": "alice", "uid": "u1", "groups": ["ops"], "extra": {"scopes": ["a"]}},
        }

    kmock.token_review = review
    assert await kube.token_review("good", ["nodegate"]) == UserInfo(
        "alice", "u1", ("ops",), {"scopes": ("a",)}
    )
    assert seen[-1] == {"token": "good", "audiences": ["nodegate"]}
    assert await kube.token_review("bad") is None
    assert await kube.token_review("good", ["someone-else"]) is None  # the audience was not confirmed
    assert await kube.token_review("good") == UserInfo("alice", "u1", ("ops",), {"scopes": ("a",)})


async def test_token_review_failure_does_not_echo_the_server(kmock: Any, kube: Kube) -> None:
    kmock.token_review = lambda _body: 500  # the shim's Status message is "scripted"
    with pytest.raises(KubeUnavailable, match="HTTP 500") as info:
        await kube.token_review("s3cret-token")
    assert "scripted" not in str(info.value)  # a server could echo what it was sent


# -- errors and timeouts ----------------------------------------------------------------------


async def test_timeouts_and_unreachable_servers_are_unavailable(kmock: Any) -> None:
    gate = asyncio.Event()

    async def hang() -> Any:
        await gate.wait()
        return {}

    kmock["get /api/v1/nodes/slow"] << hang
    kube = Kube.for_host(str(kmock.url), timeout=0.05)
    try:
        with pytest.raises(KubeUnavailable, match=r"no answer within 0\.05 s"):
            await kube.get_node("slow")
    finally:
        gate.set()
        await kube.close()
    dead = Kube.for_host("http://127.0.0.1:9", timeout=1.0)
    try:
        with pytest.raises(KubeUnavailable):
            await dead.get_cluster_object(G, V, P, "w1")
    finally:
        await dead.close()


@pytest.mark.parametrize("status", [400, 403, 422, 500, 503])
async def test_other_statuses_are_unavailable(kmock: Any, kube: Kube, status: int) -> None:
    kmock[f"get /apis/{G}/{V}/{P}/w1"] << status << {"kind": "Status", "code": status, "message": "m"}
    with pytest.raises(KubeUnavailable, match=f"HTTP {status}"):
        await kube.get_cluster_object(G, V, P, "w1")


async def test_a_non_json_answer_is_unavailable(kmock: Any, kube: Kube) -> None:
    kmock["get /api/v1/nodes/w1"] << b"<html>proxy error</html>"
    with pytest.raises(KubeUnavailable):
        await kube.get_node("w1")


# -- configuration ----------------------------------------------------------------------------


def _ca_pem() -> bytes:
    return certs.cert_pem(certs.self_signed("cluster-ca")[1])


async def test_from_config_with_a_kubeconfig_pointing_at_kmock(kmock: Any, tmp_path: Path) -> None:
    ca = _ca_pem()
    server = str(kmock.url).rstrip("/")
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {
                            "server": server,
                            "certificate-authority-data": base64.b64encode(ca).decode(),
                        },
                    }
                ],
                "users": [{"name": "u", "user": {"token": "tok-123"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    kube = await Kube.from_config(str(path), timeout=2.0)
    assert kube is not None
    try:
        assert kube.api_server() == (server, None)  # plain HTTP: the loader takes no CA
        kmock.objects["v1/nodes", None, "w1"] = {"metadata": {"name": "w1"}}
        assert (await kube.get_node("w1") or {})["metadata"]["name"] == "w1"
        assert kmock[-1].headers["Authorization"] == "Bearer tok-123"
    finally:
        await kube.close()
    from kubernetes_asyncio import client as kc

    assert kc.Configuration.get_default_copy().host != server  # the global default is untouched

    https = path.read_text().replace(server, "https://api.example.org:6443")
    path.write_text(https)
    kube = await Kube.from_config(str(path))
    assert kube is not None
    try:
        assert kube.api_server() == ("https://api.example.org:6443", ca)
    finally:
        await kube.close()


async def test_from_config_refuses_unusable_kubeconfigs(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError):
        await Kube.from_config(str(tmp_path / "missing"))
    bad = tmp_path / "bad"
    bad.write_text("clusters: [")
    with pytest.raises(KubeConfigError):
        await Kube.from_config(str(bad))
    empty = tmp_path / "empty"
    empty.write_text("apiVersion: v1\nkind: Config\n")
    with pytest.raises(KubeConfigError):
        await Kube.from_config(str(empty))


async def test_from_config_without_a_cluster_is_none(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert await Kube.from_config(None) is None
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setattr(kube_mod, "SERVICE_ACCOUNT_TOKEN", str(tmp_path / "no-token"))
    assert await Kube.from_config(None) is None  # not in a pod: no token file


async def test_from_config_in_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ca = _ca_pem()
    (tmp_path / "token").write_text("sa-token")
    (tmp_path / "ca.crt").write_bytes(ca)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setattr(kube_mod, "SERVICE_ACCOUNT_TOKEN", str(tmp_path / "token"))
    monkeypatch.setattr(kube_mod, "SERVICE_ACCOUNT_CA", str(tmp_path / "ca.crt"))
    kube = await Kube.from_config(None)
    assert kube is not None
    try:
        assert kube.api_server() == ("https://10.0.0.1:443", ca)
    finally:
        await kube.close()
