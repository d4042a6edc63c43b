"""Where a server's time goes per review: a py-spy sampling profile cut into stages.

``python -m tests.bench admission --profile`` runs ``py-spy record`` (from PyPI, in the test
extras) against each server process for the whole load part of the run: 100 samples a second,
``--nonblocking`` (the server is never paused, so its figures stay usable), pinned to the load
generator's CPUs. Each sample's stack is put in the first stage, in the order below, that it
matches; what is left goes by its innermost frame (the listener, aiohttp, TLS, the event loop).
The shares are of the process's on-CPU samples; times a review are share x the server CPU per
review measured in the same run.

``NODEGATE_BENCH_SPY_DIR=DIR`` keeps the raw stacks (``DIR/<server>.pyspy.txt``, py-spy's raw
format: one ``frame;frame;... count`` line per stack) for a closer look.

py-spy needs ptrace rights over the server (root, or the same user with kernel.yama.ptrace_scope
0); without them, or without py-spy, the run goes on and the profile says why it is missing.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

RATE = 100  # samples a second
KEEP_ENV = "NODEGATE_BENCH_SPY_DIR"  # keep py-spy's raw stacks (<mode>.pyspy.txt) in this folder

# (stage, pattern on any frame of the stack), first match wins: a log call inside the handler
# is logging, not the handler.
STAGES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern))
    for name, pattern in (
        ("logging (record, format, write)", r"logging/|bootstrap/logs/\w+\.py"),
        ("metrics (prometheus_client)", r"prometheus_client/"),
        ("decision cache", r"admission/decision/decisioncache\.py"),
        ("reading the review (JSON, envelope)", r"admission/reading/review\.py|\(json/"),
        (
            "the decision (Decider.decide)",
            r"admission/(?![\w/]*\b(?:webhook|review|response|decisioncache)\.py)[\w/]+\.py"
            r"|service/decisions\.py",
        ),
        ("the answer (encode)", r"admission/decision/response\.py"),
        (
            "webhook handler, rest (web.Response, ...)",
            r"admission/webhook\.py|validate \([^)]*admission_server\.py|BareReviews\.answer",
        ),
        ("review slots, routes (webhook app)", r"bootstrap/service/webhook/app\.py"),
        (
            "HTTP framing (nodegate's listener)",
            r"bootstrap/service/(http/framing|webhook/protocol|webhook/site)\.py",
        ),
    )
)
# By the innermost frame whose file matches, for the rest.
LEAF_STAGES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern))
    for name, pattern in (
        ("listener (connections, deadlines)", r"bootstrap/service/http/listener\.py"),
        ("TLS (ssl, sslproto)", r"/ssl\.py|sslproto\.py"),
        ("HTTP (aiohttp)", r"aiohttp/"),
        ("event loop (asyncio, epoll)", r"asyncio/|selectors\.py"),
    )
)
OTHER = "other"
# A sample whose innermost frame is one of these is a thread at rest (py-spy's --nonblocking mode
# cannot always tell): the log writer between batches.
IDLE = re.compile(r"^(BatchHandler\.)?_run \([^)]*bootstrap/logs/batch\.py")


def stage_of(stack: list[str]) -> str:
    joined = ";".join(stack)
    for name, pattern in STAGES:
        if pattern.search(joined):
            return name
    for frame in reversed(stack):
        for name, pattern in LEAF_STAGES:
            if pattern.search(frame):
                return name
    return OTHER


def stages(raw: str) -> Counter[str]:
    """Samples per stage from py-spy's ``--format raw`` output (``frame;frame;... count`` lines)."""
    out: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        if IDLE.search(frames[-1]):
            continue
        out[stage_of(frames)] += int(count)
    return out


def py_spy() -> str | None:
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).with_name("py-spy")  # the venv's, when it is not on PATH
    return str(beside) if beside.exists() else None


@dataclass
class Recording:
    mode: str
    proc: subprocess.Popen[bytes] | None
    output: Path
    log: Path
    problem: str = ""

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def result(self) -> tuple[Counter[str], str]:
        """(samples per stage, why there are none)."""
        if self.problem:
            return Counter(), self.problem
        try:
            found = stages(self.output.read_text(errors="replace"))
        except OSError:
            tail = ""
            with contextlib.suppress(OSError):
                tail = self.log.read_text(errors="replace")[-300:].strip()
            return Counter(), f"py-spy wrote no profile ({tail or 'no output'})"
        return found, "" if found else "py-spy took no sample"


def record(mode: str, pid: int, workdir: Path, cpus: set[int]) -> Recording:
    output, log = workdir / f"{mode}.pyspy.txt", workdir / f"{mode}.pyspy.log"
    exe = py_spy()
    if exe is None:
        return Recording(mode, None, output, log, "py-spy is not installed (pip install py-spy)")
    cmd = [exe, "record", "--pid", str(pid), "--rate", str(RATE), "--format", "raw", "--nonblocking"]
    cmd += ["--output", str(output)]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    if cpus and hasattr(os, "sched_setaffinity"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(proc.pid, cpus)
    return Recording(mode, proc, output, log)
