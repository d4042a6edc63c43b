"""``nodegate policy test`` on plain objects and on a table of expected verdicts.

A file that is not an AdmissionReview is taken as the object itself (a NodeWright or Skyhook CR,
a DeploymentPolicy, a Node: what ``kubectl apply -f`` would send); ``--user``/``--group`` say who
sends it, and the AdmissionReview is built the way the API server builds it (kind, resource,
name, namespace, userInfo, the object). ``--expect FILE`` runs a table of cases, each with the
verdict it should get, and prints PASS or FAIL per row, like ``kyverno test``:

    cases:
      - name: team-a may deploy the driver to pool a
        object: crs/driver.yaml          # relative to the table
        user: alice
        groups: [team-a]
        operation: CREATE                # default CREATE; UPDATE needs old_object
        expect: allowed                  # or denied
        rules: [registry]                # optional: rule ids (docs/admission.md) among the denial's
"""

from __future__ import annotations

import difflib
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from admission.decision.decider import Decider
from admission.decision.response import Decision
from admission.decision.ruleids import RULE_IDS
from admission.reading.review import ReviewError, parse_review
from bootstrap.service.webhook.policyload import ToolError, documents

OPERATIONS = ("CREATE", "UPDATE", "DELETE")
_CLUSTER_SCOPED = frozenset({"Skyhook", "NodeWright", "DeploymentPolicy", "Node", "PackagePolicy"})


@dataclass(frozen=True)
class Sender:
    user: str | None
    groups: tuple[str, ...] = ()
    operation: str = "CREATE"


def plural(kind: str) -> str:
    low = kind.lower()
    if low.endswith("y") and low[-2:-1] not in tuple("aeiou"):
        return low[:-1] + "ies"
    return low + ("es" if low.endswith(("s", "x", "ch", "sh")) else "s")


def review_for(obj: dict[str, Any], sender: Sender, old: dict[str, Any] | None = None) -> dict[str, Any]:
    """The AdmissionReview the API server would send for ``obj`` from ``sender``."""
    if sender.user is None:
        raise ToolError("a plain object needs --user (and --group for each group) to say who sends it")
    api_version = str(obj.get("apiVersion") or "")
    kind = str(obj.get("kind") or "")
    if not api_version or not kind:
        raise ToolError("the object has no apiVersion or kind")
    group, _, version = api_version.rpartition("/")
    raw_meta = obj.get("metadata")
    meta: dict[str, Any] = raw_meta if isinstance(raw_meta, dict) else {}
    gvk = {"group": group, "version": version, "kind": kind}
    request: dict[str, Any] = {
        "uid": str(uuid.uuid4()),
        "kind": gvk,
        "resource": {"group": group, "version": version, "resource": plural(kind)},
        "requestKind": gvk,
        "name": str(meta.get("name") or ""),
        "namespace": "" if kind in _CLUSTER_SCOPED else str(meta.get("namespace") or "default"),
        "operation": sender.operation,
        "userInfo": {"username": sender.user, "groups": list(sender.groups)},
        "object": None if sender.operation == "DELETE" else obj,
        "oldObject": old if sender.operation != "CREATE" else None,
        "dryRun": False,
    }
    if sender.operation == "DELETE":
        request["oldObject"] = obj
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


async def judge(decider: Decider, doc: Any, sender: Sender, where: str) -> tuple[str, Decision]:
    """(uid, decision) for an AdmissionReview document or a plain object."""
    if not isinstance(doc, dict):
        raise ToolError(f"{where}: not a mapping")
    if doc.get("kind") != "AdmissionReview":
        doc = review_for(doc, sender)
    try:
        review = parse_review(json.dumps(doc).encode())
    except ReviewError as exc:
        raise ToolError(f"{where}: {exc}") from None
    return review.request.uid, await decider.decide(review.request)


# -- the table ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    obj: dict[str, Any]
    old: dict[str, Any] | None
    sender: Sender
    allowed: bool
    rules: tuple[str, ...]


