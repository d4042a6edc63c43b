"""The names the self-issued TLS certificate carries: ``server_names`` when set, else what nodes
can dial on this host (its name, its addresses, and loopback for local tools).

No DNS query beyond resolving the host's own name (normally ``/etc/hosts``): the outward address
is found by asking the kernel which source address it would route from (a UDP socket that is
connected, never sent on).
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket

from bootstrap.config import Settings, host_port
from bootstrap.names import is_node_name

_LOOPBACK = ("localhost", "127.0.0.1", "::1")
# documentation networks (RFC 5737, RFC 3849): connecting a UDP socket sends nothing
_PROBES = ((socket.AF_INET, "192.0.2.1"), (socket.AF_INET6, "2001:db8::1"))
_MAX_NAMES = 32


def server_names(settings: Settings) -> tuple[str, ...]:
    if settings.server_names:
        return settings.server_names
    return host_names(settings.listen)


def host_names(listen: str) -> tuple[str, ...]:
    names: list[str] = list(_LOOPBACK)
    host, _ = host_port(listen)
    hostname = socket.gethostname().lower()
    if hostname and is_node_name(hostname):
        names.append(hostname)
    addresses: list[str] = []
    if _is_address(host) and not ipaddress.ip_address(host).is_unspecified:
        addresses.append(host)
    for family, target in _PROBES:
        with contextlib.suppress(OSError), socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((target, 9))
            addresses.append(str(s.getsockname()[0]))
    with contextlib.suppress(OSError, UnicodeError):
        for info in socket.getaddrinfo(hostname, None, type=socket.SOCK_STREAM):
            addresses.append(str(info[4][0]))
    for a in addresses:
        text = str(ipaddress.ip_address(a.split("%", 1)[0]))  # drop an IPv6 zone
        if text not in names:
            names.append(text)
    return tuple(dict.fromkeys(names))[:_MAX_NAMES]


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
