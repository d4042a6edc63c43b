"""Helpers every benchmark uses: percentiles, CPU pinning, argument checks, package versions."""

from __future__ import annotations

import argparse
import contextlib
import gc
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from importlib import metadata


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1) of unsorted values."""
    ordered = sorted(values)
    return float(ordered[max(0, math.ceil(q * len(ordered)) - 1)])


def usable_cpus() -> set[int]:
    return set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set()


def split_cpus() -> tuple[set[int], set[int]]:
    """(the first usable CPU, the others) for a server and its load generator; with fewer than
    two CPUs both get what there is (and the report says so)."""
    usable = usable_cpus()
    if len(usable) < 2:
        return usable, usable
    first = min(usable)
    return {first}, usable - {first}


@contextlib.contextmanager
def pinned(cpus: set[int]) -> Iterator[None]:
    """This process on ``cpus`` for the block (nothing when empty or unsupported)."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def versions(dists: Iterable[str]) -> dict[str, str | None]:
    """Installed versions of ``dists`` (None for one that is not installed)."""
    out: dict[str, str | None] = {}
    for dist in dists:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def per_call_us(fn: Callable[[], object], n: int) -> float:
    """Mean µs per call of ``n`` back-to-back calls, the garbage collector paused."""
    gc.disable()
    try:
        start = time.perf_counter_ns()
        for _ in range(n):
            fn()
        return (time.perf_counter_ns() - start) / n / 1000.0
    finally:
        gc.enable()


def num(value: float | None, fmt: str) -> str:
    """``value`` formatted, or "-" when it was not measured."""
    return "-" if value is None else format(value, fmt)


def pct(value: float | None) -> str:
    """A share as a whole percentage, or "-"."""
    return "-" if value is None else f"{value * 100:.0f}%"
