"""Real answers of Intel's EK certificate service (ekop.intel.com) for real Intel PTT EKs
(the public test data's tpm/ftpm/, provenance in its manifest.json).

Every Intel PTT EK certificate published so far encodes DEFAULT values, which DER forbids (X.690
11.5): ``critical BOOLEAN FALSE`` in the subjectDirectoryAttributes extension and ``cA BOOLEAN
FALSE`` in basicConstraints (the bytes ``30 24 06 03 55 1d 09 01 01 00`` and ``30 03 01 01 00``).
``cryptography`` refuses them ("EncodedDefault"); Go's crypto/x509 (go-attestation) accepts them,
and so does ``attest.certparse`` as the ``encoded-default`` quirk, with every signature checked
over Intel's own bytes. The SPTH certificate verifies up to the Intel EK root in the shipped store;
the GLK intermediate is not public, so that one is refused as untrusted, not as malformed.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import unquote

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from cryptography import x509
from cryptography.x509.oid import ExtensionOID

from attest import certparse, tpm
from attest.errors import EkMismatch, EkUntrusted
from bootstrap.node import ekfetch
from bootstrap.service.join import ekroots
from tests.attest import ekbuild as b
from tests.support import realtpm
from tests.support.shared_data import shared

RSA_ANSWER = "ftpm/intel-ptt-ek-rsa-answer.json"
GLK_ANSWER = "ftpm/intel-ptt-ek-ecc-glk-answer.json"
RSA_EK_PUBLIC = "ftpm/intel-ptt-ek-rsa.pub"
ANSWERS = realtpm.named("ek-service-answer", "intel")
INTEL_ROOT = "CN=www.intel.com,OU=TPM EK root cert signing,O=Intel Corporation,L=Santa Clara,ST=CA,C=US"
BC_CA_FALSE = bytes.fromhex("3003010100")  # basicConstraints { cA FALSE }, DEFAULT encoded
SDA_CRITICAL_FALSE = bytes.fromhex("0603551d09010100")  # subjectDirectoryAttributes, critical FALSE


def _certificate(name: str) -> bytes:
    value = unquote(json.loads(realtpm.data(name))["certificate"])
    return base64.b64decode(value + "=" * (-len(value) % 4), altchars=b"-_", validate=True)


@pytest.fixture(scope="module")
def store() -> ekroots.Roots:
    """The public collection of vendor CAs (shared data), as an ``ek_roots`` folder loads it: it
    holds Intel's SPTH intermediate, which ``vendors`` gets from the AIA URL instead."""
    roots = ekroots.load_roots([shared("ek-roots").folder()])
    assert roots.skipped == ()
    return roots


def test_both_real_intel_answers_are_committed() -> None:
    assert ANSWERS == [GLK_ANSWER, RSA_ANSWER]


def test_the_real_rsa_answer_is_the_one_for_the_real_ptt_ek() -> None:
    """The answer and the EK public come from two projects; Intel's pubhash ties them together."""
    url = ekfetch.certificate_url(ekfetch.INTEL, realtpm.data(RSA_EK_PUBLIC))
    assert url is not None
    assert url.rsplit("/", 1)[1] == json.loads(realtpm.data(RSA_ANSWER))["pubhash"]


@pytest.mark.parametrize("name", ANSWERS)
def test_a_real_intel_ek_certificate_is_read_with_the_encoded_default_quirk(name: str) -> None:
    der = _certificate(name)
    assert BC_CA_FALSE in der  # the fixture carries the quirk
    assert SDA_CRITICAL_FALSE in der
    with pytest.raises(ValueError, match="EncodedDefault"):
        x509.load_der_x509_certificate(der)  # else the tests below prove nothing
    cert = certparse.read_certificate(der, "EK certificate")
    assert cert.quirks == (certparse.ENCODED_DEFAULT,)
    assert cert.der == der
    assert BC_CA_FALSE in cert.tbs  # Intel's bytes, as signed
    assert SDA_CRITICAL_FALSE in cert.tbs
    basic = cert.view.extensions.get_extension_for_class(x509.BasicConstraints)
    assert (basic.critical, basic.value.ca, basic.value.path_length) == (True, False, None)
    sda = cert.view.extensions.get_extension_for_oid(ExtensionOID.SUBJECT_DIRECTORY_ATTRIBUTES)
    assert sda.critical is False


def test_the_real_rsa_ptt_certificate_verifies_against_the_shipped_store(store: ekroots.Roots) -> None:
    der = _certificate(RSA_ANSWER)
    ident = tpm.verify_ek(
        realtpm.data(RSA_EK_PUBLIC), der, roots=store.anchors, intermediates=store.intermediates
    )
    assert ident.trusted_by == f"chain:{INTEL_ROOT}"
    assert ident.quirks == (certparse.ENCODED_DEFAULT,)
    assert [link.quirks for link in ident.links] == [(certparse.ENCODED_DEFAULT,), (), ()]
    assert "SPTH_EPID_PROD" in ident.links[1].name()
    assert all(store.listed[link.sha256].vendor == "intel" for link in ident.links[1:])
    assert ident.links[0].der == der


