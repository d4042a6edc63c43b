"""The one builder of ``application/problem+json`` answers for the whole service (the join and
admin APIs, routing errors, and the admission webhook's refusals of bodies it does not judge)."""

from __future__ import annotations

from aiohttp import web

from admission.webhook import WebhookProblem

TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    409: "Conflict",
    410: "Gone",
    413: "Payload Too Large",
    415: "Unsupported Media Type",
    429: "Too Many Requests",
    503: "Service Unavailable",
}


def problem(status: int, code: str, detail: str, *, retry_after: float | None = None) -> web.Response:
    title = TITLES.get(status, "Error")
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail, "code": code}
    resp = web.json_response(body, status=status, content_type="application/problem+json")
    if retry_after is not None:
        resp.headers["Retry-After"] = str(max(1, int(retry_after + 0.999)))
    return resp


def webhook_problem(exc: WebhookProblem) -> web.Response:
    resp = problem(exc.status, exc.code, exc.detail)
    if exc.status == 413:
        resp.force_close()  # the unread body would otherwise keep the connection busy
    return resp
