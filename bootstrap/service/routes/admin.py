"""The admin API's routes (admin SVID or bearer token, see ``bootstrap.service.admin.auth``): list and
revoke nodes, rotate the CA, and the Prometheus metrics."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from attest.errors import MalformedInput
from bootstrap.names import is_node_name
from bootstrap.problems import NotFound, Unavailable
from bootstrap.protocol import QuarantineRequest, RevokeRequest, parse_request
from bootstrap.service.http.inputs import client_address, peer_certificate, read_json
from bootstrap.service.pki import authority, startup
from bootstrap.service.state import SERVICE, Service
from bootstrap.store import AuditEntry, NodeRecord, StoreUnavailable
from bootstrap.times import rfc3339

log = logging.getLogger("nodegate.server")


async def metrics(request: web.Request) -> web.StreamResponse:
    await _admin(request, "metrics")
    return web.Response(
        body=request.app[SERVICE].metrics.render(), content_type="text/plain", charset="utf-8"
    )


async def admin_list(request: web.Request) -> web.StreamResponse:
    await _admin(request, "list")
    store = request.app[SERVICE].store
    try:
        nodes = await store.list_nodes()
        damaged = await store.damaged_nodes()
    except StoreUnavailable as exc:
        raise Unavailable(f"store: {exc}", retry_after=2) from None
    # Damaged records are shown apart: they are nodes, but nothing in them can be trusted. The
    # boot records (~2 KB a node) only when asked for (``?boot=true``: --where selects on them).
    boot = request.query.get("boot") == "true"
    return web.json_response(
        {
            "nodes": [_record_json(r, boot=boot) for r in sorted(nodes, key=lambda r: r.node_name)],
            "damaged": [{"node_name": d.node_name, "problem": d.problem} for d in damaged],
        }
    )


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
    # the node's SPIRE agents go (or, unrevoked and still current, may come back) with it
    await request.app[SERVICE].spire_sync(name, "revoke" if req.revoked else "unrevoke")
    return web.json_response(_record_json(record))


async def admin_quarantine(request: web.Request) -> web.StreamResponse:
    """Hold a node ``quarantined`` until it attests a new boot the policy allows (docs/fleet.md);
    the ``revoke`` permission (a softer revocation: its renewals go on)."""
    name = _name(request)
    actor = await _admin(request, "revoke", name)
    req = parse_request(QuarantineRequest, await read_json(request))
    try:
        record = await request.app[SERVICE].store.quarantine(name, actor=actor, reason=req.reason)
    except KeyError:
        raise NotFound(f"no node {name}") from None
    except StoreUnavailable as exc:
        raise Unavailable(f"store: {exc}", retry_after=2) from None
    log.warning("node quarantined", extra={"actor": actor, "node": name})
    return web.json_response(_record_json(record))


async def admin_show(request: web.Request) -> web.StreamResponse:
    """One node: its record (a damaged one answers node_record_damaged) and its recent audit."""
    name = _name(request)
    await _admin(request, "list", name)
    store = request.app[SERVICE].store
    try:
        record = await store.get(name)
        audit = await store.audit(name, limit=20)
    except StoreUnavailable as exc:
        raise Unavailable(f"store: {exc}", retry_after=2) from None
    if record is None:
        raise NotFound(f"no node {name}")
    return web.json_response({**_record_json(record), "audit": [_audit_json(a) for a in audit]})


async def admin_forget(request: web.Request) -> web.StreamResponse:
    """Drop a node's binding (damaged or not), so a re-imaged machine may join with the name."""
    name = _name(request)
    actor = await _admin(request, "forget", name)
    req = parse_request(RevokeRequest, await read_json(request))
    try:
        forgotten = await request.app[SERVICE].store.forget(name, actor=actor, reason=req.reason)
    except StoreUnavailable as exc:
        raise Unavailable(f"store: {exc}", retry_after=2) from None
    if not forgotten:
        raise NotFound(f"no node {name}")
    log.warning("node forgotten", extra={"actor": actor, "node": name})
    await request.app[SERVICE].spire_sync(name, "forget")  # no record: no agent
    return web.json_response({"node_name": name, "forgotten": True})


def _name(request: web.Request) -> str:
    name = request.match_info["name"]
    if not is_node_name(name):
        raise MalformedInput("not a node name")
    return name


def _audit_json(a: AuditEntry) -> dict[str, Any]:
    return {"at": rfc3339(a.at), "action": a.action, "actor": a.actor, "code": a.code, "detail": a.detail}


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
    await startup.remember(service.store, service.cas)
    log.warning("CA rotated", extra={"actor": actor})
    return web.json_response(
        {
            "sequence": rotated.bundle_sequence(now),
            "roots": len(rotated.roots(now)),
            "signer": rotated.signer.stem,
        }
    )


async def _admin(request: web.Request, permission: str, name: str = "") -> str:
    service: Service = request.app[SERVICE]
    service.admin_rate(client_address(request))  # before any credential is looked at
    caller = await service.admin.authorize(
        permission,
        peer=peer_certificate(request),
        authorization=request.headers.get("Authorization"),
        name=name,
    )
    if permission != "metrics":  # scrapes every few seconds would drown the audit-worthy lines
        log.info("admin %s", permission, extra={"actor": caller.actor, "node": name or None})
    return caller.actor


def _record_json(r: NodeRecord, *, boot: bool = True) -> dict[str, Any]:
    out = {
        "node_name": r.node_name,
        "ek_sha256": r.ek_sha256,
        "spiffe_id": r.spiffe_id,
        "attested_at": rfc3339(r.attested_at) if r.attested_at else None,
        "expires_at": rfc3339(r.expires_at) if r.expires_at else None,
        "revoked": r.revoked,
        "counters": list(r.counters) if r.counters else None,
        "svid_serials": list(r.svid_serials),
        "boot_id": r.boot_id,
        "measured_boot_class": r.measured_boot_class,
        "quarantine": r.quarantine.to_json() if r.quarantine is not None else None,
    }
    if boot:
        out["boot"] = r.boot_record.to_obj() if r.boot_record is not None else None
    return out
