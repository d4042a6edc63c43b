"""Firmware TPMs without an EK certificate in NV: the vendor URL rules (checked against real Intel
PTT and AMD fTPM EKs and the URLs their vendors publish), the fetch from a local server that
answers the way Intel's and AMD's services do, its limits and errors, and --ek-cert-file."""

from __future__ import annotations

import asyncio
import base64
import functools
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from cryptography.hazmat.primitives import serialization

from bootstrap.cli.arguments import parser
from bootstrap.node import ekfetch
from bootstrap.node.errors import EXIT_USAGE, JoinFailed, JoinUsageError, exit_status
from bootstrap.node.join import JoinOptions, ek_certificate
from bootstrap.node.tpm import Agent
from tests.attest import ekbuild as b
from tests.support import fakes, realtpm
from tests.support.swtpms import TpmInfo

INTEL_URL = "https://ekop.intel.com/ekcertservice/WVEG2rRwkQ7m3RpXlUphgo6Y2HLxl18h6ZZkkOAdnBE%3D"
AMD_URL = "https://ftpm.amd.com/pki/aia/D027B3CE6A9B6B56846D2B9935884A88"


@functools.cache
def _vendor_pki() -> tuple[bytes, bytes, bytes]:
    """(EK public area, its certificate, another EK's public area), made when a test first asks:
    built by the installed cryptography, a refusal there fails the tests, not the collection."""
    ca = b.make_ca(b.cn("Vendor fTPM EK CA"))
    ek_key, ek_public = b.ek_pair("rsa")
    ek_cert = b.issue_ek(ca, b.ek_builder(ca.name, ek_key, san=b.cn("tpm")))
    _, other_public = b.ek_pair("rsa")
    return ek_public, ek_cert, other_public


def ek_public() -> bytes:
    return _vendor_pki()[0]


def ek_cert() -> bytes:
    return _vendor_pki()[1]


def other_public() -> bytes:
    return _vendor_pki()[2]


def _amd_public() -> bytes:
    key = serialization.load_pem_public_key(realtpm.data("ftpm/amd-ftpm-ek-rsa.pem"))
    return fakes.rsa_ek_public(key)  # type: ignore[arg-type]


def test_intel_url_of_a_real_ptt_ek_is_the_one_intel_publishes() -> None:
    assert ekfetch.certificate_url(ekfetch.INTEL, realtpm.data("ftpm/intel-ptt-ek-rsa.pub")) == INTEL_URL


def test_amd_url_of_a_real_ftpm_ek_is_the_one_amd_publishes() -> None:
    assert ekfetch.certificate_url(ekfetch.AMD, _amd_public()) == AMD_URL


def test_no_url_for_ecc_eks_or_other_vendors() -> None:
    assert ekfetch.certificate_url(ekfetch.INTEL, realtpm.data("ftpm/intel-ptt-ek-ecc.pub")) is None
    infineon = int.from_bytes(b"IFX\0", "big")
    assert ekfetch.certificate_url(infineon, realtpm.data("ftpm/intel-ptt-ek-rsa.pub")) is None
    assert ekfetch.manufacturer_name(ekfetch.AMD) == "AMD"
    assert ekfetch.manufacturer_name(ekfetch.INTEL) == "INTC"


def test_a_mirror_replaces_the_base_url() -> None:
    url = ekfetch.certificate_url(ekfetch.AMD, _amd_public(), "http://mirror.internal/amd")
    assert url == "http://mirror.internal/amd/D027B3CE6A9B6B56846D2B9935884A88"


# -- a local server answering like the vendors' services -------------------------------------------


@dataclass
class Vendor:
    base: str
    answers: dict[str, tuple[int, bytes]]
    hold: asyncio.Event


@pytest.fixture
async def vendor() -> AsyncIterator[Vendor]:
    answers: dict[str, tuple[int, bytes]] = {}
    hold = asyncio.Event()

    async def handle(request: web.Request) -> web.StreamResponse:
        key = request.raw_path.rsplit("/", 1)[1]  # as sent: Intel's keys end in %3D
        if request.path.startswith("/slow/"):
            await hold.wait()  # released at teardown; the client's timeout fires first
        status, body = answers.get(key, (404, b"not found"))
        return web.Response(status=status, body=body)

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield Vendor(str(server.make_url("/ek/")), answers, hold)
    finally:
        hold.set()
        await server.close()


