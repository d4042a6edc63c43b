"""Names that cross a boundary: Kubernetes node names and loopback hosts. One definition each."""

from __future__ import annotations

import ipaddress
import re
from typing import Final, TypeGuard

MAX_NODE_NAME: Final = 253
# Kubernetes node names are DNS subdomains (RFC 1123): dot-separated labels of [a-z0-9-] that
# start and end alphanumeric, at most 253 characters in all.
NODE_NAME: Final = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*")


def is_node_name(name: object) -> TypeGuard[str]:
    """True for a valid Kubernetes node name."""
    return isinstance(name, str) and len(name) <= MAX_NODE_NAME and NODE_NAME.fullmatch(name) is not None


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (127.0.0.0/8, ::1); no name resolution."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
