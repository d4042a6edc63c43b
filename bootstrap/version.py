"""nodegate's version, as installed (``nodegate --version``, ``nodegate_build_info``)."""

from __future__ import annotations

import platform
from importlib import metadata


def version() -> str:
    try:
        return metadata.version("nodegate")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


def describe() -> str:
    return f"nodegate {version()} (Python {platform.python_version()})"
