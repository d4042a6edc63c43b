"""A cluster in miniature: upstream's e2e steps (and a user applying samples) in order, each turned
into the AdmissionReview it causes, with the object as stored before it as ``oldObject``.

After an allowed Skyhook CREATE the operator's first UPDATE follows (its ``HandleFinalizer`` in
``operator/internal/controller/skyhook_controller.go``: the Go re-encoding of the stored object
plus finalizer ``skyhook.nvidia.com/skyhook``, sent by its service account), recorded as a case of
its own (source "operator", upstream allows it). An e2e step that changes a Skyhook waits for it to
converge before the next, so the stored object then carries a ``status`` as the operator writes
it: every package complete on ``kind-worker``, except those being uninstalled (an uninstalled
package is absent from ``status.nodeState``). That status is our model, marked in the note.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from tests.admission.upstream.gotypes import encode_skyhook_spec
from tests.admission.upstream.model import (
    ALICE,
    API_VERSION,
    FINALIZER,
    OPERATOR,
    SKYHOOK,
    Case,
    Provenance,
    User,
    Verdict,
    admit,
    merge_patch,
    schema_errors,
    stamp_create,
    stamp_update,
)

NODE = "kind-worker"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
STATUS_NOTE = "oldObject.status is our model of the converged state the e2e test waits for"


def skyhook(name: str, spec: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "Skyhook", "metadata": {"name": name, **meta}, "spec": spec}


def policy(name: str, spec: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "DeploymentPolicy",
        "metadata": {"name": name, **meta},
        "spec": spec,
    }


def converged_status(obj: dict[str, Any]) -> dict[str, Any]:
    """The status the operator writes once every package is done on the test node."""
    state: dict[str, Any] = {}
    packages = (obj.get("spec") or {}).get("packages") or {}
    for key in sorted(packages):
        pkg = packages[key]
        uninstall = pkg.get("uninstall") or {}
        if uninstall.get("enabled") and uninstall.get("apply"):
            continue  # uninstalled: gone from the node's state
        name, version = pkg.get("name") or key, pkg.get("version", "")
        state[f"{name}|{version}"] = {
            "name": name,
            "version": version,
            "image": str(pkg.get("image", "")).split(":", 1)[0],
            "stage": "post-interrupt" if pkg.get("interrupt") else "config",
            "state": "complete",
        }
    return {
        "observedGeneration": obj["metadata"].get("generation", 1),
        "nodeState": {NODE: state},
        "nodeStatus": {NODE: "complete"},
        "status": "complete",
        "nodesInProgress": 0,
        "completeNodes": "1/1",
        "packageList": ",".join(
            f"{packages[k].get('name') or k}:{packages[k].get('version')}" for k in sorted(packages)
        ),
    }


def operator_update(created: dict[str, Any], repo: str) -> dict[str, Any]:
    """The operator's first UPDATE of a created Skyhook: its Go re-encoding plus the finalizer."""
    meta = copy.deepcopy(created["metadata"])
    finalizers = list(meta.get("finalizers") or [])
    if FINALIZER not in finalizers:
        finalizers.append(FINALIZER)
    meta["finalizers"] = finalizers
    spec = encode_skyhook_spec(created.get("spec") or {}, decode=True, skyhook_repo=repo == SKYHOOK)
    body = {"apiVersion": created["apiVersion"], "kind": "Skyhook", "metadata": meta, "spec": spec}
    return stamp_update(admit(body, repo), created)


def _last_applied(manifest: dict[str, Any]) -> str:
    """kubectl's last-applied-configuration: the manifest, compact, keys sorted."""
    doc = copy.deepcopy(manifest)
    doc.setdefault("metadata", {}).setdefault("annotations", {})
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n"


