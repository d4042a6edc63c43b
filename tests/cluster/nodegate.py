"""nodegate as the chart installs it, against the real control plane: the chart's RBAC, service
account and webhook configurations (``helm template``, clientConfig rewritten to a URL on
127.0.0.1 with the test's caBundle), its CRDs, and ``nodegate serve`` processes started with a
config file (each stopped by PID; kill -9 for the lease tests)."""

from __future__ import annotations

import base64
import copy
import json
import re
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.plane import ControlPlane, PlaneError, Proc, free_port, spawn
from tests.support.service import EkCa

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "nodegate"
NAMESPACE = "nodegate"
USERNAME = f"system:serviceaccount:{NAMESPACE}:nodegate"
METRICS_TOKEN = "scraper"


def helm() -> Path:
    local = ROOT / ".venv" / "bin" / "helm"
    found = local if local.is_file() else shutil.which("helm")
    if found is None:
        raise PlaneError("helm is missing: run `make helm`")
    return Path(found)


def render_chart(**values: Any) -> list[dict[str, Any]]:
    """``helm template`` of the chart (release nodegate in namespace nodegate)."""
    # what the chart requires of every install (its schema refuses one without them)
    required = {
        "config.trust_domain": "fleet.test",
        "networkPolicy.apiServer.webhookSourceCidrs": ["127.0.0.1/32"],
    }
    sets: list[str] = []
    for key, value in {**required, **values}.items():
        sets += ["--set-json", f"{key}={json.dumps(value)}"]
    out = subprocess.run(
        [str(helm()), "template", "nodegate", str(CHART), "--namespace", NAMESPACE, *sets],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def webhooks_for(docs: list[dict[str, Any]], url: str, ca_pem: bytes) -> list[dict[str, Any]]:
    """The chart's webhook configurations with clientConfig pointing at ``url`` (a service
    reference resolves to a ClusterIP nothing serves here, as envtest does it too)."""
    out = []
    for original in docs:
        if original["kind"] not in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
            continue
        doc = copy.deepcopy(original)
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"{url}{path}", "caBundle": base64.b64encode(ca_pem).decode()}
        out.append(doc)
    return out


# Our own minimal CRDs for NodeWright's two API groups: the operator's module is not served by
# the proxy here, so its CRDs are unavailable (issue 36 point 4). Permissive on purpose: the
# object is kept as sent (x-kubernetes-preserve-unknown-fields), the status is a subresource.
def package_crds() -> list[dict[str, Any]]:
    crds = []
    for group, kind in (("skyhook.nvidia.com", "Skyhook"), ("nodewright.nvidia.com", "NodeWright")):
        for k in (kind, "DeploymentPolicy"):
            plural = k.lower() + "s" if k != "DeploymentPolicy" else "deploymentpolicies"
            crds.append(
                {
                    "apiVersion": "apiextensions.k8s.io/v1",
                    "kind": "CustomResourceDefinition",
                    "metadata": {"name": f"{plural}.{group}"},
                    "spec": {
                        "group": group,
                        "names": {"kind": k, "plural": plural, "singular": k.lower(), "listKind": f"{k}List"},
                        "scope": "Cluster",
                        "versions": [
                            {
                                "name": "v1alpha1",
                                "served": True,
                                "storage": True,
                                "subresources": {"status": {}},
                                "schema": {
                                    "openAPIV3Schema": {
                                        "type": "object",
                                        "x-kubernetes-preserve-unknown-fields": True,
                                    }
                                },
                            }
                        ],
                    },
                }
            )
    return crds


def chart_crds() -> list[dict[str, Any]]:
    return [yaml.safe_load(p.read_text()) for p in sorted((CHART / "crds").glob("*.yaml"))]


def wait_established(plane: ControlPlane, names: list[str]) -> None:
    plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", *[f"crd/{n}" for n in names])


@dataclass
class Installed:
    """What every nodegate process of the session shares."""

    folder: Path
    kubeconfig: Path  # nodegate's service account, through the TokenRequest API
    serving: tuple[Path, Path]
    ek_ca: EkCa
    webhook_port: int  # the admission listener the webhook configurations point at
    rendered: list[dict[str, Any]]


def install(plane: ControlPlane, folder: Path) -> Installed:
    """CRDs, the chart's RBAC and service account, a token for it; webhooks are applied later by
    ``apply_webhooks`` (a test wants the API server without them first)."""
    folder.mkdir(parents=True, exist_ok=True)
    crds = chart_crds() + package_crds()
    plane.kubectl("create", "namespace", NAMESPACE)
    plane.apply(crds)
    wait_established(plane, [c["metadata"]["name"] for c in crds])
    rendered = render_chart(
        metricsReaders=[{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "prometheus"}]
    )
    rbac_kinds = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    plane.apply([d for d in rendered if d["kind"] in rbac_kinds])
    token = plane.kubectl("create", "token", "nodegate", "-n", NAMESPACE, "--duration=6h").stdout.strip()
    kubeconfig = plane.write_kubeconfig(folder / "nodegate.kubeconfig", token=token)
    serving = plane.ca.issue(folder, "nodegate-serving", "nodegate", server=True)
    return Installed(folder, kubeconfig, serving, EkCa.create(), free_port(), rendered)


