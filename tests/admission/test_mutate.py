"""``POST /admission/mutate``: NodeWright and Skyhook CRs get the package-hold tolerations in
``spec.additionalTolerations``; the user's tolerations and everything else stay as they are, and a
CR that has them gets no patch. Patches are applied with an independent RFC 6902 implementation
(``jsonpatch``) to the object as the API server sends it (JSON)."""

from __future__ import annotations

import base64
import copy
import json
import logging
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admission.hold.holdtolerations import hold_tolerations, missing_hold_tolerations, tolerates
from admission.hold.mutate import CrMutator, pointer, toleration_patch
from admission.reading.review import parse_review
from bootstrap.config import ConfigError, settings_from_obj
from tests.admission.test_webhook import decide, decider, review
from tests.support.service import EkCa, running, settings_for

KEY = "nodegate.io/hold"
HOLD = hold_tolerations(KEY)
GPU = {"key": "nvidia.com/gpu", "operator": "Exists"}
SKYHOOK = ("skyhook.nvidia.com", "Skyhook")
NODEWRIGHT = ("nodewright.nvidia.com", "NodeWright")
MUTATOR = CrMutator(KEY)


def cr(group: str = "skyhook.nvidia.com", kind: str = "Skyhook", **spec: Any) -> dict[str, Any]:
    """A package CR as the API server sends it to a mutating webhook on CREATE (defaults not yet
    applied: the CRD's defaulting runs after mutation)."""
    return {
        "apiVersion": f"{group}/v1alpha1",
        "kind": kind,
        "metadata": {"name": "demo", "labels": {"app.kubernetes.io/part-of": "skyhook-operator"}},
        "spec": {
            "nodeSelectors": {"matchLabels": {"agentpool": "gpu"}},
            "interruptionBudget": {"percent": 25},
            "packages": {"baz": {"version": "1.1.0", "image": "ghcr.io/nvidia/skyhook-packages/shellscript"}},
            **spec,
        },
    }


def answer(obj: Any, *, mutator: CrMutator = MUTATOR, **kw: Any) -> dict[str, Any]:
    extra = kw.pop("extra_request", {})
    body = review(obj, **kw)
    body["request"].update(extra)
    request = parse_review(json.dumps(body).encode()).request
    response = mutator.mutate(request).response(request.uid)
    assert response["uid"] == request.uid
    assert response["allowed"] is True  # this webhook never refuses
    return response


def mutated(obj: dict[str, Any], **kw: Any) -> dict[str, Any] | None:
    """The object after the API server applied the answer's patch; None when there was none."""
    response = answer(obj, **kw)
    if "patch" not in response:
        assert "patchType" not in response
        return None
    assert response["patchType"] == "JSONPatch"
    assert response["auditAnnotations"] == {"mutation": "hold-tolerations"}
    patch = json.loads(base64.b64decode(response["patch"]))
    wire = json.loads(json.dumps(obj))  # as sent
    result: dict[str, Any] = jsonpatch.apply_patch(wire, patch)
    return result


@pytest.mark.parametrize("kind", [SKYHOOK, NODEWRIGHT], ids=["skyhook", "nodewright"])
def test_a_cr_without_tolerations_gets_both_and_nothing_else(kind: tuple[str, str]) -> None:
    before = cr(*kind)
    after = mutated(before, kind=kind)
    assert after is not None
    assert after["spec"]["additionalTolerations"] == HOLD
    del after["spec"]["additionalTolerations"]
    assert after == before


def test_the_users_tolerations_stay_first_and_in_order() -> None:
    mine = [GPU, {"key": "example.com/b", "operator": "Equal", "value": "x", "effect": "NoExecute"}]
    before = cr(additionalTolerations=copy.deepcopy(mine))
    after = mutated(before)
    assert after is not None
    assert after["spec"]["additionalTolerations"] == [*mine, *HOLD]
    after["spec"]["additionalTolerations"] = mine
    assert after == before


