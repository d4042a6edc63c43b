"""Names that cross a boundary: Kubernetes node names, the attested Node labels and loopback hosts.
One definition each."""

from __future__ import annotations

import ipaddress
import re
from typing import Final, TypeGuard

MAX_NODE_NAME: Final = 253
# Kubernetes node names are DNS subdomains (RFC 1123): dot-separated labels of [a-z0-9-] that
# start and end alphanumeric, at most 253 characters in all.
NODE_NAME: Final = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*")


# The labels nodegate writes on a Node at every accepted join and re-attestation, under a prefix
# NodeRestriction forbids kubelets to set, so a Node that lacks them was not written by nodegate
# (the gate holds such a Node once its attestation records which Node object it labelled).
NODE_RESTRICTION_PREFIX: Final = "node-restriction.kubernetes.io/"
ATTESTED_LABEL: Final = f"{NODE_RESTRICTION_PREFIX}nodegate.io-attested"
EK_LABEL: Final = f"{NODE_RESTRICTION_PREFIX}nodegate.io-ek-sha256"


def ek_label_value(ek_sha256: str) -> str:
    """The EK label's value: the hash clipped to a label value's 63 characters."""
    return ek_sha256[:63]


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
