"""``ek_roots: [vendors]`` with Debian's ruby-tpm-key-attestation roots, through the running
service: real EK certificates of Infineon, STMicro, Nuvoton and Intel PTT join-start with their
intermediates fetched from AIA URLs (a loopback server stands in for the vendors' hosts through
``ek_aia.mirrors``), or sent by the node (``ek_chain``); an intermediate that does not chain adds
no trust; a private address is not fetched by default (docs/ek-roots.md). The same story runs in
the built image (tests/image/test_image_ekroots.py)."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import AuthorityInformationAccessOID, NameOID

from bootstrap.config import settings_from_obj
from bootstrap.service.join import ekroots, vendorroots
from tests.support.ekvendors import (
    AIA_INTERMEDIATES,
    MAKERS_EKS,
    RealEk,
    aia_server,
    collection_der,
    real_ek,
    vendor_folder,
)
from tests.support.service import running
from tests.support.softnode import SoftNode, b64, post
from tests.support.softtpm import SoftTpm


@pytest.fixture
def vendors(monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = vendor_folder()
    monkeypatch.setenv(vendorroots.STORE_ENV, str(folder))
    return folder


def config(tmp_path: Path, **over: Any) -> Any:
    doc: dict[str, Any] = {
        "trust_domain": "fleet.test",
        "listen": "127.0.0.1:0",
        "state_dir": str(tmp_path / "state"),
        "ek_roots": ["vendors"],
        "server_names": ["localhost", "127.0.0.1"],
        "admission": {"listen": "127.0.0.1:0"},
    }
    doc.update(over)
    return settings_from_obj(doc)


def start_body(ek: RealEk | None, name: str = "node-1", **over: Any) -> dict[str, Any]:
    body = SoftNode(SoftTpm.create(), name).start_body()
    if ek is not None:
        body["ek_public"] = b64(ek.ek_public)
        body["ek_certificate"] = b64(ek.der)
    body.update(over)
    return body


# -- the store ---------------------------------------------------------------------------------


def test_vendors_is_the_tpm_makers_roots_of_the_package(vendors: Path) -> None:
    roots = ekroots.load_roots([Path(ekroots.VENDORS)])
    assert roots.skipped == ()
    listed = {e.vendor for e in roots.listed.values()}
    assert listed == {"amd", "atmel", "infineon", "intel", "nationz", "nuvoton", "stmicro"}
    assert len(roots.anchors) + len(roots.intermediates) == len(vendorroots.FILES) - 1
    assert set(roots.provenance.values()) == {ekroots.PACKAGE}
    # Microsoft's root in the package certifies Windows AIKs, not EKs: left out, and said why.
    ((path, why),) = roots.left_out
    assert path.name == "Microsoft TPM Root Certificate Authority 2014.cer"
    assert "AIK" in why
    from attest import cloudek

    assert not {c.sha256 for c in roots.anchors + roots.intermediates} & set(cloudek.KNOWN_CLOUD_CAS)


def test_a_package_file_whose_bytes_differ_is_refused(
    vendors: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    copy = tmp_path / "store"
    shutil.copytree(vendors, copy)
    target = copy / "Infineon/RootCA/Infineon OPTIGA(TM) RSA Root CA.crt"
    target.write_bytes(target.read_bytes() + b"\n")
    (copy / "Infineon/RootCA/extra.cer").write_bytes(
        collection_der(AIA_INTERMEDIATES[next(iter(AIA_INTERMEDIATES))])
    )
    monkeypatch.setenv(vendorroots.STORE_ENV, str(copy))
    roots = ekroots.load_roots([Path(ekroots.VENDORS)])
    why = dict((p.name, w) for p, w in roots.skipped)
    assert "differs from ruby-tpm-key-attestation 0.11.0-1's" in why["Infineon OPTIGA(TM) RSA Root CA.crt"]
    assert "not a file of ruby-tpm-key-attestation" in why["extra.cer"]
    assert not any("Infineon OPTIGA(TM) RSA Root CA" in c.name() for c in roots.anchors)


# -- joins through the running service -----------------------------------------------------------


@pytest.mark.parametrize("name", sorted(MAKERS_EKS))
async def test_real_ek_certificates_start_with_intermediates_from_aia(
    name: str, vendors: Path, tmp_path: Path
) -> None:
    ek = real_ek(name)
    async with aia_server() as aia:
        settings = config(tmp_path, ek_aia={"mirrors": aia.mirrors, "allow_private_addresses": True})
        async with running(settings) as svc, svc.http() as http:
            status, body = await post(http, f"{svc.base}/v1/join/start", start_body(ek))
            assert status == 200, body
            again, _ = await post(http, f"{svc.base}/v1/join/start", start_body(ek, "node-2"))
            assert again == 200
    fetched = sum(aia.hits.values())
    assert fetched == (0 if MAKERS_EKS[name] == "nuvoton" else 1)  # once: the second join used the cache
    cache = ekroots.fetched_cache(tmp_path / "state")
    files = list(cache.glob("*.der"))
    assert len(files) == fetched
    assert all(f.stat().st_mode & 0o777 == 0o600 for f in files)


async def test_without_aia_the_intermediate_is_missing(vendors: Path, tmp_path: Path) -> None:
    ek = real_ek("ek/infineon-ek-rsa-mfr-ca022.der")
    settings = config(tmp_path, ek_aia={"enabled": False})
    async with running(settings) as svc, svc.http() as http:
        status, body = await post(http, f"{svc.base}/v1/join/start", start_body(ek))
    assert (status, body["code"]) == (403, "ek_untrusted")


async def test_an_aia_url_to_a_private_address_is_not_fetched_by_default(
    vendors: Path, tmp_path: Path
) -> None:
    ek = real_ek("ek/stmicro-ek-rsa.der")
    async with aia_server() as aia:
        settings = config(tmp_path, ek_aia={"mirrors": aia.mirrors})  # allow_private_addresses: false
        async with running(settings) as svc, svc.http() as http:
            status, body = await post(http, f"{svc.base}/v1/join/start", start_body(ek))
    assert (status, body["code"]) == (403, "ek_untrusted")
    assert "not a public address" in body["detail"]
    assert aia.hits == {}


async def test_an_intermediate_that_does_not_chain_adds_no_trust(vendors: Path, tmp_path: Path) -> None:
    """The Infineon AIA URL answers with STMicro's intermediate: a genuine CA, the wrong one."""
    ek = real_ek("ek/infineon-ek-rsa-mfr-ca022.der")
    url = "http://pki.infineon.com/OptigaRsaMfrCA022/OptigaRsaMfrCA022.crt"
    wrong = collection_der("stmicro/STM-TPM-EK-Intermediate-CA-05-870fc181411d.pem")
    async with aia_server({url: wrong}) as aia:
        settings = config(tmp_path, ek_aia={"mirrors": aia.mirrors, "allow_private_addresses": True})
        async with running(settings) as svc, svc.http() as http:
            status, body = await post(http, f"{svc.base}/v1/join/start", start_body(ek))
    assert (status, body["code"]) == (403, "ek_untrusted")
    assert aia.hits == {url: 1}