@pytest.mark.parametrize(
    "shape",
    [
        {"additionalTolerations": None},
        {"additionalTolerations": []},
    ],
    ids=["null", "empty"],
)
def test_null_and_empty_lists_get_the_tolerations(shape: dict[str, Any]) -> None:
    after = mutated(cr(**shape))
    assert after is not None
    assert after["spec"]["additionalTolerations"] == HOLD


@pytest.mark.parametrize("spec", ["absent", None], ids=["absent", "null"])
def test_a_cr_without_spec_gets_one(spec: Any) -> None:
    before = cr()
    if spec == "absent":
        del before["spec"]
    else:
        before["spec"] = None
    after = mutated(before)
    assert after is not None
    assert after["spec"] == {"additionalTolerations": HOLD}


def test_only_the_missing_one_is_added() -> None:
    before = cr(additionalTolerations=[HOLD[1]])
    after = mutated(before)
    assert after is not None
    assert after["spec"]["additionalTolerations"] == [HOLD[1], HOLD[0]]


@pytest.mark.parametrize(
    "present",
    [
        HOLD,
        list(reversed(HOLD)),
        [{"key": KEY, "value": v, "effect": "NoSchedule"} for v in ("packages-pending", "validation-failed")],
        [{"key": KEY, "operator": "Equal", "value": v} for v in ("packages-pending", "validation-failed")],
    ],
    ids=["as-added", "reversed", "operator-omitted", "any-effect"],
)
def test_no_patch_when_the_tolerations_are_there(present: list[dict[str, str]]) -> None:
    assert mutated(cr(additionalTolerations=[GPU, *present])) is None


@pytest.mark.parametrize("kind", [SKYHOOK, NODEWRIGHT], ids=["skyhook", "nodewright"])
def test_a_second_apply_of_the_original_manifest_is_mutated_back_to_the_same_object(
    kind: tuple[str, str],
) -> None:
    """GitOps (Flux's server-side dry-run and apply, Argo CD's server-side diff): the manifest
    without the tolerations is applied again; the result is the stored object, so no drift."""
    manifest = cr(*kind, additionalTolerations=[GPU])
    stored = mutated(manifest, kind=kind)
    assert stored is not None
    stored["metadata"].update(
        uid="u-1", resourceVersion="7", generation=1, finalizers=["skyhook.nvidia.com/skyhook"]
    )
    reapplied = copy.deepcopy(stored)
    reapplied["spec"] = copy.deepcopy(manifest["spec"])  # the manager drops the fields it no longer sends
    again = mutated(reapplied, kind=kind, op="UPDATE", old=stored)
    assert again == stored
    assert mutated(stored, kind=kind, op="UPDATE", old=stored) is None  # a no-op apply: no patch


def test_the_operators_own_updates_are_left_alone() -> None:
    """A CR stored before nodegate was installed: the operator's finalizer, status and re-encoding
    updates do not change its spec, so they get no patch (its next spec edit does)."""
    old = cr()
    finalized = copy.deepcopy(old)
    finalized["metadata"]["finalizers"] = ["skyhook.nvidia.com/skyhook"]
    finalized["status"] = {"status": "in_progress"}
    finalized["spec"]["podNonInterruptLabels"] = {}  # the Go types' re-encoding
    finalized["spec"]["packages"]["baz"]["name"] = "baz"
    assert mutated(finalized, op="UPDATE", old=old) is None
    edited = copy.deepcopy(finalized)
    edited["spec"]["packages"]["baz"]["version"] = "1.2.0"
    after = mutated(edited, op="UPDATE", old=old)
    assert after is not None
    assert after["spec"]["additionalTolerations"] == HOLD


