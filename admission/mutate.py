"""``POST /admission/mutate``: NodeWright's package and interrupt pods get the hold-taint
tolerations, so that they run on nodes nodegate holds while their packages are pending, without
any edit to the CRs.

The operator creates those pods with its own service account (they run as the namespace's
default one), on a node named in the pod. A Pod CREATE by one of the configured operator
accounts (config ``nodewright.operator_service_accounts``) gets two Equal tolerations of the hold
taint, for reasons ``packages-pending`` and ``validation-failed``, added by a JSONPatch; Equal, so
the pods never run on nodes held ``unattested`` or ``quarantined``. Nothing else changes, and any
other request is allowed unchanged: this webhook decides nothing, it only adds.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from admission.guards import PACKAGE_REASONS
from admission.nodes import HOLD_TAINT_KEY
from admission.review import Request


def hold_tolerations(key: str = HOLD_TAINT_KEY) -> list[dict[str, str]]:
    """The tolerations package pods get, one per hold reason they are meant to run under."""
    return [
        {"key": key, "operator": "Equal", "value": reason, "effect": "NoSchedule"}
        for reason in sorted(PACKAGE_REASONS)
    ]


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """The same toleration (an omitted operator means Equal)."""
    return (
        a.get("key") == b.get("key")
        and (a.get("operator") or "Equal") == (b.get("operator") or "Equal")
        and a.get("value") == b.get("value")
        and a.get("effect") == b.get("effect")
    )


def toleration_patch(pod: Mapping[str, Any], key: str = HOLD_TAINT_KEY) -> list[dict[str, Any]]:
    """JSONPatch operations adding the hold tolerations the pod lacks (none when it has them: the
    API server may call the webhook again after another one changed the pod)."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return []
    present = spec.get("tolerations")
    if present is not None and not isinstance(present, list):
        return []  # not a pod the API server will accept; nothing to add to
    have = [t for t in present or [] if isinstance(t, Mapping)]
    missing = [t for t in hold_tolerations(key) if not any(_same(t, h) for h in have)]
    if not missing:
        return []
    if present is None:
        return [{"op": "add", "path": "/spec/tolerations", "value": missing}]
    return [{"op": "add", "path": "/spec/tolerations/-", "value": t} for t in missing]


@dataclass(frozen=True)
class Mutation:
    """The answer to one review: allowed always, with a patch or without."""

    patch: tuple[dict[str, Any], ...] = ()
    reason: str = ""  # why no patch (for the log)

    def response(self, uid: str) -> dict[str, Any]:
        out: dict[str, Any] = {"uid": uid, "allowed": True}
        if self.patch:
            out["patchType"] = "JSONPatch"
            out["patch"] = base64.b64encode(json.dumps(list(self.patch)).encode()).decode()
            out["auditAnnotations"] = {"mutation": "hold-tolerations"}
        return out


def encode_mutation_response(mutation: Mutation, uid: str) -> bytes:
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}
    return json.dumps({**review, "response": mutation.response(uid)}).encode()


@dataclass(frozen=True)
class PodMutator:
    operator_accounts: frozenset[str]
    hold_taint_key: str = HOLD_TAINT_KEY

    @classmethod
    def of(cls, accounts: Iterable[str], hold_taint_key: str = HOLD_TAINT_KEY) -> PodMutator:
        return cls(frozenset(accounts), hold_taint_key)

    def mutate(self, req: Request) -> Mutation:
        kind = req.kind
        if kind.group != "" or kind.kind != "Pod" or req.operation != "CREATE" or req.sub_resource:
            return Mutation(reason="not a Pod CREATE")
        if req.user_info.username not in self.operator_accounts:
            return Mutation(reason="not created by a NodeWright operator account")
        if req.object is None:
            return Mutation(reason="no object")
        patch = toleration_patch(req.object, self.hold_taint_key)
        return Mutation(tuple(patch), "" if patch else "tolerations present")
