"""A process's CPU time and memory, and the machine's busy CPU time, from /proc (Linux; None
elsewhere): what the benchmarks measure of their servers and of themselves."""

from __future__ import annotations

import os
from pathlib import Path


def pid_cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU time of process ``pid`` (all its threads) so far."""
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
