"""A listener's connection limits (``bootstrap.service.http.listener`` enforces them)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    per_address: int = 64
    total: int = 2048
    handshake_timeout: float = 10.0
    header_timeout: float = 10.0
    idle_timeout: float = 60.0
    body_grace: float = 5.0
    max_age: float | None = 600.0  # None: no limit (the admission listener: the API server only)
    max_requests: int | None = 1000
    # None: a timer per phase (exact deadlines). A number: deadlines are recorded per phase and one
    # sweep per listener every ``sweep`` seconds enforces them, so a request arms no timer (the
    # admission listener: the deadlines are tens of seconds, the reviews hundreds of µs).
    sweep: float | None = None
    # At the cap with nothing idle: close a busy connection of the address that holds the most
    # (the module's docstring).
    evict_busy: bool = False
    # The addresses the listener is for (the API server's): no per-address cap, and ``reserved``
    # of the ``total`` connections only they may take.
    sources: tuple[Network, ...] = ()
    reserved: int = 0
    # SO_SNDBUF and SO_RCVBUF of each accepted socket (None: the kernel's, autotuned).
    socket_buffer: int | None = None
    # Ciphertext a TLS connection holds each way (bootstrap.service.http.tls): received and not
    # yet decrypted while its handler does not read, written and not yet taken by the kernel
    # (None: 64 KiB in, the transport's default out).
    tls_buffer: int | None = None

    def __post_init__(self) -> None:
        if self.per_address < 1 or self.total < self.per_address:
            raise ValueError("connection limits: per_address >= 1 and total >= per_address")
        if self.reserved < 0 or self.reserved >= self.total or (self.reserved and not self.sources):
            raise ValueError("connection limits: 0 <= reserved < total, and reserved only with sources")
        if min(self.socket_buffer or 1, self.tls_buffer or 1) < 1:
            raise ValueError("connection limits: buffer sizes are positive")
        times = (self.handshake_timeout, self.header_timeout, self.idle_timeout, self.body_grace)
        if min(times) <= 0 or (self.max_age is not None and self.max_age <= 0):
            raise ValueError("connection limits: every timeout is positive")
        if self.max_requests is not None and self.max_requests < 1:
            raise ValueError("connection limits: max_requests >= 1")
        if self.sweep is not None and self.sweep <= 0:
            raise ValueError("connection limits: sweep is positive")
