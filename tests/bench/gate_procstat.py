"""The CPU that other work on the machine took over a span of the gate benchmark
(``tests.bench.gate``); the /proc readings themselves are ``tests.bench.procstat``'s (re-exported)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from tests.bench.procstat import busy_seconds, hwm_kib, pid_cpu_seconds, rss_kib

if TYPE_CHECKING:
    from tests.bench import gate_load
    from tests.bench.gate_double import Double


__all__ = ["Others", "busy_seconds", "hwm_kib", "pid_cpu_seconds", "rss_kib"]


class Others:
    """CPU time that neither the gate's process nor the double's spent, over a span: other work on
    the machine, which slows both (the tick counts are coarse: tenths of a second)."""

    def __init__(self, double: Double, load: gate_load.Load | None = None) -> None:
        self._double = double
        self._load = load
        self._start = self._mine_and_all()

    def _mine_and_all(self) -> tuple[float | None, float | None]:
        busy = busy_seconds()
        me, child = pid_cpu_seconds(os.getpid()), self._double.cpu_seconds()
        load = self._load.cpu_seconds() if self._load is not None else 0.0
        if me is None or child is None or load is None:
            return None, busy
        return me + child + load, busy

    def seconds(self) -> float | None:
        mine, busy = self._mine_and_all()
        mine0, busy0 = self._start
        if mine is None or busy is None or mine0 is None or busy0 is None:
            return None
        return round(max(0.0, (busy - busy0) - (mine - mine0)), 2)
