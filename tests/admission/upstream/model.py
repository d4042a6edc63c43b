"""The cases and what the API server does to an object before a validating webhook sees it.

Our model of the kube-apiserver for these two CRDs (read from the CRDs of both snapshots, not
copied): the body's unknown fields are pruned, nulls dropped, the CRD defaults filled in
(``priority: 200``, ``serial``/``runtimeRequired``/``autoTaintNewNodes: false``, in NVIDIA/nodewright
``sequencing: node`` and ``uninstall: {enabled: false, apply: false}``, in NVIDIA/skyhook
``pause: false``, ``resetBatchStateOnCompletion: true``). A CREATE drops ``.status`` (a status
subresource) and gets uid, generation 1 and a creation time; an UPDATE keeps uid and creation
time, takes the stored ``.status``, and counts the generation up when the spec changed. The few
schema checks that matter for the corpus (package name pattern, interrupt type enum, required
fields) say when the CRD refuses an object before any webhook runs.
"""

from __future__ import annotations

import copy
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

NODEWRIGHT = "NVIDIA/nodewright"
SKYHOOK = "NVIDIA/skyhook"
COMMITS = {
    NODEWRIGHT: "71ca22b89874a282e52a5a80856a5f1143f5e55c",  # main, 2026-05-01, chart v0.15.1
    SKYHOOK: "f9b9e8b995b26f5a055dca683ec4149f511b46f9",  # 2026-03-04, chart v0.13.1
}
GROUP = "skyhook.nvidia.com"
API_VERSION = f"{GROUP}/v1alpha1"
FINALIZER = "skyhook.nvidia.com/skyhook"  # SkyhookFinalizer, operator/internal/controller
CREATED = "2026-01-01T00:00:00Z"
_UIDS = uuid.UUID("9b2e0f64-3c1d-4f7a-8e55-2a1d6c0b7e13")


def uid(*parts: object) -> str:
    return str(uuid.uuid5(_UIDS, "|".join(map(str, parts))))


@dataclass(frozen=True)
class User:
    username: str
    groups: tuple[str, ...] = ("system:authenticated",)
    uid: str = ""

    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {"username": self.username, "groups": list(self.groups)}
        if self.uid:
            out["uid"] = self.uid
        return out


ALICE = User("alice")
# The operator's service account as the README's `helm install skyhook ... -n skyhook` names it.
OPERATOR = User(
    "system:serviceaccount:skyhook:skyhook-skyhook-operator-controller-manager",
    ("system:serviceaccounts", "system:serviceaccounts:skyhook", "system:authenticated"),
    uid("operator-sa"),
)


@dataclass(frozen=True)
class Provenance:
    repo: str
    path: str
    item: str

    @property
    def commit(self) -> str:
        return COMMITS[self.repo]

    def __str__(self) -> str:
        return f"{self.repo}@{self.commit[:12]}:{self.path} [{self.item}]"


@dataclass(frozen=True)
class Verdict:
    """Upstream's verdict on a case, and on what it rests."""

    allowed: bool
    basis: str  # "unit test", "chainsaw step", "derived from upstream's rules", "operator update"
    reason: str = ""  # upstream's message (or the CRD's), for a denial
    cluster_state: bool = False  # upstream decides from other objects (DeploymentPolicies, Skyhooks)
    crd_rejects: bool = False  # the CRD schema refuses the object before any webhook runs
    # What upstream's deployed webhook answers where its Go-level test says otherwise (the test
    # calls Validate() on a struct; a real request is decoded first).
    on_request: bool | None = None
    warnings: tuple[str, ...] = ()
    note: str = ""

    @property
    def wire(self) -> bool:
        """Upstream's answer to this request as the API server would send it."""
        return self.allowed if self.on_request is None else self.on_request


@dataclass
class Case:
    source: str  # unit, chainsaw, samples, docs, operator
    provenance: Provenance
    kind: str  # Skyhook or DeploymentPolicy
    operation: str
    obj: dict[str, Any] | None
    old: dict[str, Any] | None
    user: User
    verdict: Verdict
    also: list[Provenance] = field(default_factory=list)  # the same request, from elsewhere

    @property
    def name(self) -> str:
        meta = (self.obj or self.old or {}).get("metadata", {})
        return str(meta.get("name", ""))

    def review(self) -> dict[str, Any]:
        resource = {"Skyhook": "skyhooks", "DeploymentPolicy": "deploymentpolicies"}[self.kind]
        gvk = {"group": GROUP, "version": "v1alpha1", "kind": self.kind}
        gvr = {"group": GROUP, "version": "v1alpha1", "resource": resource}
        options = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions", "DELETE": "DeleteOptions"}[
            self.operation
        ]
        return {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid(self.source, self.provenance, self.operation),
                "kind": gvk,
                "resource": gvr,
                "requestKind": gvk,
                "requestResource": gvr,
                "name": self.name,
                "operation": self.operation,
                "userInfo": self.user.info(),
                "object": copy.deepcopy(self.obj),
                "oldObject": copy.deepcopy(self.old),
                "dryRun": False,
                "options": {"kind": options, "apiVersion": "meta.k8s.io/v1"},
            },
        }