def test_the_real_rsa_certificate_does_not_vouch_for_another_ek(store: ekroots.Roots) -> None:
    with pytest.raises(EkMismatch) as caught:
        tpm.verify_ek(
            realtpm.data("ftpm/intel-ptt-ek-ecc.pub"),
            _certificate(RSA_ANSWER),
            roots=store.anchors,
            intermediates=store.intermediates,
        )
    assert caught.value.code == "ek_mismatch"


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (b"491231235959Z", b"491231235958Z"),  # notAfter one second earlier
        # the model in the SAN directoryName (TPMModel "SPT") changed by one letter
        (bytes.fromhex("0c03535054"), bytes.fromhex("0c03535055")),
    ],
)
def test_the_real_rsa_certificate_with_its_tbs_changed_is_refused(
    store: ekroots.Roots, old: bytes, new: bytes
) -> None:
    der = _certificate(RSA_ANSWER)
    assert der.count(old) == 1
    with pytest.raises(EkUntrusted, match="does not verify") as caught:
        tpm.verify_ek(
            realtpm.data(RSA_EK_PUBLIC),
            der.replace(old, new),
            roots=store.anchors,
            intermediates=store.intermediates,
        )
    assert caught.value.code == "ek_untrusted"


def test_the_real_rsa_certificate_re_encoded_as_der_is_refused(store: ekroots.Roots) -> None:
    """The canonical copy (defaults dropped) loads in ``cryptography``, but Intel signed the other
    bytes: verification is over the original TBS, so the re-encoding does not verify."""
    der = _certificate(RSA_ANSWER)
    cert = certparse.read_certificate(der)
    strict_tbs = cert.view.tbs_certificate_bytes  # the canonical copy certparse decoded
    assert len(strict_tbs) == len(cert.tbs) - 6  # 01 01 00 twice, nothing else
    _tbs, algorithm, _signature = b.children(der)
    reencoded = b.assemble(strict_tbs, algorithm, cert.signature)
    _ = x509.load_der_x509_certificate(reencoded).extensions  # strict DER now
    with pytest.raises(EkUntrusted, match="does not verify"):
        tpm.verify_ek(
            realtpm.data(RSA_EK_PUBLIC), reencoded, roots=store.anchors, intermediates=store.intermediates
        )


def test_the_real_glk_certificate_is_untrusted_for_its_missing_intermediate(store: ekroots.Roots) -> None:
    """Its issuer ("TPM EK intermediate for GLK_EPID_PROD pid:7") is not public: refused as
    ek_untrusted, no longer as malformed."""
    cert = certparse.read_certificate(_certificate(GLK_ANSWER))
    assert "GLK_EPID_PROD" in cert.issuer.rfc4514_string()
    assert not any(c.subject == cert.issuer for c in (*store.anchors, *store.intermediates))
    with pytest.raises(EkUntrusted) as caught:
        tpm.verify_ek(
            realtpm.ek_public_for(cert.key),
            cert.der,
            roots=store.anchors,
            intermediates=store.intermediates,
        )
    assert caught.value.code == "ek_untrusted"
    assert "no configured EK root or intermediate is named" in str(caught.value)
    assert "GLK_EPID_PROD" in str(caught.value)


def test_join_accepts_the_real_intel_answer_file_for_its_own_ek(tmp_path: Path) -> None:
    """``nodegate join --ek-cert-file`` with the service's genuine answer, saved as it came."""
    answer = tmp_path / "ek-cert.json"
    answer.write_bytes(realtpm.data(RSA_ANSWER))
    got = ekfetch.read_certificate_file(answer, realtpm.data(RSA_EK_PUBLIC))
    assert got == _certificate(RSA_ANSWER)


@pytest.fixture
async def intel_service() -> AsyncIterator[str]:
    """A local server that answers Intel's path for the real PTT EK with Intel's real answer."""
    body = realtpm.data(RSA_ANSWER)
    pubhash = json.loads(body)["pubhash"]
    seen: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append(request.raw_path)
        if request.raw_path != f"/ekcertservice/{pubhash}":
            return web.Response(status=404)
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("/ekcertservice/"))
    finally:
        await server.close()
    assert seen == [f"/ekcertservice/{pubhash}"]


async def test_join_fetch_accepts_the_real_intel_answer(intel_service: str) -> None:
    got = await ekfetch.fetch_certificate(ekfetch.INTEL, realtpm.data(RSA_EK_PUBLIC), service=intel_service)
    assert got == _certificate(RSA_ANSWER)
