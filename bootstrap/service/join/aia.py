"""Missing EK intermediates, fetched from the certificate's Authority Information Access
(caIssuers) URL (docs/ek-roots.md, "Intermediates").

A fetched certificate adds no trust by itself: it only helps ``attest.ekcert`` build a path to a
configured anchor, exactly like an intermediate the node sends. The fetch is bounded: http or
https only, redirects only on the same host (3 at most), 10 s, 64 KiB, public addresses only
unless ``ek_aia.allow_private_addresses`` (checked on the addresses actually connected to, so a
name that resolves to a private address is refused too), at most
``ek_aia.max_fetches_per_minute`` distinct URLs fetched per minute, failures remembered for a
minute. Results are cached on disk in ``<state_dir>/ek-roots/fetched`` (atomic writes), so a
restart or another join of the same vendor does not fetch again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import json
import logging
import socket
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, pkcs7

from attest import certparse
from attest.certparse import Cert
from attest.errors import MalformedInput
from bootstrap import files
from bootstrap.config import EkAia

log = logging.getLogger("nodegate.aia")

TIMEOUT_SECONDS = 10.0
MAX_BYTES = 64 * 1024
MAX_REDIRECTS = 3
FAILURE_MEMORY_SECONDS = 60.0
WINDOW_SECONDS = 60.0
_SUFFIX = ".der"


class AddressRefused(aiohttp.ClientError):
    """The URL's host is (or resolves to) an address the configuration does not allow."""


# What a bounded fetch may raise: each is "not fetched", with a reason.
FETCH_ERRORS = (TimeoutError, aiohttp.ClientError, ValueError, OSError)


