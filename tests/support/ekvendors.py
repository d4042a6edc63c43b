"""Real EK certificates (shared data ``tpm/``), the vendor root store as Debian's package ships it,
and a loopback HTTP server that stands in for the vendors' AIA URLs, serving the intermediates
from the public collection (shared data ``ek-roots/``).

The vendor store comes from ruby-tpm-key-attestation: the installed package's folder where it is
installed, else the ``.deb`` fetched with ``apt-get download`` (a package registry, through its
ordinary client) and unpacked with ``dpkg-deb -x`` into build/ek-vendor-roots/, once per machine.
"""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from aiohttp import web

from attest import certparse
from attest.certparse import Cert
from bootstrap.service.join import vendorroots
from tests.support import realtpm
from tests.support.shared_data import required, shared

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "build" / "ek-vendor-roots" / vendorroots.VERSION

# The real EK certificates of TPM makers, and the intermediate (in the public collection) that each
# one's AIA caIssuers URL names; Nuvoton signs EK certificates with its roots (nothing to fetch).
AIA_INTERMEDIATES = {
    "http://pki.infineon.com/OptigaRsaMfrCA022/OptigaRsaMfrCA022.crt": (
        "infineon/Infineon-OPTIGA-TM-RSA-Manufacturing-CA-022-d3c4ec52ed92.pem"
    ),
    "http://pki.infineon.com/OptigaEccMfrCA022/OptigaEccMfrCA022.crt": (
        "infineon/Infineon-OPTIGA-TM-ECC-Manufacturing-CA-022-e16bddf5b812.pem"
    ),
    "http://pki.infineon.com/OptigaRsaMfrCA007/OptigaRsaMfrCA007.crt": (
        "infineon/Infineon-OPTIGA-TM-RSA-Manufacturing-CA-007-cfc15fe7d8cd.pem"
    ),
    "http://secure.globalsign.com/stmtpmekint05.crt": (
        "stmicro/STM-TPM-EK-Intermediate-CA-05-870fc181411d.pem"
    ),
    "http://secure.globalsign.com/stmtpmeccint01.crt": (
        "stmicro/STM-TPM-ECC-Intermediate-CA-01-015bcfc39435.pem"
    ),
    "http://upgrades.intel.com/content/CRL/ekcert/SPTHEPIDPROD_EK_Platform_Public_Key.cer": (
        "intel/www-intel-com-e365738ed9d4.pem"
    ),
}
MAKERS_EKS = {
    "ek/infineon-ek-rsa-mfr-ca022.der": "infineon",
    "ek/infineon-ek-ecc-mfr-ca022.der": "infineon",
    "ek/infineon-ek-rsa-mfr-ca007.der": "infineon",
    "ek/stmicro-ek-rsa.der": "stmicro",
    "ek/stmicro-ek-ecc.der": "stmicro",
    "ek/nuvoton-ek-rsa-root1110.der": "nuvoton",
    "ek/nuvoton-ek-rsa-root2110.der": "nuvoton",
    "ek/nuvoton-ek-rsa-root2111.der": "nuvoton",
    "ftpm/intel-ptt-ek-rsa-answer.json": "intel",
}
GOOGLE_EKS = (
    "ek/google-ek-rsa-ekak-ca.pem",
    "ek/google-ek-ecc-ekak-ca.pem",
    "ek/google-ek-rsa-cloud-host.pem",
    "ek/google-ek-ecc-cloud-host.pem",
)
GCE_PROJECT_ID = "google.com:wuale-gcp-testing"  # what the Google EK certificates name
GCE_PROJECT_NUMBER = "117478743145"
GCE_INSTANCE_ID = "218557372616137117"  # the EK/AK CA ones' instance


@dataclass(frozen=True)
class RealEk:
    name: str
    der: bytes  # as a node would send it (NV padding and all)
    cert: Cert
    ek_public: bytes  # the TPM2B_PUBLIC of an EK with this key, from the TCG template


