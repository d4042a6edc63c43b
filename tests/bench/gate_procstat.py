"""CPU and memory of the gate benchmark's processes (``tests.bench.gate``), from /proc: a
process's CPU time, RSS and peak, and the CPU that other work on the machine took over a span."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.bench import gate_load
    from tests.bench.gate_double import Double


def pid_cpu_seconds(pid: int | None) -> float | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # fields 3.. of proc(5); utime, stime: 14, 15
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def busy_seconds() -> float | None:
    """CPU time the whole machine has spent busy (all CPUs, every process), from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    # Interrupt time is left out: loopback traffic of the gate and the double lands there.
    user, nice, system, _idle, _iowait, _irq, _softirq, steal = (int(x) for x in fields[1:9])
    return (user + nice + system + steal) / os.sysconf("SC_CLK_TCK")


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


def _status_kib(pid: int | str | None, key: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_kib(pid: int | str | None = "self") -> int | None:
    return _status_kib(pid, "VmRSS")


def hwm_kib(pid: int | str | None = "self") -> int | None:
    return _status_kib(pid, "VmHWM")
