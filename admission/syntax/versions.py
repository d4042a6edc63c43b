"""Package versions as NodeWright reads them, and as a strict PackagePolicy wants them.

NodeWright accepts a version when, with a ``v`` put in front unless it starts with one, it is a
semantic version in the sense of Go's ``golang.org/x/mod/semver``: ``1``, ``1.2``, ``1.2.3``,
``v1.2.3-rc.1+build``, ``2024.7.6``; not ``01.2.3``, ``1.2.3.4``, ``1.2-rc1``, ``2024/07/06``.
Shorthand versions compare as if completed with zeros (``1.2`` == ``1.2.0``). It compares
versions the same way to find downgrades. ``strict_semver`` is semver.org's grammar (no ``v``, no
shorthand): what a PackagePolicy with ``versions: semver`` asks for.
"""

from __future__ import annotations

import re
from functools import lru_cache

_NUM = r"(0|[1-9][0-9]*)"
_IDENT = r"[0-9A-Za-z-]+"
_PRE_IDENT = r"(?:0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)"
# Go's semver: vMAJOR[.MINOR[.PATCH[-PRERELEASE][+BUILD]]]
_GO = re.compile(
    rf"v{_NUM}(?:\.{_NUM}(?:\.{_NUM}(?:-({_PRE_IDENT}(?:\.{_PRE_IDENT})*))?(?:\+({_IDENT}(?:\.{_IDENT})*))?)?)?"
)
_STRICT = re.compile(
    rf"{_NUM}\.{_NUM}\.{_NUM}(?:-{_PRE_IDENT}(?:\.{_PRE_IDENT})*)?(?:\+{_IDENT}(?:\.{_IDENT})*)?"
)

# (major, minor, patch, prerelease identifiers or None)
Parsed = tuple[int, int, int, tuple[str, ...] | None]


@lru_cache(maxsize=4096)  # CRs repeat the same few versions
def parse_version(version: str) -> Parsed | None:
    """The version as NodeWright reads it, or None when it refuses it."""
    if not version:
        return None
    m = _GO.fullmatch(version if version.startswith("v") else "v" + version)
    if m is None:
        return None
    major, minor, patch, pre, _build = m.groups()
    return int(major), int(minor or 0), int(patch or 0), None if pre is None else tuple(pre.split("."))


def upstream_valid(version: str) -> bool:
    return parse_version(version) is not None


@lru_cache(maxsize=4096)
def strict_semver(version: str) -> bool:
    return _STRICT.fullmatch(version) is not None


def compare(a: str, b: str) -> int | None:
    """-1, 0 or 1 as ``a`` is older, the same or newer than ``b``; None when either is invalid."""
    pa, pb = parse_version(a), parse_version(b)
    if pa is None or pb is None:
        return None
    if pa[:3] != pb[:3]:
        return -1 if pa[:3] < pb[:3] else 1
    return _compare_pre(pa[3], pb[3])


def _compare_pre(a: tuple[str, ...] | None, b: tuple[str, ...] | None) -> int:
    """semver precedence of pre-releases: none is newer than any; identifiers compared in turn,
    numbers numerically and below words; a longer list wins a tie."""
    if a == b:
        return 0
    if a is None:
        return 1
    if b is None:
        return -1
    for x, y in zip(a, b, strict=False):
        if x == y:
            continue
        x_num, y_num = x.isdigit(), y.isdigit()
        if x_num and y_num:
            return -1 if int(x) < int(y) else 1
        if x_num != y_num:
            return -1 if x_num else 1
        return -1 if x < y else 1
    return -1 if len(a) < len(b) else 1
