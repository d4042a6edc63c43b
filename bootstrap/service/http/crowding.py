"""Who yields a connection when a listener is full (issue 41, finding 3): pure rules over the
open connections, applied by ``bootstrap.service.http.listener.Connections``."""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Iterable
from typing import Protocol, TypeVar

from bootstrap.service.http.limits import Network


class Crowded(Protocol):
    """What the rules read of an open connection."""

    @property
    def address(self) -> str: ...

    @property
    def source(self) -> bool: ...  # from one of the listener's sources (the API server's)

    @property
    def since(self) -> float: ...  # when its current phase began

    @property
    def phase(self) -> str: ...

    def stalled(self) -> bool: ...


C = TypeVar("C", bound=Crowded)


def is_source(address: str, sources: tuple[Network, ...]) -> bool:
    """``address`` (an IPv4-mapped IPv6 address as its IPv4 one) is in one of ``sources``."""
    if not sources:
        return False
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in net for net in sources)


def busy_victim(open_: Iterable[C], by_address: Counter[str], newcomer: C) -> C | None:
    """The busy connection to close for ``newcomer`` when nothing is idle: one from the address
    that holds the most connections (other addresses' before the sources', and a source's only for
    a source's newcomer), preferably one that waits on its client, the longest. None unless that
    address holds at least two more than the newcomer's: an address never grows past another by
    taking its connections, so a full listener ends shared fairly between addresses (within one
    connection of each other), whatever they send
    (a stalled request, pipelined requests it does not read answers to, or a flood of genuine
    ones), and the API server's sources keep theirs."""
    best: C | None = None
    best_key: tuple[bool, int, bool, float] | None = None
    for conn in open_:
        if conn.phase == "closed" or (conn.source and not newcomer.source):
            continue
        key = (not conn.source, by_address[conn.address], conn.stalled(), -conn.since)
        if best_key is None or key > best_key:
            best, best_key = conn, key
    if best is None:
        return None
    if newcomer.source and not best.source:
        return best
    # Two more than the newcomer's, not one: addresses within one of each other would close each
    # other's connections in turn, each new one a TLS handshake for the listener.
    return best if by_address[best.address] > by_address[newcomer.address] + 1 else None
