"""A package's name and version: its key a DNS-style name, any name field equal to the key (rule
"package-name"); its version strict semver (rule "semver")."""

from __future__ import annotations

import re
from functools import lru_cache

from admission.checks.ranks import PACKAGE_NAME, SEMVER, Found
from admission.violations import Violation

_NAME_RE = re.compile(r"^[a-z][-a-z0-9]{0,41}[a-z]$")
# semver.org's regular expression: no "v" prefix, no shorthand versions.
_SEMVER_RE = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)


def identity_rules(path: str, key: str, name: str | None, version: str | None, found: Found) -> None:
    """The package at ``path`` (spec.packages.<key>): its key, name and version."""
    if not valid_name(key):
        found.append(
            (
                PACKAGE_NAME,
                Violation(
                    "package-name",
                    path,
                    f"package name {key!r} is not a DNS-style name of 2-43 characters",
                    "use lower-case letters, digits and '-', starting with a letter",
                ),
            )
        )
    if name is not None and name != key:
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
    if not version:
        found.append(
            (
                SEMVER,
                Violation(
                    "semver", f"{path}.version", "version is missing", "set a semver version such as 1.2.3"
                ),
            )
        )
    elif version == "latest" or not valid_semver(version):
        found.append(
            (
                SEMVER,
                Violation(
                    "semver",
                    f"{path}.version",
                    f"version {version!r} is not strict semver",
                    "use MAJOR.MINOR.PATCH, e.g. 1.2.3 (no 'v', no 'latest')",
                ),
            )
        )


# Memoised: CRs repeat the same few names and versions.


@lru_cache(maxsize=4096)
def valid_name(key: str) -> bool:
    return _NAME_RE.match(key) is not None


@lru_cache(maxsize=4096)
def valid_semver(version: str) -> bool:
    return _SEMVER_RE.match(version) is not None
