"""The admission webhook's line per review, made from its parts and handed to the log writer.

``logs.configure`` sends ``nodegate.admission`` to the batch writer (``bootstrap.logs.batch``) with
the JSON formatter and nowhere else. Then a review's line needs no LogRecord: it is composed from
its parts exactly as the formatter writes the record (a test compares them) and queued, which costs
the review a dict and one encoder call instead of a logging call. Whenever that logger is set up
any other way (another handler or formatter, a filter, propagation: tests, an embedding program),
the line goes through logging as before (``admission.webhook.log_decision``). Levels are honoured
either way.
"""

from __future__ import annotations

import logging
import time

from admission.webhook import log_decision
from bootstrap.logs import batch as logbatch
from bootstrap.logs import setup as logs


class AuditLog:
    def __init__(self) -> None:
        self._logger = logging.getLogger(logs.BATCHED)

    def __call__(
        self,
        allowed: bool,
        rules: list[str],
        *,
        uid: str,
        dry_run: bool,
        operation: str,
        obj: str,
        user: str,
        allowed_level: int = logging.INFO,
    ) -> None:
        logger = self._logger
        handlers = logger.handlers
        handler = handlers[0] if len(handlers) == 1 else None
        formatter = None if handler is None else handler.formatter
        if (
            not isinstance(handler, logbatch.BatchHandler)
            or not isinstance(formatter, logs.JsonFormatter)
            or logger.propagate
            or logger.filters
            or handler.filters
        ):
            log_decision(
                allowed,
                rules,
                uid=uid,
                dry_run=dry_run,
                operation=operation,
                obj=obj,
                user=user,
                allowed_level=allowed_level,
            )
            return
        level = allowed_level if allowed else logging.INFO
        if level < handler.level or not logger.isEnabledFor(level):
            return
        fields: dict[str, object] = {  # logs.FIELDS order
            "uid": uid,
            "dry_run": dry_run,
            "rules": rules,
            "user": user,
            "object": obj,
            "operation": operation,
        }
        msg = "admission allowed" if allowed else "admission denied"
        handler.submit(formatter.line(time.time(), level, logger.name, msg, fields))
