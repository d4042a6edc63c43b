"""Shared fixtures: software TPMs with EK certificates from a per-session local CA."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("TSS2_LOG", "all+none")

from bootstrap.demo import swtpm as harness
from tests.support import shared_data
from tests.support.swtpms import TpmInfo

SHARED_FOLDERS = ("ek-roots", "eventlogs", "nodewright", "nodewright-demo", "nodewright-e2e", "tpm")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under NODEGATE_REQUIRE_TEST_DATA=1 (CI) the public test data must be there and be the bytes
    its manifests record, before a single test runs: never a run that silently skipped it."""
    if not shared_data.required():
        return
    for name in SHARED_FOLDERS:
        folder = shared_data.shared(name)
        if not folder.present:
            raise pytest.UsageError(f"{folder.absent_reason()}; {shared_data.ENV_REQUIRE}=1 requires it")
        folder.verify_all()


def pytest_report_header() -> str:
    root = shared_data.data_root()
    mode = "required" if shared_data.required() else "optional"
    return f"nodegate public test data: {root} ({'present' if root.is_dir() else 'absent'}, {mode})"


@pytest.fixture(scope="session")
def local_ca(tmp_path_factory: pytest.TempPathFactory) -> harness.LocalCa:
    return harness.make_ca(tmp_path_factory.mktemp("xdg"))


def _running(
    ca: harness.LocalCa, tmp_path_factory: pytest.TempPathFactory, name: str
) -> Iterator[harness.Swtpm]:
    state = tmp_path_factory.mktemp(name)
    harness.manufacture(ca, state)
    tpm = harness.start(ca, state)
    try:
        yield tpm
    finally:
        tpm.stop()


@pytest.fixture(scope="session")
def _swtpm_a(local_ca: harness.LocalCa, tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Swtpm]:
    yield from _running(local_ca, tmp_path_factory, "tpm-a")


@pytest.fixture(scope="session")
def _swtpm_b(local_ca: harness.LocalCa, tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Swtpm]:
    yield from _running(local_ca, tmp_path_factory, "tpm-b")


def _info(tpm: harness.Swtpm) -> Iterator[TpmInfo]:
    assert tpm.process.poll() is None, "swtpm exited"
    yield TpmInfo(tpm.tcti, tpm.ca.root, tpm.ca.intermediate, tpm)
    tpm.flush_transients()


@pytest.fixture
def swtpm(_swtpm_a: harness.Swtpm) -> Iterator[TpmInfo]:
    """A software TPM with RSA and ECC EK certificates; transient objects flushed after the test."""
    yield from _info(_swtpm_a)


@pytest.fixture
def other_swtpm(_swtpm_b: harness.Swtpm) -> Iterator[TpmInfo]:
    """A second, independent software TPM (same CA)."""
    yield from _info(_swtpm_b)


@pytest.fixture
def fresh_tpm(local_ca: harness.LocalCa, tmp_path: Path) -> Iterator[TpmInfo]:
    """A TPM of the test's own: for a test that changes what the shared swtpm must keep as it is
    (extends PCRs, defines NV indices)."""
    state = tmp_path / "tpm"
    state.mkdir()
    harness.manufacture(local_ca, state)
    tpm = harness.start(local_ca, state)
    try:
        yield TpmInfo(tpm.tcti, tpm.ca.root, tpm.ca.intermediate, tpm)
    finally:
        tpm.stop()


@pytest.fixture(autouse=True)
def _logging_left_as_found() -> Iterator[None]:
    """Commands run in-process (``cli.main``) configure nodegate's loggers as a process would;
    each test gets them back as they were, so one test's handlers never print in another's."""
    names = ["nodegate", *(n for n in logging.root.manager.loggerDict if n.startswith("nodegate."))]
    saved = {}
    for name in names:
        logger = logging.getLogger(name)
        saved[name] = (list(logger.handlers), logger.level, logger.propagate)
    yield
    for name in [n for n in logging.root.manager.loggerDict if n == "nodegate" or n.startswith("nodegate.")]:
        logger = logging.getLogger(name)
        handlers, level, propagate = saved.get(name, ([], logging.NOTSET, True))
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate
