"""The pods NodeWright's operator creates for a package, built as it builds them (read from
``createPodFromPackage``, ``createInterruptPodForPackage`` and ``generateSafeName`` in
``operator/internal/controller/skyhook_controller.go`` of NVIDIA/nodewright
71ca22b89874a282e52a5a80856a5f1143f5e55c; written out again, not copied):
the pods run as the namespace's ``default`` service account (the operator sets none). Their
tolerations are the operator's own plus the CR's ``spec.additionalTolerations``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from tests.admission.upstream.model import uid

NAMESPACE = "skyhook"  # the operator's namespace (its NAMESPACE env; the chart's release namespace)
AGENT = "ghcr.io/nvidia/skyhook/agent:6.3.0"
PAUSE = "registry.k8s.io/pause:3.10"
COPY_ROOT = "/var/lib/skyhook"
# The tolerations the operator gives every package pod, before the CR's additionalTolerations:
# the cordon taint, and its runtime-required taint (RUNTIME_REQUIRED_TAINT's default).
OPERATOR_TOLERATIONS = [
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists"},
    {"key": "skyhook.nvidia.com", "operator": "Equal", "value": "runtime-required", "effect": "NoSchedule"},
]


def safe_name(max_len: int, *parts: str) -> str:
    """generateSafeName: the parts joined with '-', dots made dashes, cut to fit, lower-cased, and
    the first 8 hex digits of the SHA-256 of the joined name (before cutting) appended."""
    name = "-".join(parts).replace(".", "-")
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: max_len - len(digest) - 1]}-{digest}".lower()


def _owner(cr: str) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "skyhook.nvidia.com/v1alpha1",
            "kind": "Skyhook",
            "name": cr,
            "uid": uid("skyhook", cr),
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def _resources(cpu: str, memory: str) -> dict[str, Any]:
    return {"limits": {"cpu": cpu, "memory": memory}, "requests": {"cpu": cpu, "memory": memory}}


def _agent_env(cr: str, name: str, version: str) -> list[dict[str, str]]:
    return [
        {"name": "SKYHOOK_LOG_DIR", "value": f"/var/log/skyhook/{cr}"},
        {"name": "SKYHOOK_ROOT_DIR", "value": f"{COPY_ROOT}/{cr}"},
        {"name": "COPY_RESOLV", "value": "false"},
        {"name": "SKYHOOK_RESOURCE_ID", "value": f"{uid('skyhook', cr)}-1_{name}_{version}"},
        {"name": "SKYHOOK_NODE_ORDER", "value": "0"},
    ]


def _pod(
    name: str, cr: str, labels: dict[str, str], spec: dict[str, Any], annotations: dict[str, str]
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": _owner(cr),
        },
        "spec": spec,
    }


def package_pod(
    cr: str,
    name: str,
    version: str,
    stage: str,
    node: str,
    *,
    image: str = "ghcr.io/nvidia/skyhook/agentless",
    additional_tolerations: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The pod that runs stage ``stage`` (apply, config, upgrade, uninstall, ...) of a package."""
    copy_dir = f"{COPY_ROOT}/{cr}/{name}-{version}-{uid('skyhook', cr)}-1"
    volume = safe_name(63, "metadata", node)
    mounts = [
        {"name": "root-mount", "mountPath": "/root", "mountPropagation": "HostToContainer"},
        {"name": volume, "mountPath": "/skyhook-package/node-metadata"},
    ]
    env = _agent_env(cr, name, version)
    short = name[:43]
    spec = {
        "nodeName": node,
        "restartPolicy": "OnFailure",
        "initContainers": [
            {
                "name": f"{short}-init",
                "image": f"{image}:{version}",
                "imagePullPolicy": "Always",
                "command": ["/bin/sh"],
                "args": [
                    "-c",
                    "mkdir -p /root/${SKYHOOK_DIR} && cp -r /skyhook-package/* /root/${SKYHOOK_DIR}",
                ],
                "env": [{"name": "SKYHOOK_DIR", "value": copy_dir}],
                "securityContext": {"privileged": True},
                "volumeMounts": mounts,
            },
            *(
                {
                    "name": f"{short}-{stage}{suffix}",
                    "image": AGENT,
                    "imagePullPolicy": "Always",
                    "args": [f"{stage}{'-check' if suffix else ''}", "/root", copy_dir],
                    "env": env,
                    "securityContext": {"privileged": True},
                    "volumeMounts": mounts,
                }
                for suffix in ("", "check")
            ),
        ],
        "containers": [{"name": "pause", "image": PAUSE, "resources": _resources("100m", "20Mi")}],
        "volumes": [
            {"name": "root-mount", "hostPath": {"path": "/"}},
            {"name": volume, "configMap": {"name": safe_name(253, cr, node, "metadata")}},
        ],
        "hostPID": True,
        "hostNetwork": True,
        "tolerations": [*OPERATOR_TOLERATIONS, *(additional_tolerations or [])],
        "serviceAccountName": "default",  # the API server's ServiceAccount plugin
    }
    labels = {"skyhook.nvidia.com/name": cr, "skyhook.nvidia.com/package": f"{name}-{version}"}
    info = {"name": name, "version": version, "skyhook": cr, "stage": stage, "image": image}
    annotations = {"skyhook.nvidia.com/package": json.dumps(info, separators=(",", ":"))}
    return _pod(safe_name(63, cr, name, version, stage, node), cr, labels, spec, annotations)


def interrupt_pod(cr: str, name: str, version: str, stage: str, kind: str, node: str) -> dict[str, Any]:
    """The pod that runs a package's interrupt (``kind``: reboot, service, ...)."""
    copy_dir = f"{COPY_ROOT}/{cr}/{name}-{version}-{uid('skyhook', cr)}-1"
    spec = {
        "nodeName": node,
        "restartPolicy": "OnFailure",
        "initContainers": [
            {
                "name": "interrupt",
                "image": AGENT,
                "args": ["interrupt", "/root", copy_dir, "eyJ0eXBlIjoibm9kZV9yZXN0YXJ0In0="],
                "env": _agent_env(cr, name, version),
                "securityContext": {"privileged": True},
                "volumeMounts": [
                    {"name": "root-mount", "mountPath": "/root", "mountPropagation": "HostToContainer"}
                ],
                "resources": _resources("500m", "64Mi"),
            }
        ],
        "containers": [{"name": "pause", "image": PAUSE, "resources": _resources("100m", "20Mi")}],
        "hostPID": True,
        "hostNetwork": True,
        "tolerations": list(OPERATOR_TOLERATIONS),
        "volumes": [
            {"name": "root-mount", "hostPath": {"path": "/"}},
            {
                "name": safe_name(63, cr, node, "metadata"),
                "configMap": {"name": f"{cr}-{node}-metadata".replace(".", "-")},
            },
        ],
        "serviceAccountName": "default",
    }
    labels = {
        "skyhook.nvidia.com/name": cr,
        "skyhook.nvidia.com/package": f"{name}-{version}",
        "skyhook.nvidia.com/interrupt": "True",
    }
    info = {"name": name, "version": version, "skyhook": cr, "stage": stage, "image": AGENT}
    annotations = {"skyhook.nvidia.com/package": json.dumps(info, separators=(",", ":"))}
    return _pod(safe_name(63, cr, stage, kind, node), cr, labels, spec, annotations)
