"""A rule violation: which rule, where, what is wrong, and how to fix it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Violation:
    rule: str
    path: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message} ({self.fix})"