# -- a vendor CA of our own: AIA URLs that serve roots, literal private addresses ------------------


def _ca(
    name: str, issuer: tuple[ec.EllipticCurvePrivateKey, x509.Name] | None = None
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    signer, issuer_name = issuer if issuer is not None else (key, subject)
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1))
        .not_valid_after(now + timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(signer, hashes.SHA256())
    )
    return key, cert


def _with_aia(der: bytes, key: ec.EllipticCurvePrivateKey, url: str) -> bytes:
    """The soft TPM's EK certificate re-issued with a caIssuers URL."""
    cert = x509.load_der_x509_certificate(der)
    b = (
        x509.CertificateBuilder()
        .subject_name(cert.subject)
        .issuer_name(cert.issuer)
        .public_key(cert.public_key())  # type: ignore[arg-type]  # an EC or RSA key
        .serial_number(cert.serial_number)
        .not_valid_before(cert.not_valid_before_utc)
        .not_valid_after(cert.not_valid_after_utc)
    )
    for ext in cert.extensions:
        b = b.add_extension(ext.value, ext.critical)
    aia = x509.AuthorityInformationAccess(
        [
            x509.AccessDescription(
                AuthorityInformationAccessOID.CA_ISSUERS, x509.UniformResourceIdentifier(url)
            )
        ]
    )
    return (
        b.add_extension(aia, critical=False)
        .sign(key, hashes.SHA256())
        .public_bytes(serialization.Encoding.DER)
    )


