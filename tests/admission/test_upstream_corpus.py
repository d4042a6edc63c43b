"""nodegate's webhook against upstream's own verdicts on upstream's own cases.

Every case of :mod:`tests.admission.upstream.corpus` (NodeWright's and Skyhook's webhook unit
tests, chainsaw e2e steps, samples, documentation CRs, and the operator's first UPDATE after each
allowed CREATE) goes through the decider with a PackagePolicy that limits nothing and RBAC that
grants everyone ``deploy`` and ``reboot``. Then nodegate must allow what upstream allows, and deny
what upstream denies without looking at the cluster. Upstream's refusals that need the cluster (a
missing DeploymentPolicy, deleting one still in use) are left to upstream's own webhook; objects
the CRD schema refuses never reach a webhook. Both as the requests come and as they arrive behind
upstream's mutating webhook (the chart's default). Each chainsaw e2e test is also replayed on its
own from upstream's files in the public test data, so that a bad file fails its test alone.
"""

from __future__ import annotations

import base64
import functools
import json
from collections import Counter
from typing import Any

import jsonpatch
import pytest

from admission.decision.decider import Decider, LocalRbac, StaticPolicies
from admission.hold.mutate import CrMutator, toleration_patch
from admission.rbac.evaluator import RbacEvaluator, ResourceAttributes, UserInfo
from admission.reading.policy import PackagePolicy
from admission.reading.review import parse_review
from tests.admission.upstream import e2e
from tests.admission.upstream.corpus import SOURCES, all_cases, behind_mutating_webhook
from tests.admission.upstream.model import NODEWRIGHT, SKYHOOK, Case
from tests.support import package_crs


@functools.cache
def open_policy() -> PackagePolicy:
    """Validated when a test first asks (functools.cache), not at import: a refusal by the installed
    pydantic or the policy model fails those tests, not the collection."""
    return PackagePolicy.model_validate(package_crs.open_policy("everything"))


FULL_RBAC: list[dict[str, Any]] = [
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "deploy-everything"},
        "rules": [
            {"apiGroups": ["nodegate.io"], "resources": ["packagepolicies"], "verbs": ["deploy", "reboot"]}
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "deploy-everything"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "deploy-everything",
        },
        "subjects": [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:authenticated"}
        ],
    },
]


def _decider() -> Decider:
    return Decider(
        StaticPolicies([open_policy()]), LocalRbac(RbacEvaluator.from_objects(FULL_RBAC)), "nodegate"
    )


async def _allowed(decider: Decider, case: Case) -> tuple[bool, str]:
    decision = await decider.decide(parse_review(_wire(case)).request)
    return decision.allowed, decision.message + "".join(f"\n  - {v}" for v in decision.violations)


def _wire(case: Case) -> bytes:
    return json.dumps(case.review()).encode()


def _kind(case: Case) -> str:
    if case.verdict.crd_rejects:
        return "crd"  # the API server refuses it before any webhook
    if case.verdict.cluster_state and not case.verdict.wire:
        return "cluster"  # upstream refuses it from other objects: left to upstream's webhook
    return "checked"


def test_the_corpus_has_every_source_and_both_verdicts() -> None:
    cases = all_cases()
    sources = Counter(c.source for c in cases)
    assert set(sources) == set(SOURCES)
    assert {c.verdict.wire for c in cases} == {True, False}
    assert {c.provenance.repo for c in cases} == {"NVIDIA/nodewright", "NVIDIA/skyhook"}
    assert all(c.provenance.path and c.provenance.item for c in cases)


