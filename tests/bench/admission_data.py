"""What the admission benchmark sends and what its webhook server is configured with.

One place for both sides: the server process builds its :class:`~admission.webhook.Decider` from
:data:`POLICIES` and :data:`RBAC`, the load generator builds its request bodies from
:data:`REVIEWS` and knows from each one whether the webhook must allow it.

The configuration is meant to look like a small production cluster: three PackagePolicies (a GPU
pool that may reboot, a CPU pool that may not, and a catch-all "everything" policy that only admits
noop changes) and 22 RBAC objects (ClusterRoles per policy and verb, an aggregated admin role,
unrelated roles, a namespaced Role, and bindings to users, groups and service accounts). The
"everything" policy's pool contains every selector, so most reviews are judged against two
candidate policies, as the webhook does in a cluster with a catch-all policy.
"""

from __future__ import annotations

import copy
import itertools
import json
import random
import uuid
from dataclasses import dataclass
from typing import Any

from admission.rbac.evaluator import RbacEvaluator
from admission.reading.policy import PackagePolicy
from admission.webhook import Decider, LocalRbac, StaticPolicies

PATH = "/admission/validate"
MUTATE_PATH = "/admission/mutate"
OWNER = "system:serviceaccount:nodegate:nodegate"
UID_MARK = "@@bench-uid@@"  # stands in for the uid in a serialised template
SEQ_MARK = "@@bench-seq@@"  # stands in for a label value: "0", or a new number per review (--unique)
SEQ_LABEL = "bench.nodegate.io/seq"  # judged by no rule: the decision is the same whatever its value
RBAC_API = "rbac.authorization.k8s.io/v1"

# ------------------------------------------------------------------------------------------
# PackagePolicies


def _policy(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "nodegate.io/v1alpha1",
        "kind": "PackagePolicy",
        "metadata": {"name": name},
        "spec": spec,
    }


POLICY_DOCS: list[dict[str, Any]] = [
    _policy(
        "gpu",
        {
            "nodeSelector": {"matchLabels": {"agentpool": "gpu"}},
            "images": {"registries": ["ghcr.io/nvidia", "registry.example.com/platform"]},
            "interrupts": {"allowed": ["noop", "service", "restartAllServices", "reboot"]},
            "maxInterruptionBudget": {"percent": 50},
            "priority": {"min": 100, "max": 900},
        },
    ),
    _policy(
        "cpu",
        {
            "nodeSelector": {"matchLabels": {"agentpool": "cpu"}},
            "images": {"registries": ["ghcr.io/nvidia"]},
            "interrupts": {"allowed": ["noop", "service", "restartAllServices"]},
            "maxInterruptionBudget": {"percent": 25},
        },
    ),
    _policy("everything", {"images": {"registries": ["ghcr.io/nvidia"]}}),  # every node; noop only
]


def policies() -> list[PackagePolicy]:
    return [PackagePolicy.model_validate(doc) for doc in POLICY_DOCS]


# ------------------------------------------------------------------------------------------
# RBAC


def _cluster_role(
    name: str, rules: list[dict[str, Any]], labels: dict[str, str] | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, **({"labels": labels} if labels else {})}
    return {"apiVersion": RBAC_API, "kind": "ClusterRole", "metadata": meta, "rules": rules}


def _policy_rule(verbs: list[str], names: list[str] | None = None) -> dict[str, Any]:
    rule: dict[str, Any] = {"apiGroups": ["nodegate.io"], "resources": ["packagepolicies"], "verbs": verbs}
    return {**rule, "resourceNames": names} if names else rule


def _subject(kind: str, name: str) -> dict[str, str]:
    if kind == "ServiceAccount":
        namespace, _, account = name.partition(":")
        return {"kind": kind, "name": account, "namespace": namespace}
    return {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name}


def _binding(name: str, role: str, *subjects: tuple[str, str], namespace: str = "") -> dict[str, Any]:
    kind = "RoleBinding" if namespace else "ClusterRoleBinding"
    role_kind = "Role" if role.startswith("ns:") else "ClusterRole"
    return {
        "apiVersion": RBAC_API,
        "kind": kind,
        "metadata": {"name": name, **({"namespace": namespace} if namespace else {})},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": role_kind,
            "name": role.removeprefix("ns:"),
        },
        "subjects": [_subject(k, n) for k, n in subjects],
    }


_AGGREGATE = {"nodegate.io/aggregate-to-admin": "true"}
_SKYHOOK_RULE = {
    "apiGroups": ["skyhook.nvidia.com", "nodewright.nvidia.com"],
    "resources": ["skyhooks", "nodewrights", "deploymentpolicies"],
    "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
}