# -- the API server ------------------------------------------------------------------------

_PACKAGE_FIELDS = (
    "name",
    "version",
    "image",
    "containerSHA",
    "agentImageOverride",
    "interrupt",
    "dependsOn",
    "configInterrupts",
    "configMap",
    "env",
    "resources",
    "gracefulShutdown",
)
_SPEC_FIELDS = (
    "serial",
    "podNonInterruptLabels",
    "nodeSelectors",
    "deploymentPolicy",
    "deploymentPolicyOptions",
    "interruptionBudget",
    "packages",
    "additionalTolerations",
    "runtimeRequired",
    "autoTaintNewNodes",
    "priority",
)
_NAME = re.compile(r"^[a-z][-a-z0-9]{0,41}[a-z]$")
_INTERRUPTS = ("service", "reboot", "noop", "restartAllServices")


def _no_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _no_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_no_nulls(v) for v in value]
    return value


def admit(obj: dict[str, Any], repo: str) -> dict[str, Any]:
    """The object after pruning and defaulting (metadata and status as given)."""
    out = copy.deepcopy(obj)
    spec = _no_nulls(out.get("spec") or {})
    if out.get("kind") == "DeploymentPolicy":
        spec = {
            k: v for k, v in spec.items() if k in ("default", "compartments", "resetBatchStateOnCompletion")
        }
        spec.setdefault("resetBatchStateOnCompletion", True)
        out["spec"] = spec
        return out
    nodewright = repo == NODEWRIGHT
    known = (*_SPEC_FIELDS, "sequencing") if nodewright else (*_SPEC_FIELDS, "pause")
    spec = {k: v for k, v in spec.items() if k in known}
    for key, default in (
        ("autoTaintNewNodes", False),
        ("priority", 200),
        ("runtimeRequired", False),
        ("serial", False),
    ):
        spec.setdefault(key, default)
    spec.setdefault("sequencing" if nodewright else "pause", "node" if nodewright else False)
    if isinstance(spec.get("deploymentPolicyOptions"), dict):
        spec["deploymentPolicyOptions"].setdefault("resetBatchStateOnCompletion", True)
    packages = spec.get("packages")
    if isinstance(packages, dict):
        fields = (*_PACKAGE_FIELDS, "uninstall") if nodewright else _PACKAGE_FIELDS
        for key, given in list(packages.items()):
            kept = {k: v for k, v in given.items() if k in fields}
            if isinstance(kept.get("uninstall"), dict):
                kept["uninstall"] = {"enabled": False, "apply": False, **kept["uninstall"]}
            packages[key] = kept
    out["spec"] = spec
    return out


def schema_errors(obj: dict[str, Any]) -> list[str]:
    """What the CRD schema refuses in the object (the checks the corpus needs)."""
    spec = obj.get("spec") or {}
    errors: list[str] = []
    if obj.get("kind") == "DeploymentPolicy":
        if "default" not in spec:
            errors.append("spec.default: Required value")
        elif "strategy" not in spec["default"]:
            errors.append("spec.default.strategy: Required value")
        return errors
    for key, pkg in (spec.get("packages") or {}).items():
        at = f"spec.packages.{key}"
        if "name" in pkg and not _NAME.match(pkg["name"]):
            errors.append(f"{at}.name: Invalid value: {pkg['name']!r}: should match '{_NAME.pattern}'")
        for required in ("image", "version"):
            if required not in pkg:
                errors.append(f"{at}.{required}: Required value")
        interrupts = [("interrupt", pkg.get("interrupt"))]
        interrupts += [(f"configInterrupts.{k}", v) for k, v in (pkg.get("configInterrupts") or {}).items()]
        for where, value in interrupts:
            if value is not None and value.get("type") not in _INTERRUPTS:
                errors.append(f"{at}.{where}.type: Unsupported value: {value.get('type')!r}")
    return errors


def stamp_create(obj: dict[str, Any], key: object) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out.pop("status", None)
    meta = out.setdefault("metadata", {})
    meta.pop("resourceVersion", None)
    meta.update(uid=uid(key, meta.get("name")), generation=1, creationTimestamp=CREATED)
    return out


def stamp_update(new: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(new)
    meta, before = out.setdefault("metadata", {}), old["metadata"]
    for key in ("uid", "creationTimestamp", "name", "resourceVersion", "deletionTimestamp"):
        if key in before:
            meta[key] = before[key]
    if out.get("kind") == "Skyhook":
        out.pop("status", None)
        if "status" in old:
            out["status"] = copy.deepcopy(old["status"])
    changed = out.get("spec") != old.get("spec")
    meta["generation"] = before.get("generation", 1) + (1 if changed else 0)
    return out


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out
