"""Leader election on a coordination.k8s.io Lease: only the holder writes.

The holder renews every third of the lease duration and stops writing two thirds of the duration
after its last successful renewal, before any other replica can take an unrenewed lease over.
On shutdown it hands the lease back so another replica need not wait for it to expire.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from bootstrap.config import GateSettings
from bootstrap.gate.fields import dict_at
from bootstrap.kube import Conflict, Kube, KubeUnavailable, NotFound
from bootstrap.times import micro_time, parse_time

log = logging.getLogger("nodegate.gate")


class NotLeader(Exception):
    """Another replica holds the lease: the write was not made."""


class LeaseHeld(Exception):
    """``once()``: another gate holds the Lease and is reconciling already."""

    def __init__(self, holder: str) -> None:
        super().__init__(f"the gate is running as {holder!r} (it holds the lease); nothing was done")
        self.holder = holder


def identity() -> str:
    """This replica's Lease holder name: the pod (or host) name, the process and a random
    suffix, so two processes on one host never both believe they hold the lease."""
    base = os.environ.get("POD_NAME") or socket.gethostname() or "nodegate"
    return f"{base[:200]}_{os.getpid()}_{secrets.token_hex(4)}"


class Lease:
    """This replica's view of the Lease. Until ``elect`` or ``electing`` turns election on
    (one-shot use without a Lease), every write is allowed."""

    def __init__(
        self,
        kube: Kube,
        settings: GateSettings,
        *,
        now: Callable[[], datetime],
        identity: str,
        acquired: Callable[[], None],
    ) -> None:
        self._kube = kube
        self._settings = settings
        self._now = now
        self._identity = identity
        self._acquired = acquired  # called when this replica becomes the leader
        self.electing = False
        self._until: datetime | None = None  # writes stop here unless renewed
        self.holder = ""  # the other replica's identity when elect() last lost

    def is_leader(self) -> bool:
        """May this gate write now? Always without election; with it, only within the lease."""
        if not self.electing:
            return True
        return self._until is not None and self._now() < self._until

    def check(self) -> None:
        """Called right before every write: NotLeader when this gate may not write."""
        if not self.is_leader():
            raise NotLeader

    def drop(self) -> None:
        """Stop writing now (the lease may still name this replica)."""
        self._until = None

    def _spec(self, now: datetime, *, acquired: str, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self._identity,
            "leaseDurationSeconds": max(1, int(self._settings.lease_duration.total_seconds())),
            "acquireTime": acquired,
            "renewTime": micro_time(now),
            "leaseTransitions": transitions,
        }

    async def elect(self) -> bool:
        """Acquire or renew the Lease once; whether this gate may write afterwards. Writing stops
        at two thirds of the lease duration after the last successful renewal, before any other
        replica can take the lease over."""
        self.electing = True
        ns, name = self._settings.lease_namespace, self._settings.lease_name
        now = self._now()
        was = self.is_leader()
        try:
            lease = await self._kube.get_lease(ns, name)
            if lease is None:
                body = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": name, "namespace": ns},
                    "spec": self._spec(now, acquired=micro_time(now), transitions=0),
                }
                await self._kube.create_lease(ns, body)
            else:
                spec = dict_at(lease, "spec")
                holder = spec.get("holderIdentity") or ""
                renewed = parse_time(spec.get("renewTime"))
                duration = spec.get("leaseDurationSeconds")
                expired = (
                    renewed is None
                    or not isinstance(duration, int)
                    or renewed + timedelta(seconds=duration) <= now
                )
                if holder != self._identity and holder and not expired:
                    self._until = None
                    self.holder = str(holder)[:256]
                    if was:
                        log.warning("lost the lease %s/%s to %s: writes stop", ns, name, holder)
                    return False
                ours = holder == self._identity
                transitions = spec.get("leaseTransitions")
                count = transitions if isinstance(transitions, int) else 0
                new_spec = self._spec(
                    now,
                    acquired=str(spec.get("acquireTime"))
                    if ours and spec.get("acquireTime")
                    else micro_time(now),
                    transitions=count if ours else count + 1,
                )
                await self._kube.replace_lease(ns, name, {**lease, "spec": new_spec})
        except (Conflict, NotFound):
            self._until = None  # someone else wrote (or deleted) it first
            return False
        except KubeUnavailable as exc:
            log.warning("lease %s/%s not renewed: %s", ns, name, exc)
            return self.is_leader()  # keeps writing until the renew deadline passes
        # Whether writing had stopped by now: not only before this call (a new leader), also
        # during it (a renewal that answered after the deadline). Nodes dropped or left half
        # written meanwhile (NotLeader) are decided again: every node is queued.
        lapsed = not self.is_leader()
        self._until = now + self._settings.lease_duration * 2 / 3
        if not was:
            log.info("acquired the lease %s/%s as %s", ns, name, self._identity)
        elif lapsed:
            log.warning("lease %s/%s renewed after its deadline: writes resume", ns, name)
        if lapsed:
            self._acquired()
        return True

    async def release(self) -> None:
        """Give the Lease up (on shutdown) so another replica need not wait for it to expire.
        Best effort: a failure only means the others wait out the duration."""
        if not self.is_leader():
            return
        self._until = None  # no write from here on
        ns, name = self._settings.lease_namespace, self._settings.lease_name
        try:
            lease = await self._kube.get_lease(ns, name)
            spec = dict_at(lease or {}, "spec")
            if lease is None or spec.get("holderIdentity") != self._identity:
                return
            spec = {
                **spec,
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "renewTime": micro_time(self._now()),
            }
            await self._kube.replace_lease(ns, name, {**lease, "spec": spec})
        except (KubeUnavailable, Conflict, NotFound) as exc:
            log.info("lease %s/%s not released: %s", ns, name, exc)

    async def keep(self, *, delay_first: bool = False) -> None:
        """Forever: elect every third of the lease duration (``delay_first``: just elected)."""
        period = self._settings.lease_duration.total_seconds() / 3
        if delay_first:
            await asyncio.sleep(period)
        while True:
            try:
                await self.elect()
            except Exception:  # elect() handles API failures; this is a bug: keep electing
                self._until = None
                log.exception("lease: unexpected error")
            await asyncio.sleep(period)