RBAC: list[dict[str, Any]] = [
    # Roles on the policies: one per policy and verb, as an operator of nodegate would write them.
    _cluster_role("nodegate-deploy-gpu", [_policy_rule(["deploy"], ["gpu"])], _AGGREGATE),
    _cluster_role("nodegate-reboot-gpu", [_policy_rule(["reboot"], ["gpu"])], _AGGREGATE),
    _cluster_role("nodegate-deploy-cpu", [_policy_rule(["deploy"], ["cpu"])], _AGGREGATE),
    _cluster_role("nodegate-deploy-everything", [_policy_rule(["deploy"], ["everything"])], _AGGREGATE),
    _cluster_role("nodegate-policy-viewer", [_policy_rule(["get", "list", "watch"])]),
    {
        "apiVersion": RBAC_API,
        "kind": "ClusterRole",
        "metadata": {"name": "nodegate-admin"},
        "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": _AGGREGATE}]},
    },
    # Unrelated roles a cluster has anyway.
    _cluster_role("skyhook-editor", [_SKYHOOK_RULE]),
    _cluster_role(
        "node-reader", [{"apiGroups": [""], "resources": ["nodes", "nodes/status"], "verbs": ["get", "list"]}]
    ),
    {
        "apiVersion": RBAC_API,
        "kind": "Role",
        "metadata": {"name": "team-a-config", "namespace": "team-a"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "update"]}],
    },
    # Bindings.
    _binding("alice-deploys-gpu", "nodegate-deploy-gpu", ("User", "alice")),
    _binding("platform-deploys-gpu", "nodegate-deploy-gpu", ("Group", "ml-platform")),
    _binding("platform-reboots-gpu", "nodegate-reboot-gpu", ("Group", "ml-platform")),
    _binding("batch-deploys-cpu", "nodegate-deploy-cpu", ("Group", "batch-team"), ("User", "dave")),
    _binding("ci-deploys-cpu", "nodegate-deploy-cpu", ("ServiceAccount", "ci:deployer")),
    _binding("root-admin", "nodegate-admin", ("User", "root"), ("Group", "cluster-admins")),
    _binding("everyone-views-policies", "nodegate-policy-viewer", ("Group", "system:authenticated")),
    _binding("editors-edit-skyhooks", "skyhook-editor", ("Group", "ml-platform"), ("Group", "batch-team")),
    _binding("mallory-edits-skyhooks", "skyhook-editor", ("User", "mallory")),
    _binding("readers-read-nodes", "node-reader", ("Group", "system:authenticated")),
    _binding("team-a-config", "ns:team-a-config", ("Group", "team-a"), namespace="team-a"),
    _binding(
        "team-a-deploys-everything", "nodegate-deploy-everything", ("Group", "team-a"), namespace="team-a"
    ),
    _binding("dangling", "no-such-role", ("User", "alice")),  # a roleRef to a missing role grants nothing
]


def decider() -> Decider:
    """The webhook's decider as the benchmark's server runs it."""
    return Decider(StaticPolicies(policies()), LocalRbac(RbacEvaluator.from_objects(RBAC)), OWNER)


# ------------------------------------------------------------------------------------------
# Package CRs and reviews

GPU_CR: dict[str, Any] = {
    "apiVersion": "skyhook.nvidia.com/v1alpha1",
    "kind": "Skyhook",
    "metadata": {"name": "gpu-node-setup", "labels": {"team": "ml-platform"}},
    "spec": {
        "nodeSelectors": {"matchLabels": {"agentpool": "gpu"}},
        "additionalTolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        "podNonInterruptLabels": {"matchLabels": {"workload": "training"}},
        "interruptionBudget": {"percent": 25},
        "priority": 300,
        "packages": {
            "driver-config": {
                "version": "2.4.1",
                "image": "ghcr.io/nvidia/skyhook-packages/shellscript",
                "containerSHA": "sha256:" + "3f" * 32,
                "dependsOn": {"kernel-tuning": "1.3.0"},
                "configMap": {
                    "apply.sh": "#!/bin/bash\nset -euo pipefail\nnvidia-smi -pm 1\n",
                    "apply_check.sh": "#!/bin/bash\nnvidia-smi -q | grep -q 'Persistence Mode *: Enabled'\n",
                    "config.sh": "#!/bin/bash\necho configured\n",
                    "config_check.sh": "#!/bin/bash\ntrue\n",
                },
                "env": [{"name": "LOG_LEVEL", "value": "info"}],
                "resources": {
                    "cpuRequest": "100m",
                    "cpuLimit": "500m",
                    "memoryRequest": "64Mi",
                    "memoryLimit": "256Mi",
                },
            },
            "kernel-tuning": {
                "version": "1.3.0",
                "image": "ghcr.io/nvidia/skyhook-packages/tuning",
                "configInterrupts": {
                    "sysctl.conf": {"type": "restartAllServices"},
                    "limits.conf": {"type": "service", "services": ["containerd"]},
                },
                "configMap": {
                    "sysctl.conf": "fs.inotify.max_user_instances=8192\nvm.max_map_count=262144\n",
                    "limits.conf": "* soft nofile 1048576\n",
                },
            },
        },
    },
}


