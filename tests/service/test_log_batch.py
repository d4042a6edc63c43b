"""The admission webhook's log: one line per review written by a thread in batches
(``bootstrap.logs.batch``), each line as the synchronous handler would write it; every denial at
info, allowed reviews at the level ``admission.log_allowed`` names."""

from __future__ import annotations

import io
import json
import logging
import sys
import threading
import warnings
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bootstrap.config import settings_from_obj
from bootstrap.logs import batch as logbatch
from bootstrap.logs import setup as logs
from bootstrap.service.compose import admission_app
from tests.admission.test_admission_rules import SAMPLE
from tests.admission.test_webhook import decider, no_reboot, review
from tests.support.reviewserver import review_client


class Stream(io.StringIO):
    """stderr for a test: tells when something was written."""

    def __init__(self) -> None:
        super().__init__()
        self.written = threading.Event()

    def write(self, text: str) -> int:
        n = super().write(text)
        self.written.set()
        return n


def _stderr(monkeypatch: pytest.MonkeyPatch) -> Stream:
    """In the test's body: pytest sets its own sys.stderr again after the fixtures ran."""
    stream = Stream()
    monkeypatch.setattr(sys, "stderr", stream)
    return stream


def _record(msg: str, *args: Any, **extra: Any) -> logging.LogRecord:
    record = logging.LogRecord("nodegate.admission", logging.INFO, __file__, 1, msg, args, None)
    record.__dict__.update(extra)
    return record


def test_lines_are_the_synchronous_handlers_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    stderr = _stderr(monkeypatch)
    handler = logbatch.BatchHandler()
    handler.setFormatter(logs.JsonFormatter())
    records = [_record("admission %s", v, user="alice", rules=[]) for v in ("allowed", "denied")]
    expected = [logs.JsonFormatter().format(r) for r in records]
    for r in records:
        handler.handle(r)
    assert stderr.getvalue() == ""  # nothing written on the caller's path
    handler.flush()
    assert stderr.getvalue().splitlines() == expected
    handler.close()


def test_the_thread_writes_without_being_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    stderr = _stderr(monkeypatch)
    handler = logbatch.BatchHandler(interval=0.001)
    handler.setFormatter(logs.JsonFormatter())
    handler.handle(_record("admission denied", user="mallory"))
    assert stderr.written.wait(timeout=10), "the writer thread wrote nothing"
    assert json.loads(stderr.getvalue())["user"] == "mallory"
    handler.close()


def test_what_is_logged_is_what_was_true_when_it_was_logged(monkeypatch: pytest.MonkeyPatch) -> None:
    stderr = _stderr(monkeypatch)
    handler = logbatch.BatchHandler()
    handler.setFormatter(logs.JsonFormatter())
    changing = ["rbac"]
    handler.handle(_record("rules %s", changing))
    changing.append("registry")  # after the call: not in the line
    failed = _record("failed")
    try:
        int("boom")
    except ValueError:
        failed.exc_info = sys.exc_info()
    handler.handle(failed)
    handler.close()
    first, second = (json.loads(line) for line in stderr.getvalue().splitlines())
    assert first["msg"] == "rules ['rbac']"
    assert "ValueError: invalid literal for int() with base 10: 'boom'" in second["exception"]


def test_a_stderr_that_does_not_drain_drops_lines_and_says_how_many(monkeypatch: pytest.MonkeyPatch) -> None:
    stderr = _stderr(monkeypatch)
    handler = logbatch.BatchHandler(max_pending=3)
    handler.setFormatter(logs.JsonFormatter())
    for n in range(5):
        handler.handle(_record("line %d", n))
    handler.close()
    lines = [json.loads(line) for line in stderr.getvalue().splitlines()]
    assert [line["msg"] for line in lines[:3]] == ["line 0", "line 1", "line 2"]
    assert lines[3]["level"] == "warning"
    assert lines[3]["msg"] == "2 log lines dropped: stderr did not drain"


def test_configure_batches_the_admission_lines_only(monkeypatch: pytest.MonkeyPatch) -> None:
    stderr = _stderr(monkeypatch)
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # configure() takes it over
    logs.configure()
    assert isinstance(logging.getLogger("nodegate.admission").handlers[0], logbatch.BatchHandler)
    logging.getLogger("nodegate.server").warning("at once")
    assert json.loads(stderr.getvalue())["msg"] == "at once"  # other loggers: written when logged


