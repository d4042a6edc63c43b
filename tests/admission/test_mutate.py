"""``POST /admission/mutate``: the NodeWright operator's package and interrupt pods get the
hold-taint tolerations; nothing else changes, and nothing else is changed."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admission.mutate import PodMutator, hold_tolerations
from admission.review import parse_review
from bootstrap.config import ConfigError, settings_from_obj
from tests.admission.upstream.model import ALICE, OPERATOR, User
from tests.admission.upstream.pods import (
    OPERATOR_TOLERATIONS,
    interrupt_pod,
    package_pod,
    pod_review,
    safe_name,
)
from tests.support.service import EkCa, running, settings_for

MUTATOR = PodMutator.of([OPERATOR.username])
HOLD = [
    {"key": "nodegate.io/hold", "operator": "Equal", "value": "packages-pending", "effect": "NoSchedule"},
    {"key": "nodegate.io/hold", "operator": "Equal", "value": "validation-failed", "effect": "NoSchedule"},
]


def apply_patch(doc: dict[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 "add" into objects and arrays (all this webhook sends)."""
    out = copy.deepcopy(doc)
    for op in patch:
        assert op["op"] == "add", op
        *parents, last = op["path"].split("/")[1:]
        place: Any = out
        for part in parents:
            place = place[int(part)] if isinstance(place, list) else place[part]
        if isinstance(place, list):
            place.insert(len(place) if last == "-" else int(last), op["value"])
        else:
            place[last] = op["value"]  # (an existing member, such as a null, is replaced)
    return out


def mutated(pod: dict[str, Any] | None, **review: Any) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    body = pod_review(pod, **review)
    request = parse_review(json.dumps(body).encode()).request
    response = MUTATOR.mutate(request).response(request.uid)
    assert response["uid"] == request.uid
    assert response["allowed"] is True
    if "patch" not in response:
        assert "patchType" not in response
        return None, response
    assert response["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["patch"]))
    assert pod is not None
    return apply_patch(pod, patch), response


PODS = [
    package_pod("simple-skyhook", "dexter", "1.2.3", stage, "kind-worker")
    for stage in ("apply", "config", "upgrade", "uninstall", "post-interrupt")
] + [
    interrupt_pod("simple-skyhook", "dexter", "1.2.3", "interrupt", "reboot", "kind-worker"),
    interrupt_pod("config-skyhook", "spencer", "3.2.3", "interrupt", "service", "ip-10-0-1-17.ec2.internal"),
    package_pod(
        "interrupt-grouping",
        "zeb",
        "2.1.4",
        "apply",
        "kind-worker2",
        additional_tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}],
    ),
]


@pytest.mark.parametrize("pod", PODS, ids=lambda p: p["metadata"]["name"])
def test_the_operators_pods_get_the_hold_tolerations_and_nothing_else(pod: dict[str, Any]) -> None:
    after, response = mutated(pod)
    assert after is not None
    tolerations = pod["spec"]["tolerations"]
    assert after["spec"]["tolerations"] == [*tolerations, *HOLD]
    after["spec"]["tolerations"] = tolerations
    assert after == pod  # nothing else changed
    assert response["auditAnnotations"] == {"mutation": "hold-tolerations"}


def test_the_pods_are_shaped_as_the_operator_shapes_them() -> None:
    pod = package_pod("simple-skyhook", "dexter", "1.2.3", "apply", "kind-worker")
    assert pod["metadata"]["name"] == safe_name(
        63, "simple-skyhook", "dexter", "1.2.3", "apply", "kind-worker"
    )
    assert pod["metadata"]["name"].startswith("simple-skyhook-dexter-1-2-3-apply-kind-worker-")
    assert len(safe_name(63, "x" * 100)) == 63
    assert pod["metadata"]["labels"] == {
        "skyhook.nvidia.com/name": "simple-skyhook",
        "skyhook.nvidia.com/package": "dexter-1.2.3",
    }
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "Skyhook"
    assert [c["name"] for c in pod["spec"]["initContainers"]] == [
        "dexter-init",
        "dexter-apply",
        "dexter-applycheck",
    ]
    assert pod["spec"]["tolerations"] == OPERATOR_TOLERATIONS
    interrupt = interrupt_pod("simple-skyhook", "dexter", "1.2.3", "interrupt", "reboot", "kind-worker")
    assert interrupt["metadata"]["labels"]["skyhook.nvidia.com/interrupt"] == "True"


def test_a_pod_without_tolerations_gets_the_list() -> None:
    pod = PODS[0]
    bare = copy.deepcopy(pod)
    del bare["spec"]["tolerations"]
    after, _ = mutated(bare)
    assert after is not None
    assert after["spec"]["tolerations"] == HOLD
    bare["spec"]["tolerations"] = None
    after, _ = mutated(bare)
    assert after is not None
    assert after["spec"]["tolerations"] == HOLD


def test_called_again_it_adds_nothing_more() -> None:
    once, _ = mutated(PODS[0])
    assert once is not None
    twice, response = mutated(once)
    assert twice is None
    assert response == {"uid": response["uid"], "allowed": True}
    spelled = copy.deepcopy(PODS[0])
    spelled["spec"]["tolerations"] += [{k: v for k, v in t.items() if k != "operator"} for t in HOLD]
    assert mutated(spelled)[0] is None  # an omitted operator is Equal


