"""The composition root: ``build_service`` wires the parts from the config, ``make_app`` puts the
join API's routes and the middleware around them, ``make_admission_app`` the webhooks' (their own
listener), ``tls_context`` gives the listeners their TLS."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from admission.decision import decisioncache
from admission.decision.decider import Decider, LocalRbac, StaticPolicies
from admission.hold.mutate import CrMutator
from admission.webhook import MAX_REVIEW_BYTES
from attest import ca
from bootstrap.config import Settings
from bootstrap.gate import Gate
from bootstrap.kube import Kube
from bootstrap.logs.audit import AuditLog
from bootstrap.protocol import DISK_FINISH_PATH, DISK_START_PATH
from bootstrap.service import background, fleetmetrics
from bootstrap.service.admin.auth import AdminAuth
from bootstrap.service.admin.bearer import TokenChecks
from bootstrap.service.disk import secret as disksecret
from bootstrap.service.disk.flow import DiskService
from bootstrap.service.http.middleware import problems
from bootstrap.service.http.plumbing import PLUMBING
from bootstrap.service.http.ratelimit import RateLimiter
from bootstrap.service.join import sessions, spirelink
from bootstrap.service.join.flow import JoinService, load_ek_trust
from bootstrap.service.metrics import Metrics
from bootstrap.service.pki import authority, startup, tls
from bootstrap.service.routes import admin as adminroutes
from bootstrap.service.routes import disk as diskroutes
from bootstrap.service.routes import join as joinroutes
from bootstrap.service.routes import public as publicroutes
from bootstrap.service.state import SERVICE, Service
from bootstrap.service.webhook import app as webhookapp
from bootstrap.service.webhook.authz import SarAuthorizer
from bootstrap.service.webhook.decisions import CountingDecider
from bootstrap.service.webhook.policyload import load_policies, load_rbac
from bootstrap.service.webhook.policywatch import NO_POLICY_SOURCE, PolicyWatcher
from bootstrap.service.webhook.selectorwatch import SelectorWatcher
from bootstrap.store import NodeRecord, open_store

log = logging.getLogger("nodegate.server")


class _NoPolicies:
    """No PackagePolicy source: the webhook denies every package CR and says why (fail closed)."""

    why_none = NO_POLICY_SOURCE

    def policies(self) -> None:
        return None


async def build_service(
    settings: Settings, *, kube: Kube | bool | None = True, new_ca: bool = False
) -> Service:
    """``kube=True``: from the config (kubeconfig, else in-cluster, else none); a Kube or None
    overrides (tests). The CA is created or loaded only once the store is open: they must agree
    (``startup.load_ca``; ``new_ca`` starts a new CA on purpose)."""
    if kube is True:
        kube = await Kube.from_settings(settings.kubernetes)
    elif kube is False:
        kube = None
    if kube is not None and not isinstance(kube, Kube):
        raise TypeError("kube must be a Kube, None, True or False")
    # Everything read from files comes first: a bad policy file stops the start before anything
    # is written to state_dir (docs/troubleshooting.md, "The service does not start").
    metrics = Metrics()
    ek_trust = load_ek_trust(settings)
    decider, ready = _decider(settings, kube)
    decider.counter = metrics.webhook_decisions
    state = settings.state_dir
    state.mkdir(mode=0o700, parents=True, exist_ok=True)
    now = datetime.now(UTC)
    cas_store = authority.CaStore(state / "ca", settings.trust_domain)
    if settings.store == "sqlite":
        startup.check_sqlite_present(state)
    store = await open_store(
        settings.store, state_dir=state, kube=kube, namespace=settings.kubernetes.namespace
    )
    try:
        if settings.store == "sqlite":
            startup.mark_sqlite_store(state, now)
        cas = await startup.load_ca(cas_store, store, new_ca=new_ca, now=now)
        sealer = sessions.Sealer(sessions.load_keys(state))
        vault = await disksecret.open_vault(settings, kube, now)
    except BaseException:
        await store.close()
        raise
    holder: dict[str, Service] = {}

    def current() -> ca.CaSet:
        return holder["s"].cas

    async def refused(node: str, code: str, detail: str, evidence: bool = False) -> None:
        await holder["s"].refused(node, code, detail, evidence)

    async def accepted(before: NodeRecord | None, after: NodeRecord, action: str) -> None:
        await holder["s"].accepted(before, after, action)

    metrics.ek_roots_skipped.set(len(ek_trust.skipped))  # skipping a root never widens trust
    join = JoinService(
        settings,
        store=store,
        sealer=sealer,
        authorities=current,
        ek_trust=ek_trust,
        kube=kube,
        on_refusal=refused,
        on_accepted=accepted,
    )
    admin = AdminAuth(
        trust_domain=settings.trust_domain,
        spiffe_ids=settings.admin.spiffe_ids,
        authorities=current,
        tokens=TokenChecks(kube, budget=settings.limits.admin_reviews) if kube is not None else None,
    )
    service = Service(
        settings=settings,
        store=store,
        cas_store=cas_store,
        join=join,
        admin=admin,
        metrics=metrics,
        limiter=RateLimiter(settings.limits.join_rate, settings.limits.join_burst),
        admin_limiter=RateLimiter(settings.limits.admin_rate, settings.limits.admin_burst),
        kube=kube,
        decider=decider,
        cas=cas,
        stamp=cas_store.stamp(),
        ready_checks=ready,
    )
    if kube is not None and settings.gate.enabled:
        if settings.store != "kubernetes":
            log.warning(
                "gate: store is sqlite, so no NodeAttestation is published and the gate holds every "
                "node as unattested; use store: kubernetes with a cluster (docs/gate.md)"
            )
        service.gate = Gate.for_settings(kube, settings)
        service.gate.on_release = metrics.release_seconds.observe
    service.disk = DiskService(
        settings,
        store=store,
        sealer=sealer,
        vault=vault,
        count=lambda cls, code: metrics.disk_releases.labels(cls, code).inc(),
        # Never as a refusal of the node's evidence (docs/spire.md): anyone who knows a node's name
        # and EK public area can start a release and send a bad quote, so none bans its agents.
        on_refusal=refused,  # called without ``evidence``: False
    )
    service.spire = spirelink.build(settings)
    if service.spire is not None:
        service.spire.sync_bundle(cas, now)
    holder["s"] = service
    fleetmetrics.register(service)
    metrics.bundle_sequence.set(cas.bundle_sequence(now))
    return service


def _decider(settings: Settings, kube: Kube | None) -> tuple[CountingDecider, list[Callable[[], bool]]]:
    adm = settings.admission
    owner = adm.owner
    source: Any
    authorizer: Any
    ready: list[Callable[[], bool]] = []
    if adm.policy_files is not None:
        source = StaticPolicies(load_policies(adm.policy_files))
    elif kube is not None:
        source = PolicyWatcher(kube)
        ready.append(lambda: source.ready)
    else:
        source = _NoPolicies()
        log.warning(NO_POLICY_SOURCE)
    if adm.rbac_files is not None:
        authorizer = LocalRbac(load_rbac(adm.rbac_files))
    elif kube is not None:
        authorizer = SarAuthorizer(kube)
    else:
        authorizer = LocalRbac(load_rbac([]))
    decider = CountingDecider(source, authorizer, owner, settings.gate.taint_key)
    # Which package CRs select a node (a node's own label changes); no cluster: never known.
    decider.selector_source = SelectorWatcher(kube) if kube is not None else None
    decider.operators = frozenset(adm.operator_users)
    return decider, ready


def make_app(service: Service) -> web.Application:
    # auto_decompress off: bodies are taken as sent, and any Content-Encoding is refused before a
    # byte is read (bodies.py), so a bad or unknown encoding never reaches a decoder.
    app = web.Application(
        client_max_size=MAX_REVIEW_BYTES, middlewares=[problems], handler_args={"auto_decompress": False}
    )
    app[SERVICE] = service
    app[PLUMBING] = service  # the same, as the middleware and input readers see it
    r = app.router
    r.add_post("/v1/join/start", joinroutes.join_start, name="join_start")
    r.add_post("/v1/join/finish", joinroutes.join_finish, name="join_finish")
    r.add_post("/v1/nodes/self/renew", joinroutes.renew, name="renew")
    r.add_post(DISK_START_PATH, diskroutes.disk_start, name="disk_start")
    r.add_post(DISK_FINISH_PATH, diskroutes.disk_finish, name="disk_finish")
    r.add_get("/v1/bundle", publicroutes.bundle, name="bundle")
    r.add_get("/v1/admin/nodes", adminroutes.admin_list, name="admin_list")
    r.add_post("/v1/admin/nodes/{name}/revoke", adminroutes.admin_revoke, name="admin_revoke")
    r.add_get("/v1/admin/nodes/{name}", adminroutes.admin_show, name="admin_show")
    r.add_post("/v1/admin/nodes/{name}/forget", adminroutes.admin_forget, name="admin_forget")
    r.add_post("/v1/admin/nodes/{name}/quarantine", adminroutes.admin_quarantine, name="admin_quarantine")
    r.add_post("/v1/admin/ca/rotate", adminroutes.admin_rotate, name="admin_rotate")
    r.add_get("/healthz", publicroutes.healthz, name="healthz")
    r.add_get("/readyz", publicroutes.readyz, name="readyz")
    r.add_get("/metrics", adminroutes.metrics, name="metrics")
    app.on_startup.append(background.start)
    app.on_cleanup.append(background.stop)
    return app


def make_admission_app(service: Service) -> webhookapp.ReviewApp:
    """The webhooks on their own listener (``admission.listen``): apart from the join API, with
    their own in-flight limit (``admission.max_inflight`` per route)."""
    return admission_app(service.settings, service.decider, service.metrics)


def admission_app(settings: Settings, decider: Decider, metrics: Metrics | None) -> webhookapp.ReviewApp:
    """The webhook app as ``serve`` runs it (the admission benchmark builds it here too): with a
    decision cache when the authorizer's answers cannot change unseen (docs/admission.md)."""
    mutator = CrMutator(settings.gate.taint_key, settings.nodewright.inject_tolerations)
    limits = webhookapp.WebhookLimits(max_inflight=settings.admission.max_inflight)
    return webhookapp.make_app(
        decider,
        mutator,
        limits=limits,
        metrics=metrics,
        cache=decisioncache.for_decider(decider.compiled_policies, decider.authorizer),
        on_cached=decider.count if isinstance(decider, CountingDecider) else None,
        allowed_level=logging.DEBUG if settings.admission.log_allowed == "debug" else logging.INFO,
        audit=AuditLog(),
    )


def tls_context(service: Service) -> ssl.SSLContext:
    """TLS 1.2+, the configured or self-issued certificate, and optional client certificates
    checked against the trust bundle (node SVIDs for renewal, admin SVIDs). The service keeps it
    to reload the trust bundle and the certificate."""
    files = service.settings.tls
    ctx = tls.listener_context(service.cas, datetime.now(UTC))
    service.tls = ctx
    if files.cert_file is not None and files.key_file is not None:
        ctx.load_cert_chain(files.cert_file, files.key_file)  # raises: a bad pair stops the start
        service.tls_stamp = tls.pair_stamp(files.cert_file, files.key_file)
    else:
        service.refresh_server_certificate(force=True)
    return ctx
