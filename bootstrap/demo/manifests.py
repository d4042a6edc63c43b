"""What the demo deploys and sends: the fleet, the service config, the NodeWright CR, the PackagePolicy
and RBAC files, the package states NodeWright's agent would write, and AdmissionReviews."""

from __future__ import annotations

import copy
import hashlib
import json
import uuid
from typing import Any

TRUST_DOMAIN = "demo.nodegate.test"
NODES = ("gpu-node-1", "gpu-node-2", "gpu-node-3")
TAMPERED = "gpu-node-4"
SELECTION = "sha256:0,1,2,3,4,5,6,7"
PCR_CLASS = "demo-fleet"
MB_CLASS = "demo-linux"  # the measured_boot class: Secure Boot, the demo's db CA, shim, grub, kernel
KERNEL = "vmlinuz-6.8.0-demo"  # what the fleet boots
UNKNOWN_KERNEL = "vmlinuz-6.9.0-unknown"  # what the tampered node boots
POOL = {"node-restriction.kubernetes.io/nodegate.io-pcr-class": PCR_CLASS}  # set by nodegate at join
CR_NAME = "gpu-stack"
CR_GROUP, CR_VERSION, CR_PLURAL = "nodewright.nvidia.com", "v1alpha1", "nodewrights"
PACKAGES = {"gpu-driver": "550.54.15", "ib-tuning": "1.2.0"}
TAINT_KEY = "nodegate.io/hold"
# The pool the demo's sample CR (bootstrap/demo/admit.py, in the shape of NodeWright's simplest
# example) selects, and a PackagePolicy for it: one shellscript package, no interrupt, no budget.
SAMPLE_NAME = "hello-hosts"
SAMPLE_POOL = {"nodegate.io/demo-pool": "first-packages"}
SAMPLE_POLICY = "first-packages"
SAMPLE_IMAGE = "ghcr.io/nvidia/skyhook-packages/shellscript"


def service_config(golden: dict[int, str], authority: str, applications: list[str]) -> dict[str, Any]:
    """`nodegate serve`'s config: paths relative to the demo's folder, ``golden`` the PCR class;
    ``authority`` (the db CA certificate's digest) and ``applications`` (shim, grub and kernel digests) the
    measured-boot class."""
    return {
        "trust_domain": TRUST_DOMAIN,
        "listen": "127.0.0.1:0",
        "state_dir": "state",
        "store": "kubernetes",
        "ek_roots": ["ek-roots.pem"],
        "server_names": ["127.0.0.1", "localhost"],
        # warn: a node that booted something else is judged, and refused, by its event log, which
        # names the event; the PCR class still labels the nodes that match it (their pool).
        "pcr_policy": {
            "classes": [
                {"name": PCR_CLASS, "mode": "warn", "golden": {"sha256": {i: [v] for i, v in golden.items()}}}
            ]
        },
        "measured_boot": {
            "secure_boot": "required",
            "classes": [{"name": MB_CLASS, "authorities": [authority], "boot_applications": applications}],
        },
        "kubernetes": {"kubeconfig": "kubeconfig"},
        # The demo runs the gate's one-shot pass itself (step 6), so serve does not run one too.
        "gate": {"enabled": False, "stability_window": "0s"},
        "admission": {
            "listen": "127.0.0.1:0",
            "policy_files": ["policies.yaml"],
            "rbac_files": ["rbac.yaml"],
        },
        # The mutating webhook gives package CRs the hold tolerations (the default, said here).
        "nodewright": {"inject_tolerations": True},
        # Disk keys for the boots the measured-boot class accepts (docs/disk-keys.md).
        "disk_keys": {"classes": [MB_CLASS]},
    }