@pytest.mark.parametrize(
    ("review", "why"),
    [
        ({"user": ALICE}, "a user's pod"),
        ({"user": User("system:serviceaccount:skyhook:default")}, "the pods' own account"),
        (
            {"user": User("system:serviceaccount:other:skyhook-skyhook-operator-controller-manager")},
            "another namespace",
        ),
        ({"operation": "UPDATE"}, "not a CREATE"),
        ({"sub": "ephemeralcontainers"}, "a subresource"),
    ],
)
def test_anything_else_passes_unchanged(review: dict[str, Any], why: str) -> None:
    after, response = mutated(PODS[0], **review)
    assert after is None, why
    assert response["allowed"] is True


def test_other_kinds_and_no_object_pass_unchanged() -> None:
    body = pod_review(PODS[0])
    body["request"]["kind"] = {"group": "apps", "version": "v1", "kind": "Deployment"}
    request = parse_review(json.dumps(body).encode()).request
    assert MUTATOR.mutate(request).patch == ()
    assert mutated(None)[0] is None
    odd = copy.deepcopy(PODS[0])
    odd["spec"]["tolerations"] = "not a list"
    assert mutated(odd)[0] is None  # the API server refuses such a pod; nothing to add to


def test_the_taint_key_follows_the_gate() -> None:
    custom = PodMutator.of([OPERATOR.username], "example.com/hold")
    request = parse_review(json.dumps(pod_review(PODS[0])).encode()).request
    (first, second) = custom.mutate(request).patch
    assert first["value"]["key"] == second["value"]["key"] == "example.com/hold"
    assert hold_tolerations("example.com/hold")[0]["value"] == "packages-pending"


_tolerations = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "key": st.sampled_from(["nodegate.io/hold", "nvidia.com/gpu", ""]),
            "operator": st.sampled_from(["Equal", "Exists", ""]),
            "value": st.sampled_from(["packages-pending", "validation-failed", "unattested", ""]),
            "effect": st.sampled_from(["NoSchedule", "NoExecute", ""]),
            "tolerationSeconds": st.integers(0, 60),
        },
    ),
    max_size=5,
)


@settings(max_examples=200, deadline=None)
@given(tolerations=_tolerations, pod=st.sampled_from(PODS))
def test_the_patch_only_adds_what_is_missing(tolerations: list[dict[str, Any]], pod: dict[str, Any]) -> None:
    """Whatever tolerations a pod has: afterwards it tolerates the hold taint for both package
    reasons, its other tolerations and every other field are as they were, and a second call
    adds nothing."""
    before = copy.deepcopy(pod)
    before["spec"]["tolerations"] = tolerations
    after, _ = mutated(before)
    result = before if after is None else after
    assert result["spec"]["tolerations"][: len(tolerations)] == tolerations
    for wanted in HOLD:
        assert any(
            t.get("key") == wanted["key"]
            and t.get("value") == wanted["value"]
            and t.get("effect") == "NoSchedule"
            and (t.get("operator") or "Equal") == "Equal"
            for t in result["spec"]["tolerations"]
        )
    assert {**result, "spec": {**result["spec"], "tolerations": None}} == {
        **before,
        "spec": {**before["spec"], "tolerations": None},
    }
    assert mutated(result)[0] is None


# -- the service: config and route ---------------------------------------------------------------


def test_the_operator_accounts_are_configured() -> None:
    default = settings_from_obj({})
    assert default.nodewright.operator_service_accounts == (
        "system:serviceaccount:skyhook:skyhook-operator-controller-manager",
    )
    mine = settings_from_obj({"nodewright": {"operator_service_accounts": [OPERATOR.username]}})
    assert mine.nodewright.operator_service_accounts == (OPERATOR.username,)
    for bad in ("skyhook-operator", "system:serviceaccount:skyhook", "system:serviceaccount:Sky:op", "alice"):
        with pytest.raises(ConfigError, match="operator_service_accounts"):
            settings_from_obj({"nodewright": {"operator_service_accounts": [bad]}})
    with pytest.raises(ConfigError, match="nodewright"):
        settings_from_obj({"nodewright": {"operator": "x"}})


async def test_the_service_serves_the_mutating_webhook(tmp_path: Path) -> None:
    config = settings_for(
        tmp_path, EkCa.create(), nodewright={"operator_service_accounts": [OPERATOR.username]}
    )
    async with running(config) as svc, svc.http() as http:
        url = f"{svc.admission_base}/admission/mutate"
        body = pod_review(PODS[0])
        async with http.post(url, json=body) as resp:
            assert resp.status == 200
            out = (await resp.json())["response"]
        assert out["uid"] == body["request"]["uid"]
        assert out["patchType"] == "JSONPatch"
        assert (
            apply_patch(PODS[0], json.loads(base64.b64decode(out["patch"])))["spec"]["tolerations"][-2:]
            == HOLD
        )
        async with http.post(url, json=pod_review(PODS[0], user=ALICE)) as resp:
            assert (await resp.json())["response"] == {
                "uid": pod_review(PODS[0], user=ALICE)["request"]["uid"],
                "allowed": True,
            }
        async with http.post(url, data=b"{}", headers={"Content-Type": "application/json"}) as resp:
            assert resp.status == 400
            assert resp.content_type == "application/problem+json"
        async with http.post(url, data=b"x", headers={"Content-Type": "text/plain"}) as resp:
            assert resp.status == 415
