"""The demo's NodeWright objects match the fuller upstream-derived builders of the admission
tests, so what the demo shows is what the operator really sends."""

from __future__ import annotations

import json
from typing import Any

from admission.mutate import PodMutator
from admission.review import parse_review
from bootstrap.demo import manifests
from tests.admission.upstream import pods


def test_the_package_pod_is_named_labelled_and_tolerating_as_the_operators() -> None:
    cr = manifests.sample_cr()
    mine = manifests.package_pod(cr, "zeb", "gpu-node-3")
    theirs = pods.package_pod(
        "demo-sample",
        "zeb",
        "2.1.4",
        "apply",
        "gpu-node-3",
        additional_tolerations=cr["spec"]["additionalTolerations"],
    )
    for key in ("name", "namespace", "labels"):
        assert mine["metadata"][key] == theirs["metadata"][key]
    for key in ("nodeName", "tolerations", "serviceAccountName", "hostPID", "restartPolicy"):
        assert mine["spec"][key] == theirs["spec"][key]


def test_the_operators_pod_review_gets_exactly_the_two_hold_tolerations() -> None:
    pod = manifests.package_pod(manifests.sample_cr(), "dax", "gpu-node-1")
    mutator = PodMutator.of([manifests.OPERATOR_ACCOUNT])

    def patch(user: str) -> tuple[dict[str, Any], ...]:
        body = json.dumps(manifests.pod_review(pod, user)).encode()
        return mutator.mutate(parse_review(body).request).patch

    ops = patch(manifests.OPERATOR_ACCOUNT)
    assert [(op["path"], op["value"]["value"]) for op in ops] == [
        ("/spec/tolerations/-", "packages-pending"),
        ("/spec/tolerations/-", "validation-failed"),
    ]
    assert patch("system:serviceaccount:ml:trainer") == ()