def _key(manufacturer: int, public: bytes) -> str:
    url = ekfetch.certificate_url(manufacturer, public, "http://x/")
    assert url is not None
    return url.rsplit("/", 1)[1]


def _intel_json(der: bytes) -> bytes:
    value = base64.urlsafe_b64encode(der).decode().replace("=", "%3D")
    return json.dumps({"pubhash": "ignored", "certificate": value}).encode()


async def test_intel_style_json_answer(vendor: Vendor) -> None:
    vendor.answers[_key(ekfetch.INTEL, ek_public())] = (200, _intel_json(ek_cert()))
    assert await ekfetch.fetch_certificate(ekfetch.INTEL, ek_public(), service=vendor.base) == ek_cert()


@pytest.mark.parametrize("form", ["der", "pem"])
async def test_amd_style_der_or_pem_answer(vendor: Vendor, form: str) -> None:
    body = ek_cert() if form == "der" else _pem(ek_cert())
    vendor.answers[_key(ekfetch.AMD, ek_public())] = (200, body)
    assert await ekfetch.fetch_certificate(ekfetch.AMD, ek_public(), service=vendor.base) == ek_cert()


def _pem(der: bytes) -> bytes:
    return b"-----BEGIN CERTIFICATE-----\n" + base64.encodebytes(der) + b"-----END CERTIFICATE-----\n"


async def test_no_certificate_published_is_a_clear_error(vendor: Vendor) -> None:
    with pytest.raises(JoinFailed, match="no certificate for this EK; use --ek-cert-file") as caught:
        await ekfetch.fetch_certificate(ekfetch.AMD, ek_public(), service=vendor.base)
    assert caught.value.code == "ek_certificate_unavailable"
    assert exit_status(caught.value) == EXIT_USAGE


async def test_a_certificate_for_another_key_is_not_sent(vendor: Vendor) -> None:
    vendor.answers[_key(ekfetch.AMD, other_public())] = (200, ek_cert())
    with pytest.raises(JoinFailed, match="another key") as caught:
        await ekfetch.fetch_certificate(ekfetch.AMD, other_public(), service=vendor.base)
    assert caught.value.code == "ek_certificate_invalid"


@pytest.mark.parametrize(
    ("status", "body", "needle"),
    [
        (200, b"x" * (ekfetch.MAX_ANSWER + 1), "larger than"),
        (200, b'{"certificate": 5}', "without a certificate"),
        (200, b'{"certificate": "!!!"}', "not base64url"),
        (503, b"busy", "HTTP 503"),
    ],
)
async def test_bad_answers_are_refused(vendor: Vendor, status: int, body: bytes, needle: str) -> None:
    vendor.answers[_key(ekfetch.INTEL, ek_public())] = (status, body)
    with pytest.raises(JoinFailed, match=needle) as caught:
        await ekfetch.fetch_certificate(ekfetch.INTEL, ek_public(), service=vendor.base)
    assert caught.value.code in {"ek_certificate_unavailable", "ek_certificate_invalid"}


async def test_garbage_that_is_not_a_certificate_is_refused(vendor: Vendor) -> None:
    vendor.answers[_key(ekfetch.AMD, ek_public())] = (200, b"\x30\x03\x02\x01\x00")
    with pytest.raises(JoinFailed) as caught:
        await ekfetch.fetch_certificate(ekfetch.AMD, ek_public(), service=vendor.base)
    assert caught.value.code == "ek_certificate_invalid"


async def test_a_service_that_does_not_answer_times_out(vendor: Vendor) -> None:
    with pytest.raises(JoinFailed, match=r"no answer within 0\.2 s"):
        await ekfetch.fetch_certificate(
            ekfetch.AMD, ek_public(), service=vendor.base.replace("/ek/", "/slow/"), timeout=0.2
        )


