"""The running service: its parts (built by ``bootstrap.service.compose``) and the state the
handlers and background tasks share: the current CAs, the listener's TLS, the join concurrency,
and the Kubernetes Events for refusals."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from aiohttp import web

from admission.decision.decider import Decider
from attest import ca
from bootstrap.config import Settings
from bootstrap.gate import Gate
from bootstrap.kube import Kube, KubeUnavailable
from bootstrap.problems import RateLimited, Unavailable
from bootstrap.service.admin.auth import AdminAuth
from bootstrap.service.disk.flow import DiskService
from bootstrap.service.http.ratelimit import RateLimiter
from bootstrap.service.join.flow import JoinService
from bootstrap.service.join.spirelink import SpireLink
from bootstrap.service.metrics import Metrics
from bootstrap.service.pki import authority, tls
from bootstrap.spire import SpireUnavailable
from bootstrap.store import NodeRecord, Store, StoreUnavailable

log = logging.getLogger("nodegate.server")

MAX_PENDING_EVENTS = 64


@dataclass(frozen=True, slots=True)
class BootCounts:
    """The fleet's boots as the metrics show them, counted from the store now and then
    (``background``): nodes per (pcr class, measured-boot class, chain, dbx), and nodes without
    a record."""

    groups: dict[tuple[str, str, str, str], int]
    without: int


@dataclass
class Service:
    settings: Settings
    store: Store
    cas_store: authority.CaStore
    join: JoinService
    admin: AdminAuth
    metrics: Metrics
    limiter: RateLimiter
    kube: Kube | None
    decider: Decider
    cas: ca.CaSet
    stamp: int = 0
    ready_checks: list[Callable[[], bool]] = field(default_factory=list)
    # Per client address on the admin routes (limits.admin_rate): a bearer token costs the cluster
    # a TokenReview, so these are bounded like the joins (issue 33, finding 3).
    admin_limiter: RateLimiter = field(default_factory=lambda: RateLimiter(5.0, 20))
    tls: ssl.SSLContext | None = None
    gate: Gate | None = None  # the hold gate, when a cluster is configured and gate.enabled
    spire: SpireLink | None = None  # bans and the x509pop bundle for SPIRE (docs/spire.md)
    disk: DiskService | None = None  # disk-key releases (docs/disk-keys.md); refuses all without disk_keys
    boots: BootCounts | None = None  # None until the store was first counted
    tls_stamp: tuple[int, ...] = ()  # of tls.cert_file + tls.key_file as last loaded
    server_refresh_at: datetime | None = None
    _events: set[asyncio.Task[None]] = field(default_factory=set)
    _inflight: int = 0

    def authorities(self) -> ca.CaSet:
        return self.cas

    def reload_ca(self, *, force: bool = False) -> bool:
        """Pick up a rotation made by another replica or ``nodegate ca rotate``."""
        stamp = self.cas_store.stamp()
        if stamp == self.stamp and not force:
            return False
        self.cas = self.cas_store.load()
        self.stamp = stamp
        self.metrics.bundle_sequence.set(self.cas.bundle_sequence(datetime.now(UTC)))
        if self.tls is not None:
            tls.trust(self.tls, self.cas, datetime.now(UTC))
            self.refresh_server_certificate(force=True)
        log.info("CA reloaded", extra={"code": f"sequence {self.cas.sequence}"})
        return True

    def refresh_server_certificate(self, *, force: bool = False) -> bool:
        """The self-issued TLS certificate (no ``tls.cert_file``): reissued when it nears expiry
        or its issuer nears retirement, checked on every reload tick, not only at start."""
        if self.tls is None or self.settings.tls.cert_file is not None:
            return False
        now = datetime.now(UTC)
        if not force and self.server_refresh_at is not None and now < self.server_refresh_at:
            return False
        self.server_refresh_at = tls.load_self_issued(self.tls, self.settings, self.cas, now)
        return True

    def reload_tls_files(self) -> bool:
        """Pick up a renewed ``tls.cert_file`` / ``tls.key_file`` (cert-manager rewrites the
        mounted Secret): new handshakes use it, open connections keep theirs."""
        cert, key = self.settings.tls.cert_file, self.settings.tls.key_file
        if self.tls is None or cert is None or key is None:
            return False
        stamp = tls.reload_pair(self.tls, cert, key, self.tls_stamp)
        if stamp is None:
            return False
        self.tls_stamp = stamp
        log.info("TLS certificate reloaded", extra={"listen": self.settings.listen})
        return True

    @contextlib.asynccontextmanager
    async def join_slot(self, client: str) -> AsyncIterator[None]:
        """One join request in flight from ``client``, within the rate and concurrency limits."""
        wait = self.limiter.acquire(client)
        if wait > 0:
            raise RateLimited(
                f"too many join requests from {client}; retry in {wait:.1f} s", retry_after=wait
            )
        if self._inflight >= self.settings.limits.max_inflight:
            raise Unavailable("the service is at its concurrency limit", retry_after=1)
        self._inflight += 1
        self.metrics.inflight.inc()
        try:
            yield
        finally:
            self._inflight -= 1
            self.metrics.inflight.dec()

    def admin_rate(self, client: str) -> None:
        """One admin request from ``client``, within ``limits.admin_rate``; RateLimited if not."""
        wait = self.admin_limiter.acquire(client)
        if wait > 0:
            raise RateLimited(
                f"too many admin requests from {client}; retry in {wait:.1f} s", retry_after=wait
            )

    async def refused(self, node_name: str, code: str, detail: str, evidence: bool = False) -> None:
        """Audit a refusal (and a Kubernetes Event). A refusal of the node's evidence is stored
        against its record and its SPIRE agents are banned before the node hears of it: a SPIRE
        that cannot be reached is logged and the pass bans them (the store says so); a store that
        cannot record it answers 503, so nothing about the refusal is lost (docs/spire.md)."""
        self.metrics.refusals.labels(code).inc()
        spire = self.spire if evidence and self.spire is not None and self.spire.admin is not None else None
        try:
            await self.store.record_refusal(node_name, code, detail[:500], evidence=evidence)
        except StoreUnavailable as exc:
            if spire is None:
                raise
            raise Unavailable(
                f"store: {exc}; the refusal ({code}) could not be recorded", retry_after=2
            ) from None
        if spire is not None:
            await self._spire_sync(spire, node_name, "refused")
        if self.kube is None:
            return
        if len(self._events) >= MAX_PENDING_EVENTS:
            self.metrics.events_dropped.inc()
            return
        task = asyncio.get_running_loop().create_task(self._event(node_name, code, detail))
        self._events.add(task)
        task.add_done_callback(self._events.discard)

    async def accepted(self, before: NodeRecord | None, after: NodeRecord, action: str) -> None:
        """A join or renewal was committed: SPIRE follows it (the agents of any other attestation
        banned, a ban on this one lifted) before the node gets its answer; a renewal that changed
        nothing SPIRE sees asks nothing. A SPIRE that cannot be reached leaves that to the pass
        (fail closed: a banned agent stays banned until then)."""
        spire = self.spire
        if spire is None or spire.admin is None:
            return
        if action == "renew" and spire.in_step(before, after, datetime.now(UTC)):
            return
        await self._spire_sync(spire, after.node_name, "accepted")

    async def spire_sync(self, node_name: str, why: str) -> None:
        """After a revoke, an unrevoke or a forget (admin routes)."""
        if self.spire is not None and self.spire.admin is not None:
            await self._spire_sync(self.spire, node_name, why)

    async def _spire_sync(self, spire: SpireLink, node_name: str, why: str) -> None:
        try:
            await spire.sync_node(self.store, node_name, datetime.now(UTC))
        except (SpireUnavailable, StoreUnavailable) as exc:
            what = "SPIRE server not reached" if isinstance(exc, SpireUnavailable) else "store not reached"
            log.warning(
                f"{what}; the next SPIRE pass brings the node's agents in line",
                extra={"node": node_name, "code": why, "error": str(exc)[:300]},
            )

    async def _event(self, node_name: str, code: str, detail: str) -> None:
        if self.kube is None:
            return
        try:
            await self.kube.create_event(
                involved={"apiVersion": "nodegate.io/v1alpha1", "kind": "NodeAttestation", "name": node_name},
                reason="AttestationFailed",
                message=f"{code}: {detail}"[:1024],
                namespace=self.settings.kubernetes.events_namespace,
            )
        except KubeUnavailable:
            self.metrics.events_dropped.inc()

    async def close(self) -> None:
        for task in list(self._events):
            task.cancel()
        await self.store.close()
        if self.kube is not None:
            await self.kube.close()


SERVICE = web.AppKey("service", Service)
