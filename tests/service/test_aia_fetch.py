"""The AIA fetcher's bounds (bootstrap/service/join/aia.py): http(s) only, redirects only on the same
host, 64 KiB, public addresses unless allowed, distinct fetches per minute, failures remembered,
the disk cache; and the pure choice of which URLs to fetch (attest.ekcert.missing_issuer_urls)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from attest import ekcert
from bootstrap.config import EkAia
from bootstrap.service.join import ekroots
from bootstrap.service.join.aia import MAX_BYTES, AiaFetcher, public
from tests.support.ekvendors import collection_certs, collection_der, real_ek

STM05 = "stmicro/STM-TPM-EK-Intermediate-CA-05-870fc181411d.pem"


@contextlib.asynccontextmanager
async def server(routes: dict[str, web.StreamResponse | bytes]) -> AsyncIterator[tuple[str, dict[str, int]]]:
    hits: dict[str, int] = {}

    async def handle(request: web.Request) -> web.StreamResponse:
        hits[request.path] = hits.get(request.path, 0) + 1
        answer = routes.get(request.path)
        if answer is None:
            return web.Response(status=404)
        return web.Response(body=answer) if isinstance(answer, bytes) else answer

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", hits
    finally:
        await runner.cleanup()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fetcher(tmp_path: Path | None, clock: Clock | None = None, **kw: object) -> AiaFetcher:
    settings = EkAia.model_validate({"allow_private_addresses": True, **kw})
    cache = ekroots.fetched_cache(tmp_path) if tmp_path is not None else None
    return AiaFetcher(settings, cache, clock=clock or Clock())


async def test_fetches_are_limited_per_minute_and_failures_are_remembered(tmp_path: Path) -> None:
    der = collection_der(STM05)
    clock = Clock()
    async with server({"/a": der, "/b": der, "/c": der}) as (base, hits):
        f = fetcher(None, clock, max_fetches_per_minute=2)
        got, why = await f.fetch([f"{base}/a", f"{base}/missing", f"{base}/b"])
        assert (len(got), len(why)) == (1, 2)
        assert "HTTP 404" in why[0]
        assert "AIA fetches in the last minute" in why[1]
        again, why = await f.fetch([f"{base}/missing"])
        assert again == []
        assert "not retried yet" in why[0]
        clock.now += 61
        got, why = await f.fetch([f"{base}/b", f"{base}/a"])  # /a from memory: not a new fetch
        assert (len(got), why) == (2, [])
    assert hits == {"/a": 1, "/missing": 1, "/b": 1}


async def test_redirects_stay_on_the_host_and_bodies_are_bounded(tmp_path: Path) -> None:
    der = collection_der(STM05)
    routes: dict[str, web.StreamResponse | bytes] = {
        "/same": web.Response(status=302, headers={"Location": "/cert"}),
        "/cert": der,
        "/other": web.Response(status=302, headers={"Location": "http://localhost:1/cert"}),
        "/big": b"\x30\x82" + b"\x00" * (MAX_BYTES + 10),
        "/leaf": real_ek("ek/infineon-ek-rsa-mfr-ca022.der").der,
        "/junk": b"not a certificate",
    }
    async with server(routes) as (base, hits):
        f = fetcher(tmp_path)
        got, why = await f.fetch([f"{base}/{p}" for p in ("same", "other", "big", "leaf", "junk")])
    assert [c.sha256 for c in got] == [collection_certs(STM05)[0].sha256]
    assert "redirect to another host" in why[0]
    assert f"larger than {MAX_BYTES} bytes" in why[1]
    assert "is not a CA certificate" in why[2]
    assert len(why) == 4
    assert "localhost" not in str(hits)  # the other host was never asked


async def test_only_http_and_public_addresses_by_default() -> None:
    f = fetcher(None, allow_private_addresses=False)
    got, why = await f.fetch(
        ["ftp://pki.example/ca.crt", "http://127.0.0.1:9/ca.crt", "http://10.1.2.3/ca.crt", "http://[::1]/x"]
    )
    assert got == []
    assert "is not an http or https URL" in why[0]
    assert all("not a public address" in w for w in why[1:])
    assert not public("169.254.169.254")  # cloud metadata services are link-local
    assert not public("::ffff:10.0.0.1")
    assert public("8.8.8.8")


async def test_the_disk_cache_survives_a_restart_and_a_damaged_file_is_ignored(tmp_path: Path) -> None:
    der = collection_der(STM05)
    async with server({"/a": der}) as (base, hits):
        got, _ = await fetcher(tmp_path).fetch([f"{base}/a"])
        assert len(got) == 1
        cached = next(ekroots.fetched_cache(tmp_path).glob("*.der"))
        got, _ = await fetcher(tmp_path).fetch([f"{base}/a"])  # a new process: from disk
        assert len(got) == 1
        assert hits == {"/a": 1}
        cached.write_bytes(b"damaged")
        got, _ = await fetcher(tmp_path).fetch([f"{base}/a"])  # fetched again, rewritten
        assert len(got) == 1
        assert hits == {"/a": 2}
    assert cached.read_bytes() == got[0].der


def test_only_the_missing_issuers_urls_are_asked_for() -> None:
    ek = real_ek("ek/stmicro-ek-rsa.der")
    (inter,) = collection_certs(STM05)
    (root,) = collection_certs("stmicro/STM-TPM-EK-Root-CA-*")
    (globalsign,) = collection_certs("stmicro/GlobalSign-Trusted-Platform-Module-Root-CA-*")
    assert ekcert.missing_issuer_urls(ek.cert, [globalsign], [root]) == (
        "http://secure.globalsign.com/stmtpmekint05.crt",
    )
    assert ekcert.missing_issuer_urls(ek.cert, [globalsign], [root, inter]) == ()
    nuvoton = real_ek("ek/nuvoton-ek-rsa-root2111.der")
    assert ekcert.missing_issuer_urls(nuvoton.cert, [globalsign], []) == (
        "https://www.nuvoton.com/security/NTC-TPM-EK-Cert/Nuvoton TPM Root CA 2111.cer",
    )
    with pytest.raises(ValueError, match="not an http or https URL prefix"):
        EkAia.model_validate({"mirrors": {"file:///": "http://x/"}})


async def test_joins_of_one_vendor_arriving_together_share_one_fetch() -> None:
    import asyncio

    der = collection_der(STM05)
    async with server({"/a": der}) as (base, hits):
        f = fetcher(None, max_fetches_per_minute=1)
        results = await asyncio.gather(*(f.fetch([f"{base}/a"]) for _ in range(20)))
    assert all(len(got) == 1 and why == [] for got, why in results)
    assert hits == {"/a": 1}
