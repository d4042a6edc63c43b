"""The image is built once per test session (about a minute once the dependency wheels are
cached in build/image-test; the first build on a machine also compiles tpm2-pytss)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.image.runtime import Built, Podman, build, require_root_and_tools, start_podman


@pytest.fixture(scope="session")
def built_image() -> Built:
    require_root_and_tools("mmdebstrap")
    return build()


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
