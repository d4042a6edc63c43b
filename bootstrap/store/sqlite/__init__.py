"""The embedded store: one sqlite file, ``<state_dir>/nodegate.db``.

``schema`` holds the tables and their forward migrations; ``store`` the operations.
"""

from __future__ import annotations

from bootstrap.store.sqlite.schema import SCHEMA, SCHEMA_VERSION, Migration, migrate, read_schema_version
from bootstrap.store.sqlite.store import DEFAULT_AUDIT_ROWS, DEFAULT_BUSY_TIMEOUT, SqliteStore

__all__ = [
    "DEFAULT_AUDIT_ROWS",
    "DEFAULT_BUSY_TIMEOUT",
    "SCHEMA",
    "SCHEMA_VERSION",
    "Migration",
    "SqliteStore",
    "migrate",
    "read_schema_version",
]