async def test_a_fetched_root_is_never_an_anchor(tmp_path: Path) -> None:
    """An attacker's EK certificate whose AIA URL serves the attacker's own self-signed CA."""
    key, own_root = _ca("attacker TPM root")
    tpm = SoftTpm.create()
    url = "http://pki.attacker.test/root.crt"
    der = _with_aia(tpm.ek_certificate(key, own_root), key, url)
    _vendor_key, vendor = _ca("configured vendor root")
    roots = tmp_path / "vendor.pem"
    roots.write_bytes(vendor.public_bytes(serialization.Encoding.PEM))
    async with aia_server({url: own_root.public_bytes(serialization.Encoding.DER)}) as aia:
        settings = config(
            tmp_path, ek_roots=[str(roots)], ek_aia={"mirrors": aia.mirrors, "allow_private_addresses": True}
        )
        async with running(settings) as svc, svc.http() as http:
            body = SoftNode(tpm, "node-1", der).start_body()
            status, answer = await post(http, f"{svc.base}/v1/join/start", body)
    assert (status, answer["code"]) == (403, "ek_untrusted")
    assert aia.hits == {url: 1}  # fetched, and still no trust


async def test_a_literal_private_aia_address_is_not_fetched_by_default(tmp_path: Path) -> None:
    vendor_key, vendor = _ca("vendor root")
    inter_key, inter = _ca("vendor intermediate", (vendor_key, vendor.subject))
    tpm = SoftTpm.create()
    async with aia_server({}) as aia:
        url = f"{aia.base}/http/vendor.test/inter.crt"  # a loopback address in the certificate
        aia.served["http://vendor.test/inter.crt"] = inter.public_bytes(serialization.Encoding.DER)
        der = _with_aia(tpm.ek_certificate(inter_key, inter), inter_key, url)
        roots = tmp_path / "vendor.pem"
        roots.write_bytes(vendor.public_bytes(serialization.Encoding.PEM))
        body = SoftNode(tpm, "node-1", der).start_body()
        for allow, expected in ((False, 403), (True, 200)):
            settings = config(
                tmp_path / str(allow), ek_roots=[str(roots)], ek_aia={"allow_private_addresses": allow}
            )
            async with running(settings) as svc, svc.http() as http:
                status, answer = await post(http, f"{svc.base}/v1/join/start", body)
            assert status == expected, answer
        assert sum(aia.hits.values()) == 1  # only with allow_private_addresses


async def test_intermediates_the_node_sends_help_like_fetched_ones(vendors: Path, tmp_path: Path) -> None:
    ek = real_ek("ek/stmicro-ek-ecc.der")
    right = collection_der("stmicro/STM-TPM-ECC-Intermediate-CA-01-015bcfc39435.pem")
    wrong = collection_der("stmicro/STM-TPM-EK-Intermediate-CA-05-870fc181411d.pem")
    settings = config(tmp_path, ek_aia={"enabled": False})
    async with running(settings) as svc, svc.http() as http:
        ok, _ = await post(http, f"{svc.base}/v1/join/start", start_body(ek, ek_chain=[b64(right)]))
        bad, body = await post(
            http, f"{svc.base}/v1/join/start", start_body(ek, "node-2", ek_chain=[b64(wrong)])
        )
        junk, junk_body = await post(
            http,
            f"{svc.base}/v1/join/start",
            start_body(ek, "node-3", ek_chain=[base64.b64encode(b"x").decode()]),
        )
        many, _ = await post(
            http, f"{svc.base}/v1/join/start", start_body(ek, "node-4", ek_chain=[b64(right)] * 5)
        )
    assert ok == 200
    assert (bad, body["code"]) == (403, "ek_untrusted")
    assert (junk, junk_body["code"]) == (400, "malformed_request")
    assert many == 400
