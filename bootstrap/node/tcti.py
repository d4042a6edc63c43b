"""``--tcti NAME[:CONFIG]``: checked before the TPM is opened, so a mistyped TCTI is named as such
instead of as a missing /dev/tpmrm0 (no TPM stack imported here)."""

from __future__ import annotations

import ctypes.util
import re
from typing import Final

from bootstrap.node.errors import JoinUsageError

EXAMPLES: Final = "device:/dev/tpmrm0, swtpm:host=127.0.0.1,port=2321 or tabrmd"
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")


def check(tcti: str) -> None:
    """JoinUsageError when ``tcti`` is not NAME[:CONFIG] with a TCTI module NAME on this machine.
    A NAME with a '/' or '.so' is a library path, which the loader opens itself."""
    name, _, _ = tcti.partition(":")
    if "/" in name or ".so" in name:
        return
    if not _NAME.fullmatch(name) or any(not c.isprintable() for c in tcti):
        raise JoinUsageError(f"--tcti {tcti!r} is malformed: write NAME[:CONFIG], e.g. {EXAMPLES}")
    if ctypes.util.find_library(f"tss2-tcti-{name}") is None:
        raise JoinUsageError(
            f"--tcti {tcti!r}: no TCTI module {name!r} on this machine (libtss2-tcti-{name}.so.0); "
            f"e.g. {EXAMPLES}"
        )
