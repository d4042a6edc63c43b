"""The admission listener (``ReviewSite``) on loopback for tests, with an aiohttp client for it:
the webhook apps are tested as ``nodegate serve`` serves them, not through another HTTP stack."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from bootstrap.service.metrics import Metrics
from bootstrap.service.serve import default_admission_limits
from bootstrap.service.webhook.app import Reviews
from bootstrap.service.webhook.site import ReviewSite


class ReviewClient:
    """``post``/``get`` a path of the listener (what aiohttp's TestClient offered)."""

    def __init__(self, session: aiohttp.ClientSession, base: str, site: ReviewSite) -> None:
        self.session = session
        self.base = base
        self.site = site

    def post(self, path: str, **kw: Any) -> Any:
        return self.session.post(self.base + path, **kw)

    def get(self, path: str, **kw: Any) -> Any:
        return self.session.get(self.base + path, **kw)


@contextlib.asynccontextmanager
async def listening(
    app: Reviews, tls: ssl.SSLContext | None = None, metrics: Metrics | None = None
) -> AsyncIterator[ReviewSite]:
    site = ReviewSite(
        app, "127.0.0.1", 0, tls=tls, limits=default_admission_limits(), metrics=metrics or Metrics()
    )
    await site.start()
    try:
        yield site
    finally:
        await site.stop()


@contextlib.asynccontextmanager
async def review_client(app: Reviews) -> AsyncIterator[ReviewClient]:
    """The app on a loopback listener without TLS, and a client session for it."""
    async with listening(app) as site, aiohttp.ClientSession() as session:
        yield ReviewClient(session, f"http://127.0.0.1:{site.port}", site)