def _with_reboot(doc: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    doc["spec"]["packages"]["kernel-tuning"]["interrupt"] = {"type": "reboot"}
    doc["spec"]["packages"]["kernel-tuning"]["configMap"]["grub.conf"] = "hugepagesz=1G hugepages=64"
    doc["spec"]["packages"]["kernel-tuning"]["configInterrupts"]["grub.conf"] = {"type": "reboot"}
    return doc


def _cpu_cr() -> dict[str, Any]:
    doc = copy.deepcopy(GPU_CR)
    doc["metadata"] = {"name": "cpu-node-setup"}
    doc["spec"]["nodeSelectors"] = {"matchLabels": {"agentpool": "cpu"}}
    doc["spec"]["additionalTolerations"] = []
    doc["spec"]["interruptionBudget"] = {"count": 1}
    del doc["spec"]["packages"]["driver-config"]
    return doc


def _bumped(doc: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    doc["spec"]["packages"]["driver-config"]["version"] = "2.5.0"
    return doc


def _foreign_image(doc: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    doc["spec"]["packages"]["driver-config"]["image"] = "docker.io/someone/driver-config"
    return doc


def _cpu_reboot() -> dict[str, Any]:
    """A cpu CR with a reboot package: the cpu policy's limits do not allow reboot interrupts."""
    doc = _with_reboot(GPU_CR)
    doc["metadata"] = {"name": "cpu-kernel"}
    doc["spec"]["nodeSelectors"] = {"matchLabels": {"agentpool": "cpu"}}
    doc["spec"]["additionalTolerations"] = []
    del doc["spec"]["packages"]["driver-config"]
    return doc


def nodewright(doc: dict[str, Any]) -> dict[str, Any]:
    """The same CR as a NodeWright (nodewright.nvidia.com, the operator's new API group)."""
    doc = copy.deepcopy(doc)
    doc["apiVersion"] = "nodewright.nvidia.com/v1alpha1"
    doc["kind"] = "NodeWright"
    return doc


def _fields_v1(value: Any) -> dict[str, Any]:
    """The managedFields ``fieldsV1`` set of a value, as the API server writes it (lists as leaves)."""
    if not isinstance(value, dict):
        return {}
    return {f"f:{key}": _fields_v1(item) for key, item in value.items()}


def as_stored(doc: dict[str, Any], generation: int = 1) -> dict[str, Any]:
    """The object as the API server hands it to admission: with uid, generation, timestamps and
    the managedFields of one server-side-apply manager."""
    doc = copy.deepcopy(doc)
    meta = doc["metadata"]
    stamp = f"2026-01-15T10:{generation % 60:02d}:00Z"
    meta.update(
        {
            "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, meta["name"])),
            "generation": generation,
            "resourceVersion": str(4711 + generation),
            "creationTimestamp": "2026-01-15T10:00:00Z",
            "managedFields": [
                {
                    "manager": "argocd-controller",
                    "operation": "Apply",
                    "apiVersion": doc["apiVersion"],
                    "time": stamp,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:labels": _fields_v1(meta.get("labels"))},
                                 "f:spec": _fields_v1(doc["spec"])},
                }
            ],
        }
    )  # fmt: skip
    return doc


def review(
    obj: dict[str, Any],
    *,
    user: str,
    groups: tuple[str, ...] = (),
    op: str = "CREATE",
    old: dict[str, Any] | None = None,
    uid: str = UID_MARK,
    sequenced: bool = False,
) -> dict[str, Any]:
    """An AdmissionReview v1 as the API server sends it for a NodeWright or Skyhook CR;
    ``sequenced``: the object carries the sequence label (:data:`SEQ_MARK`, for :data:`REVIEWS`)."""
    group, version = obj["apiVersion"].split("/")
    kind = obj["kind"]
    gvk = {"group": group, "version": version, "kind": kind}
    gvr = {"group": group, "version": version, "resource": kind.lower() + "s"}
    if user.startswith("system:serviceaccount:"):  # what the API server adds for a service account
        namespace = user.split(":")[2]
        groups = (*groups, "system:serviceaccounts", f"system:serviceaccounts:{namespace}")
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": gvk,
            "resource": gvr,
            "requestKind": gvk,
            "requestResource": gvr,
            "name": obj["metadata"]["name"],
            "operation": op,
            "userInfo": {
                "username": user,
                "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, user)),
                "groups": [*groups, "system:authenticated"],
                "extra": {"authentication.kubernetes.io/credential-id": ["X509SHA256=" + "ab" * 32]},
            },
            "object": _sequenced(as_stored(obj, 2 if old else 1))
            if sequenced
            else as_stored(obj, 2 if old else 1),
            "oldObject": None if old is None else as_stored(old, 1),
            "dryRun": False,
            "options": {
                "apiVersion": "meta.k8s.io/v1",
                "kind": "CreateOptions" if op == "CREATE" else "UpdateOptions",
            },
        },
    }


