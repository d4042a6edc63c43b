"""The demo's NodeWright objects: upstream's sample is shipped unedited (the same bytes as the test
fixture, listed in both manifests), its package pod matches the fuller upstream-derived builder of
the admission tests, and the demo's JSONPatch application agrees with an independent RFC 6902
implementation on what the mutating webhook answers."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admission.decider import Decider, StaticPolicies, rbac_authorizer
from admission.mutate import CrMutator
from admission.policy import PackagePolicy
from admission.review import parse_review
from bootstrap.demo import admit, manifests
from bootstrap.demo.narration import DemoFailed
from tests.admission.upstream import picker, pods

FIXTURES = Path(__file__).parent.parent / "fixtures" / "nodewright"
SHIPPED = Path(admit.__file__).parent / "data" / "nodewright"
SKYHOOK = ("skyhook.nvidia.com", "v1alpha1", "Skyhook")


def _patch(obj: dict[str, Any]) -> list[dict[str, Any]]:
    body = manifests.review(obj, "alice", ("ml-platform",), kind=SKYHOOK)
    response = (
        CrMutator("nodegate.io/hold").mutate(parse_review(json.dumps(body).encode()).request).response("x")
    )
    return json.loads(base64.b64decode(response["patch"])) if "patch" in response else []


def test_the_shipped_sample_is_upstreams_file_unedited() -> None:
    shipped = json.loads((SHIPPED / "manifest.json").read_text())["entries"]
    fixtures = {e["file"]: e for e in json.loads((FIXTURES / "manifest.json").read_text())["entries"]}
    assert {e["file"] for e in shipped} == {admit.SAMPLE_FILE, "LICENSE"}
    for entry in shipped:
        assert entry == fixtures[entry["file"]]
        assert (SHIPPED / entry["file"]).read_bytes() == (FIXTURES / entry["file"]).read_bytes()
    sample = admit.upstream_sample()
    assert sample.path == admit.SAMPLE_FILE
    assert sample.licence == "Apache-2.0"
    assert sample.obj["spec"]["nodeSelectors"] == {"matchLabels": manifests.SAMPLE_POOL}


def test_a_changed_sample_stops_the_demo(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "data" / "nodewright" / "examples" / "simple").mkdir(parents=True)
    for name in ("manifest.json", admit.SAMPLE_FILE):
        (tmp_path / "data" / "nodewright" / name).write_bytes((SHIPPED / name).read_bytes())
    edited = tmp_path / "data" / "nodewright" / admit.SAMPLE_FILE
    edited.write_bytes(edited.read_bytes().replace(b"1.1.0", b"1.1.1"))
    monkeypatch.setattr(admit.resources, "files", lambda _pkg: tmp_path)
    with pytest.raises(DemoFailed, match="does not match its manifest"):
        admit.upstream_sample()


def test_the_demos_policies_admit_the_mutated_sample_and_the_picker_reaches_the_held_node() -> None:
    sample = admit.upstream_sample().obj
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
    sample = admit.upstream_sample().obj
    cr = admit.apply_patch(sample, _patch(sample))
    mine = manifests.package_pod(cr, "baz", "gpu-node-3")
    theirs = pods.package_pod(
        "demo",
        "baz",
        "1.1.0",
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
