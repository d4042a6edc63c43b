"""A small test-only shim over kmock's KubernetesEmulator (see research/spiffe-k8s.md §3.4).

It fills the gaps that matter to nodegate's Kubernetes code: creates answer 201 with uid and
resourceVersion, kubernetes_asyncio's ``watch=True`` is a watch, and SubjectAccessReviews are
answered by a test-supplied function (kmock has no authorizer).
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp.web
import attrs
import kmock
from kmock._internal import enums  # kmock 0.8 internals; the version is pinned by the tests' needs

SAR_PATH = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
SarAnswer = Callable[[dict[str, Any]], "dict[str, Any] | int"]


@attrs.define(kw_only=True)
class ShimEmulator(kmock.KubernetesEmulator):
    sar: SarAnswer | None = None
    _versions: Any = attrs.field(factory=lambda: itertools.count(1000), init=False)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        if request.url.path == SAR_PATH and request.method == enums.method.POST:
            answer = self.sar(request.data) if self.sar is not None else 403
            if isinstance(answer, int):
                body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": answer}
                return aiohttp.web.json_response(body, status=answer)
            return aiohttp.web.json_response({**request.data, "status": answer}, status=201)
        if request.params.get("watch") in ("True", "1") and request.action == enums.action.LIST:
            object.__setattr__(request, "action", enums.action.WATCH)
        if request.action == enums.action.CREATE and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            meta.setdefault("uid", str(uuid.uuid4()))
            meta["resourceVersion"] = str(next(self._versions))
        return await super()._handle(request)

    async def _serve_create(self, request: kmock.Request) -> kmock.Payload:
        return kmock.Response(status=201, payload=await super()._serve_create(request))
