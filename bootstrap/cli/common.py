"""What the command modules share: reading the service config, one-line node logging."""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

from bootstrap.config import ConfigError, Settings, load_settings
from bootstrap.logs.setup import StderrHandler

# A SHA-256 in hex, as the ek commands take it (--allowlist, --sha256).
SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def settings(config: Path | None, prog: str = "nodegate") -> Settings | None:
    """The config (or the defaults); None after printing why it cannot be used (exit 2)."""
    try:
        return load_settings(config) if config is not None else Settings()
    except ConfigError as exc:
        print(f"{prog}: {' '.join(str(exc).split())}", file=sys.stderr)  # one line (YAML errors span several)
        return None


def node_log(command: str) -> None:
    """The node commands print retry notices on stderr, one plain line each."""
    handler = StderrHandler()
    handler.setFormatter(logging.Formatter(f"nodegate {command}: %(message)s"))
    logger = logging.getLogger(f"nodegate.{command}")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.WARNING)
    logger.propagate = False
