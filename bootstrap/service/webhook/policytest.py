"""`nodegate policy test` and `nodegate policy audit`: offline judgements with the server's code.

    nodegate policy test --policy policies.yaml --rbac rbac.yaml review1.json review2.yaml

Prints a verdict per input, in order (``FILE: allowed`` or ``FILE: denied: MESSAGE`` and one
indented line per violation and warning; ``-o json``: the AdmissionReview response, one JSON line
per input); exits 0 when every review was allowed, 1 when any was denied, 2 for unusable inputs.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from admission.decision.decider import Decider, LocalRbac, StaticPolicies
from admission.decision.response import Decision
from admission.policies import rules
from admission.reading.policy import PackagePolicy
from bootstrap.service.webhook.policycases import Sender, judge, load_cases, run_cases
from bootstrap.service.webhook.policyload import ToolError, documents, load_policies, load_rbac

DEFAULT_OWNER = "system:serviceaccount:nodegate:nodegate"


async def _run(
    decider: Decider,
    reviews: Sequence[Path],
    out: TextIO,
    sender: Sender | None = None,
    output: str = "text",
) -> int:
    denied = False
    for path in reviews:
        docs = list(documents(path))
        if len(docs) != 1:
            raise ToolError(f"{path}: expected exactly one AdmissionReview or object")
        # an AdmissionReview as is, or a plain object sent by --user/--group (policycases)
        uid, decision = await judge(decider, docs[0], sender or Sender(None), str(path))
        denied |= not decision.allowed
        if output == "json":
            body = {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": decision.response(uid),
            }
            print(json.dumps(body, sort_keys=True), file=out)
        else:
            print("\n".join(verdict_lines(path, decision)), file=out)
    return 1 if denied else 0


def verdict_lines(path: Path, decision: Decision) -> list[str]:
    """``FILE: allowed`` or ``FILE: denied: MESSAGE``, then ``  RULE PATH: MESSAGE (FIX)`` per
    violation and ``  warning: TEXT`` per warning."""
    head = f"{path}: allowed" if decision.allowed else f"{path}: denied: {decision.message}"
    lines = [head]
    lines += [f"  {v.rule} {v}" for v in decision.violations]
    # a warning's "- item" lines (the tolerations to add) continue the warning before them
    lines += [f"    {w}" if w.startswith("- ") else f"  warning: {w}" for w in decision.warnings]
    return lines


def audit_objects(policies: list[PackagePolicy], objects: Sequence[Any]) -> list[dict[str, Any]]:
    """Judge existing package CRs against today's policies, without identity: the structural
    rules and every candidate policy's limits. Who may use a policy cannot be audited after the
    fact (the requester is gone), so a CR passes when *some* policy's limits hold."""
    out = []
    for obj in objects:
        if not isinstance(obj, dict) or obj.get("kind") not in ("NodeWright", "Skyhook"):
            continue
        name = str(obj.get("metadata", {}).get("name", ""))
        parsed = rules.parse_package_cr(obj)
        if isinstance(parsed, list):
            out.append({"kind": obj["kind"], "name": name, "violations": [str(v) for v in parsed]})
            continue
        found = [str(v) for v in rules.structural_violations(parsed)]
        found += [str(v) for v in rules.guard_violations(parsed, rules.HOLD_TAINT_KEY)]
        if not found:
            verdicts = rules.policy_verdicts(parsed, policies)
            if not verdicts:
                found = [str(rules.no_pool_violation(parsed))]
            elif not any(v.ok for v in verdicts):
                found = [f"[{v.policy}] {x}" for v in verdicts for x in v.violations]
        if found:
            out.append({"kind": obj["kind"], "name": name, "violations": found})
    return out


def audit(policies: Sequence[Path], objects: Sequence[Path]) -> int:
    """`nodegate policy audit`: print one JSON line per CR that today's policies would refuse."""
    try:
        refused = audit_objects(load_policies(policies), [doc for p in objects for doc in documents(p)])
    except ToolError as exc:
        print(f"nodegate policy audit: {exc}", file=sys.stderr)
        return 2
    for entry in refused:
        print(json.dumps(entry, sort_keys=True))
    print(
        f"{len(refused)} CR(s) would be refused (identity-dependent rules are not audited)", file=sys.stderr
    )
    return 1 if refused else 0


def run(
    policies: Sequence[Path],
    rbac: Sequence[Path],
    reviews: Sequence[Path],
    owner: str = DEFAULT_OWNER,
    sender: Sender | None = None,
    expect: Path | None = None,
    output: str = "text",
) -> int:
    try:
        decider = Decider(StaticPolicies(load_policies(policies)), LocalRbac(load_rbac(rbac)), owner)
        if expect is not None:
            return asyncio.run(run_cases(decider, load_cases(expect), sys.stdout))
        return asyncio.run(_run(decider, _given(reviews), sys.stdout, sender, output))
    except ToolError as exc:
        print(f"nodegate policy test: {exc}", file=sys.stderr)
        return 2


def _given(reviews: Sequence[Path]) -> Sequence[Path]:
    if not reviews:
        raise ToolError("give AdmissionReview or object files, or --expect FILE")
    return reviews
