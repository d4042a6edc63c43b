"""The Node webhook's matchConditions, rendered by the real helm and evaluated with a CEL
evaluator (cel-python) on Node requests as the API server hands them to admission (issue 28).

The API server binds, for a webhook's matchConditions (admissionregistration/v1 MatchCondition):
``object`` the object of the request (null for DELETE), ``oldObject`` the existing object (null
for CREATE), ``request`` the AdmissionRequest's attributes (``request.operation``,
``request.userInfo.username``, ``request.subResource``...); a request is sent only when every
condition is true, and an evaluation error applies the failurePolicy (Fail: the write is refused),
so the conditions must not error on any Node.

The requests are modelled on the kubelet's own writes: it registers with a Node CREATE, then every
``nodeStatusUpdateFrequency`` (10 s) computes its status and PATCHes ``nodes/status`` when
something changed, at least every ``nodeStatusReportFrequency`` (5 min) with a new
``lastHeartbeatTime`` (liveness itself is the Lease in kube-node-lease, which is not a Node
write). A PATCH is an UPDATE to admission, with the whole new and old Node; the API server also
moves the kubelet's ``managedFields`` entry (its time) on every such write.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import celpy
import pytest
from celpy.adapter import json_to_cel
from hypothesis import given, settings
from hypothesis import strategies as st

from admission.hold.nodes import node_violations
from admission.hold.selection import PackageSelector, selection_violations
from tests.chart.test_chart import Doc, helm_path, one, render

NODE = "gpu-7"
KUBELET = f"system:node:{NODE}"
OWNER = "system:serviceaccount:nodegate:ng-nodegate"
HOLD = {"key": "nodegate.io/hold", "value": "packages-pending", "effect": "NoSchedule"}


def _conditions(beat: str) -> list[Doc]:
    reasons = {
        "MemoryPressure": ("False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
        "DiskPressure": ("False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        "PIDPressure": ("False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        "Ready": ("True", "KubeletReady", "kubelet is posting ready status"),
    }
    return [
        {
            "type": kind,
            "status": status,
            "lastHeartbeatTime": beat,
            "lastTransitionTime": "2026-12-01T08:00:00Z",
            "reason": reason,
            "message": message,
        }
        for kind, (status, reason, message) in reasons.items()
    ]


def registered_node(beat: str = "2026-12-04T09:00:00Z") -> Doc:
    """A Node as the kubelet registered it and keeps it (nodegate pre-created it with the hold)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": NODE,
            "uid": "5b0c8a34-6c1e-4f43-9d58-2f7d0c1e9a10",
            "resourceVersion": "480211",
            "creationTimestamp": "2026-12-01T08:00:00Z",
            "labels": {
                "beta.kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/hostname": NODE,
                "kubernetes.io/os": "linux",
                "node-restriction.kubernetes.io/nodegate-class": "gpu-golden",
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
            "managedFields": [
                {
                    "manager": "kubelet",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": beat,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:status": {"f:conditions": {}}},
                    "subresource": "status",
                }
            ],
        },
        "spec": {"podCIDR": "10.244.7.0/24", "podCIDRs": ["10.244.7.0/24"], "taints": [HOLD]},
        "status": {
            "capacity": {"cpu": "64", "memory": "527958356Ki", "pods": "110", "nvidia.com/gpu": "8"},
            "allocatable": {"cpu": "63", "memory": "525758356Ki", "pods": "110", "nvidia.com/gpu": "8"},
            "conditions": _conditions(beat),
            "addresses": [
                {"type": "InternalIP", "address": "10.0.7.12"},
                {"type": "Hostname", "address": NODE},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"kubeletVersion": "v1.31.4", "containerRuntimeVersion": "containerd://1.7.24"},
            "images": [{"names": ["registry.k8s.io/pause:3.10"], "sizeBytes": 320368}],
        },
    }


def request(operation: str, user: str, obj: Doc | None, old: Doc | None, sub: str = "") -> Doc:
    groups = (
        ["system:nodes", "system:authenticated"]
        if user.startswith("system:node:")
        else ["system:authenticated"]
    )
    return {
        "request": {
            "uid": "4a1b7c9e-0000-4000-8000-000000000001",
            "kind": {"group": "", "version": "v1", "kind": "Node"},
            "resource": {"group": "", "version": "v1", "resource": "nodes"},
            "subResource": sub,
            "name": NODE,
            "operation": operation,
            "userInfo": {"username": user, "groups": groups},
            "dryRun": False,
        },
        "object": obj,
        "oldObject": old,
    }