def _sequenced(doc: dict[str, Any]) -> dict[str, Any]:
    doc["metadata"].setdefault("labels", {})[SEQ_LABEL] = SEQ_MARK
    return doc


@dataclass(frozen=True)
class Template:
    """One kind of review in the mix: its serialised body split around the uid."""

    name: str
    weight: int  # share of the mix, in percent
    allowed: bool  # what the webhook must answer
    body: dict[str, Any]

    def split(self) -> tuple[bytes, bytes, bytes]:
        """The serialised body around the uid and the sequence label's value (in that order)."""
        head, rest = json.dumps(self.body, separators=(",", ":")).split(UID_MARK)
        mid, tail = rest.split(SEQ_MARK)
        return head.encode(), mid.encode(), tail.encode()


_NW = nodewright
CI = "system:serviceaccount:ci:deployer"


def _review(obj: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    return review(obj, sequenced=True, **kwargs)


REVIEWS: list[Template] = [
    # allowed: 70 %, both API groups, five requesters (users, groups, a service account)
    Template("alice creates a gpu Skyhook (no reboot)", 15, True, _review(GPU_CR, user="alice")),
    Template("alice creates a gpu NodeWright (no reboot)", 10, True, _review(_NW(GPU_CR), user="alice")),
    Template(
        "ml-platform creates a gpu NodeWright with reboot",
        10,
        True,
        _review(_NW(_with_reboot(GPU_CR)), user="bob", groups=("ml-platform",)),
    ),
    Template(
        "ml-platform creates a gpu Skyhook with reboot",
        5,
        True,
        _review(_with_reboot(GPU_CR), user="bob", groups=("ml-platform",)),
    ),
    Template(
        "batch-team creates a cpu NodeWright",
        10,
        True,
        _review(_NW(_cpu_cr()), user="carol", groups=("batch-team",)),
    ),
    Template("dave creates a cpu Skyhook", 5, True, _review(_cpu_cr(), user="dave")),
    Template("ci's service account creates a cpu NodeWright", 5, True, _review(_NW(_cpu_cr()), user=CI)),
    Template(
        "alice bumps a version (Skyhook)",
        5,
        True,
        _review(_bumped(GPU_CR), user="alice", op="UPDATE", old=GPU_CR),
    ),
    Template(
        "alice bumps a version (NodeWright)",
        5,
        True,
        _review(_NW(_bumped(GPU_CR)), user="alice", op="UPDATE", old=_NW(GPU_CR)),
    ),
    # denied: 30 %
    Template("mallory creates a gpu Skyhook (no RBAC)", 8, False, _review(GPU_CR, user="mallory")),
    Template("mallory creates a gpu NodeWright (no RBAC)", 5, False, _review(_NW(GPU_CR), user="mallory")),
    Template(
        "alice uses a foreign registry (NodeWright)",
        7,
        False,
        _review(_NW(_foreign_image(GPU_CR)), user="alice"),
    ),
    Template("alice asks for a reboot (no verb)", 5, False, _review(_with_reboot(GPU_CR), user="alice")),
    Template(
        "batch-team reboots the cpu pool (policy limit)",
        5,
        False,
        _review(_cpu_reboot(), user="carol", groups=("batch-team",)),
    ),
]


@dataclass(frozen=True)
class Request:
    body: bytes
    uid: str
    allowed: bool


_SEQ = itertools.count(1)


def requests(count: int, rng: random.Random, unique: bool = False) -> list[Request]:
    """``count`` serialised reviews in a shuffled mix with the templates' weights, fresh uids.
    ``unique``: every object carries a label value of its own (no two reviews alike but for the
    uid, as after any real edit), otherwise the same ``0`` (repeats of a few kinds of review)."""
    parts = [(t.split(), t.allowed) for t in REVIEWS]
    weights = [t.weight for t in REVIEWS]
    out = []
    for (head, mid, tail), allowed in rng.choices(parts, weights, k=count):
        uid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        seq = b"%d" % next(_SEQ) if unique else b"0"
        out.append(Request(head + uid.encode() + mid + seq + tail, uid, allowed))
    return out
