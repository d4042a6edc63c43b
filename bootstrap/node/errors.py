"""How `nodegate join` and `nodegate renew` fail: the errors, their exit statuses, the stderr line.

Exit statuses: 0 done, 1 refused by the server (or its answer failed our checks), 2 usage or a
local problem (options, files, TPM, TLS trust), 75 (EX_TEMPFAIL) transient failures outlasted the
attempts, so a supervisor should try again later (docs/node-join.md).
"""

from __future__ import annotations

import sys

__all__ = [
    "DETAIL_LIMIT",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_TEMPFAIL",
    "EXIT_USAGE",
    "JoinFailed",
    "JoinGaveUp",
    "JoinUsageError",
    "exit_status",
    "one_line",
    "report_failure",
]

DETAIL_LIMIT = 300

EXIT_OK = 0
EXIT_REFUSED = 1  # the server's machine code, or an answer that failed our checks: final
EXIT_USAGE = 2  # options, local files, the TPM, TLS trust: something on this machine must change
EXIT_TEMPFAIL = 75  # EX_TEMPFAIL (sysexits.h): systemd's Restart=on-failure retries it


def one_line(text: object, limit: int = DETAIL_LIMIT) -> str:
    """Server- or library-provided text made safe for one terminal line."""
    s = " ".join("".join(c if c.isprintable() else " " for c in str(text)).split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


class JoinFailed(Exception):
    """The join was refused or cannot succeed by retrying. ``code`` is the server's machine code
    or a local one (``tpm_unavailable``, ``tls_untrusted``, ``bad_response``, ...); ``status`` is
    the HTTP status when the server answered."""

    def __init__(self, code: str, detail: str = "", status: int | None = None) -> None:
        self.code = code
        self.status = status
        self.detail = one_line(detail or code)
        super().__init__(self.detail)

    def __str__(self) -> str:
        return self.detail

    def __repr__(self) -> str:
        return f"JoinFailed(code={self.code!r}, status={self.status!r}, detail={self.detail!r})"


class JoinGaveUp(JoinFailed):
    """Transient failures (service down, overloaded or unreachable) outlasted the attempts: trying
    again later may well work, unlike a refusal."""


class JoinUsageError(ValueError):
    """Options that cannot work (bad URL, unreadable CA bundle, invalid node name)."""


def exit_status(exc: JoinFailed | JoinUsageError) -> int:
    if isinstance(exc, JoinUsageError):
        return EXIT_USAGE
    if isinstance(exc, JoinGaveUp):
        return EXIT_TEMPFAIL
    if exc.status is not None or exc.code == "bad_response":
        return EXIT_REFUSED
    return EXIT_USAGE


def report_failure(prog: str, exc: JoinFailed | JoinUsageError) -> int:
    """The one stderr line for a failed ``prog``; returns its exit status."""
    status = exit_status(exc)
    if isinstance(exc, JoinUsageError):
        print(f"{prog}: {one_line(exc)}", file=sys.stderr)
        return status
    where = exc.code if exc.status is None else f"{exc.code}, HTTP {exc.status}"
    verb = {EXIT_REFUSED: "refused", EXIT_TEMPFAIL: "gave up"}.get(status, "failed")
    print(f"{prog}: {verb} ({where}): {exc}", file=sys.stderr)
    return status