def _object(value: Any, base: Path, what: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if isinstance(value, str):
        docs = list(documents(base / value))
        if len(docs) != 1 or not isinstance(docs[0], dict):
            raise ToolError(f"{what}: {value} must hold exactly one object")
        return dict(docs[0])
    if isinstance(value, dict):
        return value
    raise ToolError(f"{what}: a file name or an inline object")


def load_cases(path: Path) -> list[Case]:
    docs = list(documents(path))
    table = docs[0] if len(docs) == 1 and isinstance(docs[0], dict) else None
    rows = table.get("cases") if table else None
    if not isinstance(rows, list) or not rows:
        raise ToolError(f"{path}: expected a mapping with a non-empty list 'cases'")
    out = []
    for i, row in enumerate(rows, 1):
        what = f"{path}: case {i}"
        if not isinstance(row, dict):
            raise ToolError(f"{what}: not a mapping")
        unknown = set(row) - {
            "name",
            "object",
            "old_object",
            "user",
            "groups",
            "operation",
            "expect",
            "rules",
        }
        if unknown:
            raise ToolError(f"{what}: unknown keys {sorted(unknown)}")
        expect, operation = row.get("expect"), str(row.get("operation") or "CREATE")
        if expect not in ("allowed", "denied"):
            raise ToolError(f"{what}: expect must be allowed or denied")
        if operation not in OPERATIONS:
            raise ToolError(f"{what}: operation must be one of {', '.join(OPERATIONS)}")
        obj = _object(row.get("object"), path.parent, what)
        if obj is None:
            raise ToolError(f"{what}: object is required")
        groups = row.get("groups") or []
        if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
            raise ToolError(f"{what}: groups must be a list of names")
        user = row.get("user")
        if not isinstance(user, str) or not user:
            raise ToolError(f"{what}: user is required")
        out.append(
            Case(
                name=str(row.get("name") or f"case {i}"),
                obj=obj,
                old=_object(row.get("old_object"), path.parent, what),
                sender=Sender(user, tuple(groups), operation),
                allowed=expect == "allowed",
                rules=_rule_ids(row.get("rules"), what),
            )
        )
    return out


def _rule_ids(given: object, what: str) -> tuple[str, ...]:
    """The case's ``rules:``, each a rule id the code has: a typo would make a case that cannot pass."""
    if given is None:
        return ()
    if not isinstance(given, list) or not all(isinstance(r, str) for r in given):
        raise ToolError(f"{what}: rules must be a list of rule ids (docs/admission.md)")
    for rule in given:
        if rule not in RULE_IDS:
            close = difflib.get_close_matches(rule, RULE_IDS, n=1, cutoff=0.5)
            if not close:  # images.registries -> registry: the last word may be the id
                close = difflib.get_close_matches(rule.rsplit(".", 1)[-1], RULE_IDS, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ToolError(f"{what}: no rule has the id {rule!r}{hint}; the ids are in docs/admission.md")
    return tuple(given)


async def run_cases(decider: Decider, cases: Sequence[Case], out: TextIO) -> int:
    """Prints a PASS/FAIL table; 0 when every case got its expected verdict, else 1."""
    rows: list[tuple[str, str, str, str]] = []
    for case in cases:
        doc = review_for(case.obj, case.sender, case.old)
        review = parse_review(json.dumps(doc).encode())
        decision = await decider.decide(review.request)
        got_rules = {v.rule for v in decision.violations}
        ok = decision.allowed == case.allowed and set(case.rules) <= got_rules
        got = (
            "allowed"
            if decision.allowed
            else "denied" + (f" ({', '.join(sorted(got_rules))})" if got_rules else "")
        )
        want = ("allowed" if case.allowed else "denied") + (
            f" ({', '.join(case.rules)})" if case.rules else ""
        )
        rows.append(("PASS" if ok else "FAIL", case.name, want, got))
    header = ("RESULT", "CASE", "EXPECTED", "GOT")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
    for row in [header, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(row[:3], widths, strict=True)) + "  " + row[3], file=out)
    failed = sum(r[0] == "FAIL" for r in rows)
    print(f"{len(rows) - failed} passed, {failed} failed", file=out)
    return 1 if failed else 0
