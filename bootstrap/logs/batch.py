"""A log handler whose lines are written by a thread, many lines per write.

For the admission webhook's line per review: the logging call formats the line (with the JSON
formatter's cheap path: one encoder, the timestamp's seconds formatted once a second) and queues
it; a thread, woken by the first line of a batch, waits ``interval`` for more and writes them to
``sys.stderr`` (whatever it is then) in one write. Idle, the thread sleeps on an event.

Why the line is formatted by the caller and only written by the thread (measured, see
docs/benchmarks.md): a thread that formats a batch holds the interpreter for as long as the batch
takes (a millisecond and more at thousands of reviews a second), which stretched the reviews
waiting behind it (their p99 at 8 clients rose from 0.9x to 1.6-1.9x the bare handler's); a write
per line (a system call and a flush) was the part worth moving, and it costs the thread almost no
interpreter time (the write itself runs without the GIL).

What it costs: a line can reach stderr up to ``interval`` (20 ms) after it was logged, and lines
of this handler may come out after lines other handlers wrote later. ``flush()`` (called by
``logging.shutdown`` at exit) and ``close()`` write what is queued. At most ``max_pending`` lines
wait; beyond that they are dropped and counted, and a line says how many (a stderr that stopped
draining must not grow the process without bound).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable

INTERVAL = 0.02
MAX_PENDING = 10_000


class BatchHandler(logging.Handler):
    def __init__(self, interval: float = INTERVAL, max_pending: int = MAX_PENDING) -> None:
        super().__init__()
        self._interval = interval
        self._max_pending = max_pending
        self._pending: deque[str] = deque()
        self._wake = threading.Event()
        self._write = threading.Lock()  # one drain at a time (the thread, flush, close)
        self._thread: threading.Thread | None = None
        self._closed = False
        self.dropped = 0

    def handle(self, record: logging.LogRecord) -> bool:
        # No handler lock: formatting needs none, a deque append is atomic, the thread writes.
        if not self.filter(record):
            return False
        self.emit(record)
        return True

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:  # noqa: BLE001  (as logging does: report, go on)
            self.handleError(record)
            return
        self.submit(line)

    def submit(self, line: str) -> None:
        """Queue a formatted line (``bootstrap.logs.audit`` formats without a LogRecord)."""
        if len(self._pending) >= self._max_pending:
            self.dropped += 1
            return
        self._pending.append(line)
        if self._thread is None:
            self._start()
        if not self._wake.is_set():
            self._wake.set()

    def _start(self) -> None:
        with self._write:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="nodegate-log-writer", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait()
            self._wake.clear()
            if not self._closed:
                time.sleep(self._interval)  # let the batch fill
            self.flush()

    def flush(self) -> None:
        with self._write:
            pending = self._pending
            lines = [pending.popleft() for _ in range(len(pending))]
            if self.dropped:
                lines.append(self._dropped_line())
                self.dropped = 0
            if lines:
                try:
                    stream = sys.stderr
                    stream.write("\n".join(lines) + "\n")
                    stream.flush()
                except (OSError, ValueError):  # stderr closed or gone: nothing to tell it
                    pass

    def _dropped_line(self) -> str:
        record = logging.LogRecord(
            "nodegate.logs", logging.WARNING, __file__, 0, "%d log lines dropped: stderr did not drain",
            (self.dropped,), None,
        )  # fmt: skip
        return self.format(record)

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        self.flush()
        super().close()


_shared: BatchHandler | None = None


def shared(formatter: Callable[[], logging.Formatter]) -> BatchHandler:
    """The process's one batch handler (one writer thread however often logging is configured)."""
    global _shared  # noqa: PLW0603  (one writer per process, like sys.stderr itself)
    if _shared is None or _shared._closed:
        _shared = BatchHandler()
        _shared.setFormatter(formatter())
    return _shared
