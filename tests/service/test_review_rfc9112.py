"""Issue 41, findings 5-8: heads RFC 9112 says a server refuses (or answers with 505), sent as raw
bytes to the admission listener on a real socket with the real ReviewApp. Each was served (or
left without an answer until the deadline) before: a request with no Host or two, a repeated
Content-Type, Content-Encoding or Expect line (the last one won), LF-only line ends, HTTP/0.9 and
the h2 preface. The answer is problem+json ``malformed_request`` and the connection closes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from bootstrap.service.webhook.app import make_app
from bootstrap.service.webhook.site import ReviewSite
from tests.admission.test_webhook import decider, review
from tests.support.reviewserver import listening

# An answer that does not come within this is no answer: the head deadline is 35 s.
AT_ONCE = 1.0

BODY = json.dumps(review({"metadata": {"name": "gpu-pkgs"}, "spec": {"nodeSelectors": {}}})).encode()


def post(*fields: bytes, version: bytes = b"HTTP/1.1", eol: bytes = b"\r\n", body: bytes = BODY) -> bytes:
    """A review POST with these field lines (Content-Length is added), line ends ``eol``."""
    lines = [b"POST /admission/validate?timeout=10s " + version, *fields, b"Content-Length: %d" % len(body)]
    return eol.join(lines) + eol + eol + body


HOST = b"Host: nodegate-webhook.nodegate.svc:9443"
JSON = b"Content-Type: application/json"


@pytest.fixture
async def site() -> AsyncIterator[ReviewSite]:
    async with listening(make_app(decider())) as running:
        yield running


async def exchange(
    site: ReviewSite, data: bytes, wait_close: bool = True
) -> tuple[int, dict[str, str], bytes, bool]:
    """``data`` on a fresh connection: the first answer's status, fields (lowercase names) and
    body, and (``wait_close``) whether the listener then closed the connection (each within
    AT_ONCE)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", site.port)
    try:
        writer.write(data)
        await writer.drain()
        try:
            async with asyncio.timeout(AT_ONCE):
                head = await reader.readuntil(b"\r\n\r\n")
        except TimeoutError:
            pytest.fail(f"no answer within {AT_ONCE} s to {data[:60]!r}")
        status_line, *lines = head[:-4].decode("latin-1").split("\r\n")
        fields = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
        body = await reader.readexactly(int(fields["content-length"]))
        closed = False
        if wait_close:
            try:
                async with asyncio.timeout(AT_ONCE):
                    closed = await reader.read(1) == b""
            except TimeoutError:
                pass  # kept open
        return int(status_line.split(" ")[1]), fields, body, closed
    finally:
        writer.close()


async def refused(site: ReviewSite, data: bytes, status: int = 400) -> str:
    """``data`` is refused with ``status`` problem+json ``malformed_request`` and a close; its detail."""
    got, fields, body, closed = await exchange(site, data)
    assert got == status, (data[:60], got, body[:200])
    problem = json.loads(body)
    assert (problem["status"], problem["code"]) == (status, "malformed_request"), problem
    assert fields["content-type"] == "application/problem+json"
    assert fields["connection"] == "close"
    assert closed
    detail: str = problem["detail"]
    return detail


async def served(site: ReviewSite, data: bytes) -> None:
    """The control: ``data`` is judged (200, an AdmissionReview)."""
    status, _fields, body, _closed = await exchange(site, data, wait_close=False)
    assert status == 200, body
    assert json.loads(body)["kind"] == "AdmissionReview"


async def test_finding5_a_request_needs_exactly_one_host(site: ReviewSite) -> None:
    """RFC 9112 section 3.2: 400 for an HTTP/1.1 request without Host, and for any request with
    two Host lines (h11 and llhttp refuse both). Both were judged before."""
    await served(site, post(HOST, JSON))
    assert "Host" in await refused(site, post(JSON))
    assert "Host" in await refused(site, post(HOST, JSON, b"host: other.example"))
    assert "Host" in await refused(site, post(HOST, JSON, HOST))  # even the same value twice
    assert "Host" in await refused(site, post(HOST, JSON, HOST, version=b"HTTP/1.0"))
    await served(site, post(JSON, version=b"HTTP/1.0"))  # HTTP/1.0 may leave Host out


async def test_finding6_a_repeated_field_the_listener_acts_on_is_refused(site: ReviewSite) -> None:
    """Content-Type, Content-Encoding and Expect at most once: the last line won before, so
    ``gzip`` then ``identity`` was judged as plain JSON (instead of a refusal) and ``text/plain``
    then ``application/json`` was accepted."""
    gzip, identity = b"Content-Encoding: gzip", b"Content-Encoding: identity"
    await served(site, post(HOST, JSON, identity))
    assert "Content-Encoding" in await refused(site, post(HOST, JSON, gzip, identity))
    assert "Content-Type" in await refused(site, post(HOST, b"Content-Type: text/plain", JSON))
    assert "Content-Type" in await refused(site, post(HOST, JSON, JSON))
    expect = b"Expect: 100-continue"
    assert "Expect" in await refused(site, post(HOST, JSON, b"Expect: 200-ok", expect))
    assert "Expect" in await refused(site, post(HOST, JSON, expect, expect))


async def test_finding7_lf_only_line_ends_are_refused_at_once(site: ReviewSite) -> None:
    """A head with LF-only line ends was left unanswered until 16 KiB or the 35 s deadline;
    llhttp answers 400 at once, and so does the listener now (RFC 9112 section 2.2 lets a
    server take a bare LF as a line end; this one refuses it, at the first bare LF)."""
    assert "CRLF" in await refused(site, post(HOST, JSON, eol=b"\n"))
    assert "CRLF" in await refused(site, b"GET /readyz HTTP/1.1\nHost: x\n\n")
    assert "CRLF" in await refused(site, b"GET /readyz HTTP/1.1\r\nHost: x\n")  # one bare LF, unended
    assert "CRLF" in await refused(site, b"GET /readyz HTTP/1.1\r\nHost: x\rX: y")  # a bare CR


async def test_finding8_http09_and_http2_get_400_and_505_as_docs_say(site: ReviewSite) -> None:
    """docs/admission.md promised 505 for HTTP/0.9 and HTTP/2.0, but the h2 preface got 400 and
    HTTP/0.9's simple request waited for the deadline. Now: a request line without a version
    (HTTP/0.9's ``GET /``) is not HTTP/1.x, 400 as soon as the line ends; a well-formed request
    line of another major version, whatever its target (``PRI *`` of the h2 preface), is 505
    (RFC 9110 section 15.6.6)."""
    assert "METHOD /path HTTP/1.1" in await refused(site, b"GET /\r\n")  # as an HTTP/0.9 client sends it
    assert "METHOD /path HTTP/1.1" in await refused(site, b"GET /\r\n\r\n")
    assert "HTTP/1.1" in await refused(site, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505)  # h2 prior knowledge
    await refused(site, b"PRI * HTTP/2.0\r\n", 505)  # at once, before the head ends
    await refused(site, post(HOST, JSON, version=b"HTTP/2.0"), 505)
    await refused(site, b"GET /readyz HTTP/0.9\r\n\r\n", 505)
    await refused(site, b"GET /readyz HTTP/3.0\r\nHost: x\r\n\r\n", 505)