class Scenario:
    """One upstream test (or one set of documents) applied in order to one simulated cluster."""

    def __init__(self, repo: str, source: str, prefix: str, basis: str, label: str = "") -> None:
        self.repo, self.source, self.prefix, self.basis, self.label = repo, source, prefix, basis, label
        self.store: dict[tuple[str, str], dict[str, Any]] = {}
        self.cases: list[Case] = []
        self._rv = 1000

    # -- operations -------------------------------------------------------------------------

    def create(self, path: str, item: str, body: dict[str, Any], deny: str = "", **extra: Any) -> None:
        self._write("CREATE", path, item, body, deny, ALICE, **extra)

    def apply(
        self, path: str, item: str, body: dict[str, Any], deny: str = "", kubectl: bool = False
    ) -> None:
        """chainsaw ``apply`` / ``kubectl apply``: a CREATE when absent (kubectl records what it
        applied), else a merge patch of the manifest onto the stored object."""
        live = self.store.get(_key(body))
        if live is None:
            if kubectl:
                body = copy.deepcopy(body)
                annotations = body["metadata"].setdefault("annotations", {})
                annotations[LAST_APPLIED] = _last_applied(body)
            self._write("CREATE", path, item, body, deny, ALICE)
        else:
            self._write("UPDATE", path, item, merge_patch(live, body), deny, ALICE)

    def update(self, path: str, item: str, body: dict[str, Any], deny: str = "", **extra: Any) -> None:
        """chainsaw ``update``: the manifest replaces the stored object (at its resourceVersion)."""
        self._write("UPDATE", path, item, body, deny, ALICE, **extra)

    def seed(self, body: dict[str, Any], status: dict[str, Any] | None = None) -> None:
        """An object already stored (no request of its own), with the status given."""
        obj = stamp_create(admit(body, self.repo), ("seed", body["metadata"]["name"]))
        stored = self._store(body["kind"], obj)
        if status is not None:
            stored["status"] = status

    def patch(
        self, path: str, item: str, kind: str, name: str, patch: dict[str, Any], deny: str = ""
    ) -> None:
        live = self.store[(kind, name)]
        self._write("UPDATE", path, item, merge_patch(live, patch), deny, ALICE)

    def annotate(self, path: str, item: str, name: str, annotations: dict[str, str | None]) -> None:
        self.patch(path, item, "Skyhook", name, {"metadata": {"annotations": annotations}})

    def delete(self, path: str, item: str, kind: str, name: str, deny: str = "", held: bool = False) -> None:
        """A DELETE; ``held``: the object stays, terminating (a finalizer is pending)."""
        live = self.store[(kind, name)]
        cluster = kind == "DeploymentPolicy"
        verdict = Verdict(not deny, self.basis, deny, cluster_state=cluster)
        self.cases.append(
            Case(self.source, self._prov(path, item), kind, "DELETE", None, live, ALICE, verdict)
        )
        if deny:
            return
        if held:
            live = copy.deepcopy(live)
            live["metadata"]["deletionTimestamp"] = "2026-01-01T00:10:00Z"
            self._store(kind, live)
        else:
            del self.store[(kind, name)]

    # -- the requests ---------------------------------------------------------------------------

    def _prov(self, path: str, item: str) -> Provenance:
        return Provenance(self.repo, f"{self.prefix}{path}", f"{self.label} / {item}" if self.label else item)

    def _write(
        self,
        op: str,
        path: str,
        item: str,
        body: dict[str, Any],
        deny: str,
        user: User,
        *,
        on_request: bool | None = None,
        note: str = "",
        basis: str = "",
    ) -> None:
        kind = body["kind"]
        admitted = admit(body, self.repo)
        live = self.store.get(_key(body))
        if op == "CREATE":
            obj, old = stamp_create(admitted, (self.repo, path, item)), None
        else:
            assert live is not None, (path, item)
            obj, old = stamp_update(admitted, live), live
        refused = schema_errors(obj)
        # Whether the DeploymentPolicy exists decides, unless a rule of the object itself refuses.
        cluster = kind == "Skyhook" and bool(obj["spec"].get("deploymentPolicy"))
        cluster = cluster and (not deny or deny.startswith('deploymentPolicy "'))
        if old is not None and "status" in old and self.source == "chainsaw":
            note = f"{note}; {STATUS_NOTE}" if note else STATUS_NOTE
        if refused:
            deny = deny or "rejected by the CRD schema before any webhook: " + "; ".join(refused)
        verdict = Verdict(not deny, basis or self.basis, deny, cluster, bool(refused), on_request, note=note)
        self.cases.append(Case(self.source, self._prov(path, item), kind, op, obj, old, user, verdict))
        if not verdict.wire or refused:
            return
        stored = self._store(kind, obj)
        if kind == "Skyhook" and op == "CREATE":
            self._operator(path, item, stored, cluster)
        elif kind == "Skyhook":
            stored["status"] = converged_status(stored)

    def _operator(self, path: str, item: str, created: dict[str, Any], cluster: bool) -> None:
        new = operator_update(created, self.repo)
        verdict = Verdict(True, "operator update", cluster_state=cluster)
        prov = self._prov(path, f"{item} / operator first update")
        self.cases.append(Case("operator", prov, "Skyhook", "UPDATE", new, created, OPERATOR, verdict))
        stored = self._store("Skyhook", new)
        stored["status"] = converged_status(stored)

    def _store(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        self._rv += 1
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = str(self._rv)
        self.store[(kind, stored["metadata"]["name"])] = stored
        return stored


def _key(body: dict[str, Any]) -> tuple[str, str]:
    return body["kind"], body["metadata"]["name"]
