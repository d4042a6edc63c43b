"""The one builder of ``application/problem+json`` answers for the whole service (the join and
admin APIs, routing errors, and the admission webhook's refusals of bodies it does not judge)."""

from __future__ import annotations

import json

from aiohttp import web

TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    411: "Length Required",
    409: "Conflict",
    410: "Gone",
    413: "Payload Too Large",
    415: "Unsupported Media Type",
    417: "Expectation Failed",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}


CONTENT_TYPE = "application/problem+json"


def problem_body(status: int, code: str, detail: str) -> bytes:
    """The problem document (RFC 9457) with nodegate's machine ``code``."""
    title = TITLES.get(status, "Error")
    doc = {"type": "about:blank", "title": title, "status": status, "detail": detail, "code": code}
    return json.dumps(doc).encode()


def retry_after_value(seconds: float) -> str:
    return str(max(1, int(seconds + 0.999)))


def problem(status: int, code: str, detail: str, *, retry_after: float | None = None) -> web.Response:
    resp = web.Response(body=problem_body(status, code, detail), status=status, content_type=CONTENT_TYPE)
    if retry_after is not None:
        resp.headers["Retry-After"] = retry_after_value(retry_after)
    return resp
