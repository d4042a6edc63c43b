"""A package's name and version: its key a DNS-style name and any name field equal to the key
(rule "package-name"); its version one NodeWright reads (rule "semver": ``1.2``, ``v1.0.0`` and
``2024.7.6`` pass, as upstream; a PackagePolicy may ask for strict semver, see
:mod:`admission.policies.policyrules`)."""

from __future__ import annotations

import re
from functools import lru_cache

from admission.reading.checks.ranks import PACKAGE_NAME, SEMVER, Found
from admission.syntax.versions import upstream_valid
from admission.violations import Violation

_NAME_RE = re.compile(r"[a-z][-a-z0-9]{0,41}[a-z]")


def identity_rules(path: str, key: str, name: str | None, version: str | None, found: Found) -> None:
    """The package at ``path`` (spec.packages.<key>): its key, name and version."""
    # The operator fills an empty name from the key before it checks that they agree.
    if name and name != key:
        found.append(
            (
                PACKAGE_NAME,
                Violation(
                    "package-name",
                    f"{path}.name",
                    f"name {name!r} differs from its key {key!r}",
                    "remove name; the key is the name",
                ),
            )
        )
    if not valid_name(key):
        found.append(
            (
                PACKAGE_NAME,
                Violation(
                    "package-name",
                    path,
                    f"package name {key!r} is not a DNS-style name of 2-43 characters",
                    "use lower-case letters, digits and '-', starting and ending with a letter",
                ),
            )
        )
    if not version or not upstream_valid(version):
        found.append(
            (
                SEMVER,
                Violation(
                    "semver",
                    f"{path}.version",
                    "version is missing" if not version else f"version {version!r} is not a semantic version",
                    "use a version such as 1.2.3",
                ),
            )
        )


@lru_cache(maxsize=4096)  # CRs repeat the same few names
def valid_name(key: str) -> bool:
    return _NAME_RE.fullmatch(key) is not None
