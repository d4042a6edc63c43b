"""The join API's routes: ``POST /v1/join/start``, ``/v1/join/finish`` and
``/v1/nodes/self/renew`` (docs/protocol.md), each within the rate and concurrency limits."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from bootstrap.protocol import (
    FinishRequest,
    RenewFinishRequest,
    RenewStartRequest,
    StartRequest,
    parse_request,
)
from bootstrap.service.http.inputs import client_address, peer_certificate, read_json
from bootstrap.service.state import SERVICE


async def join_start(request: web.Request) -> web.StreamResponse:
    service = request.app[SERVICE]
    async with service.join_slot(client_address(request)):
        req = parse_request(StartRequest, await read_json(request))
        return _json(await service.join.start(req))


async def join_finish(request: web.Request) -> web.StreamResponse:
    service = request.app[SERVICE]
    async with service.join_slot(client_address(request)):
        req = parse_request(FinishRequest, await read_json(request))
        return _json(await service.join.finish(req))


async def renew(request: web.Request) -> web.StreamResponse:
    service = request.app[SERVICE]
    async with service.join_slot(client_address(request)):
        body = await read_json(request)
        peer = peer_certificate(request)
        if isinstance(body, dict) and "session" in body:
            return _json(await service.join.renew_finish(peer, parse_request(RenewFinishRequest, body)))
        return _json(await service.join.renew_start(peer, parse_request(RenewStartRequest, body)))


def _json(model: Any, status: int = 200) -> web.Response:
    # The x509pop certificate is an addition (docs/spire.md): absent, not null, when not issued, so
    # the answer stays exactly the design contract's without spire.x509pop.
    exclude = {"x509pop_certificate"} if getattr(model, "x509pop_certificate", "") is None else None
    body = model.model_dump_json(exclude=exclude).encode()
    return web.Response(body=body, status=status, content_type="application/json")
