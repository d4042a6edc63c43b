"""The disk-key release routes: ``POST /v1/disk/start`` and ``/v1/disk/finish`` (docs/disk-keys.md),
within the join's rate and concurrency limits (a release costs what a renewal costs)."""

from __future__ import annotations

from aiohttp import web
from pydantic import BaseModel

from bootstrap.problems import DiskKeysDisabled
from bootstrap.protocol import DiskFinishRequest, DiskStartRequest, parse_request
from bootstrap.service.disk.flow import DiskService
from bootstrap.service.http.inputs import client_address, read_json
from bootstrap.service.state import SERVICE, Service


def _disk(service: Service) -> DiskService:
    if service.disk is None:
        raise DiskKeysDisabled("disk keys are not configured on this service (disk_keys)")
    return service.disk


async def disk_start(request: web.Request) -> web.StreamResponse:
    service = request.app[SERVICE]
    async with service.join_slot(client_address(request)):
        req = parse_request(DiskStartRequest, await read_json(request))
        return _json(await _disk(service).start(req))


async def disk_finish(request: web.Request) -> web.StreamResponse:
    service = request.app[SERVICE]
    async with service.join_slot(client_address(request)):
        req = parse_request(DiskFinishRequest, await read_json(request))
        return _json(await _disk(service).finish(req))


def _json(model: BaseModel) -> web.Response:
    return web.Response(body=model.model_dump_json().encode(), content_type="application/json")
