"""The admission webhook alone, on its own aiohttp app (tests and the benchmark; the service mounts
the same handler on its listener). Its refusals are rendered by the service's problem+json builder."""

from __future__ import annotations

from aiohttp import web

from admission.decider import Decider
from admission.webhook import MAX_REVIEW_BYTES, WebhookProblem, make_handler
from bootstrap.service.problemjson import webhook_problem


def make_app(decider: Decider) -> web.Application:
    """``POST /admission/validate``, and ``/readyz``: 200 once PackagePolicies are loaded, 503
    before (the webhook denies meanwhile)."""
    app = web.Application(client_max_size=MAX_REVIEW_BYTES)
    handler = make_handler(decider)

    # A wrapper rather than a middleware: the benchmark measures this app's happy path.
    async def validate(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except WebhookProblem as exc:
            return webhook_problem(exc)

    async def readyz(_request: web.Request) -> web.Response:
        if decider.policy_source.policies() is None:
            return web.Response(status=503, text="PackagePolicies not loaded\n")
        return web.Response(text="ok\n")

    app.router.add_post("/admission/validate", validate)
    app.router.add_get("/readyz", readyz)
    return app
