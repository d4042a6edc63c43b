"""configInterrupts keys as NodeWright matches them against configMap keys.

A key that is a configMap key matches it. A key with ``*`` is a pattern in the syntax of Go's
``path/filepath.Match`` (on Linux): ``*`` any run of characters but ``/``, ``?`` one character
but ``/``, ``[...]`` / ``[^...]`` a class of characters and ranges, ``\\`` escapes the next
character. A malformed pattern (an unclosed class, an empty class, a dangling ``\\``, a class
range without its ends) matches nothing. A key without ``*`` must be a configMap key: ``?`` and
classes alone do not make it a pattern.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from functools import lru_cache


class BadPattern(ValueError):
    """Not a pattern Go's filepath.Match accepts."""


def _escaped(pattern: str, i: int) -> tuple[str, int]:
    """The class character at ``i`` (which may be escaped), and the index after it."""
    if i >= len(pattern) or pattern[i] in "-]":
        raise BadPattern(pattern)
    if pattern[i] == "\\":
        i += 1
        if i >= len(pattern):
            raise BadPattern(pattern)
    return pattern[i], i + 1


def _class(pattern: str, i: int) -> tuple[str, int]:
    """The regex of the class that starts after '[' at ``i``, and the index after its ']'."""
    negate = i < len(pattern) and pattern[i] == "^"
    if negate:
        i += 1
    parts: list[str] = []
    while True:
        if i < len(pattern) and pattern[i] == "]" and parts:
            return ("[^" if negate else "[") + "".join(parts) + "]", i + 1
        lo, i = _escaped(pattern, i)
        hi = lo
        if i < len(pattern) and pattern[i] == "-":
            hi, i = _escaped(pattern, i + 1)
        # A range whose ends are reversed is well-formed and matches nothing.
        parts.append(f"{re.escape(lo)}-{re.escape(hi)}" if lo <= hi else "(?!)")


@lru_cache(maxsize=1024)  # CRs repeat the same few patterns
def compile_glob(pattern: str) -> re.Pattern[str]:
    """The regex of a filepath.Match pattern; BadPattern when it is malformed."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            regex, i = _class(pattern, i + 1)
            out.append(regex)
        elif c == "\\":
            if i + 1 >= len(pattern):
                raise BadPattern(pattern)
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    return re.compile("".join(out) + r"\Z", re.DOTALL)


def matches_some(pattern: str, keys: Collection[str]) -> bool:
    """Whether the configInterrupts key ``pattern`` names one of ``keys`` as NodeWright decides."""
    if pattern in keys:
        return True
    if "*" not in pattern:
        return False
    try:
        regex = compile_glob(pattern)
    except BadPattern:
        return False
    return any(regex.match(k) for k in keys)
