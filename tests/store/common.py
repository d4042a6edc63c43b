"""What the store tests share: attestations to commit, a clock, and a commit with defaults."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from attest.tpm import Counters
from bootstrap.store import Attestation, NodeRecord, Store

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
C0 = Counters(1, 0, 100)
EK_A = "a" * 64
EK_B = "b" * 64
SESSION_TTL = timedelta(seconds=60)

# the NodeAttestation resource on the emulated API (kmock), as the kubernetes store uses it
G, V, P = "nodegate.io", "v1alpha1", "nodeattestations"
RES = f"{G}/{V}/{P}"
PATH = f"/apis/{G}/{V}/{P}"


def make_att(
    node: str = "gpu-1",
    ek: str = EK_A,
    *,
    serial: str = "01",
    counters: Counters = C0,
    at: datetime = T0,
) -> Attestation:
    return Attestation(
        node_name=node,
        ek_sha256=ek,
        ak_public=b"\x00\x10ak-" + node.encode(),
        spiffe_id=f"spiffe://example.org/node/{node}",
        counters=counters,
        svid_serial=serial,
        attested_at=at,
        expires_at=at + timedelta(hours=1),
    )


def allow(_existing: NodeRecord | None) -> None:
    return None


class Ticker:
    """A store clock that moves one second per reading, from T0 (so sessions expiring at T0 + 60 s
    stay live for the first readings)."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now


async def commit(
    store: Store,
    att: Attestation,
    session: str,
    action: str = "join",
    check: Callable[[NodeRecord | None], None] = allow,
    exp: datetime | None = None,
) -> NodeRecord:
    """``store.commit`` with the session expiring ``exp`` (default: a minute after the attestation)."""
    return await store.commit(
        att,
        session_id=session,
        session_expires_at=att.attested_at + SESSION_TTL if exp is None else exp,
        action=action,
        check=check,
    )
