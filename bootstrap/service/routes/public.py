"""The routes anyone may call: the trust bundle (``GET /v1/bundle``, JWKS or PEM) and the probes
(``/healthz``, ``/readyz``)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from aiohttp import web

from attest import svid
from attest.errors import MalformedInput
from bootstrap.service.state import SERVICE, Service
from bootstrap.service.webhook.policywatch import WAITING_FOR_POLICIES
from bootstrap.store import StoreUnavailable

log = logging.getLogger("nodegate.server")


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
        return web.Response(status=503, text=f"PackagePolicies not loaded: {WAITING_FOR_POLICIES}\n")
    try:
        await service.store.get("readyz.nodegate.io")
    except StoreUnavailable as exc:
        log.warning("readyz: store unavailable", extra={"error": str(exc)[:300]})
        return web.Response(status=503, text="store unavailable\n")
    # Ready still: a skipped EK root only narrows trust, but the operator should see which.
    skipped = "".join(f"ek_roots skipped: {line}\n" for line in service.join.ek_trust.skipped_lines())
    # Ready for joins; the webhook, with no policy source, never will be: say so where people look
    why = getattr(service.decider.policy_source, "why_none", None)
    webhook = f"webhook: {why}\n" if isinstance(why, str) else ""
    return web.Response(text="ok\n" + skipped + webhook)
