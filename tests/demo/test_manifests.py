"""The demo's NodeWright objects: its sample CR is the project's own, in the shape of upstream's
simplest example (public test data, not shipped), its package pod matches the fuller
upstream-derived builder of the admission tests, and the demo's JSONPatch application agrees with
an independent RFC 6902 implementation on what the mutating webhook answers."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import jsonpatch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from admission.decision.decider import Decider, StaticPolicies, rbac_authorizer
from admission.hold.mutate import CrMutator
from admission.reading.policy import PackagePolicy
from admission.reading.review import parse_review
from bootstrap.demo import admit, manifests
from tests.admission.upstream import picker, pods
from tests.support.shared_data import shared

UPSTREAM = shared("nodewright-demo")  # upstream's examples/simple, public test data: not shipped
SKYHOOK = ("skyhook.nvidia.com", "v1alpha1", "Skyhook")


def _patch(obj: dict[str, Any]) -> list[dict[str, Any]]:
    body = manifests.review(obj, "alice", ("ml-platform",), kind=SKYHOOK)
    response = (
        CrMutator("nodegate.io/hold").mutate(parse_review(json.dumps(body).encode()).request).response("x")
    )
    return json.loads(base64.b64decode(response["patch"])) if "patch" in response else []


def test_the_demo_ships_no_upstream_file() -> None:
    """The demo's CR is the project's own: nothing of upstream's is package data any more."""
    package = Path(admit.__file__).parent
    assert not (package / "data").exists()
    assert "nodewright" not in json.dumps(admit.sample_cr()["metadata"])


def _shape(value: Any) -> Any:
    """The structure of a CR: its keys and the types of its leaves, names of packages aside."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(v) for v in value]
    return type(value).__name__


def test_the_sample_has_the_shape_of_upstreams_simplest_example() -> None:
    theirs = yaml.safe_load(UPSTREAM.read("examples/simple/scr.yaml"))
    mine = admit.sample_cr()
    assert (mine["apiVersion"], mine["kind"]) == (theirs["apiVersion"], theirs["kind"])
    assert mine["spec"]["nodeSelectors"] == {"matchLabels": manifests.SAMPLE_POOL}
    assert set(mine["spec"]) == set(theirs["spec"])
    (their_package,) = theirs["spec"]["packages"].values()
    (my_package,) = mine["spec"]["packages"].values()
    assert set(my_package) == set(their_package) == {"version", "image", "configMap"}
    assert my_package["image"] == their_package["image"]
    assert _shape(my_package["configMap"]) == {k: "str" for k in my_package["configMap"]}
    assert mine != theirs


def test_the_demos_policies_admit_the_mutated_sample_and_the_picker_reaches_the_held_node() -> None:
    sample = admit.sample_cr()
    mutated = admit.apply_patch(sample, _patch(sample))
    decider = Decider(
        StaticPolicies([PackagePolicy.model_validate(p) for p in manifests.policy_documents()]),
        rbac_authorizer(manifests.rbac_documents()),
        "nodegate",
    )
    body = manifests.review(mutated, "alice", ("ml-platform",), kind=SKYHOOK)
    decision = asyncio.run(decider.decide(parse_review(json.dumps(body).encode()).request))
    assert decision.allowed, decision.message
    assert decision.audit["policy"] == manifests.SAMPLE_POLICY
    held = picker.node(
        "gpu-node-3",
        manifests.SAMPLE_POOL,
        {"key": manifests.TAINT_KEY, "value": "validation-failed", "effect": "NoSchedule"},
    )
    assert not picker.selects(sample, held)
    assert picker.runs_on(mutated, held)


def test_the_package_pod_is_named_labelled_and_tolerating_as_the_operators() -> None:
    sample = admit.sample_cr()
    cr = admit.apply_patch(sample, _patch(sample))
    mine = manifests.package_pod(cr, "motd", "gpu-node-3")
    theirs = pods.package_pod(
        manifests.SAMPLE_NAME,
        "motd",
        "1.0.0",
        "apply",
        "gpu-node-3",
        additional_tolerations=cr["spec"]["additionalTolerations"],
    )
    for key in ("name", "namespace", "labels"):
        assert mine["metadata"][key] == theirs["metadata"][key]
    for key in ("nodeName", "tolerations", "serviceAccountName", "hostPID", "restartPolicy"):
        assert mine["spec"][key] == theirs["spec"][key]
    assert mine["spec"]["tolerations"] == picker.package_pod_tolerations(cr)


_tolerations = st.lists(
    st.fixed_dictionaries(
        {"key": st.sampled_from(["a/b", "nodegate.io/hold", "x~y"]), "operator": st.just("Exists")}
    ),
    max_size=3,
)


@settings(max_examples=100, deadline=None)
@given(shape=st.sampled_from(["absent", "null", "list", "no-spec", "null-spec"]), tolerations=_tolerations)
def test_the_demos_patch_application_agrees_with_rfc_6902(
    shape: str, tolerations: list[dict[str, str]]
) -> None:
    obj: dict[str, Any] = {
        "apiVersion": "skyhook.nvidia.com/v1alpha1",
        "kind": "Skyhook",
        "metadata": {"name": "s"},
    }
    obj["spec"] = {
        "absent": {"packages": {}},
        "null": {"additionalTolerations": None},
        "list": {"additionalTolerations": tolerations},
        "null-spec": None,
    }.get(shape)
    if shape == "no-spec":
        del obj["spec"]
    patch = _patch(obj)
    assert admit.apply_patch(obj, patch) == jsonpatch.apply_patch(obj, patch)