def test_subresources_deletes_and_other_kinds_are_not_mutated() -> None:
    assert "patch" not in answer(cr(), extra_request={"subResource": "status"}, op="UPDATE", old=cr())
    assert "patch" not in answer(None, op="DELETE", old=cr())
    policy = {"apiVersion": "skyhook.nvidia.com/v1alpha1", "kind": "DeploymentPolicy", "spec": {}}
    assert "patch" not in answer(policy, kind=("skyhook.nvidia.com", "DeploymentPolicy"))
    assert "patch" not in answer({"apiVersion": "v1", "kind": "Node"}, kind=("", "Node"))
    assert "patch" not in answer(cr(), kind=("skyhook.nvidia.com", "NodeWright"))  # kind of the other group


def test_dry_run_gets_the_same_answer() -> None:
    wet, dry = answer(cr()), answer(cr(), dry_run=True)
    assert dry["patch"] == wet["patch"]


def test_shapes_the_api_server_refuses_are_not_patched() -> None:
    assert toleration_patch({"spec": ["x"]}, KEY) == []
    assert toleration_patch({"spec": {"additionalTolerations": "x"}}, KEY) == []


def test_inject_tolerations_off_sends_no_patch() -> None:
    off = CrMutator(KEY, enabled=False)
    assert "patch" not in answer(cr(), mutator=off)


def test_a_custom_taint_key() -> None:
    after = mutated(cr(), mutator=CrMutator("example.com/hold"))
    assert after is not None
    assert [t["key"] for t in after["spec"]["additionalTolerations"]] == ["example.com/hold"] * 2


def test_json_pointer_escaping() -> None:
    assert pointer("spec", "additionalTolerations", "-") == "/spec/additionalTolerations/-"
    assert pointer("a/b", "c~d", "~1") == "/a~1b/c~0d/~01"
    doc = {"a/b": {"c~d": {"~1": 1}}}
    assert jsonpatch.apply_patch(
        doc, [{"op": "replace", "path": pointer("a/b", "c~d", "~1"), "value": 2}]
    ) == {"a/b": {"c~d": {"~1": 2}}}


# -- properties ----------------------------------------------------------------------------------

_words = st.sampled_from(["", KEY, "nvidia.com/gpu", "example.com/a~b", "x/y"])
_toleration = st.fixed_dictionaries(
    {},
    optional={
        "key": _words,
        "operator": st.sampled_from(["", "Equal", "Exists", "Lt"]),
        "value": st.sampled_from(["", "packages-pending", "validation-failed", "unattested", "1"]),
        "effect": st.sampled_from(["", "NoSchedule", "NoExecute", "PreferNoSchedule"]),
        "tolerationSeconds": st.integers(0, 5),
    },
)
_tolerations = st.one_of(st.just("absent"), st.none(), st.lists(_toleration, max_size=5))


@settings(max_examples=300, deadline=None)
@given(tolerations=_tolerations, key=_words.filter(bool), kind=st.sampled_from([SKYHOOK, NODEWRIGHT]))
def test_the_patch_applies_keeps_everything_and_is_idempotent(
    tolerations: Any, key: str, kind: tuple[str, str]
) -> None:
    before = cr(*kind) if tolerations == "absent" else cr(*kind, additionalTolerations=tolerations)
    mutator = CrMutator(key)
    after = mutated(before, kind=kind, mutator=mutator) or copy.deepcopy(before)
    got = after["spec"].get("additionalTolerations") or []
    mine = [] if tolerations in ("absent", None) else tolerations
    assert got[: len(mine)] == mine  # the user's, unchanged and in order
    added = got[len(mine) :]
    assert added == missing_hold_tolerations(mine, key)
    for value in ("packages-pending", "validation-failed"):
        assert any(tolerates(t, {"key": key, "value": value, "effect": "NoSchedule"}) for t in got)
    rest = copy.deepcopy(after)
    rest["spec"].pop("additionalTolerations", None)
    original = copy.deepcopy(before)
    original["spec"].pop("additionalTolerations", None)
    assert rest == original  # nothing else
    assert mutated(after, kind=kind, mutator=mutator) is None  # idempotent


# -- the validating webhook's warning when the tolerations are missing ---------------------------