def real_ek(name: str) -> RealEk:
    raw = shared("tpm").read(name)
    if name.endswith("-answer.json"):  # Intel's EK certificate service: base64url in JSON
        value = unquote(json.loads(raw)["certificate"])
        der = base64.b64decode(value + "=" * (-len(value) % 4), altchars=b"-_", validate=True)
    elif certparse.is_pem(raw):
        der = next(certparse.pem_blocks(raw))
    else:
        der = raw
    cert = certparse.read_certificate(der)
    return RealEk(name, der, cert, realtpm.ek_public_for(cert.key))


def collection_der(name: str) -> bytes:
    """One CA certificate of the public collection, as DER."""
    return next(certparse.pem_blocks(shared("ek-roots").read(name)))


def collection_certs(pattern: str) -> list[Cert]:
    folder = shared("ek-roots")
    return [
        certparse.read_certificate(collection_der(n), trailing=certparse.FILE_WHITESPACE)
        for n in folder.names(pattern)
    ]


def vendor_folder() -> Path:
    """The package's certificate folder (see the module's docstring); skips (fails in CI) when
    it cannot be had."""
    installed = Path("/") / vendorroots.PACKAGE_DIR
    if installed.is_dir():
        return installed
    folder = CACHE / vendorroots.PACKAGE_DIR
    if folder.is_dir():
        return folder
    why = _unpack_deb(CACHE)
    if why is None and folder.is_dir():
        return folder
    message = f"{vendorroots.PACKAGE} {vendorroots.VERSION} unavailable: {why}"
    if required():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def _unpack_deb(out: Path) -> str | None:
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        return "apt-get and dpkg-deb are needed (Debian)"
    with tempfile.TemporaryDirectory(prefix="ek-vendor-deb-") as tmp:
        got = subprocess.run(
            ["apt-get", "download", "-q", f"{vendorroots.PACKAGE}={vendorroots.VERSION}"],
            cwd=tmp,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        debs = list(Path(tmp).glob("*.deb"))
        if got.returncode != 0 or len(debs) != 1:
            return f"apt-get download failed: {got.stderr.strip()[-300:]}"
        staging = Path(tmp) / "x"
        subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(staging)], check=True, timeout=120)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(out, ignore_errors=True)
        shutil.move(str(staging), str(out))
    return None


@dataclass
class AiaServer:
    """The loopback stand-in for the vendors' AIA hosts: ``mirrors`` maps each vendor URL prefix to
    it (config ``ek_aia.mirrors``); ``hits`` counts requests per original URL."""

    base: str
    mirrors: dict[str, str]
    hits: dict[str, int]
    served: dict[str, bytes]


@contextlib.asynccontextmanager
async def aia_server(served: dict[str, bytes] | None = None) -> AsyncIterator[AiaServer]:
    """Serves ``served`` (original AIA URL -> body; default: every intermediate of
    :data:`AIA_INTERMEDIATES`) under ``http://127.0.0.1:PORT/<scheme>/<host>/<path>``."""
    table = served if served is not None else {u: collection_der(n) for u, n in AIA_INTERMEDIATES.items()}
    hits: dict[str, int] = {}

    async def handle(request: web.Request) -> web.StreamResponse:
        scheme, _, rest = request.path.lstrip("/").partition("/")
        url = f"{scheme}://{rest}"
        hits[url] = hits.get(url, 0) + 1
        body = table.get(url)
        if body is None:
            return web.Response(status=404)
        return web.Response(body=body, content_type="application/pkix-cert")

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    hosts = {f"{urlsplit(u).scheme}://{urlsplit(u).netloc}/" for u in table}
    mirrors = {h: f"{base}/{h.split('://')[0]}/{h.split('://')[1]}" for h in hosts}
    try:
        yield AiaServer(base, mirrors, hits, table)
    finally:
        await runner.cleanup()
