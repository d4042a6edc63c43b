"""How the gate paces retries: after API failures (exponential, capped, jittered) and before
re-reading after a 409 (short and random, so racing writers spread out)."""

from __future__ import annotations

import asyncio
import random

CONFLICT_ATTEMPTS = 6  # writes of one object before a run of 409s is given up (retried later)
MAX_BACKOFF = 30.0  # seconds


def failure_delay(failures: int) -> float:
    """Seconds to wait after ``failures`` failures in a row: doubling from 1 s, capped at
    MAX_BACKOFF, each drawn between half and all of that."""
    # The exponent is capped (the cap on the delay is reached long before) so that a day-long
    # outage cannot overflow the float and end the informer or the worker.
    return min(MAX_BACKOFF, 0.5 * 2.0 ** min(failures, 16)) * random.uniform(0.5, 1.0)  # noqa: S311


async def jitter(attempt: int) -> None:
    """A short random pause before re-reading after a 409, so racing writers spread out."""
    await asyncio.sleep(random.uniform(0, 0.02 * 2**attempt))  # noqa: S311
