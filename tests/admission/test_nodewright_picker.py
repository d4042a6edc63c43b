"""Held nodes get their packages: nodegate's mutation against a model of NodeWright's node picker
and package pods (:mod:`tests.admission.upstream.picker`, written from upstream's code).

- upstream's own ``CheckTaintToleration`` cases agree with the model;
- property: for any CR the webhook admits and any node, after mutation the picker selects a node
  held ``packages-pending`` or ``validation-failed`` exactly when it would select the same node
  without the hold, and never one held ``unattested`` (also: rebooted since its attestation) or
  ``quarantined``; whenever it selects one, the package pods tolerate the hold;
- upstream's sample and documentation CRs, unedited (the public test data's ``nodewright/``), go through
  mutate -> validate -> picker -> package pod tolerations.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import functools
import hashlib
import json
from typing import Any

import jsonpatch
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from admission.decision.decider import Decider, LocalRbac, StaticPolicies
from admission.hold.holdtolerations import hold_tolerations
from admission.hold.mutate import CrMutator
from admission.rbac.evaluator import RbacEvaluator
from admission.reading.review import parse_review
from tests.admission.test_upstream_corpus import FULL_RBAC, open_policy
from tests.admission.upstream import picker
from tests.admission.upstream.model import NODEWRIGHT, admit, schema_errors, stamp_create
from tests.admission.upstream.pods import OPERATOR_TOLERATIONS, package_pod
from tests.support.shared_data import shared

KEY = "nodegate.io/hold"
SAMPLES = shared("nodewright")  # upstream's CRs: public test data, not committed
PACKAGE_HOLDS = ("packages-pending", "validation-failed")
OTHER_HOLDS = ("unattested", "quarantined")  # a rebooted node is held unattested
MUTATOR = CrMutator(KEY)


@functools.cache
def decider() -> Decider:
    """Made when a test first asks, not at import: the policy and the RBAC objects are validated."""
    return Decider(
        StaticPolicies([open_policy()]), LocalRbac(RbacEvaluator.from_objects(FULL_RBAC)), "nodegate"
    )


def hold(value: str, effect: str = "NoSchedule") -> dict[str, str]:
    return {"key": KEY, "value": value, "effect": effect}


def _review(obj: dict[str, Any], group: str, kind: str) -> bytes:
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "0b4f6f0e-1f5e-4f54-9a43-5b3d1c2e7a10",
                "kind": {"group": group, "version": "v1alpha1", "kind": kind},
                "resource": {"group": group, "version": "v1alpha1", "resource": kind.lower() + "s"},
                "operation": "CREATE",
                "name": obj["metadata"]["name"],
                "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
                "object": obj,
            },
        }
    ).encode()


def mutate(obj: dict[str, Any]) -> dict[str, Any]:
    group, kind = obj["apiVersion"].split("/")[0], obj["kind"]
    response = MUTATOR.mutate(parse_review(_review(obj, group, kind)).request).response("x")
    if "patch" not in response:
        return copy.deepcopy(obj)
    result: dict[str, Any] = jsonpatch.apply_patch(obj, json.loads(base64.b64decode(response["patch"])))
    return result


def validate(obj: dict[str, Any]) -> tuple[bool, str, list[str]]:
    group, kind = obj["apiVersion"].split("/")[0], obj["kind"]
    d = asyncio.run(decider().decide(parse_review(_review(obj, group, kind)).request))
    return d.allowed, d.message + "".join(f"\n  - {v}" for v in d.violations), d.warnings


# -- the model against upstream's own cases ------------------------------------------------------


def test_the_model_agrees_with_upstreams_check_taint_toleration_cases() -> None:
    """``operator/internal/controller/cluster_state_v2_test.go`` at 71ca22b8 (its four
    ``CheckTaintToleration`` expectations, written out again)."""
    k1 = {"key": "key1", "value": "value1", "effect": "NoSchedule"}
    k2 = {"key": "key2", "value": "value2", "effect": "NoSchedule"}
    equal = [{**t, "operator": "Equal"} for t in (k1, k2)]
    assert picker.tolerate_all(equal, [k1, k2])
    assert not picker.tolerate_all(
        [{"effect": "NoSchedule", "operator": "Exists"}], [k1, {**k2, "effect": "NoExecute"}]
    )
    assert picker.tolerate_all([{"effect": "NoSchedule", "operator": "Exists"}], [])
    assert picker.tolerate_all([], [])


def test_an_unmutated_cr_never_reaches_a_held_node() -> None:
    """What the issue was: a CR written as upstream documents it is blocked on every held node."""
    cr = {"spec": {"nodeSelectors": {"matchLabels": {"pool": "a"}}}}
    for value in (*PACKAGE_HOLDS, *OTHER_HOLDS):
        assert not picker.selects(cr, picker.node("n", {"pool": "a"}, hold(value)))
    assert picker.selects(cr, picker.node("n", {"pool": "a"}))


# -- the property --------------------------------------------------------------------------------

_keys = st.sampled_from(
    ["", KEY, "nvidia.com/gpu", "skyhook.nvidia.com", "nodewright.nvidia.com", picker.CORDON_KEY]
)
_values = st.sampled_from(["", *PACKAGE_HOLDS, *OTHER_HOLDS, "runtime-required", "x"])
_effects = st.sampled_from(["", "NoSchedule", "NoExecute", "PreferNoSchedule"])
_toleration = st.fixed_dictionaries(
    {},
    optional={
        "key": _keys,
        "operator": st.sampled_from(["", "Equal", "Exists", "Gt"]),
        "value": _values,
        "effect": _effects,
    },
)
_taint = st.fixed_dictionaries(
    {
        "key": st.sampled_from(
            ["nvidia.com/gpu", "skyhook.nvidia.com", "nodewright.nvidia.com", picker.CORDON_KEY, "x"]
        ),
        "value": _values,
        "effect": _effects.filter(bool),
    }
)
_spec = st.fixed_dictionaries(
    {"nodeSelectors": st.just({"matchLabels": {"pool": "a"}})},
    optional={
        "additionalTolerations": st.one_of(st.none(), st.lists(_toleration, max_size=4)),
        "runtimeRequired": st.booleans(),
        "autoTaintNewNodes": st.booleans(),
    },
)


@settings(max_examples=400, deadline=None)
@given(
    spec=_spec,
    group=st.sampled_from([("skyhook.nvidia.com", "Skyhook"), ("nodewright.nvidia.com", "NodeWright")]),
    labels=st.sampled_from([{"pool": "a"}, {"pool": "b"}, {"pool": "a", picker.IGNORE_LABEL: "true"}]),
    taints=st.lists(_taint, max_size=3),
    quarantine_effect=st.sampled_from(["NoSchedule", "NoExecute"]),
)
def test_after_mutation_held_nodes_are_picked_exactly_when_they_would_be_without_the_hold(
    spec: dict[str, Any],
    group: tuple[str, str],
    labels: dict[str, str],
    taints: list[dict[str, str]],
    quarantine_effect: str,
) -> None:
    cr = {"apiVersion": f"{group[0]}/v1alpha1", "kind": group[1], "metadata": {"name": "c"}, "spec": spec}
    mutated = mutate(cr)
    allowed, message, _ = validate(mutated)
    if not allowed:  # refused CRs never reach the operator; which ones are refused is tested elsewhere
        return
    bare = picker.node("n", labels, *taints)
    for operator in picker.OPERATORS:
        without_hold = picker.selects(mutated, bare, operator)
        for value in PACKAGE_HOLDS:
            held = picker.node("n", labels, *taints, hold(value))
            assert picker.selects(mutated, held, operator) == without_hold, (operator.name, value)
            if without_hold:
                pods = picker.package_pod_tolerations(mutated, operator)
                assert any(picker.tolerates(t, hold(value)) for t in pods)
                assert picker.kubelet_admits(pods, held) == picker.kubelet_admits(pods, bare)
        for value, effect in (("unattested", "NoSchedule"), ("quarantined", quarantine_effect)):
            held = picker.node("n", labels, *taints, hold(value, effect))
            assert not picker.selects(mutated, held, operator), (operator.name, value, message)


# -- upstream's samples and documentation CRs, unedited ------------------------------------------


def test_the_samples_are_as_the_manifest_lists_them() -> None:
    entries = list(SAMPLES.manifest().values())
    listed = {e["file"] for e in entries}
    present = {str(p.relative_to(SAMPLES.path)) for p in SAMPLES.path.rglob("*") if p.is_file()}
    assert listed == present - {"manifest.json"}
    for e in entries:
        assert hashlib.sha256(SAMPLES.read(e["file"])).hexdigest() == e["sha256"], e["file"]
        assert e["repository"] == "NVIDIA/nodewright"
        assert len(e["commit"]) == 40
        assert e["licence"] == "Apache-2.0"
        assert e["fetched"]
        assert e["path"]


# Upstream's verdicts that come before nodegate: the CRD refuses restart_all_services (an interrupt
# type it does not have) in operator/README.md; everything else is admitted.
CRD_REFUSES = {"operator/README.md.block0.yaml"}


def _package_crs() -> list[Any]:
    """The folder's files that are package CRs with packages (the folder also holds the
    DeploymentPolicies and policy-only Skyhooks of the documentation, for the upstream corpus)."""
    if not SAMPLES.present:
        return SAMPLES.params("*.yaml")

    def has_packages(name: str) -> bool:
        doc = yaml.safe_load(SAMPLES.read(name))
        return doc.get("kind") == "Skyhook" and bool((doc.get("spec") or {}).get("packages"))

    return SAMPLES.params(names=[n for n in SAMPLES.names("*.yaml") if has_packages(n)])


@pytest.mark.parametrize("name", _package_crs())
def test_an_unedited_upstream_cr_reaches_a_held_node(name: str) -> None:
    entry = SAMPLES.entry(name)
    raw = yaml.safe_load(SAMPLES.read(name))
    sent = admit(stamp_create(raw, entry["file"]), NODEWRIGHT)  # pruned and defaulted, as sent
    if entry["file"] in CRD_REFUSES:
        assert schema_errors(sent)
        return
    assert not schema_errors(sent)
    # Before: NodeWright skips every held node (TaintNotTolerable), and nodegate warns.
    labels = picker.node_labels(sent)
    held = {value: picker.node("gpu-1", labels, hold(value)) for value in (*PACKAGE_HOLDS, *OTHER_HOLDS)}
    assert not any(picker.selects(sent, n) for n in held.values())
    allowed, message, warnings = validate(sent)
    assert allowed, message
    assert warnings[0].startswith(f"NodeWright skips nodes held by {KEY}")
    # mutate -> validate
    mutated = mutate(sent)
    before = copy.deepcopy(sent)
    assert mutated["spec"]["additionalTolerations"] == [
        *before["spec"].pop("additionalTolerations", []),
        *hold_tolerations(KEY),
    ]
    mutated_rest = copy.deepcopy(mutated)
    del mutated_rest["spec"]["additionalTolerations"]
    assert mutated_rest == before  # nothing else changed
    allowed, message, warnings = validate(mutated)
    assert allowed, message
    assert not any(KEY in w for w in warnings)
    assert mutate(mutated) == mutated  # no patch the second time
    # picker -> package pods
    for operator in picker.OPERATORS:
        for value in PACKAGE_HOLDS:
            node = held[value]
            assert picker.selects(mutated, node, operator), (operator.name, value)
            assert picker.runs_on(mutated, node, operator)
        for value in OTHER_HOLDS:
            assert not picker.selects(mutated, held[value], operator)
    for package, pkg in mutated["spec"]["packages"].items():
        pod = package_pod(
            mutated["metadata"]["name"],
            package,
            pkg["version"],
            "apply",
            "gpu-1",
            image=pkg["image"],
            additional_tolerations=mutated["spec"]["additionalTolerations"],
        )
        assert pod["spec"]["tolerations"] == [
            *OPERATOR_TOLERATIONS,
            *mutated["spec"]["additionalTolerations"],
        ]
        assert pod["spec"]["tolerations"] == picker.package_pod_tolerations(mutated)
        for value in PACKAGE_HOLDS:
            assert picker.tolerate_all(pod["spec"]["tolerations"], [hold(value)])
