"""EK claims: one EK, one node name, across replicas.

The reverse lookup (this EK bound to another name) is a label-selector list, which is not a lock,
so a commit first *claims* the EK with a Lease named ``ek-<sha256>`` in nodegate's namespace,
holder = the node name. A create is atomic (409 for the second), so of two names racing with one
EK only one holds the claim. A claim whose holder has no record with that EK (a crash between
claim and write, or a forgotten node) is taken over, but only after ``CLAIM_STALE`` (far longer
than a commit can take), so a claim in progress is never stolen. ``forget`` deletes the claim.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, Final

from bootstrap.kube import Conflict, Kube, NotFound
from bootstrap.problems import NodeNameConflict
from bootstrap.store.kube.objects import Corrupt, exhausted, field, optional_time, read
from bootstrap.times import micro_time

__all__ = ["CLAIM_LABEL", "CLAIM_PREFIX", "CLAIM_STALE", "EkClaims"]

log = logging.getLogger("nodegate.store")

CLAIM_PREFIX: Final = "ek-"
CLAIM_LABEL: Final = "nodegate.io/claim"
CLAIM_STALE: Final = timedelta(minutes=10)


def _acquired(value: object) -> datetime | None:
    """A claim's acquireTime; an unreadable one counts as stale (a claim must not block forever)."""
    try:
        return optional_time(value, "acquireTime")
    except Corrupt:
        return None


class EkClaims:
    """The EK claim Leases in ``namespace``; ``pause(attempt)`` paces retries after a conflict."""

    def __init__(
        self,
        kube: Kube,
        *,
        namespace: str,
        clock: Callable[[], datetime],
        attempts: int,
        pause: Callable[[int], Awaitable[None]],
    ) -> None:
        self._kube = kube
        self._namespace = namespace
        self._clock = clock
        self._attempts = attempts
        self._pause = pause

    async def claim(self, ek: str, node_name: str) -> None:
        """Hold the EK's claim for ``node_name``, or raise NodeNameConflict. Idempotent for the
        holder."""
        ns, name = self._namespace, f"{CLAIM_PREFIX}{ek}"
        for attempt in range(self._attempts):
            now = self._clock()
            claim: dict[str, Any] = {"holderIdentity": node_name, "acquireTime": micro_time(now)}
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": name, "namespace": ns, "labels": {CLAIM_LABEL: "ek"}},
                "spec": claim,
            }
            try:
                await self._kube.create_lease(ns, body)
            except Conflict:
                pass  # it exists: whose is it?
            else:
                return
            lease = await self._kube.get_lease(ns, name)
            if lease is None:
                continue  # deleted since: create again
            spec = field(lease, "spec")
            holder = str(spec.get("holderIdentity") or "")
            if holder == node_name:
                return
            other = await read(self._kube, holder) if holder else None
            if other is not None and other.record is not None and other.record.ek_sha256 == ek:
                raise NodeNameConflict(f"this TPM is bound to another node name ({holder})")
            acquired = _acquired(spec.get("acquireTime"))
            if acquired is not None and now - acquired < CLAIM_STALE:
                raise NodeNameConflict(
                    f"another node name ({holder}) is joining with this TPM right now; retry later"
                )
            # Stale: its holder never committed (or was forgotten). Take it over, guarded by rv.
            taken = {**lease, "spec": {**spec, **claim}}  # metadata as read: its resourceVersion guards
            try:
                await self._kube.replace_lease(ns, name, taken)
            except (Conflict, NotFound):
                await self._pause(attempt)
                continue
            log.info("EK claim %s taken over from %s by %s", ek[:16], holder or "nobody", node_name)
            return
        raise exhausted(name, self._attempts)

    async def release(self, ek: str, node_name: str) -> None:
        """Delete the claim if ``node_name`` holds it (the TPM may then join under another name)."""
        ns, name = self._namespace, f"{CLAIM_PREFIX}{ek}"
        lease = await self._kube.get_lease(ns, name)
        if lease is None or field(lease, "spec").get("holderIdentity") != node_name:
            return
        await self._kube.delete_lease(ns, name)
