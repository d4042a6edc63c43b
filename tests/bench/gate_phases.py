"""Where the gate's time goes, without a profiler (part of ``tests/bench/gate.py``).

Wrappers around the gate's own steps, counting this thread's CPU time for the synchronous ones
(watch decode, cache index, decision) and wall time for the writes (they await the API):

  decode    bootstrap/kube/watch.py's event decode, for the gate's watches only (the benchmark's
            own node watch decodes with another decoder object and is not counted)
  index     Cache.apply_event: the caches and the package CRs' per-node index
  decision  Gate.decide (holds.decide over the caches)
  writes    Writer.taint / condition / attestation: wall time, API round trips included

Everything else the gate's process spends (the HTTP client, the event loop, the benchmark's agent
and node watch in this process) is the difference to the process's CPU time.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bootstrap.gate import Gate
from bootstrap.kube import watch as watch_mod
from bootstrap.kube.decode import PLAIN, ObjectDecoder

PHASES = ("decode", "index", "decision", "writes")


class _Own:
    """PLAIN, as another object: the gate's watches are told apart from the agent's by it."""

    def from_json(self, data: Any) -> dict[str, Any]:
        return PLAIN.from_json(data)

    def from_mapping(self, obj: dict[str, Any]) -> dict[str, Any]:
        return obj


GATE_PLAIN: ObjectDecoder[dict[str, Any]] = _Own()


class Phases:
    def __init__(self) -> None:
        self.ns = dict.fromkeys(PHASES, 0)
        self.count = dict.fromkeys(PHASES, 0)
        self.gate_decoders: set[int] = {id(GATE_PLAIN)}

    def take(self) -> dict[str, dict[str, float]]:
        out = {k: {"ms": self.ns[k] / 1e6, "calls": self.count[k]} for k in PHASES}
        self.ns = dict.fromkeys(PHASES, 0)
        self.count = dict.fromkeys(PHASES, 0)
        return out

    def _add(self, phase: str, ns: int) -> None:
        self.ns[phase] += ns
        self.count[phase] += 1

    def install(self, gate: Gate, decoders: tuple[object, ...]) -> Callable[[], None]:
        """Wrap ``gate``'s steps (and the watch module's decode); returns the undo."""
        self.gate_decoders |= {id(d) for d in decoders}
        original_event = watch_mod._event

        def event(what: str, line: bytes, decoder: Any) -> Any:
            if id(decoder) not in self.gate_decoders:
                return original_event(what, line, decoder)
            start = time.thread_time_ns()
            try:
                return original_event(what, line, decoder)
            finally:
                self._add("decode", time.thread_time_ns() - start)

        watch_mod._event = event  # type: ignore[assignment]
        cache = gate._cache
        apply = cache.apply_event

        @functools.wraps(apply)
        def apply_event(src: Any, ev: Any) -> None:
            start = time.thread_time_ns()
            try:
                apply(src, ev)
            finally:
                self._add("index", time.thread_time_ns() - start)

        cache.apply_event = apply_event  # type: ignore[method-assign]
        decide = gate.decide

        @functools.wraps(decide)
        def timed_decide(node: Any) -> Any:
            start = time.thread_time_ns()
            try:
                return decide(node)
            finally:
                self._add("decision", time.thread_time_ns() - start)

        gate.decide = timed_decide  # type: ignore[method-assign]
        writer = gate._writer
        for name in ("taint", "condition", "attestation"):
            setattr(writer, name, self._timed_write(getattr(writer, name)))

        def undo() -> None:
            watch_mod._event = original_event

        return undo

    def _timed_write(self, write: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(write)
        async def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter_ns()
            try:
                return await write(*args, **kwargs)
            finally:
                self._add("writes", time.perf_counter_ns() - start)

        return timed


def render(label: str, phases: dict[str, dict[str, float]], per: int, what: str) -> str:
    per = max(per, 1)
    parts = [
        f"{k} {v['ms'] / per:.2f} ms ({v['calls'] / per:.1f})" for k, v in phases.items() if k != "writes"
    ]
    w = phases["writes"]
    return (
        f"  {label}: per {what}, gate CPU: {', '.join(parts)}; writes {w['calls'] / per:.2f} "
        f"taking {w['ms'] / per:.2f} ms wall"
    )
