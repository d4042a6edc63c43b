"""Per-client-address token buckets for the join endpoints (429 with Retry-After when empty).

Bounded memory: at most ``max_clients`` buckets, least recently seen dropped first. A dropped
bucket comes back full, which is the generous direction; a flood of distinct addresses is a
network-level problem and is met by the concurrency cap, not here.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable


class RateLimiter:
    def __init__(
        self,
        rate: float,
        burst: int,
        *,
        max_clients: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be positive and burst at least 1")
        self._rate = rate
        self._burst = float(burst)
        self._max = max_clients
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, last

    def acquire(self, client: str) -> float:
        """0.0 when the request may go ahead, else the seconds until a token is free."""
        now = self._clock()
        tokens, last = self._buckets.pop(client, (self._burst, now))
        tokens = min(self._burst, tokens + (now - last) * self._rate)
        wait = 0.0
        if tokens >= 1.0:
            tokens -= 1.0
        else:
            wait = (1.0 - tokens) / self._rate
        self._buckets[client] = (tokens, now)
        while len(self._buckets) > self._max:
            self._buckets.popitem(last=False)
        return wait
