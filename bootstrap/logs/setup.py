"""Structured JSON logs, one object per line. Only whitelisted extra fields are emitted, so a
careless ``extra=`` can never put a token, proof or key into the log.

The admission webhook's line per review (``nodegate.admission``) is formatted when it is logged and
written by a thread, many lines per write (``bootstrap.logs.batch``): no write per review. Every
other line is written when it is logged."""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings
from datetime import UTC, datetime

from bootstrap.logs import batch as logbatch

FIELDS = (
    "node",
    "code",
    "endpoint",
    "status",
    "ms",
    "peer",
    "error",
    "actor",
    "spiffe_id",
    "listen",
    "uid",  # admission: the review's uid, dry run and the rules that denied
    "dry_run",
    "rules",
    "ek_sha256",  # a successful join or renewal: what it was attested as
    "pcr_class",
    "measured_boot_class",
    "action",
    "user",  # admission: who sent the review, what it was about
    "object",
    "operation",
    "volume",  # a disk-key release (docs/disk-keys.md): the volume, the class, the verdict, the version
    "disk_class",
    "verdict",
    "key_version",
)


_ENCODE = json.JSONEncoder(default=str).encode  # json.dumps(..., default=str) builds one per call


class JsonFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        # (second, the timestamp up to that second): one tuple, replaced whole, so that threads
        # sharing the formatter never see one's second with another's text.
        self._seconds: tuple[float, str] = (-1.0, "")

    def _timestamp(self, created: float) -> str:
        """``datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")``, with the
        part up to the seconds formatted once a second."""
        second = float(int(created))
        micros = round((created - second) * 1e6)  # as fromtimestamp rounds
        if micros >= 1_000_000:
            second, micros = second + 1, micros - 1_000_000
        cached, prefix = self._seconds
        if second != cached:
            prefix = datetime.fromtimestamp(second, UTC).isoformat(timespec="seconds")[:-6]
            self._seconds = (second, prefix)
        return f"{prefix}.{micros // 1000:03d}+00:00"

    def line(self, created: float, levelno: int, logger: str, msg: str, fields: dict[str, object]) -> str:
        """What ``format`` writes for a record with these attributes and ``fields`` (in FIELDS
        order, no None), without building the record (``bootstrap.logs.audit``)."""
        out: dict[str, object] = {
            "ts": self._timestamp(created),
            "level": logging.getLevelName(levelno).lower(),
            "logger": logger,
            "msg": msg,
        }
        out.update(fields)
        return _ENCODE(out)

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": self._timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in FIELDS:
            value = record.__dict__.get(key)
            if value is not None:
                out[key] = value
        if record.exc_info and record.exc_info[0] is not None:
            out["exception"] = self.formatException(record.exc_info)  # code lines, never locals
        return _ENCODE(out)


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at the time of the record, not at set-up (a process
    that swaps stderr, such as a test harness, must not leave handlers on a closed stream)."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass  # StreamHandler.__init__ assigns one; the property always answers sys.stderr


LEVEL_ENV = "NODEGATE_LOG_LEVEL"
LEVELS = ("debug", "info", "warning", "error")


def level_named(name: str | None) -> int:
    """``--log-level`` (or, when it is not given, ``$NODEGATE_LOG_LEVEL``), default info;
    ValueError for a name that is not a level."""
    text = (name or os.environ.get(LEVEL_ENV) or "info").strip().lower()
    if text not in LEVELS:
        raise ValueError(
            f"log level {text!r:.40} is not one of {', '.join(LEVELS)} (--log-level, ${LEVEL_ENV})"
        )
    return int(getattr(logging, text.upper()))


BATCHED = "nodegate.admission"  # one line per review: written by logbatch's thread


def configure(level: int = logging.INFO) -> None:
    handler = StderrHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("nodegate")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
    batched = logging.getLogger(BATCHED)
    batched.handlers[:] = [logbatch.shared(JsonFormatter)]
    batched.propagate = False  # same stream, same format, same level (the parent's)
    # No line shows the thread or process: not collecting them makes every record cheaper (the
    # logging HOWTO's "Optimization").
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    capture_warnings()


def capture_warnings() -> None:
    """Python warnings (cryptography's, aiohttp's, ...) become records of ``nodegate.warnings``:
    one line in the log's own format, never Python's two-line warning on the terminal nor a
    non-JSON line in the JSON stream. Warnings that carry nothing are filtered where they arise
    (attest/certparse.py)."""
    warnings.showwarning = _show_warning


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: object = None,
    line: str | None = None,
) -> None:
    where = f"{filename.rsplit('/', 1)[-1]}:{lineno}"
    logging.getLogger("nodegate.warnings").warning(
        "%s: %s", category.__name__, message, extra={"error": where}
    )
