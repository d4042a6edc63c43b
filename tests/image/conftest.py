"""The image is built at most once per test session, and not at all when the last build in
build/image-test has the same inputs (runtime.INPUTS). A build takes 1-3 minutes on this kind of
machine (2 cores); the first one on a machine also compiles tpm2-pytss's wheel."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.image.runtime import Built, Podman, build_once, require_root_and_tools, start_podman


@pytest.fixture(scope="session")
def built_image() -> Built:
    require_root_and_tools("mmdebstrap")
    return build_once()


@pytest.fixture(scope="session")
def podman(built_image: Built, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Podman]:
    require_root_and_tools("podman", "unshare")
    state: Path = tmp_path_factory.mktemp("podman")
    runtime, why = start_podman(state, built_image.archive, built_image.name)
    if runtime is None:
        pytest.fail(f"rootful podman cannot run the image here: {why}", pytrace=False)
    print(f"\nimage tests run the image with podman (storage driver {runtime.driver}, host network)")
    try:
        yield runtime
    finally:
        runtime.cleanup()
        runtime.call("rmi", "-a", "-f", timeout=120)
