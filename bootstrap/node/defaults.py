"""The node side's defaults, importable without the TPM stack (the CLI's help text uses them)."""

from __future__ import annotations

from pathlib import Path
from typing import Final

DEFAULT_TCTI: Final = "device:/dev/tpmrm0"
NODE_DIR: Final = Path("/var/lib/nodegate-node")  # `nodegate join --out`, `renew --dir`
ATTEMPTS: Final = 8  # total tries for transient failures, then exit 75
EVENT_LOG: Final = Path("/sys/kernel/security/tpm0/binary_bios_measurements")
BOOT_ID: Final = Path("/proc/sys/kernel/random/boot_id")