def heartbeat() -> Doc:
    old = registered_node()
    new = registered_node("2026-12-04T09:05:00Z")  # nodeStatusReportFrequency later
    return request("UPDATE", KUBELET, new, old, "status")


def status_change() -> Doc:
    old = registered_node()
    new = registered_node("2026-12-04T09:00:10Z")
    new["status"]["images"].append({"names": ["nvcr.io/nvidia/driver:550"], "sizeBytes": 912345678})
    new["status"]["allocatable"]["nvidia.com/gpu"] = "7"
    return request("UPDATE", KUBELET, new, old, "status")


def with_annotation(key: str, value: str, user: str = KUBELET, sub: str = "status") -> Doc:
    old = registered_node()
    new = registered_node()
    new["metadata"]["annotations"][key] = value
    return request("UPDATE", user, new, old, sub)


def with_label(key: str, value: str) -> Doc:
    old = registered_node()
    new = registered_node()
    new["metadata"]["labels"][key] = value
    return request("UPDATE", KUBELET, new, old, "status")


def without_hold(user: str) -> Doc:
    old = registered_node()
    new = registered_node()
    new["spec"]["taints"] = []
    return request("UPDATE", user, new, old)


def registration() -> Doc:
    node = registered_node()
    del node["metadata"]["managedFields"], node["metadata"]["resourceVersion"], node["metadata"]["uid"]
    return request("CREATE", KUBELET, node, None)


def volumes_attached() -> Doc:
    old = registered_node()
    new = copy.deepcopy(old)
    new["status"]["volumesAttached"] = [{"name": "kubernetes.io/csi/ebs^vol-1", "devicePath": ""}]
    return request("UPDATE", "system:serviceaccount:kube-system:attachdetach-controller", new, old, "status")


SENT, SKIPPED = True, False
CASES = {
    "kubelet heartbeat (nodes/status, only lastHeartbeatTime and managedFields move)": (heartbeat, SKIPPED),
    "kubelet status change (images, allocatable)": (status_change, SKIPPED),
    "attach-detach controller status (volumesAttached)": (volumes_attached, SKIPPED),
    "NodeWright operator writes its nodeState annotation": (
        lambda: with_annotation(
            "skyhook.nvidia.com/nodeState_gpu",
            '{"driver|2.4.1":{"state":"complete"}}',
            user="system:serviceaccount:skyhook:skyhook-operator-controller-manager",
            sub="",
        ),
        SKIPPED,
    ),
    "node controller taints an unreachable node (exempt)": (
        lambda: without_hold("system:serviceaccount:kube-system:node-controller"),
        SKIPPED,
    ),
    "kubelet registers (Node CREATE)": (registration, SENT),
    "kubelet writes a nodeState annotation through nodes/status": (
        lambda: with_annotation("skyhook.nvidia.com/nodeState_gpu", '{"driver|2.4.1":{"state":"complete"}}'),
        SENT,
    ),
    "kubelet adds any annotation (CSI node id)": (
        lambda: with_annotation("csi.volume.kubernetes.io/nodeid", '{"ebs.csi.aws.com":"i-0abc"}'),
        SENT,
    ),
    "kubelet changes a label": (lambda: with_label("kubernetes.io/os", "windows"), SENT),
    "kubelet changes the pool label a package CR selects it by": (lambda: with_label("pool", "other"), SENT),
    "an admin removes the hold taint": (lambda: without_hold("alice"), SENT),
    "nodegate lifts the hold (its own account: exempt)": (lambda: without_hold(OWNER), SKIPPED),
}


