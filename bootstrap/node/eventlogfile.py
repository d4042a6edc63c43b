"""An event log named with ``--event-log`` must be sent: the operator named it because the service
judges measured boot. A file that cannot be read, is empty or is too large stops the command
before it contacts the server (a usage error, exit 2), instead of a warning followed by a refusal
(``measured_boot_violation``) that points elsewhere."""

from __future__ import annotations

from pathlib import Path

from bootstrap.node.errors import JoinUsageError
from bootstrap.protocol import EVENT_LOG_BYTES


def require_event_log(path: Path) -> None:
    try:
        with path.open("rb") as f:
            size = len(f.read(EVENT_LOG_BYTES + 1))
    except FileNotFoundError:
        raise JoinUsageError(f"--event-log {path} does not exist") from None
    except PermissionError:
        raise JoinUsageError(
            f"--event-log {path} is not readable by this user (the firmware log is root-only: run as root)"
        ) from None
    except OSError as exc:
        raise JoinUsageError(f"--event-log {path} cannot be read: {exc.strerror or exc}") from None
    if size == 0:
        raise JoinUsageError(f"--event-log {path} is empty (no measured boot on this machine?)")
    if size > EVENT_LOG_BYTES:
        raise JoinUsageError(f"--event-log {path} is larger than {EVENT_LOG_BYTES} bytes")
