"""The chart's rendered Deployment turned into podman arguments, the way a kubelet would mount it:
ConfigMaps and Secrets as read-only files (root:fsGroup, the volume's defaultMode), emptyDirs as
tmpfs, subPath mounts as single files, the service account token at its in-cluster path. Read
from `helm template` output at test time, so a changed chart (new volumes, ports, env) is what
the test runs."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.image.runtime import ROOT

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


def helm_path() -> str:
    local = ROOT / ".venv" / "bin" / "helm"
    found = str(local) if local.exists() else shutil.which("helm")
    if found is None:
        pytest.fail("helm is not installed: run `make helm` (CI does)", pytrace=False)
    return found


def render(namespace: str, *sets: str) -> list[dict[str, Any]]:
    args = [helm_path(), "template", "nodegate", str(ROOT / "charts" / "nodegate"), "-n", namespace]
    # what every install must set; a later --set of the same key wins
    required = ("config.trust_domain=fleet.test", "networkPolicy.apiServer.webhookSourceCidrs={192.0.2.0/24}")
    for item in (*required, *sets):
        args += ["--set", item]
    out = subprocess.run(args, capture_output=True, text=True, check=False, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def find(docs: list[dict[str, Any]], kind: str, suffix: str = "") -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)]
    return doc


@dataclass
class Pod:
    """What the test supplies for the pod's volumes: ConfigMap/Secret contents by volume name."""

    docs: list[dict[str, Any]]
    folder: Path
    namespace: str
    api: tuple[str, int]  # KUBERNETES_SERVICE_HOST / PORT
    objects: dict[str, dict[str, bytes]]  # extra ConfigMaps / Secrets by name (not in the render)

    @property
    def deployment(self) -> dict[str, Any]:
        return find(self.docs, "Deployment")

    def _data(self, kind: str, name: str) -> dict[str, bytes]:
        if name in self.objects:
            return self.objects[name]
        doc = find(self.docs, kind, name)
        if kind == "ConfigMap":
            return {k: v.encode() for k, v in (doc.get("data") or {}).items()}
        return {k: base64.b64decode(v) for k, v in (doc.get("data") or {}).items()}

    def volume_dir(self, volume: dict[str, Any]) -> Path:
        """A host folder holding the volume's files (owner root, group fsGroup, defaultMode)."""
        spec = volume.get("secret") or volume.get("configMap")
        assert spec is not None
        kind = "Secret" if "secret" in volume else "ConfigMap"
        name = spec.get("secretName") or spec.get("name")
        target = self.folder / "volumes" / volume["name"]
        if target.exists():
            return target
        target.mkdir(parents=True)
        data = self._data(kind, name)
        items = spec.get("items") or [{"key": k, "path": k} for k in sorted(data)]
        gid = self.deployment["spec"]["template"]["spec"]["securityContext"].get("fsGroup", 0)
        for item in items:
            path = target / item["path"]
            path.write_bytes(data[item["key"]])
            path.chmod(spec.get("defaultMode", 0o644))
            shutil.chown(path, 0, gid)
        return target

    def service_account(self) -> Path:
        sa = self.folder / "serviceaccount"
        sa.mkdir(exist_ok=True)
        return sa

    def podman_args(self, container: str) -> list[str]:
        """--user, --env, --mount, --tmpfs for one of the pod's containers (or init containers)."""
        spec = self.deployment["spec"]["template"]["spec"]
        (ctr,) = [c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == container]
        user = spec["securityContext"]
        ctx = ctr.get("securityContext", {})
        assert ctx.get("readOnlyRootFilesystem") is True
        args = ["--user", f"{user['runAsUser']}:{user['runAsGroup']}", "--group-add", str(user["fsGroup"])]
        args += ["--cap-drop", "all", "--security-opt", "no-new-privileges"]
        env = {"KUBERNETES_SERVICE_HOST": self.api[0], "KUBERNETES_SERVICE_PORT": str(self.api[1])}
        for item in ctr.get("env", []):
            if "value" in item:
                env[item["name"]] = item["value"]
            else:
                path = item["valueFrom"]["fieldRef"]["fieldPath"]
                env[item["name"]] = {
                    "metadata.namespace": self.namespace,
                    "metadata.name": f"{container}-pod",
                }[path]
        for key, value in env.items():
            args += ["--env", f"{key}={value}"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        for mount in ctr.get("volumeMounts", []):
            volume = volumes[mount["name"]]
            ro = ",ro" if mount.get("readOnly") else ""
            if "emptyDir" in volume:
                args += ["--mount", f"type=tmpfs,destination={mount['mountPath']},tmpfs-mode=0777"]
                continue
            source = self.volume_dir(volume)
            if "subPath" in mount:
                source = source / mount["subPath"]
            args += ["--mount", f"type=bind,source={source},destination={mount['mountPath']}{ro}"]
        if spec.get("automountServiceAccountToken", True):
            args += ["--mount", f"type=bind,source={self.service_account()},destination={SERVICE_ACCOUNT},ro"]
        return args

    def command(self, container: str) -> tuple[list[str], list[str]]:
        """(podman options before the image, arguments after it): command becomes --entrypoint."""
        spec = self.deployment["spec"]["template"]["spec"]
        (ctr,) = [c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == container]
        command, args = ctr.get("command", []), ctr.get("args", [])
        if not command:
            return [], args
        return ["--entrypoint", json.dumps(command)], args