def package_cr(**changes: Any) -> dict[str, Any]:
    """The NodeWright CR of the story: two packages for every node of the demo-fleet PCR class.
    ``changes`` replace spec keys, or (``package=...``) keys of the gpu-driver package."""
    packages = {
        name: {
            "version": version,
            "image": f"ghcr.io/nvidia/nodewright-packages/{name}",
            "containerSHA": "sha256:" + hashlib.sha256(f"{name}:{version}".encode()).hexdigest(),
            "interrupt": {"type": "service", "services": ["nvidia-persistenced"]},
        }
        for name, version in PACKAGES.items()
    }
    packages["gpu-driver"].update(changes.pop("package", {}))
    spec: dict[str, Any] = {
        # No toleration of the hold taint: nodegate's mutating webhook adds the ones NodeWright needs
        # to reach held nodes (docs/admission.md).
        "nodeSelectors": {"matchLabels": dict(POOL)},
        "interruptionBudget": {"percent": 33},
        "packages": packages,
        **changes,
    }
    return {
        "apiVersion": f"{CR_GROUP}/{CR_VERSION}",
        "kind": "NodeWright",
        "metadata": {"name": CR_NAME},
        "spec": spec,
    }


def node_state_annotation(name: str) -> dict[str, str]:
    """What NodeWright's agent writes on the Node as it applies the packages: complete (their
    service interrupt ran, so stage post-interrupt), except on the last node, whose driver fails
    to apply (and ib-tuning waits behind it)."""
    failing = name == NODES[-1]
    states = {
        f"{pkg}|{version}": {
            "name": pkg,
            "version": version,
            "image": f"ghcr.io/nvidia/nodewright-packages/{pkg}",
            "stage": "apply" if failing else "post-interrupt",
            "state": "erroring" if failing and pkg == "gpu-driver" else "complete",
        }
        for pkg, version in PACKAGES.items()
    }
    if failing:
        states.pop(f"ib-tuning|{PACKAGES['ib-tuning']}")
    return {f"{CR_GROUP}/nodeState_{CR_NAME}": json.dumps(states, sort_keys=True)}


def policy_documents() -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "nodegate.io/v1alpha1",
            "kind": "PackagePolicy",
            "metadata": {"name": PCR_CLASS},
            "spec": {
                "nodeSelector": {"matchLabels": dict(POOL)},
                "images": {"registries": ["ghcr.io/nvidia"], "requireDigest": True},
                "interrupts": {"allowed": ["noop", "service", "reboot"]},
                "maxInterruptionBudget": {"percent": 50},
            },
        },
        {
            "apiVersion": "nodegate.io/v1alpha1",
            "kind": "PackagePolicy",
            "metadata": {"name": SAMPLE_POLICY},
            "spec": {
                "nodeSelector": {"matchLabels": dict(SAMPLE_POOL)},
                "images": {"registries": ["ghcr.io/nvidia"]},
            },
        },
    ]


def rbac_documents() -> list[dict[str, Any]]:
    def role(verb: str, policy: str = PCR_CLASS) -> dict[str, Any]:
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": f"{verb}-{policy}"},
            "rules": [
                {
                    "apiGroups": ["nodegate.io"],
                    "resources": ["packagepolicies"],
                    "resourceNames": [policy],
                    "verbs": [verb],
                }
            ],
        }

    def binding(role_name: str, group: str) -> dict[str, Any]:
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{group}-{role_name}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}],
        }

    return [
        role("deploy"),
        role("reboot"),
        binding(f"deploy-{PCR_CLASS}", "ml-platform"),  # alice's team deploys, but may not reboot
        binding(f"reboot-{PCR_CLASS}", "sre"),
        role("deploy", SAMPLE_POLICY),
        binding(f"deploy-{SAMPLE_POLICY}", "ml-platform"),
    ]


def review(
    obj: dict[str, Any] | None,
    user: str,
    groups: tuple[str, ...],
    *,
    op: str = "CREATE",
    old: dict[str, Any] | None = None,
    kind: tuple[str, str, str] = (CR_GROUP, CR_VERSION, "NodeWright"),
) -> dict[str, Any]:
    group, version, kind_name = kind
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": group, "version": version, "kind": kind_name},
            "operation": op,
            "name": str((obj or old or {}).get("metadata", {}).get("name", "")),
            "userInfo": {"username": user, "groups": [*groups, "system:authenticated"]},
            "object": obj,
            "oldObject": old,
        },
    }