async def test_an_unreachable_service_is_a_clear_error() -> None:
    with pytest.raises(JoinFailed) as caught:
        await ekfetch.fetch_certificate(ekfetch.AMD, ek_public(), service="http://127.0.0.1:9/")
    assert caught.value.code == "ek_certificate_unavailable"


def test_ek_cert_file_der_or_pem(tmp_path: Path) -> None:
    der = tmp_path / "ek.der"
    der.write_bytes(ek_cert())
    pem = tmp_path / "ek.pem"
    pem.write_bytes(_pem(ek_cert()))
    assert ekfetch.read_certificate_file(der, ek_public()) == ek_cert()
    assert ekfetch.read_certificate_file(pem, ek_public()) == ek_cert()
    with pytest.raises(JoinFailed, match="another key"):
        ekfetch.read_certificate_file(der, other_public())
    with pytest.raises(JoinUsageError, match="ek-cert-file"):
        ekfetch.read_certificate_file(tmp_path / "missing.der", ek_public())


# -- what nodegate join sends ----------------------------------------------------------------------


@dataclass
class FakeEk:
    public: bytes
    certificate: bytes | None


class FakeDevice:
    def __init__(self, cert: bytes | None, manufacturer: int) -> None:
        self.ek = FakeEk(ek_public(), cert)
        self._manufacturer = manufacturer
        self.asked = 0

    def require_ek(self) -> FakeEk:
        return self.ek

    async def manufacturer(self) -> int:
        self.asked += 1
        return self._manufacturer


def _opts(**kw: object) -> JoinOptions:
    return JoinOptions(server="https://join.example:8443", ca_bundle=Path("ca.pem"), node_name="n1", **kw)  # type: ignore[arg-type]


async def test_join_sends_nv_first_then_the_vendor_service(vendor: Vendor) -> None:
    in_nv = FakeDevice(b"nv-cert", ekfetch.AMD)
    assert await ek_certificate(in_nv, _opts()) == b"nv-cert"  # type: ignore[arg-type]
    assert in_nv.asked == 0
    vendor.answers[_key(ekfetch.AMD, ek_public())] = (200, ek_cert())
    ftpm = FakeDevice(None, ekfetch.AMD)
    assert await ek_certificate(ftpm, _opts(ek_cert_service=vendor.base)) == ek_cert()  # type: ignore[arg-type]
    assert await ek_certificate(ftpm, _opts(ek_cert_fetch=False)) is None  # type: ignore[arg-type]
    infineon = FakeDevice(None, int.from_bytes(b"IFX\0", "big"))
    assert await ek_certificate(infineon, _opts(ek_cert_service=vendor.base)) is None  # type: ignore[arg-type]


async def test_join_ek_cert_file_wins_over_nv(tmp_path: Path) -> None:
    path = tmp_path / "ek.der"
    path.write_bytes(ek_cert())
    device = FakeDevice(b"nv-cert", ekfetch.INTEL)
    assert await ek_certificate(device, _opts(ek_cert_file=path)) == ek_cert()  # type: ignore[arg-type]
    assert device.asked == 0


def test_join_flags() -> None:
    args = parser().parse_args(
        ["join", "--server", "https://s:8443", "--ca-bundle", "ca.pem", "--node-name", "n1",
         "--ek-cert-file", "ek.der", "--no-ek-cert-fetch", "--ek-cert-service", "http://mirror/"]
    )  # fmt: skip
    assert (args.ek_cert_file, args.ek_cert_fetch, args.ek_cert_service) == (
        Path("ek.der"),
        False,
        "http://mirror/",
    )
    default = parser().parse_args(["join", "--server", "https://s", "--ca-bundle", "c", "--node-name", "n"])
    assert (default.ek_cert_file, default.ek_cert_fetch, default.ek_cert_service) == (None, True, None)


@pytest.mark.swtpm
def test_the_tpm_reports_its_manufacturer(swtpm: TpmInfo) -> None:
    """swtpm reports IBM's id; Intel PTT "INTC" and AMD "AMD" select the vendor services."""
    with Agent(swtpm.tcti) as agent:
        assert ekfetch.manufacturer_name(agent.manufacturer()) == "IBM"
