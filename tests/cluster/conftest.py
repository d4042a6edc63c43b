"""One real control plane per test session (etcd, kube-apiserver, kube-controller-manager, kwok on
127.0.0.1), shared by every test in tests/cluster/. Absent binaries skip these tests with one line
(`make cluster` builds them), unless NODEGATE_REQUIRE_CLUSTER=1 (CI), which makes that a failure."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import nodegate as ng
from tests.cluster import plane as cp
from tests.cluster import policies

_LOGS: list[Path] = []


@pytest.fixture(scope="session")
def plane(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[cp.ControlPlane]:
    missing = cp.missing_binaries()
    if missing:
        why = f"real control plane not built ({', '.join(missing)} missing): run `make cluster`"
        if cp.required():
            pytest.fail(f"{why}; {cp.REQUIRE_ENV}=1 requires it", pytrace=False)
        pytest.skip(why)
    folder = tmp_path_factory.mktemp("plane")
    # kwok's heartbeat stage at 2-5 s instead of 20-45 s: a short test sees many status updates.
    # A silent Node is unreachable after 15 s (the failure-policy test waits for that).
    started = cp.ControlPlane.start(folder, heartbeat_ms=(2000, 3000), node_grace_s=15)
    failed_before = request.session.testsfailed
    try:
        yield started
    finally:
        started.stop()
        if request.session.testsfailed > failed_before:
            _LOGS.append(folder)
        else:
            shutil.rmtree(folder / "etcd-data", ignore_errors=True)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for folder in _LOGS:
        terminalreporter.write_line(f"control plane logs kept in {folder} (*.log, one per process)")


@pytest.fixture(scope="session")
def installed(plane: cp.ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> ng.Installed:
    """The chart's CRDs, RBAC and service account, our permissive package CRDs, the test's
    PackagePolicies and the RBAC of its users (tests/cluster/policies.py)."""
    inst = ng.install(plane, tmp_path_factory.mktemp("nodegate"))
    plane.apply(policies.objects())
    return inst


@pytest.fixture(scope="session")
def webhook_server(plane: cp.ControlPlane, installed: ng.Installed) -> Iterator[ng.Nodegate]:
    """One ``nodegate serve`` (sqlite store, gate off) behind the chart's webhook configurations."""
    server = ng.start_nodegate(plane, installed, "webhooks", admission_port=installed.webhook_port)
    ng.apply_webhooks(plane, installed)
    try:
        yield server
    finally:
        server.stop()