@pytest.mark.parametrize("mutated", [False, True], ids=["as-sent", "behind-upstream-mutating-webhook"])
async def test_nodegate_agrees_with_upstream(mutated: bool, capsys: pytest.CaptureFixture[str]) -> None:
    decider = _decider()
    counts: Counter[tuple[str, str]] = Counter()
    disagreements = []
    for original in all_cases():
        case = behind_mutating_webhook(original) if mutated else original
        kind = _kind(case)
        allowed, message = await _allowed(decider, case)
        counts[(case.source, "fixtures")] += 1
        counts[(case.source, kind)] += 1
        if kind == "checked":
            if allowed == case.verdict.wire:
                counts[(case.source, "agree")] += 1
            else:
                disagreements.append(
                    f"{case.provenance}: upstream {case.verdict.wire}, nodegate {allowed}: {message}"
                )
        elif kind == "crd" and not allowed:
            counts[(case.source, "crd-also-denied")] += 1
    with capsys.disabled():
        print(f"\nupstream corpus ({'behind the mutating webhook' if mutated else 'as sent'}):")
        for source in SOURCES:
            row = {
                k: counts[(source, k)]
                for k in ("fixtures", "checked", "agree", "cluster", "crd", "crd-also-denied")
            }
            print(f"  {source:9} " + " ".join(f"{k}={v}" for k, v in row.items()))
        total = sum(counts[(s, "fixtures")] for s in SOURCES)
        agree = sum(counts[(s, "agree")] for s in SOURCES)
        checked = sum(counts[(s, "checked")] for s in SOURCES)
        print(f"  total     fixtures={total} checked={checked} agree={agree}")
    assert disagreements == []
    assert sum(counts[(s, "checked")] for s in SOURCES) > 400


# -- the chainsaw e2e tests, one by one, from upstream's files in the public test data -----------

E2E = e2e.DATA
# Each test of e2e.TESTS by its chainsaw-test.yaml: a listing, nothing is read at collection.
_E2E_TESTS = [
    f"{repo}/k8s-tests/chainsaw/{test}/chainsaw-test.yaml"
    for test, repos in e2e.TESTS.items()
    for repo in repos
]
# What the replay makes of the e2e tests at the two snapshots: requests by repository and source,
# and how many of them upstream refuses (the retyped copies it replaced gave the same 285, issue 40).
E2E_REQUESTS = {
    (NODEWRIGHT, "chainsaw"): 122,
    (NODEWRIGHT, "operator"): 47,
    (SKYHOOK, "chainsaw"): 83,
    (SKYHOOK, "operator"): 33,
}
E2E_REFUSED = {NODEWRIGHT: 8, SKYHOOK: 5}


@pytest.mark.parametrize("name", E2E.params(names=_E2E_TESTS))
async def test_an_e2e_test_replayed_from_upstreams_files(name: str) -> None:
    """One chainsaw test, step by step from its files: it makes requests, and nodegate agrees with
    upstream on each (as sent and behind upstream's mutating webhook)."""
    E2E.require()
    repo, _, rest = name.partition("/k8s-tests/chainsaw/")
    s = e2e.scenario(repo, rest.removesuffix("/chainsaw-test.yaml"))
    assert any(c.source == "chainsaw" for c in s.cases)
    decider = _decider()
    disagreements = []
    for original in s.cases:
        for case in (original, behind_mutating_webhook(original)):
            if _kind(case) != "checked":
                continue
            allowed, message = await _allowed(decider, case)
            if allowed != case.verdict.wire:
                disagreements.append(f"{case.provenance}: upstream {case.verdict.wire}, nodegate {message}")
    assert disagreements == []


def test_the_e2e_replay_reads_every_file_and_makes_every_request(monkeypatch: pytest.MonkeyPatch) -> None:
    E2E.require()
    read: set[str] = set()
    documents = e2e._documents

    def recording(repo: str, path: str) -> list[dict[str, Any]]:
        read.add(f"{repo}/{path}")
        return documents(repo, path)

    monkeypatch.setattr(e2e, "_documents", recording)
    cases = [c for repo in (NODEWRIGHT, SKYHOOK) for s in e2e.scenarios(repo) for c in s.cases]
    assert Counter((c.provenance.repo, c.source) for c in cases) == E2E_REQUESTS
    assert Counter(c.provenance.repo for c in cases if not c.verdict.wire) == E2E_REFUSED
    # Every file of the folder is read by a step (the licences aside): a test left out of TESTS fails.
    assert read == {n for n in E2E.names() if not n.endswith("/LICENSE")}