@given(st.floats(min_value=0, max_value=2**33, allow_nan=False))
def test_timestamps_are_those_of_datetime(created: float) -> None:
    expected = datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")
    assert logs.JsonFormatter()._timestamp(created) == expected


@pytest.mark.parametrize(("log_allowed", "allowed_level"), [("info", logging.INFO), ("debug", logging.DEBUG)])
async def test_allowed_reviews_at_the_chosen_level_denials_at_info(
    log_allowed: str, allowed_level: int, caplog: pytest.LogCaptureFixture
) -> None:
    settings = settings_from_obj({"admission": {"log_allowed": log_allowed}})
    app = admission_app(settings, decider(), None)
    with caplog.at_level(logging.DEBUG, logger="nodegate"):
        async with review_client(app) as client:
            for user in ("alice", "mallory"):
                body = review(no_reboot(SAMPLE), user=user)
                assert (await client.post("/admission/validate", json=body)).status == 200
    lines = {r.getMessage(): r for r in caplog.records if r.getMessage().startswith("admission ")}
    assert lines["admission allowed"].levelno == allowed_level
    assert lines["admission allowed"].__dict__["user"] == "alice"
    assert lines["admission denied"].levelno == logging.INFO
    assert set(lines["admission denied"].__dict__["rules"]) == {"rbac"}  # one per candidate policy


def test_an_unknown_level_is_refused() -> None:
    with pytest.raises(ValueError, match="log_allowed"):
        settings_from_obj({"admission": {"log_allowed": "warning"}})


# -- the webhook's line by its parts (bootstrap.logs.audit) ------------------------------------------

_TEXT = st.text(max_size=20)


@given(
    created=st.floats(min_value=0, max_value=2**33, allow_nan=False),
    allowed=st.booleans(),
    rules=st.lists(_TEXT, max_size=3),
    uid=_TEXT,
    dry_run=st.booleans(),
    operation=_TEXT,
    obj=_TEXT,
    user=_TEXT,
)
def test_a_line_by_its_parts_is_the_records_line(
    created: float,
    allowed: bool,
    rules: list[str],
    uid: str,
    dry_run: bool,
    operation: str,
    obj: str,
    user: str,
) -> None:
    logger = logging.getLogger("nodegate.admission")
    fields = {"uid": uid, "dry_run": dry_run, "rules": rules, "operation": operation, "object": obj}
    record = logger.makeRecord(
        logger.name, logging.INFO, __file__, 0, "admission %s", ("allowed" if allowed else "denied",), None
    )
    record.__dict__.update(fields, user=user)
    record.created = created
    ordered = {
        "uid": uid,
        "dry_run": dry_run,
        "rules": rules,
        "user": user,
        "object": obj,
        "operation": operation,
    }
    formatter = logs.JsonFormatter()
    assert formatter.line(
        created, logging.INFO, logger.name, record.getMessage(), ordered
    ) == formatter.format(record)


def test_the_audit_log_writes_through_the_batch_writer_or_through_logging(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from bootstrap.logs.audit import AuditLog

    audit = AuditLog()
    args: dict[str, Any] = {
        "uid": "u-1",
        "dry_run": False,
        "operation": "CREATE",
        "obj": "x",
        "user": "alice",
    }
    with caplog.at_level(logging.INFO, logger="nodegate"):
        audit(False, ["rbac"], **args)  # logging as tests set it up: through logging
    assert [r.getMessage() for r in caplog.records] == ["admission denied"]
    stderr = _stderr(monkeypatch)
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)
    logs.configure()
    audit(True, [], **args)
    audit(True, [], **args, allowed_level=logging.DEBUG)  # below the logger's level: no line
    audit(False, ["rbac"], **args)
    logbatch.shared(logs.JsonFormatter).flush()
    lines = [json.loads(line) for line in stderr.getvalue().splitlines()]
    assert [(line["msg"], line["level"], line["rules"]) for line in lines] == [
        ("admission allowed", "info", []),
        ("admission denied", "info", ["rbac"]),
    ]
    assert lines[0]["user"] == "alice"
    assert list(lines[0]) == [
        "ts",
        "level",
        "logger",
        "msg",
        "uid",
        "dry_run",
        "rules",
        "user",
        "object",
        "operation",
    ]
