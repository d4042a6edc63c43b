"""The PackagePolicies and RBAC the cluster tests apply: two pools matching upstream's sample CRs
(``skyhook.nvidia.com/test-node: skyhooke2e`` of examples/simple, ``agentpool: gpu`` of the
operator's config/samples), and the token users of tests/cluster/plane.py:

- alice (group team-gpu): may create package CRs and ``deploy`` to both pools, not ``reboot``;
- carol (groups team-gpu, gpu-admins): also ``reboot`` on the gpu pool;
- bob (group team-web): may create package CRs (the API server's own RBAC lets him through) but
  holds no PackagePolicy rights, so nodegate's webhook refuses him.
"""

from __future__ import annotations

from typing import Any

RBAC_V1 = "rbac.authorization.k8s.io/v1"
PACKAGE_GROUPS = ["skyhook.nvidia.com", "nodewright.nvidia.com"]


def _policy(name: str, labels: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "nodegate.io/v1alpha1",
        "kind": "PackagePolicy",
        "metadata": {"name": name},
        "spec": {"nodeSelector": {"matchLabels": labels}, **spec},
    }


def _role(name: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": RBAC_V1, "kind": "ClusterRole", "metadata": {"name": name}, "rules": rules}


def _binding(name: str, role: str, group: str) -> dict[str, Any]:
    return {
        "apiVersion": RBAC_V1,
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}],
    }


def _policy_verb(verb: str, names: list[str]) -> list[dict[str, Any]]:
    return [
        {
            "apiGroups": ["nodegate.io"],
            "resources": ["packagepolicies"],
            "verbs": [verb],
            "resourceNames": names,
        }
    ]


def objects() -> list[dict[str, Any]]:
    authoring = [
        {
            "apiGroups": PACKAGE_GROUPS,
            "resources": ["skyhooks", "nodewrights", "deploymentpolicies"],
            "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
        }
    ]
    return [
        _policy(
            "e2e",
            {"skyhook.nvidia.com/test-node": "skyhooke2e"},
            images={"registries": ["ghcr.io/nvidia"]},
        ),
        _policy(
            "gpu",
            {"agentpool": "gpu"},
            images={"registries": ["ghcr.io/nvidia"]},
            interrupts={"allowed": ["noop", "service", "restartAllServices", "reboot"]},
            maxInterruptionBudget={"percent": 50},
        ),
        _role("package-author", authoring),
        _role("deploy-pools", _policy_verb("deploy", ["e2e", "gpu"])),
        _role("reboot-gpu", _policy_verb("reboot", ["gpu"])),
        _binding("gpu-team-authors", "package-author", "team-gpu"),
        _binding("web-team-authors", "package-author", "team-web"),
        _binding("gpu-team-deploys", "deploy-pools", "team-gpu"),
        _binding("gpu-admins-reboot", "reboot-gpu", "gpu-admins"),
    ]