def public(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


class _CheckedResolver(AbstractResolver):
    """Resolves as usual, then drops every address the configuration does not allow: the
    connection can only go to an address that was checked (no rebinding between check and use)."""

    def __init__(self, allow_private: bool) -> None:
        self._inner = aiohttp.ThreadedResolver()
        self._allow_private = allow_private

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        allowed = [r for r in found if self._allow_private or public(r["host"])]
        if not allowed:
            raise AddressRefused(
                f"{host} resolves only to non-public addresses (ek_aia.allow_private_addresses)"
            )
        return allowed

    async def close(self) -> None:
        await self._inner.close()


@dataclass(frozen=True, slots=True)
class Fetched:
    url: str
    cert: Cert
    cached_file: Path


class AiaFetcher:
    def __init__(
        self,
        settings: EkAia,
        cache_dir: Path | None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._cache_dir = cache_dir
        self._clock = clock
        self._recent: deque[float] = deque()  # times of the fetches in the last minute
        self._failed: dict[str, tuple[float, str]] = {}  # url -> (when, why)
        self._memory: dict[str, Cert] = {}
        self._inflight: dict[str, asyncio.Future[Cert]] = {}
        self._lock = asyncio.Lock()

    # -- the cache -----------------------------------------------------------------------------

    def _cache_file(self, url: str) -> Path | None:
        if self._cache_dir is None:
            return None
        return self._cache_dir / (hashlib.sha256(url.encode()).hexdigest()[:40] + _SUFFIX)

    def _cached(self, url: str) -> Cert | None:
        if url in self._memory:
            return self._memory[url]
        path = self._cache_file(url)
        if path is None or not path.is_file():
            return None
        try:
            cert = certparse.read_certificate(path.read_bytes()[: MAX_BYTES + 1], "cached intermediate")
        except (OSError, MalformedInput) as exc:
            log.warning("ek_aia: ignoring the damaged cache file %s", path, extra={"error": str(exc)})
            return None
        self._memory[url] = cert
        return cert

    def _store(self, url: str, cert: Cert) -> Path | None:
        self._memory[url] = cert
        path = self._cache_file(url)
        if path is None:
            return None
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        meta = {"url": url, "sha256": cert.sha256, "subject": cert.name(), "fetched": int(time.time())}
        # The certificate last: a listing never shows metadata without its certificate.
        files.write_atomic(path.with_suffix(".json"), json.dumps(meta).encode())
        files.write_atomic(path, cert.der)
        return path

    # -- fetching ------------------------------------------------------------------------------

    def rewrite(self, url: str) -> str:
        """The URL to fetch: the longest configured mirror prefix replaced."""
        best = max((p for p in self._settings.mirrors if url.startswith(p)), key=len, default=None)
        return url if best is None else self._settings.mirrors[best] + url[len(best) :]

    async def fetch(self, urls: Iterable[str]) -> tuple[list[Cert], list[str]]:
        """CA certificates for the URLs (cached, or fetched within the limits), and why each URL
        that gave none did not."""
        got: list[Cert] = []
        why: list[str] = []
        for url in dict.fromkeys(urls):
            try:
                got.append(await self._one(url))
            except FETCH_ERRORS as exc:
                reason = str(exc) or type(exc).__name__
                why.append(f"AIA {url}: {reason}")
        return got, why

    async def _one(self, url: str) -> Cert:
        cached = self._cached(url)
        if cached is not None:
            return cached
        # Joins of one vendor's TPMs arrive together: one fetch per URL, the others wait for it.
        running = self._inflight.get(url)
        if running is None:
            running = asyncio.ensure_future(self._fetch(url))
            self._inflight[url] = running
            running.add_done_callback(lambda done: self._finished(url, done))
        return await asyncio.shield(running)

    def _finished(self, url: str, done: asyncio.Future[Cert]) -> None:
        self._inflight.pop(url, None)
        if not done.cancelled():
            done.exception()  # retrieved: every waiter already got it (or has gone)

    async def _fetch(self, url: str) -> Cert:
        async with self._lock:
            now = self._clock()
            failed = self._failed.get(url)
            if failed is not None and now - failed[0] < FAILURE_MEMORY_SECONDS:
                raise ValueError(f"failed {now - failed[0]:.0f} s ago ({failed[1]}); not retried yet")
            while self._recent and now - self._recent[0] >= WINDOW_SECONDS:
                self._recent.popleft()
            if len(self._recent) >= self._settings.max_fetches_per_minute:
                raise ValueError(
                    f"{self._settings.max_fetches_per_minute} AIA fetches in the last minute "
                    "(ek_aia.max_fetches_per_minute): not fetched"
                )
            self._recent.append(now)
        try:
            body = await self._download(self.rewrite(url))
            cert = _ca_certificate(body)
        except FETCH_ERRORS as exc:
            self._failed[url] = (self._clock(), str(exc) or type(exc).__name__)
            raise
        try:
            self._store(url, cert)
        except OSError as exc:  # the cache is an optimisation: the join goes on without it
            log.warning("ek_aia: cannot cache %s", url, extra={"error": str(exc)})
        log.info("ek_aia: fetched %s", url, extra={"subject": cert.name(), "sha256": cert.sha256})
        return cert

    async def _download(self, url: str) -> bytes:
        return await download(url, allow_private=self._settings.allow_private_addresses)


async def download(url: str, *, allow_private: bool, limit: int = MAX_BYTES) -> bytes:
    """One bounded GET (module docstring): http(s), same-host redirects, 10 s, ``limit`` bytes,
    public addresses unless ``allow_private``."""
    host = _check_url(url, allow_private)
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_SECONDS)
    connector = aiohttp.TCPConnector(resolver=_CheckedResolver(allow_private))
    async with aiohttp.ClientSession(timeout=timeout, connector=connector, trust_env=False) as http:
        for _ in range(MAX_REDIRECTS + 1):
            async with http.get(url, allow_redirects=False) as resp:
                if resp.status in (301, 302, 303, 307, 308):
                    target = urljoin(url, resp.headers.get("Location", ""))
                    if _check_url(target, allow_private) != host:
                        raise ValueError(f"redirect to another host ({target}) not followed")
                    url = target
                    continue
                if resp.status != 200:
                    raise ValueError(f"HTTP {resp.status}")
                body = await resp.content.read(limit + 1)
                if len(body) > limit:
                    raise ValueError(f"larger than {limit} bytes")
                return bytes(body)
    raise ValueError(f"more than {MAX_REDIRECTS} redirects")


def _check_url(url: str, allow_private: bool) -> str:
    """The URL's host, if the URL may be fetched at all (scheme, and a literal address's range)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an http or https URL")
    host = parts.hostname
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        return host.lower()
    if not allow_private and not public(str(literal)):
        raise AddressRefused(f"{host} is not a public address (ek_aia.allow_private_addresses)")
    return host


def _ca_certificate(body: bytes) -> Cert:
    """One CA certificate from DER, PEM or a PKCS#7 certs-only bundle of one."""
    candidates: list[bytes]
    if certparse.is_pem(body):
        candidates = list(certparse.pem_blocks(body))
    else:
        candidates = [body]
        if body[:1] == b"\x30":
            with contextlib.suppress(ValueError):  # not PKCS#7: a plain certificate
                candidates = [
                    c.public_bytes(Encoding.DER) for c in pkcs7.load_der_pkcs7_certificates(body)
                ] or candidates
    if len(candidates) != 1:
        raise ValueError(f"{len(candidates)} certificates where one was expected")
    try:
        cert = certparse.read_certificate(
            candidates[0], "AIA certificate", trailing=certparse.FILE_WHITESPACE
        )
    except MalformedInput as exc:
        raise ValueError(exc.detail) from None
    try:
        bc: Any = cert.view.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        bc = None
    if bc is None or not bc.ca:
        raise ValueError(f"{cert.name()} is not a CA certificate")
    return cert


def cached_files(cache_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    """The fetched intermediates on disk, each with what was recorded about it (for ``ek roots``)."""
    out: list[tuple[Path, dict[str, Any]]] = []
    if not cache_dir.is_dir():
        return out
    for path in sorted(cache_dir.glob("*" + _SUFFIX)):
        try:
            meta = json.loads(path.with_suffix(".json").read_text())
        except (OSError, ValueError):
            meta = {}
        out.append((path, meta if isinstance(meta, dict) else {}))
    return out
