"""``POST /admission/mutate``: NodeWright and Skyhook CRs get the package-hold tolerations, so that
the operator reaches nodes nodegate holds while their packages are pending, with CRs written the
way upstream documents them.

NodeWright's node picker selects a node for a CR only when the CR's own tolerations tolerate every
taint on it, and its package pods carry that same list (:mod:`admission.hold.holdtolerations`). A CREATE
or UPDATE of a package CR (both API groups) whose ``spec.additionalTolerations`` lacks them gets
them appended by an RFC 6902 JSONPatch: the user's tolerations stay as they are, in order, and
nothing else in the object changes. No patch when they are there (the API server may call again
after another webhook; a re-apply of the original manifest is mutated back to the same object),
for an UPDATE that leaves the spec as it was to the operator (its finalizer and re-encoding
updates, status, labels, pause/disable), and for subresources. Config
``nodewright.inject_tolerations`` off: no patch at all (the validating webhook then warns).
The webhook decides nothing and has no side effects, so ``dryRun`` gets the same answer.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from admission.hold.holdtolerations import missing_hold_tolerations
from admission.hold.nodes import HOLD_TAINT_KEY
from admission.reading import changes
from admission.reading.crs import PACKAGE_GROUPS
from admission.reading.review import Request

SPEC, FIELD = "spec", "additionalTolerations"


def pointer(*tokens: str) -> str:
    """An RFC 6901 JSON Pointer: ``~`` as ``~0`` and ``/`` as ``~1`` in each reference token."""
    return "".join("/" + t.replace("~", "~0").replace("/", "~1") for t in tokens)


def toleration_patch(obj: Mapping[str, Any], key: str = HOLD_TAINT_KEY) -> list[dict[str, Any]]:
    """JSONPatch operations appending the hold tolerations the CR lacks (none when it has them, or
    when its spec or tolerations are not of a shape the API server stores: the validating webhook
    and the CRD refuse those, nothing is added to them)."""
    spec = obj.get(SPEC)
    if spec is not None and not isinstance(spec, Mapping):
        return []
    present = spec.get(FIELD) if spec is not None else None
    if present is not None and not isinstance(present, list):
        return []
    missing = missing_hold_tolerations(present, key)
    if not missing:
        return []
    if spec is None:  # absent or null: "add" sets the member either way
        return [{"op": "add", "path": pointer(SPEC), "value": {FIELD: missing}}]
    if present is None:  # absent or null
        return [{"op": "add", "path": pointer(SPEC, FIELD), "value": missing}]
    return [{"op": "add", "path": pointer(SPEC, FIELD, "-"), "value": t} for t in missing]


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
class CrMutator:
    hold_taint_key: str = HOLD_TAINT_KEY
    enabled: bool = True  # config nodewright.inject_tolerations

    def mutate(self, req: Request) -> Mutation:
        kind = req.kind
        if PACKAGE_GROUPS.get(kind.group) != kind.kind or req.sub_resource:
            return Mutation(reason="not a NodeWright or Skyhook CR")
        if req.operation not in ("CREATE", "UPDATE"):
            return Mutation(reason=f"{req.operation} is not mutated")
        obj = req.object
        if obj is None:
            return Mutation(reason="no object")
        if not self.enabled:
            return Mutation(reason="nodewright.inject_tolerations is off")
        old = req.old_object
        if req.operation == "UPDATE" and old is not None and changes.unchanged(old, obj)[0]:
            # The operator's finalizer and re-encoding updates, status, labels, pause/disable: the
            # spec stays as it was stored (a CR from before nodegate gets them on its next edit).
            return Mutation(reason="spec unchanged")
        patch = toleration_patch(obj, self.hold_taint_key)
        return Mutation(tuple(patch), "" if patch else "tolerations present")