class _Nobody:
    """An authorizer that grants nothing and counts what it was asked."""

    def __init__(self) -> None:
        self.asked = 0

    async def allowed(self, user: UserInfo, attrs: ResourceAttributes) -> bool:
        self.asked += 1
        return False


class _NotLoaded:
    def policies(self) -> None:
        return None


@pytest.mark.parametrize("mutated", [False, True], ids=["as-sent", "behind-upstream-mutating-webhook"])
async def test_the_operators_own_updates_need_no_policy_and_no_rights(mutated: bool) -> None:
    """No PackagePolicy loaded, an authorizer that refuses everyone: the operator's finalizer
    UPDATE of every CR upstream admitted still passes, without a single access check."""
    nobody = _Nobody()
    decider = Decider(_NotLoaded(), nobody, "nodegate")
    operator_cases = [c for c in all_cases() if c.source == "operator"]
    assert len(operator_cases) > 100
    for original in operator_cases:
        case = behind_mutating_webhook(original) if mutated else original
        decision = await decider.decide(parse_review(_wire(case)).request)
        assert decision.allowed, (str(case.provenance), decision.message)
        assert decision.audit.get("reason") == "spec unchanged"
    assert nobody.asked == 0


async def test_without_rights_only_unchanged_updates_pass() -> None:
    """The same corpus with an authorizer that grants nothing: every CREATE and every UPDATE that
    changes the spec or pause/disable is refused; so is every DELETE (issue 33, finding 5)."""
    decider = Decider(StaticPolicies([open_policy()]), _Nobody(), "nodegate")
    for case in all_cases():
        if case.kind != "Skyhook" or case.verdict.crd_rejects:
            continue
        decision = await decider.decide(parse_review(_wire(case)).request)
        if case.operation == "DELETE":
            assert not decision.allowed
        elif decision.allowed:
            assert decision.audit.get("reason") == "spec unchanged", str(case.provenance)
            assert case.operation == "UPDATE"


def _behind_nodegate(case: Case) -> Case:
    """The case behind nodegate's own mutating webhook: the object gets the patch the webhook
    answers for this very review, and a stored ``oldObject`` went through it when written."""
    mutator = CrMutator("nodegate.io/hold")
    old = case.old
    if old is not None and case.kind == "Skyhook":
        old = jsonpatch.apply_patch(old, toleration_patch(old, "nodegate.io/hold"))
    moved = Case(
        case.source, case.provenance, case.kind, case.operation, case.obj, old, case.user, case.verdict
    )
    if case.obj is None:
        return moved
    response = mutator.mutate(parse_review(_wire(moved)).request).response("x")
    if "patch" in response:
        moved.obj = jsonpatch.apply_patch(case.obj, json.loads(base64.b64decode(response["patch"])))
    return moved


async def test_nodegate_agrees_with_upstream_behind_its_own_mutating_webhook() -> None:
    """Upstream's verdicts are unchanged by nodegate's mutation; nothing admitted lacks the hold
    tolerations (no warning), and the operator's own updates stay unchanged UPDATEs."""
    decider = _decider()
    disagreements = []
    checked = 0
    for original in all_cases():
        case = _behind_nodegate(original)
        if _kind(case) != "checked":
            continue
        checked += 1
        decision = await decider.decide(parse_review(_wire(case)).request)
        if decision.allowed != case.verdict.wire:
            disagreements.append(
                f"{case.provenance}: upstream {case.verdict.wire}, nodegate {decision.message}"
            )
        assert not any("nodegate.io/hold" in w for w in decision.warnings), str(case.provenance)
        if case.source == "operator":
            assert decision.audit.get("reason") == "spec unchanged", str(case.provenance)
    assert disagreements == []
    assert checked > 400
