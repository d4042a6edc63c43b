"""The Helm chart (charts/nodegate): `helm lint` and `helm template` with the defaults and several
non-default values; every manifest against the Kubernetes API schema (kubernetes-validate, strict,
its newest version) or, for cert-manager and Prometheus Operator kinds it does not know, against
the shapes those CRDs define; the rendered nodegate config through nodegate's own config loader;
RBAC through the project's RBAC evaluator (admission/rbac/evaluator.py); the webhook configuration; the
values schema refusing bad values; the Helm-generated certificate kept across upgrades; and the
CA init container script (files/ca-init.py) against a fake API server.

helm is not a Debian or PyPI package: `scripts/get-helm.sh` installs it into .venv/bin. Without it
these tests fail (they never skip): CI must run that script first."""

from __future__ import annotations

import base64
import copy
import datetime as dt
import functools
import hashlib
import ipaddress
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import jsonschema  # type: ignore[import-untyped]
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from admission.rbac.evaluator import RbacEvaluator, ResourceAttributes, UserInfo
from attest import ca
from bootstrap.config import settings_from_obj

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "nodegate"
KUBELET_SIGNER = "kubernetes.io/kube-apiserver-client-kubelet"
RBAC_KINDS = ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
HELM_HINT = "helm is not installed: run `scripts/get-helm.sh` (installs .venv/bin/helm); CI must run it too"


@functools.cache
def k8s_version() -> str:
    """The newest Kubernetes schemas kubernetes-validate ships, asked when a test needs them (not at
    import: a change in that package fails those tests, not the collection of every chart test)."""
    return kubernetes_validate.latest_version()


Doc = dict[str, Any]


# -- running helm ---------------------------------------------------------------------------------


def helm_path() -> str:
    local = ROOT / ".venv" / "bin" / "helm"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which("helm")
    if found is None:
        pytest.fail(HELM_HINT, pytrace=False)
    return found


@pytest.fixture(scope="module")
def helm() -> str:
    path = helm_path()
    out = subprocess.run(
        [path, "version", "--template", "{{.Version}}"], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        pytest.fail(f"{path} does not run: {out.stderr.strip()} ({HELM_HINT})", pytrace=False)
    return path


class _StrictLoader(yaml.SafeLoader):
    """Duplicate keys in a manifest are a template bug (the API server would take the last one)."""


def _mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    keys = [loader.construct_object(k, deep=deep) for k, _v in node.value]
    dupes = sorted({str(k) for k in keys if keys.count(k) > 1})
    if dupes:
        raise yaml.constructor.ConstructorError(None, None, f"duplicate keys {dupes}", node.start_mark)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


# What every install must set (the chart refuses to render without them): the trust domain, and
# the webhook port's sources while the NetworkPolicy is on (test_required_values_are_refused_*).
TRUST_DOMAIN = "fleet.test"
WEBHOOK_SOURCES = ["192.0.2.0/24"]


REQUIRED_SETS = (
    "--set",
    f"config.trust_domain={TRUST_DOMAIN}",
    "--set",
    "networkPolicy.apiServer.webhookSourceCidrs={" + ",".join(WEBHOOK_SOURCES) + "}",
)


def with_required(values: Doc) -> Doc:
    """``values`` with the required keys filled where the test leaves them out (``None``: keep
    them out, to test the refusal)."""
    out = copy.deepcopy(values)
    config = out.setdefault("config", {})
    if "trust_domain" not in config:
        config["trust_domain"] = TRUST_DOMAIN
    elif config["trust_domain"] is None:
        del config["trust_domain"]
    api = out.setdefault("networkPolicy", {}).setdefault("apiServer", {})
    if "webhookSourceCidrs" not in api and "cidrs" not in api:
        api["webhookSourceCidrs"] = WEBHOOK_SOURCES
    return out


def _helm(
    helm: str, tmp: Path, command: str, values: Doc, namespace: str, release: str, chart: Path = CHART
) -> subprocess.CompletedProcess[str]:
    vfile = tmp / f"values-{len(list(tmp.iterdir()))}.yaml"
    values = with_required(values)  # the chart, or a copy of it (lookup_chart)
    vfile.write_text(yaml.safe_dump(values))
    args = [helm, command]
    if command == "template":
        args.append(release)
    args += [str(chart), "--namespace", namespace, "-f", str(vfile)]
    return subprocess.run(args, capture_output=True, text=True, check=False, timeout=120)


def render(
    helm: str,
    tmp: Path,
    values: Doc | None = None,
    *,
    namespace: str = "nodegate",
    release: str = "ng",
    chart: Path = CHART,
) -> list[Doc]:
    out = _helm(helm, tmp, "template", values or {}, namespace, release, chart)
    assert out.returncode == 0, f"helm template failed:\n{out.stderr}"
    docs = [d for d in yaml.load_all(out.stdout, Loader=_StrictLoader) if d is not None]
    assert all(isinstance(d, dict) for d in docs)
    return docs


def render_error(helm: str, tmp: Path, values: Doc) -> str:
    out = _helm(helm, tmp, "template", values, "nodegate", "ng")
    assert out.returncode != 0, f"helm template accepted {values}"
    return out.stderr


def one(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def kinds(docs: list[Doc]) -> list[str]:
    return sorted(d["kind"] for d in docs)


# -- scenarios ------------------------------------------------------------------------------------

# name -> (values, namespace, release)
SCENARIOS: dict[str, tuple[Doc, str, str]] = {
    "defaults": ({}, "nodegate", "ng"),
    "cert-manager": ({"certManager": {"enabled": True}}, "nodegate", "ng"),
    "cert-manager-cluster-issuer": (
        {"certManager": {"enabled": True, "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}},
        "nodegate",
        "ng",
    ),
    "service-monitor": (
        {
            "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
            "metricsReaders": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}],
        },
        "nodegate",
        "ng",
    ),
    "service-monitor-token-secret": (
        {"serviceMonitor": {"enabled": True, "bearerTokenSecret": {"name": "prom-token", "key": "token"}}},
        "nodegate",
        "ng",
    ),
    "five-replicas": ({"replicaCount": 5, "webhook": {"timeoutSeconds": 3}}, "nodegate", "ng"),
    "sqlite": ({"store": "sqlite", "replicaCount": 1, "persistence": {"enabled": True}}, "nodegate", "ng"),
    "sqlite-emptydir": ({"store": "sqlite", "replicaCount": 1}, "nodegate", "ng"),
    "custom-namespace": ({"config": {"trust_domain": "fleet.example.com"}}, "gpu-trust", "edge"),
    "disk-keys": (
        {
            "config": {
                "pcr_policy": {"classes": [{"name": "fleet", "golden": {"sha256": {0: ["00" * 32]}}}]},
                "disk_keys": {"classes": ["fleet"], "require_measured_boot": False},
            }
        },
        "nodegate",
        "ng",
    ),
    "own-ca-secret": (
        {"ca": {"create": False, "generate": False, "secretName": "corp-nodegate-ca"}},
        "nodegate",
        "ng",
    ),
    "exposed": (
        {
            "service": {"type": "LoadBalancer", "loadBalancerSourceRanges": ["10.20.0.0/16"]},
            "tls": {"extraDnsNames": ["join.fleet.example.com"], "ipAddresses": ["192.0.2.10"]},
            "ekRoots": {"configMap": "ek-roots"},
            "networkPolicy": {
                "ingressFrom": [{"ipBlock": {"cidr": "10.20.0.0/16"}}],
                "apiServer": {"cidrs": ["192.0.2.1/32"], "ports": [6443]},
            },
            "config": {
                "trust_domain": "fleet.example.com",
                "ek_roots": ["/etc/ssl/ek"],
                "gate": {"stability_window": "0s", "quarantine_effect": "NoExecute"},
                "kubernetes": {"csr_timeout": "30s"},
                "limits": {"join_rate": 20, "join_burst": 50},
            },
            "nodeSelector": {"node-role.kubernetes.io/system": ""},
        },
        "edge-system",
        "nodegate",
    ),
}


@pytest.fixture(scope="module", params=sorted(SCENARIOS))
def scenario(
    request: pytest.FixtureRequest, helm: str, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Doc, str, list[Doc]]:
    name: str = request.param
    values, namespace, release = SCENARIOS[name]
    docs = render(helm, tmp_path_factory.mktemp(name), values, namespace=namespace, release=release)
    return name, values, namespace, docs


def test_lint_defaults_and_scenarios(helm: str, tmp_path: Path) -> None:
    for name, (values, namespace, release) in sorted(SCENARIOS.items()):
        out = _helm(helm, tmp_path, "lint", values, namespace, release)
        assert out.returncode == 0, f"helm lint ({name}) failed:\n{out.stdout}\n{out.stderr}"
        assert "0 chart(s) failed" in out.stdout, out.stdout


def test_kinds_per_scenario(scenario: tuple[str, Doc, str, list[Doc]]) -> None:
    name, values, _ns, docs = scenario
    present = set(kinds(docs))
    always = {"ConfigMap", "Deployment", "Service", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
              "Role", "RoleBinding", "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration",
              "NetworkPolicy"}  # fmt: skip
    assert always <= present, always - present
    cert_manager = values.get("certManager", {}).get("enabled", False)
    assert ("Certificate" in present) == cert_manager
    assert ("ServiceMonitor" in present) == values.get("serviceMonitor", {}).get("enabled", False)
    assert ("PodDisruptionBudget" in present) == (values.get("replicaCount", 3) > 1)
    assert ("PersistentVolumeClaim" in present) == (name == "sqlite")
    tls_secrets = [d for d in docs if d["kind"] == "Secret" and d.get("type") == "kubernetes.io/tls"]
    assert len(tls_secrets) == (0 if cert_manager else 1)
    if name == "cert-manager":
        assert kinds([d for d in docs if d["apiVersion"].startswith("cert-manager.io/")]) == [
            "Certificate", "Certificate", "Issuer", "Issuer"]  # fmt: skip
    if name == "cert-manager-cluster-issuer":  # the user's issuer: no chart-made CA
        assert kinds([d for d in docs if d["apiVersion"].startswith("cert-manager.io/")]) == ["Certificate"]
    assert not any(d["kind"] == "CustomResourceDefinition" for d in docs), "CRDs live in crds/, not templates"
    disk = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == "nodegate-disk-keys"]
    assert len(disk) == (1 if values.get("config", {}).get("disk_keys") else 0)
    assert all(
        "data" not in d and d["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep" for d in disk
    )


# -- schemas ----------------------------------------------------------------------------------------

_NAME = {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "maxLength": 253}
_META = {
    "type": "object",
    "required": ["name", "namespace"],
    "properties": {
        "name": _NAME,
        "namespace": _NAME,
        "labels": {"type": "object"},
        "annotations": {"type": "object"},
    },
    "additionalProperties": False,
}
_ISSUER_REF = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": _NAME,
        "kind": {"enum": ["Issuer", "ClusterIssuer"]},
        "group": {"const": "cert-manager.io"},
    },
    "additionalProperties": False,
}
_DURATION = {"type": "string", "pattern": r"^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$"}