def webhook_cases(node: dict[str, Any]) -> list[tuple[str, bool, dict[str, Any]]]:
    """(what, allowed?, AdmissionReview) for the webhook step. ``node``: the held last node as
    stored, which its kubelet then tries to lift the hold from."""
    lifted = copy.deepcopy(node)
    lifted["spec"]["taints"] = [t for t in lifted["spec"].get("taints") or [] if t.get("key") != TAINT_KEY]
    alice = ("alice", ("ml-platform",))
    return [
        (f"alice (ml-platform) creates NodeWright {CR_NAME}", True, review(package_cr(), *alice)),
        (f"mallory creates NodeWright {CR_NAME}", False, review(package_cr(), "mallory", ())),
        (
            "alice: an image from docker.io, interruption budget 100%",
            False,
            review(
                package_cr(
                    interruptionBudget={"percent": 100}, package={"image": "docker.io/someone/gpu-driver"}
                ),
                *alice,
            ),
        ),
        (
            "alice: gpu-driver with a reboot interrupt",
            False,
            review(package_cr(package={"interrupt": {"type": "reboot"}}), *alice),
        ),
        (
            f"{NODES[-1]}'s kubelet removes its own hold taint (Node UPDATE)",
            False,
            review(
                lifted,
                f"system:node:{NODES[-1]}",
                ("system:nodes",),
                op="UPDATE",
                old=node,
                kind=("", "v1", "Node"),
            ),
        ),
    ]


def _safe_name(*parts: str, limit: int = 63) -> str:
    """How the operator names its pods (generateSafeName): the parts joined by dashes, dots as
    dashes, cut to fit, lower case, and 8 hex digits of the full name's SHA-256."""
    name = "-".join(parts).replace(".", "-")
    return f"{name[: limit - 9]}-{hashlib.sha256(name.encode()).hexdigest()[:8]}".lower()


def package_pod(cr: dict[str, Any], package: str, node: str, stage: str = "apply") -> dict[str, Any]:
    """The pod NodeWright's operator creates to run ``stage`` of ``package`` on ``node``: the shape
    of createPodFromPackage (operator/internal/controller/skyhook_controller.go, NVIDIA/nodewright
    71ca22b89874a282e52a5a80856a5f1143f5e55c; tests/admission/upstream/pods.py builds it in full):
    pinned to the node, privileged agent on the host's root, the operator's own tolerations plus
    the CR's additionalTolerations, and no service account of its own (the API server sets default)."""
    name, spec = str(cr["metadata"]["name"]), cr["spec"]
    version = str(spec["packages"][package]["version"])
    info = {"name": package, "version": version, "skyhook": name, "stage": stage}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": _safe_name(name, package, version, stage, node),
            "namespace": "skyhook",
            "labels": {"skyhook.nvidia.com/name": name, "skyhook.nvidia.com/package": f"{package}-{version}"},
            "annotations": {"skyhook.nvidia.com/package": json.dumps(info, separators=(",", ":"))},
            "ownerReferences": [
                {"apiVersion": cr["apiVersion"], "kind": cr["kind"], "name": name, "controller": True}
            ],
        },
        "spec": {
            "nodeName": node,
            "restartPolicy": "OnFailure",
            "initContainers": [
                {
                    "name": f"{package}-{stage}",
                    "image": "ghcr.io/nvidia/skyhook/agent:6.3.0",
                    "args": [stage, "/root", f"/var/lib/skyhook/{name}/{package}-{version}"],
                    "securityContext": {"privileged": True},
                    "volumeMounts": [{"name": "root-mount", "mountPath": "/root"}],
                }
            ],
            "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10"}],
            "volumes": [{"name": "root-mount", "hostPath": {"path": "/"}}],
            "hostPID": True,
            "hostNetwork": True,
            "tolerations": [
                {"key": "node.kubernetes.io/unschedulable", "operator": "Exists"},
                {
                    "key": "skyhook.nvidia.com",
                    "operator": "Equal",
                    "value": "runtime-required",
                    "effect": "NoSchedule",
                },
                *spec.get("additionalTolerations", []),
            ],
            "serviceAccountName": "default",
        },
    }
