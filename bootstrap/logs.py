"""Structured JSON logs, one object per line. Only whitelisted extra fields are emitted, so a
careless ``extra=`` can never put a token, proof or key into the log."""

from __future__ import annotations

import json
import logging
import sys
import warnings
from datetime import UTC, datetime

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
)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
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
        return json.dumps(out, default=str)


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


def configure(level: int = logging.INFO) -> None:
    handler = StderrHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("nodegate")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
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
