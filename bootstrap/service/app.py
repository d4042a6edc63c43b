"""The nodegate service: app factory, TLS, middlewares, routes (DESIGN.md "Join protocol").

``build_service`` wires the parts from the config; ``make_app`` puts HTTP around them; ``serve``
runs it on TLS (or, with the dev flag, plaintext on loopback only). One middleware turns every
failure into ``application/problem+json`` with a machine code; nothing reaches the client as a
500 or a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web
from cryptography import x509

from admission.webhook import MAX_REVIEW_BYTES, Decider, LocalRbac, StaticPolicies, make_handler
from attest import ca, svid
from attest.errors import AttestationError, MalformedInput
from bootstrap.config import Settings, host_port
from bootstrap.gate import Gate
from bootstrap.kube import Kube, KubeUnavailable
from bootstrap.names import is_loopback, is_node_name
from bootstrap.problems import (
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    ServiceError,
    Unavailable,
    UnsupportedMediaType,
    attestation_status,
)
from bootstrap.protocol import (
    FinishRequest,
    RenewFinishRequest,
    RenewStartRequest,
    RevokeRequest,
    StartRequest,
    parse_request,
)
from bootstrap.service import authority, sessions
from bootstrap.service.admin import AdminAuth
from bootstrap.service.authz import SarAuthorizer
from bootstrap.service.join import JoinService, load_ek_trust
from bootstrap.service.metrics import Metrics
from bootstrap.service.ratelimit import RateLimiter
from bootstrap.store import NodeRecord, Store, StoreUnavailable, open_store
from bootstrap.times import rfc3339

log = logging.getLogger("nodegate.server")

RELOAD_SECONDS = 2.0
PRUNE_SECONDS = 60.0
MAX_PENDING_EVENTS = 64
_JOIN_ENDPOINTS = frozenset({"join_start", "join_finish", "renew"})


class _NoPolicies:
    """No PackagePolicy source: the webhook denies every package CR and says why (fail closed)."""

    def policies(self) -> None:
        return None


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
    tls: ssl.SSLContext | None = None
    gate: Gate | None = None  # the hold gate, when a cluster is configured and gate.enabled
    _tls_stamp: tuple[int, ...] = ()
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
            # Adds the new roots for client certificates; retired ones are refused by verify_svid.
            self.tls.load_verify_locations(cadata=svid.bundle_pem(self.cas.roots(datetime.now(UTC))).decode())
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
        cert = authority.server_certificate(
            self.settings.state_dir / "tls", self.cas, self.settings.server_names, now
        )
        self.tls.load_cert_chain(cert.cert_file, cert.key_file)
        self.server_refresh_at = cert.refresh_at
        return True

    def reload_tls_files(self) -> bool:
        """Pick up a renewed ``tls.cert_file`` / ``tls.key_file`` (cert-manager rewrites the
        mounted Secret): new handshakes use it, open connections keep theirs. A pair that does
        not load (caught mid-update) keeps the old one and is tried again on the next tick."""
        cert, key = self.settings.tls.cert_file, self.settings.tls.key_file
        if self.tls is None or cert is None or key is None:
            return False
        stamp = _file_stamp(cert) + _file_stamp(key)
        if stamp == self._tls_stamp:
            return False
        try:
            self.tls.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            log.warning("TLS certificate not reloaded", extra={"error": str(exc)[:300]})
            return False
        self._tls_stamp = stamp
        log.info("TLS certificate reloaded", extra={"listen": self.settings.listen})
        return True

    async def refused(self, node_name: str, code: str, detail: str) -> None:
        await self.store.record_refusal(node_name, code, detail[:500])
        if self.kube is None:
            return
        if len(self._events) >= MAX_PENDING_EVENTS:
            self.metrics.events_dropped.inc()
            return
        task = asyncio.get_running_loop().create_task(self._event(node_name, code, detail))
        self._events.add(task)
        task.add_done_callback(self._events.discard)

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


async def build_service(settings: Settings, *, kube: Kube | bool | None = True) -> Service:
    """``kube=True``: from the config (kubeconfig, else in-cluster, else none); a Kube or None
    overrides (tests)."""
    if kube is True:
        kube = await Kube.from_settings(settings.kubernetes)
    elif kube is False:
        kube = None
    if kube is not None and not isinstance(kube, Kube):
        raise TypeError("kube must be a Kube, None, True or False")
    state = settings.state_dir
    state.mkdir(mode=0o700, parents=True, exist_ok=True)
    now = datetime.now(UTC)
    cas_store = authority.CaStore(state / "ca", settings.trust_domain)
    cas = cas_store.load_or_create(now)
    store = await open_store(
        settings.store, state_dir=state, kube=kube, namespace=settings.kubernetes.namespace
    )
    sealer = sessions.Sealer(sessions.load_keys(state))
    metrics = Metrics()
    holder: dict[str, Service] = {}

    def current() -> ca.CaSet:
        return holder["s"].cas

    async def refused(node: str, code: str, detail: str) -> None:
        await holder["s"].refused(node, code, detail)

    join = JoinService(
        settings,
        store=store,
        sealer=sealer,
        authorities=current,
        ek_trust=load_ek_trust(settings),
        kube=kube,
        on_refusal=refused,
    )
    admin = AdminAuth(
        trust_domain=settings.trust_domain,
        spiffe_ids=settings.admin.spiffe_ids,
        authorities=current,
        kube=kube,
    )
    decider, ready = _decider(settings, kube)
    service = Service(
        settings=settings,
        store=store,
        cas_store=cas_store,
        join=join,
        admin=admin,
        metrics=metrics,
        limiter=RateLimiter(settings.limits.join_rate, settings.limits.join_burst),
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
    holder["s"] = service
    metrics.bundle_sequence.set(cas.bundle_sequence(now))
    return service


def _decider(settings: Settings, kube: Kube | None) -> tuple[Decider, list[Callable[[], bool]]]:
    from bootstrap.service import policyfiles as policytool  # noqa: PLC0415  (YAML loading helpers shared with the CLI)

    adm = settings.admission
    owner = adm.owner
    source: Any
    authorizer: Any
    ready: list[Callable[[], bool]] = []
    if adm.policy_files is not None:
        source = StaticPolicies(policytool.load_policies(adm.policy_files))
    elif kube is not None:
        from bootstrap.service.policywatch import PolicyWatcher  # noqa: PLC0415

        source = PolicyWatcher(kube)
        ready.append(lambda: source.ready)
    else:
        source = _NoPolicies()
    if adm.rbac_files is not None:
        authorizer = LocalRbac(policytool.load_rbac(adm.rbac_files))
    elif kube is not None:
        authorizer = SarAuthorizer(kube)
    else:
        authorizer = LocalRbac(policytool.load_rbac([]))
    return Decider(source, authorizer, owner, settings.gate.taint_key), ready


# ------------------------------------------------------------------------------------------
# HTTP


def problem(status: int, code: str, detail: str, *, retry_after: float | None = None) -> web.Response:
    title = _TITLES.get(status, "Error")
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail, "code": code}
    resp = web.json_response(body, status=status, content_type="application/problem+json")
    if retry_after is not None:
        resp.headers["Retry-After"] = str(max(1, int(retry_after + 0.999)))
    return resp


_TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    410: "Gone",
    413: "Payload Too Large",
    415: "Unsupported Media Type",
    429: "Too Many Requests",
    503: "Service Unavailable",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _endpoint(request: web.Request) -> str:
    route = request.match_info.route
    return route.name or "other" if route is not None else "other"


@web.middleware
async def problems(request: web.Request, handler: Handler) -> web.StreamResponse:
    service: Service = request.app[SERVICE]
    endpoint = _endpoint(request)
    started = time.perf_counter()
    code = "ok"
    try:
        resp = await handler(request)
    except AttestationError as exc:
        code = exc.code
        resp = problem(attestation_status(exc), exc.code, exc.detail, retry_after=_retry(exc))
    except ServiceError as exc:
        code = exc.code
        resp = problem(exc.status, exc.code, exc.detail, retry_after=exc.retry_after)
    except web.HTTPRequestEntityTooLarge:
        code = PayloadTooLarge.code
        resp = problem(
            413, code, f"request bodies are limited to {service.settings.limits.max_body_bytes} bytes"
        )
        resp.force_close()
    except web.HTTPMethodNotAllowed:
        code = MethodNotAllowed.code
        resp = problem(405, code, f"{request.method} is not allowed on {request.path}")
    except web.HTTPNotFound:
        code = NotFound.code
        resp = problem(404, code, f"no endpoint {request.path}")
    except web.HTTPException as exc:  # other routing answers (e.g. 400 from the parser)
        code = "malformed_request" if exc.status < 500 else "unavailable"
        resp = problem(exc.status if exc.status < 500 else 503, code, exc.reason)
    except asyncio.CancelledError:
        raise
    except Exception:  # a bug: never a 500 with a traceback; the log has it
        log.exception("unexpected error", extra={"endpoint": endpoint})
        code = "unavailable"
        resp = problem(503, code, "internal error; the request changed nothing, retry later", retry_after=5)
    if endpoint in _JOIN_ENDPOINTS or endpoint.startswith("admin"):
        service.metrics.requests.labels(endpoint, code).inc()
        service.metrics.latency.labels(endpoint).observe(time.perf_counter() - started)
    return resp


def _retry(exc: AttestationError) -> float | None:
    return getattr(exc, "retry_after", None)


async def read_json(request: web.Request) -> Any:
    limit = request.app[SERVICE].settings.limits.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=request.content_length)
    if request.content_type != "application/json":
        raise UnsupportedMediaType("send application/json")
    # The app's client_max_size is the webhook's (AdmissionReviews carry whole objects); the join
    # API keeps the protocol's 64 KiB, also for bodies without Content-Length.
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(16 * 1024):
        size += len(chunk)
        if size > limit:
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=size)
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        return json.loads(raw, object_pairs_hook=_no_duplicates)
    except (ValueError, RecursionError) as exc:
        raise MalformedInput(f"body is not JSON: {str(exc)[:120]}") from None


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("duplicate key in a JSON object")
    return out


def _peer(request: web.Request) -> x509.Certificate | None:
    obj = request.transport.get_extra_info("ssl_object") if request.transport is not None else None
    if obj is None:
        return None
    der = obj.getpeercert(binary_form=True)
    return x509.load_der_x509_certificate(der) if der else None


def _client(request: web.Request) -> str:
    peer = request.transport.get_extra_info("peername") if request.transport is not None else None
    return str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"


def _json(model: Any, status: int = 200) -> web.Response:
    return web.Response(body=model.model_dump_json().encode(), status=status, content_type="application/json")


@contextlib.asynccontextmanager
async def _join_slot(request: web.Request) -> AsyncIterator[None]:
    service: Service = request.app[SERVICE]
    wait = service.limiter.acquire(_client(request))
    if wait > 0:
        err = RateLimited(f"too many join requests from {_client(request)}; retry in {wait:.1f} s")
        err.retry_after = wait  # type: ignore[attr-defined]
        raise err
    if service._inflight >= service.settings.limits.max_inflight:
        raise Unavailable("the service is at its concurrency limit", retry_after=1)
    service._inflight += 1
    service.metrics.inflight.inc()
    try:
        yield
    finally:
        service._inflight -= 1
        service.metrics.inflight.dec()


async def join_start(request: web.Request) -> web.StreamResponse:
    async with _join_slot(request):
        req = parse_request(StartRequest, await read_json(request))
        return _json(await request.app[SERVICE].join.start(req))


async def join_finish(request: web.Request) -> web.StreamResponse:
    async with _join_slot(request):
        req = parse_request(FinishRequest, await read_json(request))
        return _json(await request.app[SERVICE].join.finish(req))


async def renew(request: web.Request) -> web.StreamResponse:
    async with _join_slot(request):
        body = await read_json(request)
        join = request.app[SERVICE].join
        if isinstance(body, dict) and "session" in body:
            return _json(await join.renew_finish(_peer(request), parse_request(RenewFinishRequest, body)))
        return _json(await join.renew_start(_peer(request), parse_request(RenewStartRequest, body)))


async def bundle(request: web.Request) -> web.StreamResponse:
    service: Service = request.app[SERVICE]
    service.reload_ca()
    now = datetime.now(UTC)
    roots = service.cas.roots(now)
    fmt = request.query.get("format", "jwks")
    if fmt == "pem":
        return web.Response(body=svid.bundle_pem(roots), content_type="application/x-pem-file")
    if fmt != "jwks":
        raise MalformedInput("format is jwks (default) or pem")
    doc = svid.bundle_document(
        roots,
        sequence=service.cas.bundle_sequence(now),
        refresh_hint=max(60, int(service.settings.svid_ttl.total_seconds() // 6)),
    )
    return web.json_response(doc)


async def healthz(_request: web.Request) -> web.StreamResponse:
    return web.Response(text="ok\n")


async def readyz(request: web.Request) -> web.StreamResponse:
    service: Service = request.app[SERVICE]
    waiting = [i for i, check in enumerate(service.ready_checks) if not check()]
    if waiting:
        return web.Response(status=503, text="PackagePolicies not loaded\n")
    try:
        await service.store.get("readyz.nodegate.io")
    except StoreUnavailable as exc:
        log.warning("readyz: store unavailable", extra={"error": str(exc)[:300]})
        return web.Response(status=503, text="store unavailable\n")
    return web.Response(text="ok\n")


async def metrics(request: web.Request) -> web.StreamResponse:
    await _admin(request, "metrics")
    return web.Response(
        body=request.app[SERVICE].metrics.render(), content_type="text/plain", charset="utf-8"
    )


def _record_json(r: NodeRecord) -> dict[str, Any]:
    return {
        "node_name": r.node_name,
        "ek_sha256": r.ek_sha256,
        "spiffe_id": r.spiffe_id,
        "attested_at": rfc3339(r.attested_at) if r.attested_at else None,
        "expires_at": rfc3339(r.expires_at) if r.expires_at else None,
        "revoked": r.revoked,
        "counters": list(r.counters) if r.counters else None,
        "svid_serials": list(r.svid_serials),
    }


async def _admin(request: web.Request, permission: str, name: str = "") -> str:
    service: Service = request.app[SERVICE]
    caller = await service.admin.authorize(
        permission, peer=_peer(request), authorization=request.headers.get("Authorization"), name=name
    )
    if permission != "metrics":  # scrapes every few seconds would drown the audit-worthy lines
        log.info("admin %s", permission, extra={"actor": caller.actor, "node": name or None})
    return caller.actor


async def admin_list(request: web.Request) -> web.StreamResponse:
    await _admin(request, "list")
    try:
        nodes = await request.app[SERVICE].store.list_nodes()
    except StoreUnavailable as exc:
        raise Unavailable(f"store: {exc}", retry_after=2) from None
    return web.json_response({"nodes": [_record_json(r) for r in sorted(nodes, key=lambda r: r.node_name)]})


async def admin_revoke(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    if not is_node_name(name):
        raise MalformedInput("not a node name")
    actor = await _admin(request, "revoke", name)
    req = parse_request(RevokeRequest, await read_json(request))
    try:
        record = await request.app[SERVICE].store.revoke(
            name, actor=actor, reason=req.reason, revoked=req.revoked
        )
    except KeyError:
        raise NotFound(f"no node {name}") from None
    except StoreUnavailable as exc:
        raise Unavailable(f"store: {exc}", retry_after=2) from None
    return web.json_response(_record_json(record))


async def admin_rotate(request: web.Request) -> web.StreamResponse:
    actor = await _admin(request, "rotate")
    service: Service = request.app[SERVICE]
    now = datetime.now(UTC)
    try:
        rotated = await asyncio.to_thread(service.cas_store.rotate, now, service.settings.ca_grace)
    except authority.CaUnavailable as exc:
        raise Unavailable(str(exc), retry_after=5) from None
    except OSError as exc:  # e.g. ca/ is a read-only Secret mount (the Helm chart): rotate offline
        raise Unavailable(
            f"the CA folder cannot be written ({exc.strerror}); rotate where the CA is stored "
            "(the Helm chart: see its README) and the replicas pick it up",
            retry_after=60,
        ) from None
    service.reload_ca(force=True)
    log.warning("CA rotated", extra={"actor": actor})
    return web.json_response(
        {
            "sequence": rotated.bundle_sequence(now),
            "roots": len(rotated.roots(now)),
            "signer": rotated.signer.stem,
        }
    )


SERVICE = web.AppKey("service", Service)


def make_app(service: Service) -> web.Application:
    app = web.Application(client_max_size=MAX_REVIEW_BYTES, middlewares=[problems], handler_args={})
    app[SERVICE] = service
    r = app.router
    r.add_post("/v1/join/start", join_start, name="join_start")
    r.add_post("/v1/join/finish", join_finish, name="join_finish")
    r.add_post("/v1/nodes/self/renew", renew, name="renew")
    r.add_get("/v1/bundle", bundle, name="bundle")
    r.add_get("/v1/admin/nodes", admin_list, name="admin_list")
    r.add_post("/v1/admin/nodes/{name}/revoke", admin_revoke, name="admin_revoke")
    r.add_post("/v1/admin/ca/rotate", admin_rotate, name="admin_rotate")
    r.add_get("/healthz", healthz, name="healthz")
    r.add_get("/readyz", readyz, name="readyz")
    r.add_get("/metrics", metrics, name="metrics")
    r.add_post("/admission/validate", make_handler(service.decider), name="admission")
    app.on_startup.append(_start_background)
    app.on_cleanup.append(_stop_background)
    return app


_TASKS = web.AppKey("tasks", list)


async def _start_background(app: web.Application) -> None:
    service = app[SERVICE]
    tasks: list[asyncio.Task[None]] = [
        asyncio.get_running_loop().create_task(_every(RELOAD_SECONDS, lambda: _reload(service))),
        asyncio.get_running_loop().create_task(_every(PRUNE_SECONDS, lambda: _prune(service))),
    ]
    if service.gate is not None:
        # gate.run() never ends on API errors; only the leader of its Lease writes.
        tasks.append(asyncio.get_running_loop().create_task(service.gate.run(), name="gate"))
    source = service.decider.policy_source
    run = getattr(source, "run", None)
    if callable(run):
        tasks.append(asyncio.get_running_loop().create_task(run()))
    app[_TASKS] = tasks


async def _stop_background(app: web.Application) -> None:
    for task in app.get(_TASKS, []):
        task.cancel()
    for task in app.get(_TASKS, []):
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _every(seconds: float, step: Callable[[], Awaitable[None]]) -> None:
    while True:
        await asyncio.sleep(seconds)
        try:
            await step()
        except (StoreUnavailable, authority.CaUnavailable, OSError) as exc:
            log.warning("background step failed", extra={"error": str(exc)[:300]})


async def _reload(service: Service) -> None:
    service.reload_ca()
    service.reload_tls_files()
    service.refresh_server_certificate()


def _file_stamp(path: Path) -> tuple[int, int, int]:
    """What changes when a file is replaced or rewritten (a Secret update swaps a symlink)."""
    try:
        st = path.stat()
    except OSError:
        return (0, 0, 0)
    return (st.st_ino, st.st_mtime_ns, st.st_size)


async def _prune(service: Service) -> None:
    await service.store.prune(datetime.now(UTC))


# ------------------------------------------------------------------------------------------
# TLS and running


def tls_context(service: Service) -> ssl.SSLContext:
    """TLS 1.2+, the configured or self-issued certificate, and optional client certificates
    checked against the trust bundle (node SVIDs for renewal, admin SVIDs)."""
    tls = service.settings.tls
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.verify_mode = ssl.CERT_OPTIONAL
    ctx.load_verify_locations(cadata=svid.bundle_pem(service.cas.roots(datetime.now(UTC))).decode())
    service.tls = ctx
    if tls.cert_file is not None and tls.key_file is not None:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)  # raises: a bad pair stops the start
        service._tls_stamp = _file_stamp(tls.cert_file) + _file_stamp(tls.key_file)
    else:
        service.refresh_server_certificate(force=True)
    return ctx


async def serve(
    settings: Settings,
    *,
    insecure_plaintext: bool = False,
    ready: Callable[[int], None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    host, port = host_port(settings.listen)
    if insecure_plaintext and not is_loopback(host):
        raise ValueError(f"--insecure-plaintext only binds loopback; listen is {settings.listen}")
    service = await build_service(settings)
    app = make_app(service)
    ctx = None if insecure_plaintext else tls_context(service)
    if insecure_plaintext:
        log.warning(
            "PLAINTEXT LISTENER (--insecure-plaintext): development only, loopback only, no mTLS",
            extra={"listen": settings.listen},
        )
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ctx, backlog=1024)
    await site.start()
    bound = _bound_port(runner, port)
    log.info("nodegate serving", extra={"listen": f"{host}:{bound}"})
    if ready is not None:
        ready(bound)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
        await service.close()


def _bound_port(runner: web.AppRunner, default: int) -> int:
    for server in runner.sites:
        sock = getattr(server, "_server", None)
        sockets = getattr(sock, "sockets", None) or []
        for s in sockets:
            return int(s.getsockname()[1])
    return default


def write_port(path: Path, port: int) -> None:
    from bootstrap.files import write_atomic  # noqa: PLC0415

    write_atomic(path, f"{port}\n".encode(), mode=0o644)