def _top(api_version: str, kind: str, spec: Doc) -> Doc:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": api_version},
            "kind": {"const": kind},
            "metadata": _META,
            "spec": spec,
        },
        "additionalProperties": False,
    }


# The fields of cert-manager.io/v1 and monitoring.coreos.com/v1 the chart uses, as their CRDs define
# them; anything else is refused so that a typo cannot pass as an unknown field.
CRD_SHAPES: dict[tuple[str, str], Doc] = {
    ("cert-manager.io/v1", "Issuer"): _top(
        "cert-manager.io/v1",
        "Issuer",
        {
            "type": "object",
            "minProperties": 1,
            "maxProperties": 1,
            "properties": {
                "selfSigned": {"type": "object", "maxProperties": 0},
                "ca": {
                    "type": "object",
                    "required": ["secretName"],
                    "properties": {"secretName": _NAME},
                    "additionalProperties": False,
                },
            },
            "additionalProperties": False,
        },
    ),
    ("cert-manager.io/v1", "Certificate"): _top(
        "cert-manager.io/v1",
        "Certificate",
        {
            "type": "object",
            "required": ["secretName", "issuerRef"],
            "properties": {
                "secretName": _NAME,
                "secretTemplate": {
                    "type": "object",
                    "properties": {"labels": {"type": "object"}, "annotations": {"type": "object"}},
                    "additionalProperties": False,
                },
                "isCA": {"type": "boolean"},
                "commonName": {"type": "string", "maxLength": 64},
                "dnsNames": {"type": "array", "minItems": 1, "items": {"type": "string"}},
                "ipAddresses": {"type": "array", "items": {"type": "string"}},
                "duration": _DURATION,
                "renewBefore": _DURATION,
                "usages": {
                    "type": "array",
                    "items": {
                        "enum": [
                            "server auth",
                            "client auth",
                            "digital signature",
                            "key encipherment",
                            "cert sign",
                        ]
                    },
                },
                "privateKey": {
                    "type": "object",
                    "properties": {
                        "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                        "size": {"type": "integer"},
                        "rotationPolicy": {"enum": ["Never", "Always"]},
                    },
                    "additionalProperties": False,
                },
                "issuerRef": _ISSUER_REF,
            },
            "additionalProperties": False,
        },
    ),
    ("monitoring.coreos.com/v1", "ServiceMonitor"): _top(
        "monitoring.coreos.com/v1",
        "ServiceMonitor",
        {
            "type": "object",
            "required": ["selector", "endpoints"],
            "properties": {
                "selector": {
                    "type": "object",
                    "properties": {"matchLabels": {"type": "object"}},
                    "additionalProperties": False,
                },
                "namespaceSelector": {
                    "type": "object",
                    "properties": {"matchNames": {"type": "array", "items": _NAME}},
                    "additionalProperties": False,
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "properties": {
                            "port": {"type": "string"},
                            "scheme": {"enum": ["http", "https"]},
                            "path": {"type": "string", "pattern": "^/"},
                            "interval": _DURATION,
                            "scrapeTimeout": _DURATION,
                            "bearerTokenFile": {"type": "string"},
                            "authorization": {
                                "type": "object",
                                "properties": {
                                    "type": {"type": "string"},
                                    "credentials": {
                                        "type": "object",
                                        "required": ["name", "key"],
                                        "properties": {"name": _NAME, "key": {"type": "string"}},
                                        "additionalProperties": False,
                                    },
                                },
                                "additionalProperties": False,
                            },
                            "tlsConfig": {
                                "type": "object",
                                "properties": {
                                    "serverName": {"type": "string"},
                                    "ca": {
                                        "type": "object",
                                        "properties": {
                                            "secret": {
                                                "type": "object",
                                                "required": ["name", "key"],
                                                "properties": {"name": _NAME, "key": {"type": "string"}},
                                                "additionalProperties": False,
                                            }
                                        },
                                        "additionalProperties": False,
                                    },
                                },
                                "additionalProperties": False,
                            },
                        },
                        "not": {"required": ["bearerTokenFile", "authorization"]},
                        "additionalProperties": False,
                    },
                },
            },
            "additionalProperties": False,
        },
    ),
}