def apply_webhooks(plane: ControlPlane, inst: Installed) -> list[dict[str, Any]]:
    hooks = webhooks_for(inst.rendered, f"https://127.0.0.1:{inst.webhook_port}", plane.ca.pem)
    plane.apply(hooks)
    return hooks


@dataclass
class Nodegate:
    proc: Proc
    config: Path
    port: int
    admission_port: int
    ctx: ssl.SSLContext

    def get(self, path: str, *, admission: bool = False, token: str | None = None) -> tuple[int, str]:
        port = self.admission_port if admission else self.port
        req = urllib.request.Request(f"https://127.0.0.1:{port}{path}")
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=10) as resp:  # noqa: S310
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except (urllib.error.URLError, OSError):
            return 0, ""

    def metric(self, name: str, **labels: str) -> float:
        """Sum of a metric's samples whose labels include ``labels`` (scraped as user prometheus)."""
        status, text = self.get("/metrics", token=METRICS_TOKEN)
        assert status == 200, (status, text[:300])
        total = 0.0
        for line in text.splitlines():
            m = re.match(rf"^{re.escape(name)}(?:\{{(.*)\}})? (\S+)$", line)
            if not m:
                continue
            got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
            if all(got.get(k) == v for k, v in labels.items()):
                total += float(m.group(2))
        return total

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.proc.stop(sig)

    def restart(self) -> None:
        """The same process again (same config, ports and state) after ``stop``."""
        self.proc = spawn(self.proc.name, list(self.proc.popen.args), self.proc.log.parent)  # type: ignore[arg-type]
        wait_ready(self)


def start_nodegate(
    plane: ControlPlane,
    inst: Installed,
    name: str,
    *,
    admission_port: int | None = None,
    args: tuple[str, ...] = (),
    **settings: Any,
) -> Nodegate:
    port, admission_port = free_port(), admission_port or free_port()
    config = write_config(inst, name, port, admission_port, **settings)
    proc = spawn(
        f"nodegate-{name}", [str(nodegate_bin()), "serve", "--config", str(config), *args], inst.folder
    )
    ng = Nodegate(proc, config, port, admission_port, plane.ssl_context())
    wait_ready(ng)
    return ng


def nodegate_bin() -> Path:
    """The ``nodegate`` command of the running interpreter's environment."""
    return Path(sys.executable).parent / "nodegate"


def write_config(inst: Installed, name: str, port: int, admission_port: int, **settings: Any) -> Path:
    """The config of a nodegate named ``name`` (its folder under the install's), ``settings`` over
    the defaults here (a dict merged into the default's dict)."""
    folder = inst.folder / name
    folder.mkdir(exist_ok=True)
    doc: dict[str, Any] = {
        "trust_domain": "fleet.test",
        "listen": f"127.0.0.1:{port}",
        "state_dir": str(folder / "state"),
        "tls": {"cert_file": str(inst.serving[0]), "key_file": str(inst.serving[1])},
        "ek_roots": [str(inst.ek_ca.write(folder / "ek-root.pem"))],
        "server_names": ["localhost", "127.0.0.1"],
        "kubernetes": {
            "kubeconfig": str(inst.kubeconfig),
            "namespace": NAMESPACE,
            "events_namespace": NAMESPACE,
        },
        "admission": {"listen": f"127.0.0.1:{admission_port}"},
        "gate": {"enabled": False},
    }
    for key, value in settings.items():
        if isinstance(value, dict) and isinstance(doc.get(key), dict):
            doc[key] = {**doc[key], **value}
        else:
            doc[key] = value
    config = folder / "config.yaml"
    config.write_text(yaml.safe_dump(doc))
    return config


def wait_ready(ng: Nodegate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not ng.proc.alive():
            raise PlaneError(f"{ng.proc.name} exited; log {ng.proc.log}:\n{ng.proc.tail()}")
        if ng.get("/readyz", admission=True)[0] == 200:
            return
        time.sleep(0.2)
    ng.proc.stop()
    raise PlaneError(f"{ng.proc.name} not ready in {timeout:.0f} s; log {ng.proc.log}:\n{ng.proc.tail()}")


def start_gate(plane: ControlPlane, inst: Installed, name: str, *, lease: str = "15s") -> Nodegate:
    """``nodegate serve`` with the gate on (kubernetes store, stability window 0), as the gate
    benchmarks and tests/cluster/test_gate_churn.py run it; ``--new-ca``: their NodeAttestations
    are synthetic, no CA issued them."""
    return start_nodegate(
        plane,
        inst,
        name,
        args=("--new-ca",),
        store="kubernetes",
        gate={"enabled": True, "stability_window": "0s", "lease_duration": lease},
    )
