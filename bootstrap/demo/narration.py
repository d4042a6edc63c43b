"""What `nodegate demo` prints: numbered steps, indented details, and the one-line failure."""

from __future__ import annotations

import re

STEPS = 12
_INDENT = " " * 6


class DemoFailed(Exception):
    """A step did not turn out as the story says; the message is the one line printed."""


def step(n: int, text: str) -> None:
    print(f"[{n}/{STEPS}] {text}", flush=True)


def detail(text: str) -> None:
    print(f"{_INDENT}{text}", flush=True)


def short(text: str, limit: int = 200) -> str:
    """A refusal line for a terminal: digests shortened, at most ``limit`` characters."""
    text = re.sub(r"\b([0-9a-f]{12})[0-9a-f]{52}\b", r"\1...", text)
    return text if len(text) <= limit else text[: limit - 3] + "..."