def test_every_manifest_validates(scenario: tuple[str, Doc, str, list[Doc]]) -> None:
    _name, _values, _ns, docs = scenario
    for doc in docs:
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        shape = CRD_SHAPES.get((doc["apiVersion"], doc["kind"]))
        if shape is not None:
            jsonschema.Draft202012Validator.check_schema(shape)
            errors = [
                f"{'.'.join(map(str, e.path))}: {e.message}"
                for e in jsonschema.Draft202012Validator(shape).iter_errors(doc)
            ]
            assert not errors, f"{where}: {errors}"
            continue
        try:
            kubernetes_validate.validate(doc, k8s_version(), strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{where} fails Kubernetes {k8s_version()}: {path}: {exc.message}")


def test_validation_catches_a_typo(helm: str, tmp_path: Path) -> None:
    """The strict schemas reject a field the API server would drop, so the test above means something."""
    docs = render(helm, tmp_path)
    bad = copy.deepcopy(one(docs, "Deployment"))
    bad["spec"]["template"]["spec"]["containers"][0]["readOnlyRootFilesytem"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, k8s_version(), strict=True)
    cert = {"apiVersion": "cert-manager.io/v1", "kind": "Certificate",
            "metadata": {"name": "x", "namespace": "y"},
            "spec": {"secretName": "x", "issuerRef": {"name": "i"}, "dnsName": ["a"]}}  # fmt: skip
    assert list(
        jsonschema.Draft202012Validator(CRD_SHAPES[("cert-manager.io/v1", "Certificate")]).iter_errors(cert)
    )


# -- the workload ---------------------------------------------------------------------------------


def pod_spec(docs: list[Doc]) -> Doc:
    spec: Doc = one(docs, "Deployment")["spec"]["template"]["spec"]
    return spec


def container(docs: list[Doc], name: str = "nodegate") -> Doc:
    spec = pod_spec(docs)
    found = [c for c in spec["containers"] + spec.get("initContainers", []) if c["name"] == name]
    assert len(found) == 1
    chosen: Doc = found[0]
    return chosen


def rendered_config(docs: list[Doc]) -> Doc:
    cm = one(docs, "ConfigMap")
    cfg = yaml.safe_load(cm["data"]["config.yaml"])
    assert isinstance(cfg, dict)
    return cfg


def service_account(docs: list[Doc], namespace: str) -> str:
    name: str = pod_spec(docs)["serviceAccountName"]
    return f"system:serviceaccount:{namespace}:{name}"


def test_config_is_accepted_by_nodegate(scenario: tuple[str, Doc, str, list[Doc]]) -> None:
    _name, values, namespace, docs = scenario
    settings = settings_from_obj(rendered_config(docs))  # raises ConfigError on any bad key
    assert settings.store == values.get("store", "kubernetes")
    assert settings.listen == "0.0.0.0:8443"
    assert settings.kubernetes.kubeconfig is None  # in-cluster
    assert settings.kubernetes.namespace == namespace
    assert settings.kubernetes.events_namespace == namespace
    assert settings.gate.lease_namespace == namespace
    assert settings.admission.owner == service_account(docs, namespace)
    assert settings.trust_domain == with_required(values)["config"]["trust_domain"]
    # The webhooks' listener keeps room for the sources its NetworkPolicy admits (issue 41).
    policy = with_required(values)["networkPolicy"]
    if policy.get("enabled", True):
        admitted = policy["apiServer"].get("webhookSourceCidrs") or policy["apiServer"].get("cidrs")
        assert [str(n) for n in settings.admission.api_server_sources] == admitted
    else:
        assert settings.admission.api_server_sources == ()
    # TLS files are where the TLS Secret is mounted; the CA Secret is mounted at state_dir/ca.
    mounts = {m["mountPath"]: m for m in container(docs)["volumeMounts"]}
    assert settings.tls.cert_file is not None
    assert settings.tls.key_file is not None
    assert str(settings.tls.cert_file.parent) in mounts
    assert str(settings.tls.key_file.parent) in mounts
    tls_volume = next(
        v
        for v in pod_spec(docs)["volumes"]
        if v["name"] == mounts[str(settings.tls.cert_file.parent)]["name"]
    )
    issued = [
        d["metadata"]["name"] for d in docs if d["kind"] == "Secret" and d.get("type") == "kubernetes.io/tls"
    ]
    issued += [
        d["spec"]["secretName"] for d in docs if d["kind"] == "Certificate" and not d["spec"].get("isCA")
    ]
    assert issued == [tls_volume["secret"]["secretName"]]
    # The pods get the leaf and its key, never the Helm-generated CA's key.
    assert {i["key"] for i in tls_volume["secret"]["items"]} == {"tls.crt", "tls.key"}
    ca_mount = mounts[str(settings.state_dir / "ca")]
    assert ca_mount["readOnly"] is True
    key_mount = mounts[str(settings.state_dir / "session.key")]
    assert key_mount["subPath"] == "session.key"
    assert key_mount["name"] == ca_mount["name"]
    if values.get("ekRoots", {}).get("configMap"):
        assert Path("/etc/nodegate/ek-roots") in settings.ek_roots
        assert Path("/etc/ssl/ek") in settings.ek_roots
        assert "/etc/nodegate/ek-roots" in mounts


def test_user_config_passes_through(helm: str, tmp_path: Path) -> None:
    values, namespace, release = SCENARIOS["exposed"]
    settings = settings_from_obj(
        rendered_config(render(helm, tmp_path, values, namespace=namespace, release=release))
    )
    assert settings.gate.stability_window == dt.timedelta(0)
    assert settings.gate.quarantine_effect == "NoExecute"
    assert settings.kubernetes.csr_timeout == dt.timedelta(seconds=30)
    assert settings.limits.join_rate == 20
    assert settings.limits.join_burst == 50


def test_deployment(scenario: tuple[str, Doc, str, list[Doc]]) -> None:
    name, values, namespace, docs = scenario
    deploy = one(docs, "Deployment")
    assert deploy["metadata"]["namespace"] == namespace
    replicas = values.get("replicaCount", 3)
    assert deploy["spec"]["replicas"] == replicas
    spec = pod_spec(docs)
    labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert deploy["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert spec["priorityClassName"] == "system-cluster-critical"
    # Soft anti-affinity over hosts, selecting this release's pods.
    anti = spec["affinity"]["podAntiAffinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in anti
    term = anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == deploy["spec"]["selector"]["matchLabels"]
    if values.get("store") == "sqlite":
        assert deploy["spec"]["strategy"] == {"type": "Recreate"}
    else:
        assert deploy["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    main = container(docs)
    assert main["command"] == ["nodegate"]
    assert main["args"][:2] == ["serve", "--config"]
    config_path = Path(main["args"][2])
    config_mount = next(m for m in main["volumeMounts"] if m["mountPath"] == str(config_path.parent))
    config_volume = next(v for v in spec["volumes"] if v["name"] == config_mount["name"])
    assert config_volume["configMap"]["name"] == one(docs, "ConfigMap")["metadata"]["name"]
    assert config_path.name in one(docs, "ConfigMap")["data"]
    env = {e["name"]: e for e in main["env"]}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert main["ports"] == [
        {"name": "https", "containerPort": 8443, "protocol": "TCP"},
        {"name": "admission", "containerPort": 9443, "protocol": "TCP"},
    ]
    assert rendered_config(docs)["admission"]["listen"] == "0.0.0.0:9443"  # the webhooks' own listener
    for probe, path in (
        ("readinessProbe", "/readyz"),
        ("livenessProbe", "/healthz"),
        ("startupProbe", "/healthz"),
    ):
        assert main[probe]["httpGet"] == {"path": path, "port": "https", "scheme": "HTTPS"}, probe
    for c in spec["containers"] + spec["initContainers"]:
        assert c["resources"]["requests"]["cpu"], c["name"]
        assert c["resources"]["requests"]["memory"], c["name"]
        assert c["resources"]["limits"]["memory"], c["name"]
    state = next(v for v in spec["volumes"] if v["name"] == "state")
    if name == "sqlite":
        assert (
            state["persistentVolumeClaim"]["claimName"]
            == one(docs, "PersistentVolumeClaim")["metadata"]["name"]
        )
    else:
        assert "emptyDir" in state
    if "nodeSelector" in values:
        assert spec["nodeSelector"] == values["nodeSelector"]
    assert_restricted(spec)


def assert_restricted(spec: Doc) -> None:
    """The Pod Security Standards "restricted" profile, checked field by field."""
    allowed_volumes = {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
    for v in spec["volumes"]:
        assert set(v) - {"name"} <= allowed_volumes, v
    for field in ("hostNetwork", "hostPID", "hostIPC", "hostUsers"):
        assert not spec.get(field), field
    pod = spec["securityContext"]
    assert pod["runAsNonRoot"] is True
    assert pod["runAsUser"] != 0
    assert pod["seccompProfile"]["type"] == "RuntimeDefault"
    for c in spec["containers"] + spec.get("initContainers", []):
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False, c["name"]
        assert sc["capabilities"]["drop"] == ["ALL"], c["name"]
        assert not sc["capabilities"].get("add"), c["name"]
        assert sc["readOnlyRootFilesystem"] is True, c["name"]
        assert not sc.get("privileged"), c["name"]
        assert sc.get("runAsUser", 1) != 0, c["name"]
        assert sc["seccompProfile"]["type"] == "RuntimeDefault", c["name"]
        assert all("hostPort" not in p for p in c.get("ports", [])), c["name"]


def test_ca_init_container(scenario: tuple[str, Doc, str, list[Doc]]) -> None:
    name, _values, _ns, docs = scenario
    init = container(docs, "ca-init")
    env = {e["name"]: e.get("value") for e in init["env"]}
    script = Path(init["command"][1])
    assert init["command"][0] == "python3"
    assert script.name in one(docs, "ConfigMap")["data"]
    ca_volume = next(v for v in pod_spec(docs)["volumes"] if v["name"] == "ca")
    assert env["NODEGATE_CA_SECRET"] == ca_volume["secret"]["secretName"]
    assert env["NODEGATE_CA_DIR"] == "/var/lib/nodegate/ca"
    assert env["NODEGATE_TRUST_DOMAIN"] == rendered_config(docs)["trust_domain"]
    own = name == "own-ca-secret"
    assert env["NODEGATE_CA_GENERATE"] == ("false" if own else "true")
    ca_secrets = [
        d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == env["NODEGATE_CA_SECRET"]
    ]
    if own:
        assert env["NODEGATE_CA_SECRET"] == "corp-nodegate-ca"
        assert not ca_secrets
    else:
        (secret,) = ca_secrets
        # No key material in the release: the pods write it.
        assert "data" not in secret
        assert "stringData" not in secret
        assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_service_pdb_networkpolicy(scenario: tuple[str, Doc, str, list[Doc]]) -> None:
    _name, values, _ns, docs = scenario
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    svc = one(docs, "Service")
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert svc["spec"]["ports"][0]["targetPort"] == "https"
    assert svc["spec"]["ports"][0]["port"] == 443
    assert svc["spec"]["ports"][1] == {
        "name": "admission",
        "port": 9443,
        "targetPort": "admission",
        "protocol": "TCP",
    }
    assert svc["spec"]["type"] == values.get("service", {}).get("type", "ClusterIP")
    if values.get("replicaCount", 3) > 1:
        pdb = one(docs, "PodDisruptionBudget")
        assert pdb["spec"]["minAvailable"] == 1
        assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    np = one(docs, "NetworkPolicy")["spec"]
    assert np["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert np["policyTypes"] == ["Ingress", "Egress"]
    assert [r["ports"] for r in np["ingress"]] == [
        [{"port": "https", "protocol": "TCP"}],
        [{"port": "admission", "protocol": "TCP"}],
    ]
    # The webhook port: only the API server's source addresses (its egress CIDRs by default).
    api = with_required(values)["networkPolicy"]["apiServer"]
    sources = api.get("webhookSourceCidrs") or api.get("cidrs") or []
    assert sources  # required: the port is never open to every source by default
    webhook_rule = np["ingress"][1]
    assert webhook_rule["from"] == [{"ipBlock": {"cidr": c}} for c in sources]
    egress_ports = {(p["protocol"], p["port"]) for r in np["egress"] for p in r["ports"]}
    assert {("UDP", 53), ("TCP", 53)} <= egress_ports
    api_ports = values.get("networkPolicy", {}).get("apiServer", {}).get("ports", [443, 6443])
    assert {("TCP", p) for p in api_ports} <= egress_ports


def test_the_api_server_sources_a_user_sets_win(helm: str, tmp_path: Path) -> None:
    values = {"config": {"admission": {"api_server_sources": ["198.51.100.7/32"]}}}
    settings = settings_from_obj(rendered_config(render(helm, tmp_path, values)))
    assert [str(n) for n in settings.admission.api_server_sources] == ["198.51.100.7/32"]


def test_service_monitor(helm: str, tmp_path: Path) -> None:
    for name in ("service-monitor", "service-monitor-token-secret"):
        values, namespace, release = SCENARIOS[name]
        docs = render(helm, tmp_path, values, namespace=namespace, release=release)
        sm = one(docs, "ServiceMonitor")
        svc = one(docs, "Service")
        assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
        (endpoint,) = sm["spec"]["endpoints"]
        assert endpoint["port"] == svc["spec"]["ports"][0]["name"]
        assert endpoint["scheme"] == "https"
        assert endpoint["path"] == "/metrics"
        assert endpoint["tlsConfig"]["ca"]["secret"] == {"name": "ng-nodegate-tls", "key": "ca.crt"}
        assert endpoint["tlsConfig"]["serverName"] == f"{svc['metadata']['name']}.{namespace}.svc"
        if name == "service-monitor":
            assert sm["metadata"]["labels"]["release"] == "prom"
            assert "bearerTokenFile" in endpoint
            reader = one(docs, "ClusterRole", "ng-nodegate-metrics-reader")
            assert reader["rules"] == [
                {"apiGroups": ["nodegate.io"], "resources": ["metrics"], "verbs": ["get"]}
            ]
            rbac = RbacEvaluator.from_objects([d for d in docs if d["kind"] in RBAC_KINDS])
            prom = UserInfo("system:serviceaccount:monitoring:prometheus", groups=("system:serviceaccounts",))
            assert rbac.allowed(prom, ResourceAttributes("get", "nodegate.io", "metrics"))
        else:
            assert endpoint["authorization"]["credentials"] == {"name": "prom-token", "key": "token"}


# -- RBAC -------------------------------------------------------------------------------------------

# Every (apiGroup, resource, verb) the chart grants nodegate, and where: each one is a code path in
# bootstrap/kube.py's callers (docs/gate.md, docs/operations.md). A new grant must be added here.
CLUSTER_GRANTS = (
    {("", "nodes", v) for v in ("get", "list", "watch", "create", "patch")}
    | {
        ("", "nodes/status", "patch"),
        ("", "pods", "list"),  # read-only: a failing package pod's container (issue 45)
        ("certificates.k8s.io", "certificatesigningrequests", "create"),
        ("certificates.k8s.io", "certificatesigningrequests", "get"),
        ("certificates.k8s.io", "certificatesigningrequests", "list"),
        ("certificates.k8s.io", "certificatesigningrequests", "watch"),
        ("certificates.k8s.io", "certificatesigningrequests/approval", "update"),
        ("certificates.k8s.io", "signers", "approve"),
        ("authentication.k8s.io", "tokenreviews", "create"),
        ("authorization.k8s.io", "subjectaccessreviews", "create"),
        ("nodegate.io", "packagepolicies", "get"),
        ("nodegate.io", "packagepolicies", "list"),
        ("nodegate.io", "packagepolicies", "watch"),
        ("nodegate.io", "nodeattestations/status", "get"),
        ("nodegate.io", "nodeattestations/status", "patch"),
        ("nodewright.nvidia.com", "nodewrights", "get"),
        ("nodewright.nvidia.com", "nodewrights", "list"),
        ("nodewright.nvidia.com", "nodewrights", "watch"),
        ("skyhook.nvidia.com", "skyhooks", "get"),
        ("skyhook.nvidia.com", "skyhooks", "list"),
        ("skyhook.nvidia.com", "skyhooks", "watch"),
    }
    | {("nodegate.io", "nodeattestations", v) for v in ("get", "list", "watch", "create", "patch")}
)
NAMESPACE_GRANTS = {("coordination.k8s.io", "leases", v) for v in ("get", "create", "update", "delete")}
# Events about Nodes and NodeAttestations (cluster-scoped) are accepted only in default.
EVENT_GRANTS = {("", "events", "create")}


def _grants(rules: list[Doc]) -> set[tuple[str, str, str]]:
    return {
        (g, r, v)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


def _own_roles(docs: list[Doc], sa: str) -> tuple[list[Doc], list[Doc]]:
    """(ClusterRoles, Roles) bound to nodegate's service account."""
    ns, name = sa.split(":")[2:]
    bound: set[tuple[str, str]] = set()
    for b in docs:
        if b["kind"] in ("ClusterRoleBinding", "RoleBinding") and any(
            s["kind"] == "ServiceAccount" and s["name"] == name and s.get("namespace") == ns
            for s in b["subjects"]
        ):
            bound.add((b["roleRef"]["kind"], b["roleRef"]["name"]))
    cluster = [
        d for d in docs if d["kind"] == "ClusterRole" and ("ClusterRole", d["metadata"]["name"]) in bound
    ]
    roles = [d for d in docs if d["kind"] == "Role" and ("Role", d["metadata"]["name"]) in bound]
    return cluster, roles


def test_rbac_least_privilege(scenario: tuple[str, Doc, str, list[Doc]]) -> None:
    _name, values, namespace, docs = scenario
    for doc in docs:
        if doc["kind"] not in ("ClusterRole", "Role"):
            continue
        for rule in doc["rules"]:
            where = f"{doc['kind']}/{doc['metadata']['name']} {rule}"
            assert "nonResourceURLs" not in rule, where
            for key in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert not any("*" in item for item in rule.get(key, [])), f"wildcard in {key}: {where}"
            assert not {"escalate", "bind", "impersonate", "deletecollection"} & set(rule["verbs"]), where
            if "secrets" in rule["resources"]:
                assert doc["kind"] == "Role", f"Secrets must never be granted cluster-wide: {where}"
            if "approve" in rule["verbs"]:
                assert rule == {"apiGroups": ["certificates.k8s.io"], "resources": ["signers"],
                                "resourceNames": [KUBELET_SIGNER], "verbs": ["approve"]}, where  # fmt: skip
    sa = service_account(docs, namespace)
    cluster, roles = _own_roles(docs, sa)
    assert len(cluster) == 1
    assert len(roles) == 2
    assert not any("aggregationRule" in c for c in cluster)
    assert _grants(cluster[0]["rules"]) == CLUSTER_GRANTS
    (events,) = [r for r in roles if r["metadata"]["name"].endswith("-node-events")]
    (role,) = [r for r in roles if r is not events]
    assert events["metadata"]["namespace"] == "default"
    assert _grants(events["rules"]) == EVENT_GRANTS
    assert role["metadata"]["namespace"] == namespace
    secret_rules = [r for r in role["rules"] if "secrets" in r["resources"]]
    other = [r for r in role["rules"] if "secrets" not in r["resources"]]
    assert _grants(other) == NAMESPACE_GRANTS
    generate = values.get("ca", {}).get("generate", True)
    ca_secret = next(v for v in pod_spec(docs)["volumes"] if v["name"] == "ca")["secret"]["secretName"]
    if generate:
        assert [r for r in secret_rules if r.get("resourceNames") != ["nodegate-disk-keys"]] == [
            {
                "apiGroups": [""],
                "resources": ["secrets"],
                "resourceNames": [ca_secret],
                "verbs": ["get", "patch"],
            }
        ]
    else:
        assert secret_rules == [], "without ca.generate the pods need no Secret access at all"
    disk = values.get("config", {}).get("disk_keys")
    disk_rules = [r for r in secret_rules if r.get("resourceNames") == ["nodegate-disk-keys"]]
    grant = {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["nodegate-disk-keys"]}
    assert disk_rules == ([{**grant, "verbs": ["get", "update"]}] if disk else [])


def test_rbac_decisions(scenario: tuple[str, Doc, str, list[Doc]]) -> None:
    """The same questions the API server's RBAC authorizer would answer, via admission/rbac/evaluator.py."""
    _name, values, namespace, docs = scenario
    rbac = RbacEvaluator.from_objects([d for d in docs if d["kind"] in RBAC_KINDS])
    user = UserInfo(
        service_account(docs, namespace),
        groups=("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"),
    )

    def can(verb: str, group: str, resource: str, *, sub: str = "", name: str = "", ns: str = "") -> bool:
        return rbac.allowed(user, ResourceAttributes(verb, group, resource, sub, name, ns))

    assert can("approve", "certificates.k8s.io", "signers", name=KUBELET_SIGNER)
    for signer in (
        "kubernetes.io/kube-apiserver-client",
        "kubernetes.io/kubelet-serving",
        "kubernetes.io/legacy-unknown",
        "kubernetes.io/*",
        "example.com/custom",
    ):
        assert not can("approve", "certificates.k8s.io", "signers", name=signer), signer
    assert not can("approve", "certificates.k8s.io", "signers")  # a request without a name never matches
    assert can(
        "update", "certificates.k8s.io", "certificatesigningrequests", sub="approval", name="nodegate-x"
    )
    assert not can(
        "update", "certificates.k8s.io", "certificatesigningrequests", sub="status", name="nodegate-x"
    )
    assert not can("delete", "certificates.k8s.io", "certificatesigningrequests", name="nodegate-x")
    assert can("patch", "", "nodes", name="gpu-1")
    assert can("patch", "", "nodes", sub="status", name="gpu-1")
    assert not can("delete", "", "nodes", name="gpu-1")
    assert not can("update", "", "nodes", name="gpu-1")
    assert can("create", "coordination.k8s.io", "leases", ns=namespace)
    assert not can("create", "coordination.k8s.io", "leases", ns="kube-system")
    assert can("create", "", "events", ns="default")
    assert not can("create", "", "events", ns="kube-system")
    assert not can("update", "", "events", ns="default")
    ca_secret = next(v for v in pod_spec(docs)["volumes"] if v["name"] == "ca")["secret"]["secretName"]
    generate = values.get("ca", {}).get("generate", True)
    assert can("get", "", "secrets", name=ca_secret, ns=namespace) == generate
    assert can("patch", "", "secrets", name=ca_secret, ns=namespace) == generate
    for verb in ("get", "list", "watch", "create", "update", "delete"):
        assert not can(verb, "", "secrets", name="other", ns=namespace), verb
        assert not can(verb, "", "secrets", ns=namespace), verb
        assert not can(verb, "", "secrets", name=ca_secret, ns="default"), verb
    assert not can("update", "", "secrets", name=ca_secret, ns=namespace)
    assert not can("delete", "", "secrets", name=ca_secret, ns=namespace)
    assert not can("create", "", "pods", ns=namespace)
    assert can("list", "", "pods", ns="gpu-operator")  # the package pods, read-only
    for verb in ("get", "watch", "create", "update", "patch", "delete", "deletecollection"):
        assert not can(verb, "", "pods", ns="gpu-operator"), verb
    assert not can("get", "", "pods", sub="log", name="x", ns="gpu-operator")
    assert not can("create", "", "pods", sub="exec", name="x", ns="gpu-operator")
    assert not can("create", "", "serviceaccounts", sub="token", name="x", ns=namespace)
    for kind in ("nodewrights", "skyhooks"):
        group = "nodewright.nvidia.com" if kind == "nodewrights" else "skyhook.nvidia.com"
        assert can("watch", group, kind)
        assert not can("update", group, kind, name="x")
        assert not can("create", group, kind)
    assert not can(
        "update", "admissionregistration.k8s.io", "validatingwebhookconfigurations", name="ng-nodegate"
    )
    assert not can(
        "deploy", "nodegate.io", "packagepolicies", name="h100"
    )  # nodegate never deploys packages itself


# -- webhook ----------------------------------------------------------------------------------------

EXPECTED_RULES = {
    # DELETE of package CRs is judged like a change (issue 33, finding 5); of DeploymentPolicies not.
    "packages.nodegate.io": {
        ("nodewright.nvidia.com", "nodewrights", op) for op in ("CREATE", "UPDATE", "DELETE")
    }
    | {("skyhook.nvidia.com", "skyhooks", op) for op in ("CREATE", "UPDATE", "DELETE")}
    | {
        (g, "deploymentpolicies", op)
        for g in ("nodewright.nvidia.com", "skyhook.nvidia.com")
        for op in ("CREATE", "UPDATE")
    },
    "nodes.nodegate.io": {("", r, op) for r in ("nodes", "nodes/status") for op in ("CREATE", "UPDATE")},
}


def test_webhook_configuration(scenario: tuple[str, Doc, str, list[Doc]]) -> None:
    _name, values, namespace, docs = scenario
    vwc = one(docs, "ValidatingWebhookConfiguration")
    svc = one(docs, "Service")
    cert_manager = values.get("certManager", {}).get("enabled", False)
    hooks = {h["name"]: h for h in vwc["webhooks"]}
    assert set(hooks) == set(EXPECTED_RULES)
    for name, hook in hooks.items():
        assert hook["failurePolicy"] == "Fail", name
        assert hook["sideEffects"] == "None", name
        assert hook["matchPolicy"] == "Equivalent", name
        assert hook["timeoutSeconds"] == values.get("webhook", {}).get("timeoutSeconds", 5), name
        assert hook["admissionReviewVersions"] == ["v1"], name
        assert hook["clientConfig"]["service"] == {
            "name": svc["metadata"]["name"],
            "namespace": namespace,
            "path": "/admission/validate",
            "port": 9443,
        }
        assert "url" not in hook["clientConfig"]
        # Label-based skipping would let anyone who can set a label skip the webhook.
        assert "objectSelector" not in hook, name
        # nodegate's own namespace is never sent (all judged kinds are cluster-scoped today).
        assert hook["namespaceSelector"] == {
            "matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [namespace]}
            ]
        }
        got = {
            (g, r, op)
            for rule in hook["rules"]
            for g in rule["apiGroups"]
            for r in rule["resources"]
            for op in rule["operations"]
        }
        assert got == EXPECTED_RULES[name], name
        for rule in hook["rules"]:
            assert rule["scope"] == "Cluster", rule
            assert "*" not in rule["apiVersions"], rule
        if cert_manager:
            assert "caBundle" not in hook["clientConfig"]
        else:
            assert hook["clientConfig"]["caBundle"], name
    assert "matchConditions" not in hooks["packages.nodegate.io"], "package CRs have no exemptions"
    cond, _judged = hooks["nodes.nodegate.io"][
        "matchConditions"
    ]  # the second: tests/chart/test_node_conditions.py
    exempt = [
        service_account(docs, namespace),
        *values.get("webhook", {}).get(
            "nodeExemptUsers", ["system:serviceaccount:kube-system:node-controller"]
        ),
    ]
    assert (
        cond["expression"] == f"!(request.userInfo.username in {json.dumps(exempt, separators=(',', ':'))})"
    )
    annotations = vwc["metadata"].get("annotations", {})
    if cert_manager:
        cert_ref = annotations["cert-manager.io/inject-ca-from"]
        ns, cert_name = cert_ref.split("/")
        certificate = one(docs, "Certificate", cert_name)
        assert ns == namespace
        assert certificate["metadata"]["namespace"] == namespace
        tls_volume = next(v for v in pod_spec(docs)["volumes"] if v["name"] == "tls")
        assert certificate["spec"]["secretName"] == tls_volume["secret"]["secretName"]
        assert f"{svc['metadata']['name']}.{namespace}.svc" in certificate["spec"]["dnsNames"]
        ref = certificate["spec"]["issuerRef"]
        if values["certManager"].get("issuerRef", {}).get("name"):
            assert ref == {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
        else:
            issuer = one(docs, "Issuer", ref["name"])
            ca_cert = one(docs, "Certificate", issuer["spec"]["ca"]["secretName"])
            assert ca_cert["spec"]["isCA"] is True
            assert one(docs, "Issuer", ca_cert["spec"]["issuerRef"]["name"])["spec"] == {"selfSigned": {}}
    else:
        assert "cert-manager.io/inject-ca-from" not in annotations
        check_helm_certificate(docs, namespace, values)


def test_mutating_webhook_configuration(scenario: tuple[str, Doc, str, list[Doc]]) -> None:
    """CREATE and UPDATE of the package CRs of both groups go to /admission/mutate, with the
    validating webhook's failure policy, service, CA and timeout; nothing else (no Pods)."""
    _name, values, _namespace, docs = scenario
    mwc = one(docs, "MutatingWebhookConfiguration")
    vwc = one(docs, "ValidatingWebhookConfiguration")
    (hook,) = mwc["webhooks"]
    packages = next(h for h in vwc["webhooks"] if h["name"] == "packages.nodegate.io")
    assert hook["name"] == "package-tolerations.nodegate.io"
    assert hook["failurePolicy"] == packages["failurePolicy"] == "Fail"
    assert hook["sideEffects"] == "None"
    assert hook["matchPolicy"] == "Equivalent"
    assert hook["reinvocationPolicy"] == "IfNeeded"
    assert (
        hook["timeoutSeconds"]
        == packages["timeoutSeconds"]
        == values.get("webhook", {}).get("timeoutSeconds", 5)
    )
    assert hook["admissionReviewVersions"] == ["v1"]
    validating = packages["clientConfig"]
    assert hook["clientConfig"]["service"] == {**validating["service"], "path": "/admission/mutate"}
    assert hook["clientConfig"].get("caBundle") == validating.get("caBundle")
    assert mwc["metadata"].get("annotations") == vwc["metadata"].get("annotations")  # cert-manager's CA
    assert hook["rules"] == [
        {
            "apiGroups": [group],
            "apiVersions": ["v1alpha1"],
            "resources": [resource],
            "operations": ["CREATE", "UPDATE"],
            "scope": "Cluster",
        }
        for group, resource in (("nodewright.nvidia.com", "nodewrights"), ("skyhook.nvidia.com", "skyhooks"))
    ]
    # The same package CRs; the validating webhook also judges their DELETE (nothing to mutate).
    assert [
        {**r, "operations": [op for op in r["operations"] if op != "DELETE"]}
        for r in packages["rules"]
        if r["resources"] != ["deploymentpolicies"]
    ] == hook["rules"]
    assert "objectSelector" not in hook
    assert "matchConditions" not in hook
    assert hook["namespaceSelector"] == packages["namespaceSelector"]
    assert settings_from_obj(rendered_config(docs)).nodewright.inject_tolerations is True


def test_no_injection_no_mutating_webhook(helm: str, tmp_path: Path) -> None:
    values = {"config": {"trust_domain": "a.org", "nodewright": {"inject_tolerations": False}}}
    docs = render(helm, tmp_path, values)
    assert not [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
    assert settings_from_obj(rendered_config(docs)).nodewright.inject_tolerations is False


def check_helm_certificate(docs: list[Doc], namespace: str, values: Doc) -> None:
    """The generated Secret's leaf chains to the caBundle and names the Service."""
    tls = next(d for d in docs if d["kind"] == "Secret" and d.get("type") == "kubernetes.io/tls")
    leaf = x509.load_pem_x509_certificate(base64.b64decode(tls["data"]["tls.crt"]))
    root = x509.load_pem_x509_certificate(base64.b64decode(tls["data"]["ca.crt"]))
    serialization.load_pem_private_key(base64.b64decode(tls["data"]["tls.key"]), None)
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        for hook in one(docs, kind)["webhooks"]:
            assert hook["clientConfig"]["caBundle"] == tls["data"]["ca.crt"]
    leaf.verify_directly_issued_by(root)
    assert root.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert (
        ExtendedKeyUsageOID.SERVER_AUTH
        in leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    )
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    svc = one(docs, "Service")["metadata"]["name"]
    names = set(san.get_values_for_type(x509.DNSName))
    assert {f"{svc}.{namespace}.svc", f"{svc}.{namespace}.svc.cluster.local"} <= names
    assert set(values.get("tls", {}).get("extraDnsNames", [])) <= names
    ips = {str(i) for i in san.get_values_for_type(x509.IPAddress)}
    assert set(values.get("tls", {}).get("ipAddresses", [])) == ips


def test_install_notes(helm: str) -> None:
    """NOTES.txt renders (helm template skips it) and tells how to back up the CA Secret."""
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    for args, needles in (
        (
            [],
            [
                "ng-nodegate-ca",
                "then back it up",
                "kubectl delete validatingwebhookconfiguration ng-nodegate",
            ],
        ),
        (["--set", "store=sqlite", "--set", "replicaCount=1"], ["WARNING: store: sqlite", "emptyDir"]),
    ):
        out = subprocess.run(
            [helm, "install", "ng", str(CHART), "--dry-run=client", "--namespace", "nodegate",
             *REQUIRED_SETS, *args],
            capture_output=True, text=True, check=False, timeout=120, env=env,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        notes = out.stdout.partition("\nNOTES:\n")[2]
        for needle in needles:
            assert needle in notes, notes


# -- the values schema and the template checks -----------------------------------------------------

BAD_VALUES: list[tuple[Doc, str]] = [
    ({"replicaCount": 0}, "replicaCount"),
    ({"replicaCount": "three"}, "replicaCount"),
    ({"store": "mysql"}, "store"),
    ({"replicas": 3}, "replicas"),
    ({"webhook": {"timeoutSeconds": 31}}, "timeoutSeconds"),
    ({"webhook": {"failurePolicy": "Ignore"}}, "failurePolicy"),
    ({"webhook": {"nodeExemptUsers": ['x"]) || true || (["']}}, "nodeExemptUsers"),
    ({"image": {"digest": "sha256:abc"}}, "digest"),
    ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
    ({"service": {"type": "ExternalName"}}, "type"),
    ({"certManager": {"issuerRef": {"kind": "Vault"}}}, "kind"),
    ({"config": {"trust_domain": ""}}, "trust_domain"),
    ({"config": {"trust_domain": "Example.ORG/x"}}, "trust_domain"),
    ({"config": {"enrollment": "anyone"}}, "enrollment"),
    ({"config": {"nodewright": {"operator_service_accounts": []}}}, "operator_service_accounts"),
    ({"config": {"nodewright": {"inject_tolerations": "yes"}}}, "inject_tolerations"),
    ({"config": {"nodewright": {"operators": ["x"]}}}, "operators"),
    ({"tls": {"ipAddresses": ["not an ip"]}}, "ipAddresses"),
    ({"containerPort": 443}, "containerPort"),
    ({"networkPolicy": {"apiServer": {"cidrs": ["everywhere"]}}}, "cidrs"),
    ({"ca": {"waitSeconds": 0}}, "waitSeconds"),
    # Durations need a unit (the service refuses a bare number at start): helm refuses them first.
    ({"config": {"trust_domain": "a.org", "svid_ttl": 3600}}, "svid_ttl"),
    ({"config": {"trust_domain": "a.org", "gate": {"resync": 300}}}, "resync"),
    # Template checks: combinations and the keys the chart owns.
    ({"store": "sqlite"}, "replicaCount: 1"),
    ({"store": "sqlite", "replicaCount": 2}, "replicaCount: 1"),
    ({"persistence": {"enabled": True}}, "persistence is for store: sqlite"),
    ({"ca": {"create": False}}, "ca.secretName"),
    ({"config": {"trust_domain": "a.org", "listen": "0.0.0.0:1"}}, "config.listen is set by the chart"),
    (
        {"config": {"trust_domain": "a.org", "admission": {"listen": "0.0.0.0:1"}}},
        "config.admission.listen is set by the chart",
    ),
    ({"networkPolicy": {"apiServer": {"webhookSourceCidrs": ["anywhere"]}}}, "webhookSourceCidrs"),
    ({"config": {"trust_domain": "a.org", "tls": {"cert_file": "/x"}}}, "config.tls is set by the chart"),
    ({"config": {"trust_domain": "a.org", "state_dir": "/x"}}, "config.state_dir is set by the chart"),
    ({"config": {"trust_domain": "a.org", "kubernetes": {"namespace": "x"}}}, "config.kubernetes.namespace"),
    (
        {"config": {"trust_domain": "a.org", "kubernetes": {"kubeconfig": "/x"}}},
        "config.kubernetes.kubeconfig",
    ),
    ({"config": {"trust_domain": "a.org", "gate": {"lease_namespace": "x"}}}, "config.gate.lease_namespace"),
    (
        {"config": {"trust_domain": "a.org", "admission": {"owner": "system:anonymous"}}},
        "config.admission.owner",
    ),
]


@pytest.mark.parametrize(
    ("values", "needle"), BAD_VALUES, ids=[json.dumps(v, sort_keys=True)[:60] for v, _ in BAD_VALUES]
)
def test_bad_values_are_refused(helm: str, tmp_path: Path, values: Doc, needle: str) -> None:
    err = render_error(helm, tmp_path, values)
    assert needle in err, err


def test_schema_is_draft7_and_closed() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    jsonschema.Draft7Validator(schema).validate(defaults)
    # Every documented default has a schema entry, and no entry lacks a default.
    assert set(schema["properties"]) - {"global"} == set(defaults)
    assert schema["additionalProperties"] is False


# -- the Helm-generated certificate across upgrades -------------------------------------------------


@pytest.fixture
def lookup_chart(tmp_path: Path) -> Path:
    """A copy of the chart whose `lookup` of the TLS Secret answers from a value (helm template has
    no cluster to look up in), so the reuse logic itself runs."""
    chart = tmp_path / "nodegate"
    shutil.copytree(CHART, chart)
    (chart / "values.schema.json").unlink()  # it rightly refuses the stand-in value
    helpers = chart / "templates" / "_helpers.tpl"
    text = helpers.read_text()
    call = 'lookup "v1" "Secret" .Release.Namespace (include "nodegate.tlsSecretName" .)'
    assert text.count(call) == 1
    helpers.write_text(text.replace(call, "(.Values.fakeLookup | default dict)"))
    return chart


def _tls(docs: list[Doc]) -> Doc:
    return next(d for d in docs if d["kind"] == "Secret" and d.get("type") == "kubernetes.io/tls")


def _tls_checksum(docs: list[Doc]) -> str:
    value: str = one(docs, "Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/tls"]
    return value


def test_helm_certificate_is_kept_across_upgrades(helm: str, tmp_path: Path, lookup_chart: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    docs = render(helm, work, chart=lookup_chart)
    first = _tls(docs)
    # The pods roll when the certificate changes: the checksum is of the certificate in the Secret.
    assert _tls_checksum(docs) == hashlib.sha256(first["data"]["tls.crt"].encode()).hexdigest()
    # The first install generates; a second render without a cluster generates afresh.
    assert _tls(render(helm, work, chart=lookup_chart))["data"]["tls.crt"] != first["data"]["tls.crt"]
    # An upgrade finds the installed Secret and keeps it, caBundle and checksum included.
    docs = render(helm, work, {"fakeLookup": first}, chart=lookup_chart)
    assert _tls(docs)["data"] == first["data"]
    assert _tls_checksum(docs) == hashlib.sha256(first["data"]["tls.crt"].encode()).hexdigest()
    bundles = {h["clientConfig"]["caBundle"] for h in one(docs, "ValidatingWebhookConfiguration")["webhooks"]}
    assert bundles == {first["data"]["ca.crt"]}
    # New names: a new leaf that carries them, signed by the same CA, so the caBundle (and what
    # joining machines trust) stays; the pods roll to the new leaf.
    names = {"tls": {"extraDnsNames": ["join.example.com"]}}
    docs = render(helm, work, {"fakeLookup": first, **names}, chart=lookup_chart)
    renamed = _tls(docs)
    assert renamed["data"]["tls.crt"] != first["data"]["tls.crt"]
    assert renamed["data"]["ca.crt"] == first["data"]["ca.crt"]
    assert renamed["data"]["ca.key"] == first["data"]["ca.key"]
    assert _tls_checksum(docs) == hashlib.sha256(renamed["data"]["tls.crt"].encode()).hexdigest()
    check_helm_certificate(docs, "nodegate", names)
    # A Secret without the names digest gets a new leaf; one without its CA, a new CA.
    stripped = copy.deepcopy(first)
    del stripped["metadata"]["annotations"]
    redone = _tls(render(helm, work, {"fakeLookup": stripped}, chart=lookup_chart))
    assert redone["data"]["tls.crt"] != first["data"]["tls.crt"]
    assert redone["data"]["ca.crt"] == first["data"]["ca.crt"]
    for missing in ("ca.crt", "ca.key"):
        partial = copy.deepcopy(first)
        del partial["data"][missing]
        fresh = _tls(render(helm, work, {"fakeLookup": partial, **names}, chart=lookup_chart))
        assert fresh["data"]["ca.crt"] != first["data"]["ca.crt"], missing


# -- the CA init container script --------------------------------------------------------------------


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fake-apiserver")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp / "server.pem", tmp / "server.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_file, key_file


class FakeApi:
    """One Secret behind GET and merge-PATCH with resourceVersion preconditions. After every change
    it writes the Secret's files into ``mount``, standing in for the kubelet's volume refresh."""

    TOKEN: ClassVar[str] = "test-token"

    def __init__(self, mount: Path, namespace: str, name: str) -> None:
        self.mount, self.namespace, self.name = mount, namespace, name
        self.data: dict[str, str] | None = {}  # None: the Secret does not exist
        self.rv = 1
        self.requests: list[tuple[str, Doc | None]] = []
        self.forbid = False
        self.race: dict[str, str] | None = None  # written "by another replica" just before our PATCH
        self.lock = threading.Lock()

    def path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/secrets/{self.name}"

    def secret(self) -> Doc:
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": self.name, "namespace": self.namespace, "resourceVersion": str(self.rv)},
            "data": dict(self.data or {}),
        }

    def store(self, data: dict[str, str]) -> None:
        self.data = data
        self.rv += 1
        for key, value in data.items():
            (self.mount / key).write_bytes(base64.b64decode(value))

    def handle(self, method: str, path: str, headers: Any, body: Doc | None) -> tuple[int, Doc]:
        with self.lock:
            self.requests.append((method, body))
            if headers.get("Authorization") != f"Bearer {self.TOKEN}" or self.forbid:
                return 403, {"kind": "Status", "code": 403}
            if path != self.path() or self.data is None:
                return 404, {"kind": "Status", "code": 404}
            if method == "GET":
                return 200, self.secret()
            assert headers.get("Content-Type") == "application/merge-patch+json"
            assert body is not None
            if self.race is not None:
                self.store({**self.data, **self.race})
                self.race = None
            if body["metadata"].get("resourceVersion") != str(self.rv):
                return 409, {"kind": "Status", "code": 409}
            self.store({**self.data, **body["data"]})
            return 200, self.secret()


@pytest.fixture
def fake_api(tmp_path: Path) -> Iterator[tuple[FakeApi, dict[str, str]]]:
    mount = tmp_path / "mount"
    mount.mkdir()
    sa = tmp_path / "sa"
    sa.mkdir()
    cert_file, key_file = _self_signed(tmp_path)
    shutil.copy(cert_file, sa / "ca.crt")
    (sa / "token").write_text(FakeApi.TOKEN + "\n")
    api = FakeApi(mount, "nodegate", "ng-nodegate-ca")

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            status, doc = api.handle(self.command, self.path, self.headers, body)
            raw = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        do_GET = _serve
        do_PATCH = _serve

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert_file, key_file)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    env = {
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(server.server_address[1]),
        "NODEGATE_SERVICEACCOUNT_DIR": str(sa),
        "POD_NAMESPACE": "nodegate",
        "NODEGATE_CA_SECRET": "ng-nodegate-ca",
        "NODEGATE_CA_DIR": str(mount),
        "NODEGATE_TRUST_DOMAIN": "fleet.example.com",
        "NODEGATE_CA_GENERATE": "true",
        "NODEGATE_CA_WAIT_SECONDS": "0",  # the fake "kubelet" writes the mount before answering
    }
    try:
        yield api, env
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture(scope="module")
def ca_init_script(helm: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The script as the chart ships it (out of the rendered ConfigMap)."""
    tmp = tmp_path_factory.mktemp("script")
    docs = render(helm, tmp)
    script = tmp / "ca-init.py"
    script.write_text(one(docs, "ConfigMap")["data"]["ca-init.py"])
    assert script.read_text() == (CHART / "files" / "ca-init.py").read_text()
    return script


def run_init(script: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "NODEGATE_"))}
    full.update(env)
    return subprocess.run(
        [sys.executable, str(script)],
        env=full,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        cwd=ROOT,
    )


def _files(data: dict[str, str]) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in data.items()}


def test_ca_init_fills_an_empty_secret_once(
    ca_init_script: Path, fake_api: tuple[FakeApi, dict[str, str]]
) -> None:
    api, env = fake_api
    out = run_init(ca_init_script, env)
    assert out.returncode == 0, out.stderr
    assert "wrote a new CA and a session key" in out.stdout
    assert "CA ok: trust domain fleet.example.com" in out.stdout
    assert api.data is not None
    files = _files(api.data)
    cas = ca.CaSet.load(files)
    assert cas.trust_domain == "fleet.example.com"
    assert len(cas.authorities) == 1
    assert re.fullmatch(rb"[0-9a-f]{64}\n", files["session.key"])
    for secret in (files[f"{cas.signer.stem}.key"], files["session.key"].strip()):
        assert secret.decode() not in out.stdout + out.stderr, "key material must never be printed"
    patches = [r for r in api.requests if r[0] == "PATCH"]
    assert len(patches) == 1
    # A second pod (or a restart) finds it complete and writes nothing.
    before = dict(api.data)
    again = run_init(ca_init_script, env)
    assert again.returncode == 0, again.stderr
    assert "already holds a CA and a session key" in again.stdout
    assert api.data == before
    assert len([r for r in api.requests if r[0] == "PATCH"]) == 1


def test_ca_init_loses_a_race_gracefully(
    ca_init_script: Path, fake_api: tuple[FakeApi, dict[str, str]]
) -> None:
    """Another replica writes between our read and our write: our write is refused (409), and we
    use its CA instead of replacing it."""
    api, env = fake_api
    theirs = ca.initial("fleet.example.com", now=dt.datetime.now(dt.UTC)).dump()
    theirs["session.key"] = b"ab" * 32 + b"\n"
    api.race = {k: base64.b64encode(v).decode() for k, v in theirs.items()}
    out = run_init(ca_init_script, env)
    assert out.returncode == 0, out.stderr
    assert api.data is not None
    assert _files(api.data) == theirs
    assert [m for m, _ in api.requests] == ["GET", "PATCH", "GET"]
    assert f"signer {ca.CaSet.load(theirs).signer.stem}" in out.stdout


def test_ca_init_adds_only_what_is_missing(
    ca_init_script: Path, fake_api: tuple[FakeApi, dict[str, str]]
) -> None:
    api, env = fake_api
    existing = ca.initial("fleet.example.com", now=dt.datetime.now(dt.UTC)).dump()
    api.store({k: base64.b64encode(v).decode() for k, v in existing.items()})
    out = run_init(ca_init_script, env)
    assert out.returncode == 0, out.stderr
    assert "wrote a session key" in out.stdout
    assert api.data is not None
    files = _files(api.data)
    assert {k: v for k, v in files.items() if k != "session.key"} == existing
    ((_, patch),) = [r for r in api.requests if r[0] == "PATCH"]
    assert patch is not None
    assert set(patch["data"]) == {"session.key"}


@pytest.mark.parametrize(
    ("setup", "needle"),
    [
        ("forbidden", "needs get/patch"),
        ("missing", "does not exist"),
        ("other-domain", "trust domain"),
        ("bad-session-key", "session key"),
    ],
)
def test_ca_init_failures_say_why(
    ca_init_script: Path, fake_api: tuple[FakeApi, dict[str, str]], setup: str, needle: str
) -> None:
    api, env = fake_api
    if setup == "forbidden":
        api.forbid = True
    elif setup == "missing":
        api.data = None
    else:
        files = ca.initial(
            "other.example.com" if setup == "other-domain" else "fleet.example.com",
            now=dt.datetime.now(dt.UTC),
        ).dump()
        files["session.key"] = b"not hex\n" if setup == "bad-session-key" else b"cd" * 32 + b"\n"
        api.store({k: base64.b64encode(v).decode() for k, v in files.items()})
    out = run_init(ca_init_script, env)
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert needle in out.stderr, out.stderr
    assert "Traceback" not in out.stderr, out.stderr


def test_ca_init_check_only(ca_init_script: Path, tmp_path: Path) -> None:
    """ca.generate=false: no API access at all; a Secret without the files fails with the fix."""
    mount = tmp_path / "mount"
    mount.mkdir()
    env = {"NODEGATE_CA_SECRET": "corp-ca", "NODEGATE_CA_DIR": str(mount),
           "NODEGATE_TRUST_DOMAIN": "fleet.example.com", "NODEGATE_CA_GENERATE": "false",
           "NODEGATE_CA_WAIT_SECONDS": "0"}  # fmt: skip
    out = run_init(ca_init_script, env)  # no KUBERNETES_SERVICE_HOST: it must not try the API
    assert out.returncode == 1, out.stderr
    assert "still lacks index.json or session.key" in out.stderr, out.stderr
    for name, data in ca.initial("fleet.example.com", now=dt.datetime.now(dt.UTC)).dump().items():
        (mount / name).write_bytes(data)
    (mount / "session.key").write_text("ef" * 32 + "\n")
    out = run_init(ca_init_script, env)
    assert out.returncode == 0, out.stderr
    assert "CA ok: trust domain fleet.example.com" in out.stdout