async def test_validation_warns_about_missing_tolerations_naming_them() -> None:
    sample = cr(additionalTolerations=[GPU])
    d = await decide(decider(), review(sample, groups=("ml-platform",)))
    assert d.allowed, d.message
    assert d.warnings[:3] == [
        "NodeWright skips nodes held by nodegate.io/hold; add to spec.additionalTolerations:",
        "- {key: nodegate.io/hold, operator: Equal, value: packages-pending, effect: NoSchedule}",
        "- {key: nodegate.io/hold, operator: Equal, value: validation-failed, effect: NoSchedule}",
    ]
    after = mutated(sample)
    d = await decide(decider(), review(after, groups=("ml-platform",)))
    assert d.allowed
    assert not any("held by" in w or w.startswith("- {key") for w in d.warnings)


@pytest.mark.parametrize(
    "toleration",
    [
        {"key": KEY, "operator": "Exists"},
        {"key": KEY, "operator": "Equal", "value": "unattested", "effect": "NoSchedule"},
        {"key": KEY, "operator": "Equal", "value": "quarantined"},
        {"operator": "Equal", "value": "unattested"},  # no key: every taint with that value
        {"operator": "Exists"},
    ],
    ids=["exists", "unattested", "quarantined", "keyless-equal", "wildcard"],
)
async def test_wider_hold_tolerations_stay_refused_after_mutation(toleration: dict[str, str]) -> None:
    before = cr(additionalTolerations=[toleration])
    after = mutated(before) or before  # Exists already tolerates the hold: nothing to add
    d = await decide(decider(), review(after, groups=("ml-platform",)))
    assert not d.allowed
    assert d.violations[0].rule in ("hold-toleration", "toleration-wildcard")


# -- the service: config and route ---------------------------------------------------------------


def test_inject_tolerations_is_configured_and_the_pod_setting_is_gone() -> None:
    assert settings_from_obj({}).nodewright.inject_tolerations is True
    assert (
        settings_from_obj({"nodewright": {"inject_tolerations": False}}).nodewright.inject_tolerations
        is False
    )
    with pytest.raises(ConfigError, match="operator_service_accounts"):
        settings_from_obj({"nodewright": {"operator_service_accounts": []}})


@pytest.mark.parametrize("inject", [True, False])
async def test_the_service_serves_the_mutating_webhook(tmp_path: Path, inject: bool) -> None:
    config = settings_for(tmp_path, EkCa.create(), nodewright={"inject_tolerations": inject})
    async with running(config) as svc, svc.http() as http:
        url = f"{svc.admission_base}/admission/mutate"
        body = review(cr())
        async with http.post(url, json=body) as resp:
            assert resp.status == 200
            out = (await resp.json())["response"]
        assert out["uid"] == body["request"]["uid"]
        if inject:
            patch = json.loads(base64.b64decode(out["patch"]))
            assert jsonpatch.apply_patch(cr(), patch)["spec"]["additionalTolerations"] == HOLD
        else:
            assert out == {"uid": body["request"]["uid"], "allowed": True}
        async with http.post(url, data=b"{}", headers={"Content-Type": "application/json"}) as resp:
            assert resp.status == 400
            assert resp.content_type == "application/problem+json"
        async with http.post(url, data=b"x", headers={"Content-Type": "text/plain"}) as resp:
            assert resp.status == 415


async def test_the_mutate_log_line_names_a_cluster_scoped_cr_without_a_slash(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Skyhook and NodeWright are cluster-scoped: the line says ``Skyhook demo``, not ``Skyhook /demo``."""
    config = settings_for(tmp_path, EkCa.create())
    with caplog.at_level(logging.INFO, logger="nodegate.admission"):
        async with (
            running(config) as svc,
            svc.http() as http,
            http.post(f"{svc.admission_base}/admission/mutate", json=review(cr())) as resp,
        ):
            assert resp.status == 200
    (record,) = [r for r in caplog.records if r.getMessage() == "admission mutated: hold-taint tolerations"]
    assert record.__dict__["object"] == "skyhook.nvidia.com/Skyhook demo"
