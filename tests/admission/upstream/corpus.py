"""Every upstream-derived case, from both repositories, and the same requests as they arrive behind
upstream's own mutating webhook.

Sources: ``unit`` (webhook unit tests), ``chainsaw`` (e2e steps), ``samples``, ``docs``, and
``operator`` (the operator's first UPDATE after every Skyhook CREATE upstream allows). A request
that two sources make alike (same operation, requester, object and old object) is kept once, with
the other provenances in ``also``. The e2e steps, samples and documentation CRs are read from the
public test data, and only from there: without it, a test that asks for the corpus skips with one
line naming the folder (fails under NODEGATE_REQUIRE_TEST_DATA=1).

Upstream's chart enables its mutating webhooks, which answer with a patch to the Go re-encoding
of the object (:mod:`gotypes`; for DeploymentPolicies with the strategy defaults filled in). Since
validating webhooks run after all mutating ones, nodegate then sees that re-encoding, never the
raw request; :func:`behind_mutating_webhook` gives the cases as they arrive then.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from typing import Any

from tests.admission.upstream import documents, e2e, unit
from tests.admission.upstream.gotypes import encode_deployment_policy_spec, encode_skyhook_spec
from tests.admission.upstream.model import NODEWRIGHT, SKYHOOK, Case, admit

SOURCES = ("unit", "chainsaw", "samples", "docs", "operator")
_VOLATILE = ("uid", "resourceVersion", "generation", "creationTimestamp")


def _collect(repo: str) -> list[Case]:
    out = unit.cases(repo)
    for scenario in e2e.scenarios(repo):
        out += scenario.cases
    return out + documents.cases(repo)


def _identity(case: Case) -> str:
    def strip(obj: dict[str, Any] | None) -> Any:
        if obj is None:
            return None
        obj = copy.deepcopy(obj)
        meta = obj.get("metadata", {})
        for key in _VOLATILE:
            meta.pop(key, None)
        meta.get("annotations", {}).pop("kubectl.kubernetes.io/last-applied-configuration", None)
        return obj

    doc = [case.kind, case.operation, case.user.username, strip(case.obj), strip(case.old), case.verdict.wire]
    return json.dumps(doc, sort_keys=True)


@cache
def all_cases() -> tuple[Case, ...]:
    for folder in (e2e.DATA, documents.DATA):
        folder.require()  # skips (or fails under NODEGATE_REQUIRE_TEST_DATA=1) when absent
    seen: dict[str, Case] = {}
    for repo in (NODEWRIGHT, SKYHOOK):
        for case in _collect(repo):
            key = _identity(case)
            if key in seen:
                seen[key].also.append(case.provenance)
            else:
                seen[key] = case
    return tuple(seen.values())


def _mutated(obj: dict[str, Any] | None, repo: str) -> dict[str, Any] | None:
    """The object as upstream's mutating webhook leaves it (metadata and status as they were)."""
    if obj is None:
        return None
    out = copy.deepcopy(obj)
    spec = out.get("spec") or {}
    if out["kind"] == "Skyhook":
        out["spec"] = encode_skyhook_spec(spec, decode=True, skyhook_repo=repo == SKYHOOK)
    else:
        out["spec"] = encode_deployment_policy_spec(spec, defaults=True)
    return admit(out, repo)


def behind_mutating_webhook(case: Case) -> Case:
    """The case as it reaches a validating webhook in a cluster where upstream's mutating webhook
    runs (it mutated the stored object too, when it was written)."""
    repo = case.provenance.repo
    return Case(
        case.source,
        case.provenance,
        case.kind,
        case.operation,
        _mutated(case.obj, repo),
        _mutated(case.old, repo),
        case.user,
        case.verdict,
        case.also,
    )
