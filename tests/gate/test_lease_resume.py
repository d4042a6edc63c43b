"""bootstrap/gate/lease.py: a renewal that answers after the write deadline (a loaded API server)
re-queues every node: nodes dropped or left half written while writes had stopped are decided
again, not lost."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

from bootstrap.config import GateSettings
from bootstrap.gate.lease import Lease
from bootstrap.kube import Kube

T0 = datetime(2026, 3, 1, 12, tzinfo=UTC)


class SlowLeaseApi:
    """Holds the Lease; each GET answers ``delay`` later on the test's clock."""

    def __init__(self, clock: list[datetime]) -> None:
        self.clock = clock
        self.delay = timedelta(0)
        self.lease: dict[str, Any] | None = None

    async def get_lease(self, _ns: str, _name: str) -> dict[str, Any] | None:
        self.clock[0] += self.delay
        return self.lease

    async def create_lease(self, _ns: str, body: dict[str, Any]) -> dict[str, Any]:
        self.lease = body
        return body

    async def replace_lease(self, _ns: str, _name: str, body: dict[str, Any]) -> dict[str, Any]:
        self.lease = body
        return body


async def test_a_renewal_answered_after_the_deadline_requeues_every_node() -> None:
    clock = [T0]
    api = SlowLeaseApi(clock)
    acquired: list[datetime] = []
    lease = Lease(
        cast(Kube, api),
        GateSettings(),
        now=lambda: clock[0],
        identity="gate-a",
        acquired=lambda: acquired.append(clock[0]),
    )
    assert await lease.elect()
    assert len(acquired) == 1  # a new leader decides everything
    clock[0] += timedelta(seconds=5)
    assert await lease.elect()
    assert len(acquired) == 1  # an ordinary renewal: nothing to do again
    # The next renewal starts in time but is answered 6 s later, past the deadline (10 s after
    # the last renewal): writes stopped meanwhile, so every node is queued again once it succeeds.
    clock[0] += timedelta(seconds=5)
    api.delay = timedelta(seconds=6)
    assert await lease.elect()
    assert len(acquired) == 2
    assert lease.is_leader()
