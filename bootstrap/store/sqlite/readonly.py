"""The boot records of a sqlite store, read without writing a byte (``nodegate policy whatif``
runs beside a live service, or on a copy from ``nodegate backup``): no migration, no WAL switch,
no file created. A file from before boot records (schema < 5) holds none."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from attest.bootrecord.model import BootRecord
from bootstrap.store.model import StoreSchemaError, StoreUnavailable
from bootstrap.store.sqlite.schema import SCHEMA_VERSION, read_schema_version

__all__ = ["read_boot_records"]

FIRST_WITH_RECORDS = 5


def read_boot_records(path: Path) -> tuple[list[tuple[str, BootRecord | None, str | None]], dict[str, bytes]]:
    """(node name, record or None, why none) for every node, by name; and every kept dbx's
    digests. StoreUnavailable when the file cannot be read; StoreSchemaError for a file this
    nodegate does not understand."""
    if not path.is_file():
        raise StoreUnavailable(f"{path} does not exist")
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=5.0)
    except sqlite3.Error as exc:
        raise StoreUnavailable(f"sqlite: {exc}") from None
    try:
        version = read_schema_version(db)
        if version is None:
            return [], {}
        if version > SCHEMA_VERSION:
            raise StoreSchemaError(
                f"{path} has schema version {version}; this nodegate knows 1..{SCHEMA_VERSION}"
            )
        if version < FIRST_WITH_RECORDS:
            names = [str(r[0]) for r in db.execute("SELECT node_name FROM nodes ORDER BY node_name")]
            return [(n, None, "written before boot records were kept") for n in names], {}
        out: list[tuple[str, BootRecord | None, str | None]] = []
        for name, text in db.execute("SELECT node_name, boot_record FROM nodes ORDER BY node_name"):
            if text is None:
                out.append((str(name), None, "no boot record yet (attested before they were kept)"))
                continue
            try:
                out.append((str(name), BootRecord.model_validate_json(text), None))
            except ValueError:
                out.append((str(name), None, "the stored boot record is damaged"))
        dbx = {str(k): bytes(v) for k, v in db.execute("SELECT sha256, digests FROM dbx")}
    except sqlite3.Error as exc:
        raise StoreUnavailable(f"sqlite: {exc}") from None
    finally:
        db.close()
    return out, dbx
