"""Why a package failed (issue 45): the gate names the failing package pod, its container, the
termination reason and message (one line, cut, credentials replaced), or says the pod is gone; in
the NodeAttestation's message and in `kubectl nodegate status`. Pure parts directly, the gate
against kmock (pods listed read-only by spec.nodeName)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kmock._internal import enums

from bootstrap.gate import Gate, podfailure
from bootstrap.gate.kubectl import node_row
from bootstrap.kube import Kube
from tests.gate.test_gate import (
    ATT,
    NODES,
    T0,
    Clock,
    add_cr,
    joined,
    make_gate,
    operator_writes,
    register,
    stored,
)
from tests.support.kshim import ShimEmulator

pytestmark = pytest.mark.kmock(cls=ShimEmulator)

DRIVERS = "skyhook.nvidia.com/drivers"
PODS = "v1/pods"


def package_pod(
    name: str,
    *,
    node: str = "w1",
    cr: str = "drivers",
    package: str = "gpu-driver-550.1",
    init: list[dict[str, Any]] | None = None,
    created: str = "2026-03-01T12:00:00Z",
    prefix: str = "skyhook.nvidia.com",
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "skyhook",
            "creationTimestamp": created,
            "labels": {f"{prefix}/name": cr, f"{prefix}/package": package},
        },
        "spec": {"nodeName": node},
        "status": {"phase": "Running", "initContainerStatuses": init or []},
    }


def terminated(name: str, code: int, reason: str = "Error", message: str = "") -> dict[str, Any]:
    return {"name": name, "state": {"terminated": {"exitCode": code, "reason": reason, "message": message}}}


OK_INIT = terminated("gpu-driver-init", 0, "Completed")


def test_the_failing_init_container_is_named_with_its_reason_and_message() -> None:
    pod = package_pod(
        "drivers-gpu-driver-apply-x1",
        init=[OK_INIT, terminated("gpu-driver-apply", 2, "Error", "apply.sh: dkms build failed\nsee log")],
    )
    found = podfailure.failure([pod], DRIVERS, "gpu-driver", "550.1")
    assert found.text() == (
        f"{DRIVERS}: gpu-driver 550.1 failed: pod skyhook/drivers-gpu-driver-apply-x1 container "
        "gpu-driver-apply Error, exit 2: apply.sh: dkms build failed see log"
    )


def test_a_crash_looping_container_names_the_last_termination() -> None:
    looping = {
        "name": "gpu-driver-applycheck",
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": "check failed"}},
    }
    found = podfailure.failure([package_pod("p", init=[OK_INIT, looping])], DRIVERS, "gpu-driver", "550.1")
    assert (found.container, found.reason, found.exit_code, found.message) == (
        "gpu-driver-applycheck",
        "CrashLoopBackOff after Error",
        1,
        "check failed",
    )


def test_only_this_packages_pods_and_the_newest_one() -> None:
    other_cr = package_pod("other", cr="tuning", init=[terminated("x", 1)])
    other_version = package_pod("old-version", package="gpu-driver-549.0", init=[terminated("x", 1)])
    older = package_pod("older", created="2026-03-01T11:00:00Z", init=[terminated("a", 3)])
    newer = package_pod("newer", created="2026-03-01T12:30:00Z", init=[terminated("b", 4)])
    legacy_free = package_pod("nw", prefix="nodewright.nvidia.com", created="2026-03-01T10:00:00Z")
    found = podfailure.failure(
        [other_cr, other_version, older, newer, legacy_free], DRIVERS, "gpu-driver", "550.1"
    )
    assert (found.pod, found.exit_code) == ("skyhook/newer", 4)


def test_a_gone_pod_is_said_and_a_pod_not_failed_yet_is_named() -> None:
    gone = podfailure.failure([], DRIVERS, "gpu-driver", "550.1")
    assert gone.pod is None
    assert gone.text() == (
        f"{DRIVERS}: gpu-driver 550.1 failed: its package pod is gone (NodeWright deleted it, or it was "
        "never created)"
    )
    running = podfailure.failure([package_pod("p", init=[OK_INIT])], DRIVERS, "gpu-driver", "550.1")
    assert running.text().endswith("pod skyhook/p container - not failed yet (phase Running)")


@pytest.mark.parametrize(
    ("said", "secret"),
    [
        ("curl failed: password=hunter2-very-secret", "hunter2"),
        ('login with API_KEY: "abc def ghi"', "abc def"),
        ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig", "eyJhbGci"),
        ("token=" + "q" * 50, "q" * 20),
        ("pulled with " + "A1b2" * 12, "A1b2A1b2"),
    ],
)
def test_credentials_in_a_termination_message_are_replaced(said: str, secret: str) -> None:
    pod = package_pod("p", init=[terminated("gpu-driver-apply", 1, "Error", said)])
    text = podfailure.failure([pod], DRIVERS, "gpu-driver", "550.1").text()
    assert secret not in text
    assert "<redacted>" in text


@given(st.text(max_size=600), st.sampled_from(["password", "secret", "token", "apikey", "private_key"]))
def test_a_cleaned_message_is_one_short_line_without_the_secret(text: str, key: str) -> None:
    value = "S3cr3tValue"
    out = podfailure.clean(f"{text} {key}={value} {text}")
    assert len(out) <= podfailure.MAX_TEXT
    assert "\n" not in out
    assert "\r" not in out
    assert value not in out


# -- the gate ----------------------------------------------------------------------------------


@pytest.fixture
async def kube_pods(kmock: Any) -> Any:
    register(kmock)
    k = Kube.for_host(str(kmock.url), timeout=2.0)
    yield k
    await k.close()


@pytest.fixture
async def kube_without_pods(kmock: Any) -> Any:
    register(kmock, pods=False)
    k = Kube.for_host(str(kmock.url), timeout=2.0)
    yield k
    await k.close()


async def failing_node(kmock: Any, kube: Kube, gate: Gate) -> str:
    await joined(kube)
    await add_cr(kube, "skyhook.nvidia.com", "drivers", {"gpu-driver": "550.1"})
    await operator_writes(kube, "w1", "drivers", {"gpu-driver": ("550.1", "apply", "erroring")})
    report = await gate.reconcile_all()
    assert report.held == {"validation-failed": 1}
    return str(stored(kmock, ATT, "w1")["status"]["message"])


async def test_the_nodeattestation_and_kubectl_name_the_failing_pod(kmock: Any, kube_pods: Kube) -> None:
    kube = kube_pods
    failing = package_pod(
        "drivers-gpu-driver-apply-x1",
        init=[OK_INIT, terminated("gpu-driver-apply", 2, "Error", "dkms build failed; token=abc123")],
    )
    elsewhere = package_pod("on-w2", node="w2", init=[terminated("gpu-driver-apply", 9)])
    for pod in (failing, elsewhere):
        kmock.objects[PODS, "skyhook", pod["metadata"]["name"]] = pod
    gate = make_gate(kube, Clock())
    message = await failing_node(kmock, kube, gate)
    line = (
        f"{DRIVERS}: gpu-driver 550.1 failed: pod skyhook/drivers-gpu-driver-apply-x1 container "
        "gpu-driver-apply Error, exit 2: dkms build failed, token=<redacted>"
    )
    assert line in message
    assert "on-w2" not in message
    # Read-only, and only this node's pods: one LIST with spec.nodeName.
    lists = [r for r in kmock[enums.method.GET] if r.url.path == "/api/v1/pods"]
    assert [r.params.get("fieldSelector") for r in lists] == ["spec.nodeName=w1"]
    writes = (enums.method.POST, enums.method.PUT, enums.method.PATCH, enums.method.DELETE)
    assert not [r for m in writes for r in kmock[m] if "/pods" in r.url.path]
    row = node_row(stored(kmock, NODES, "w1"), stored(kmock, ATT, "w1"), now=T0)
    assert (row.waiting[0], row.waiting[-1]) == (line, f"{DRIVERS}: gpu-driver 550.1 (apply/erroring)")


async def test_a_gone_pod_is_said(kmock: Any, kube_pods: Kube) -> None:
    message = await failing_node(kmock, kube_pods, make_gate(kube_pods, Clock()))
    assert f"{DRIVERS}: gpu-driver 550.1 failed: its package pod is gone" in message


async def test_pods_that_cannot_be_read_do_not_keep_the_gate_from_holding(
    kmock: Any, kube_without_pods: Kube
) -> None:
    """Pods not listable (an older chart without the grant): the node is held all the same, and
    the message says why no pod is named."""
    message = await failing_node(kmock, kube_without_pods, make_gate(kube_without_pods, Clock()))
    assert (
        f"{DRIVERS}: gpu-driver 550.1 failed: its package pods could not be read (list pods on w1: "
        in message
    )


async def test_the_pods_are_listed_at_most_once_per_pace_for_the_same_failure(
    kmock: Any, kube_pods: Kube
) -> None:
    clock = Clock()
    gate = make_gate(kube_pods, clock)
    await failing_node(kmock, kube_pods, gate)

    def lists() -> int:
        return len([r for r in kmock[enums.method.GET] if r.url.path == "/api/v1/pods"])

    assert lists() == 1
    clock.advance(seconds=9)
    await gate.reconcile("w1")
    assert lists() == 1  # the same failing package, within 10 s: what the pods said is kept
    clock.advance(seconds=1)
    await gate.reconcile("w1")
    assert lists() == 2