@pytest.fixture(scope="module")
def conditions(tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    """The Node hook's matchConditions from the rendered chart, compiled."""
    docs = render(helm_path(), tmp_path_factory.mktemp("conditions"), {}, namespace="nodegate", release="ng")
    vwc = one(docs, "ValidatingWebhookConfiguration")
    (hook,) = [h for h in vwc["webhooks"] if h["name"] == "nodes.nodegate.io"]
    assert {r for rule in hook["rules"] for r in rule["resources"]} == {"nodes", "nodes/status"}
    env = celpy.Environment()
    return [env.program(env.compile(c["expression"])) for c in hook["matchConditions"]]


def sent(conditions: list[Any], review: Doc) -> bool:
    """What the API server does: every condition evaluated; sent only when all are true. An
    error would apply failurePolicy Fail (the write refused): none may occur."""
    activation = {k: json_to_cel(v) for k, v in review.items()}
    results = [program.evaluate(activation) for program in conditions]
    for r in results:
        assert isinstance(r, celpy.celtypes.BoolType), f"not a bool (an evaluation error): {r!r}"
    return all(bool(r) for r in results)


@pytest.mark.parametrize("case", sorted(CASES))
def test_only_the_writes_nodegate_judges_reach_it(conditions: list[Any], case: str) -> None:
    build, expected = CASES[case]
    assert sent(conditions, build()) is expected


# -- the conditions never skip a write the webhook would refuse -------------------------------------

ANNOTATIONS = st.dictionaries(
    st.sampled_from(
        [
            "skyhook.nvidia.com/nodeState_gpu",
            "nodewright.nvidia.com/nodeState_cpu",
            "node.alpha.kubernetes.io/ttl",
            "csi.volume.kubernetes.io/nodeid",
        ]
    ),
    st.sampled_from(["0", "1", '{"a":1}']),
    max_size=3,
)
LABELS = st.dictionaries(
    st.sampled_from(["kubernetes.io/os", "pool", "zone"]), st.sampled_from(["a", "b"]), max_size=2
)
TAINTS = st.lists(
    st.sampled_from(
        [
            HOLD,
            {**HOLD, "value": "unattested"},
            {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
        ]
    ),
    max_size=2,
    unique_by=json.dumps,
)


def _node(
    annotations: dict[str, str] | None, labels: dict[str, str] | None, taints: list[Doc] | None, beat: str
) -> Doc:
    node = registered_node(beat)
    meta, spec = node["metadata"], node["spec"]
    for key, value in (("annotations", annotations), ("labels", labels)):
        if value is None:
            del meta[key]  # absent, as the API server omits an empty map
        else:
            meta[key] = value
    if taints is None:
        del spec["taints"]
    else:
        spec["taints"] = taints
    return node


# Package CRs whose selection a node's own label change may not leave (admission.hold.selection).
SELECTORS = [
    PackageSelector("skyhook.nvidia.com/pool-a", {"matchLabels": {"pool": "a"}}),
    PackageSelector(
        "nodewright.nvidia.com/not-zone-b",
        {"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["b"]}]},
    ),
]


@settings(max_examples=150, deadline=None)
@given(
    user=st.sampled_from([KUBELET, "system:node:other", "alice", OWNER]),
    old=st.tuples(st.none() | ANNOTATIONS, st.none() | LABELS, st.none() | TAINTS),
    new=st.tuples(st.none() | ANNOTATIONS, st.none() | LABELS, st.none() | TAINTS),
    sub=st.sampled_from(["", "status"]),
    selectors=st.sampled_from([SELECTORS, None]),
)
def test_no_refusable_write_is_skipped(
    conditions: list[Any],
    user: str,
    old: tuple[Any, Any, Any],
    new: tuple[Any, Any, Any],
    sub: str,
    selectors: list[PackageSelector] | None,
) -> None:
    """For any Node UPDATE: if nodegate's rules (admission.hold.nodes, admission.hold.selection) would
    refuse it, the conditions send it; a write that leaves annotations, labels and taints as they
    were is not sent."""
    before = _node(*old, "2026-12-04T09:00:00Z")
    after = _node(*new, "2026-12-04T09:05:00Z")
    review = request("UPDATE", user, after, before, sub)
    refused = node_violations("UPDATE", after, before, username=user, owner=OWNER)
    refused += selection_violations("UPDATE", after, before, username=user, selectors=selectors)
    is_sent = sent(conditions, review)
    if refused:
        assert is_sent, refused
    unchanged = old == new or (
        (old[0] or {}) == (new[0] or {})
        and (old[1] or {}) == (new[1] or {})
        and (old[2] or []) == (new[2] or [])
    )
    if unchanged:
        assert not is_sent


def test_webhook_port_admits_the_configured_api_server_sources(tmp_path: Path) -> None:
    """webhookSourceCidrs, when set, are the only sources on the webhook port (the join port keeps
    ingressFrom); the webhook configurations call the Service's admission port."""
    values = {
        "service": {"admissionPort": 10443},
        "networkPolicy": {
            "apiServer": {"cidrs": ["192.0.2.1/32"], "webhookSourceCidrs": ["198.51.100.0/28"]}
        },
    }
    docs = render(helm_path(), tmp_path, values)
    join_rule, webhook_rule = one(docs, "NetworkPolicy")["spec"]["ingress"]
    assert "from" not in join_rule
    assert webhook_rule == {
        "ports": [{"port": "admission", "protocol": "TCP"}],
        "from": [{"ipBlock": {"cidr": "198.51.100.0/28"}}],
    }
    ports = {p["name"]: p for p in one(docs, "Service")["spec"]["ports"]}
    assert ports["admission"]["port"] == 10443
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        for hook in one(docs, kind)["webhooks"]:
            assert hook["clientConfig"]["service"]["port"] == 10443
