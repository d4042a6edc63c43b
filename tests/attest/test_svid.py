"""SPIFFE IDs, X.509-SVID issuance and verification, SPIFFE bundles."""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import json
import subprocess
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, ExtensionOID, NameOID
from hypothesis import given
from hypothesis import strategies as st

from attest import ca, svid
from attest.svid import BundleInvalid, SpiffeId, SpiffeIdError, SvidInvalid

NOW = datetime(2026, 7, 1, 12, 0, tzinfo=UTC)
TD = "example.org"
NODE_PATH = "/node/worker-1"
NODE_URI = f"spiffe://{TD}{NODE_PATH}"
EK = "ab" * 32


@pytest.fixture(scope="module")
def authority() -> ca.Authority:
    return ca.new_authority(TD, now=NOW - timedelta(days=1))


@pytest.fixture(scope="module")
def node_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def node_id() -> SpiffeId:
    """The node's SPIFFE ID, built when a test runs (the constructor validates)."""
    return SpiffeId(TD, NODE_PATH)


def _issue(authority: ca.Authority, key: ec.EllipticCurvePrivateKey, **kw: Any) -> x509.Certificate:
    args: dict[str, Any] = {"spiffe_id": node_id(), "public_key": key.public_key(), "now": NOW}
    args["ttl"] = timedelta(hours=1)
    args.update(kw)
    return svid.issue_svid(authority, **args)


# -- SPIFFE IDs --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("spiffe://example.org", "spiffe://example.org"),
        ("spiffe://example.org/node/worker-1", "spiffe://example.org/node/worker-1"),
        ("spiffe://td_1.example-x/A.b_c-D/9", "spiffe://td_1.example-x/A.b_c-D/9"),
        ("spiffe://10.0.0.1/x", "spiffe://10.0.0.1/x"),
        ("spiffe://example.org/...", "spiffe://example.org/..."),
        # Scheme and trust domain are case-insensitive on parse; the path keeps its case.
        ("SPIFFE://Example.ORG/Node/X", "spiffe://example.org/Node/X"),
        ("Spiffe://EXAMPLE.org", "spiffe://example.org"),
    ],
)
def test_parse_accepts_and_canonicalises(text: str, canonical: str) -> None:
    sid = svid.parse_spiffe_id(text)
    assert str(sid) == canonical
    assert svid.parse_spiffe_id(str(sid)) == sid


def test_parse_splits_trust_domain_and_path() -> None:
    assert svid.parse_spiffe_id("spiffe://example.org/a/b") == SpiffeId("example.org", "/a/b")
    root = svid.parse_spiffe_id("spiffe://example.org")
    assert root.path == ""
    assert root.is_trust_domain_id


def test_length_limits_are_exact() -> None:
    td255 = "a" * 255
    assert svid.parse_spiffe_id(f"spiffe://{td255}").trust_domain == td255
    path = "/" + "p" * (2048 - len("spiffe://example.org") - 1)
    ok = f"spiffe://example.org{path}"
    assert len(ok) == 2048
    assert str(svid.parse_spiffe_id(ok)) == ok
    with pytest.raises(SpiffeIdError, match="2048"):
        svid.parse_spiffe_id(ok + "p")
    with pytest.raises(SpiffeIdError, match="255"):
        svid.parse_spiffe_id("spiffe://" + "a" * 256 + "/x")


@pytest.mark.parametrize(
    "text",
    [
        "spiffe://example.org/a\n",  # py-spiffe accepts this one
        "spiffe://example.org\n",
        "\nspiffe://example.org/a",
        "spiffe://example.org/a b",
        "spiffe://example.org/a%20b",
        "spiffe://exa%6dple.org/a",
        "spiffe://example.org:8443/a",
        "spiffe://user@example.org/a",
        "spiffe://example.org/a?x=1",
        "spiffe://example.org/a#frag",
        "spiffe://example.org?x",
        "spiffe://example.org/a//b",
        "spiffe://example.org//a",
        "spiffe://example.org/a/./b",
        "spiffe://example.org/a/../b",
        "spiffe://example.org/.",
        "spiffe://example.org/..",
        "spiffe://example.org/a/",
        "spiffe://example.org/",
        "spiffe:///a",
        "spiffe://",
        "spiffe:/example.org/a",
        "http://example.org/a",
        "example.org/a",
        "",
        "spiffe://[::1]/a",
        "spiffe://exa*mple.org/a",
        "spiffe://example.org/caf\u00e9",
        "spiffe://\u212aexample.org/a",  # Kelvin sign: lowercases to "k" with str.lower()
        "spiffe://example.org/a\x00",
    ],
)
def test_parse_rejects(text: str) -> None:
    with pytest.raises(SpiffeIdError):
        svid.parse_spiffe_id(text)


@pytest.mark.parametrize("value", [None, b"spiffe://example.org/a", 5, ["spiffe://example.org/a"]])
def test_parse_rejects_non_str(value: Any) -> None:
    with pytest.raises(SpiffeIdError):
        svid.parse_spiffe_id(value)


def test_spiffe_id_construction_validates() -> None:
    with pytest.raises(SpiffeIdError):
        SpiffeId("Example.org", "/a")  # the dataclass holds canonical values only
    with pytest.raises(SpiffeIdError):
        SpiffeId("example.org", "a")
    with pytest.raises(SpiffeIdError):
        SpiffeId("example.org", "/a/")


def test_validate_trust_domain_requires_canonical_name() -> None:
    assert svid.validate_trust_domain("prod.example.org") == "prod.example.org"
    for bad in ("Example.org", "", "spiffe://example.org", "a" * 256, "example.org:1", "ex ample", 7):
        with pytest.raises(SpiffeIdError):
            svid.validate_trust_domain(bad)  # type: ignore[arg-type]


_td = st.text("abcdefghijklmnopqrstuvwxyz0123456789._-", min_size=1, max_size=60)
_segment = st.text("ABCXYZabcxyz0189._-", min_size=1, max_size=20).filter(lambda s: s not in (".", ".."))


@given(td=_td, segments=st.lists(_segment, max_size=8), upper=st.booleans())
def test_round_trip_of_generated_ids(td: str, segments: list[str], upper: bool) -> None:
    text = "spiffe://" + td + "".join("/" + s for s in segments)
    sid = svid.parse_spiffe_id(text.upper()[:9] + td.upper() + text[9 + len(td) :] if upper else text)
    assert str(sid) == text
    assert sid.trust_domain == td
    assert svid.parse_spiffe_id(str(sid)) == sid


@given(
    st.text(max_size=300) | st.text("spifeSPIFE:/%@?#.\n-_aZ09", max_size=40).map(lambda s: "spiffe://" + s)
)
def test_arbitrary_text_raises_only_spiffe_id_error(text: str) -> None:
    try:
        sid = svid.parse_spiffe_id(text)
    except SpiffeIdError:
        return
    assert str(sid).lower() == text.lower()


# -- templates ---------------------------------------------------------------------------------


def test_render_default_and_ek_templates() -> None:
    sid = svid.render_spiffe_id(
        "spiffe://{trust_domain}/node/{node_name}", trust_domain=TD, node_name="gpu-7", ek_sha256=EK
    )
    assert str(sid) == "spiffe://example.org/node/gpu-7"
    sid = svid.render_spiffe_id(
        "spiffe://{trust_domain}/node/tpm/{ek_sha256}", trust_domain=TD, node_name="n", ek_sha256=EK
    )
    assert sid.path == f"/node/tpm/{EK}"


@pytest.mark.parametrize(
    ("template", "node_name", "match"),
    [
        ("spiffe://{trust_domain}/node/{hostname}", "n1", "unknown placeholder"),
        ("spiffe://{trust_domain}/node/{node_name!r}", "n1", "format or conversion"),
        ("spiffe://{trust_domain}/node/{node_name:>10}", "n1", "format or conversion"),
        ("spiffe://{trust_domain}/node/{node_name.upper}", "n1", "unknown placeholder"),
        ("spiffe://{trust_domain}/node/{node_name[0]}", "n1", "unknown placeholder"),
        ("spiffe://{trust_domain}/node/{node_name", "n1", "template"),
        ("spiffe://{trust_domain}/node/{{x}}", "n1", "segment"),
        ("spiffe://{trust_domain}/node/{node_name}", "a/b", "path segment"),
        ("spiffe://{trust_domain}/node/{node_name}", "..", "path segment"),
        ("spiffe://{trust_domain}/node/{node_name}", "", "path segment"),
        ("spiffe://{node_name}/x", "other.org", "not in trust domain"),
        ("spiffe://{trust_domain}", "n1", "no path"),
        ("spiffe://other.org/node/{node_name}", "n1", "not in trust domain"),
        ("https://{trust_domain}/node/{node_name}", "n1", "spiffe://"),
    ],
)
def test_render_rejects(template: str, node_name: str, match: str) -> None:
    with pytest.raises(SpiffeIdError, match=match):
        svid.render_spiffe_id(template, trust_domain=TD, node_name=node_name, ek_sha256=EK)


def test_render_rejects_bad_trust_domain() -> None:
    with pytest.raises(SpiffeIdError):
        svid.render_spiffe_id("spiffe://{trust_domain}/n", trust_domain="Bad TD", node_name="n", ek_sha256=EK)


# -- issuance ----------------------------------------------------------------------------------


def test_issued_svid_extensions(authority: ca.Authority, node_key: ec.EllipticCurvePrivateKey) -> None:
    leaf = _issue(authority, node_key)
    exts = leaf.extensions
    assert leaf.subject == x509.Name([])
    assert leaf.issuer == authority.certificate.subject
    assert leaf.serial_number > 0
    assert leaf.serial_number.bit_length() >= 64
    assert leaf.signature_hash_algorithm is not None
    assert leaf.signature_hash_algorithm.name == "sha256"
    assert leaf.not_valid_before_utc == NOW - timedelta(seconds=60)
    assert leaf.not_valid_after_utc == NOW + timedelta(hours=1)
    assert leaf.public_key() == node_key.public_key()

    san = exts.get_extension_for_class(x509.SubjectAlternativeName)
    assert san.critical
    assert list(san.value) == [x509.UniformResourceIdentifier("spiffe://example.org/node/worker-1")]
    bc = exts.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical
    assert bc.value.ca is False
    assert bc.value.path_length is None
    ku = exts.get_extension_for_class(x509.KeyUsage)
    assert ku.critical
    assert ku.value.digital_signature
    assert not any(
        (
            ku.value.content_commitment,
            ku.value.key_encipherment,
            ku.value.data_encipherment,
            ku.value.key_agreement,
            ku.value.key_cert_sign,
            ku.value.crl_sign,
        )
    )
    eku = exts.get_extension_for_class(x509.ExtendedKeyUsage)
    assert set(eku.value) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    ca_ski = authority.certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    aki = exts.get_extension_for_class(x509.AuthorityKeyIdentifier)
    assert not aki.critical
    assert aki.value.key_identifier == ca_ski.digest
    ski = exts.get_extension_for_class(x509.SubjectKeyIdentifier)
    assert ski.value == x509.SubjectKeyIdentifier.from_public_key(node_key.public_key())
    assert len(exts) == 6
    leaf.verify_directly_issued_by(authority.certificate)


def test_issue_with_dns_and_ip_sans(authority: ca.Authority, node_key: ec.EllipticCurvePrivateKey) -> None:
    leaf = _issue(
        authority,
        node_key,
        dns_names=["NodeGate.kube-system.svc", "localhost"],
        ip_addresses=[ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")],
    )
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == [NODE_URI]
    assert san.get_values_for_type(x509.DNSName) == ["nodegate.kube-system.svc", "localhost"]
    assert len(san.get_values_for_type(x509.IPAddress)) == 2
    assert (
        svid.verify_svid(leaf, roots=[authority.certificate], trust_domain=TD, now=NOW, usage="server")
        == node_id()
    )


def test_issue_caps_lifetime_at_signer_expiry(node_key: ec.EllipticCurvePrivateKey) -> None:
    short = ca.new_authority(TD, now=NOW, ttl=timedelta(minutes=30))
    leaf = _issue(short, node_key)
    assert leaf.not_valid_after_utc == short.certificate.not_valid_after_utc


def test_issue_accepts_rsa_and_p384(authority: ca.Authority) -> None:
    for key in (rsa.generate_private_key(65537, 2048), ec.generate_private_key(ec.SECP384R1())):
        leaf = svid.issue_svid(
            authority, spiffe_id=node_id(), public_key=key.public_key(), now=NOW, ttl=timedelta(hours=1)
        )
        assert svid.verify_svid(leaf, roots=[authority.certificate], trust_domain=TD, now=NOW) == node_id()


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda: {"spiffe_id": SpiffeId(TD, "")}, "trust-domain ID"),
        (lambda: {"spiffe_id": SpiffeId("other.org", "/node/x")}, "trust domain"),
        (lambda: {"ttl": timedelta(0)}, "ttl"),
        (lambda: {"now": datetime(2026, 7, 1, 12)}, "timezone-aware"),
        (lambda: {"now": NOW + timedelta(days=4000)}, "expired"),
        (lambda: {"dns_names": ["bad_name.example"]}, "DNS name"),
        (lambda: {"dns_names": ["-x.example"]}, "DNS name"),
    ],
    ids=[
        "trust-domain-id",
        "other-trust-domain",
        "zero-ttl",
        "naive-now",
        "past-ca-expiry",
        "underscore-dns-name",
        "hyphen-dns-name",
    ],
)
def test_issue_rejects(
    authority: ca.Authority,
    node_key: ec.EllipticCurvePrivateKey,
    change: Callable[[], dict[str, Any]],
    match: str,
) -> None:
    with pytest.raises(ValueError, match=match):
        _issue(authority, node_key, **change())


def test_issue_rejects_weak_keys(authority: ca.Authority) -> None:
    weak_rsa = rsa.generate_private_key(65537, 1024)  # noqa: S505 - a weak key is the point here
    for key in (weak_rsa, ec.generate_private_key(ec.SECP521R1())):
        with pytest.raises(ValueError, match="key"):
            svid.issue_svid(
                authority, spiffe_id=node_id(), public_key=key.public_key(), now=NOW, ttl=timedelta(hours=1)
            )


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def test_openssl_accepts_the_svid(
    authority: ca.Authority, node_key: ec.EllipticCurvePrivateKey, tmp_path: Path
) -> None:
    (tmp_path / "root.pem").write_bytes(_pem(authority.certificate))
    (tmp_path / "leaf.pem").write_bytes(_pem(_issue(authority, node_key)))
    for purpose in ("sslclient", "sslserver"):
        result = subprocess.run(
            [
                *("openssl", "verify", "-x509_strict", "-attime", str(int(NOW.timestamp()))),
                *("-CAfile", "root.pem", "-purpose", purpose, "leaf.pem"),
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "leaf.pem: OK" in result.stdout
    text = subprocess.run(
        ["openssl", "x509", "-in", "leaf.pem", "-noout", "-text"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "X509v3 Subject Alternative Name: critical" in text
    assert "URI:spiffe://example.org/node/worker-1" in text
    assert "X509v3 Basic Constraints: critical" in text
    assert "CA:FALSE" in text
    assert "X509v3 Key Usage: critical" in text
    assert "Digital Signature" in text
    assert "Certificate Sign" not in text
    assert "TLS Web Server Authentication, TLS Web Client Authentication" in text
    assert "ecdsa-with-SHA256" in text


# -- verification ------------------------------------------------------------------------------


def _ku_digital() -> x509.KeyUsage:
    return x509.KeyUsage(True, False, False, False, False, False, False, False, False)


_BOTH = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
_Mutator = Callable[[dict[str, Any]], None]


def _forge(
    issuer: ca.Authority,
    key: ec.EllipticCurvePrivateKey,
    mutate: _Mutator = lambda spec: None,
) -> x509.Certificate:
    """A leaf like issue_svid's, with one aspect changed by ``mutate`` (on a spec dict)."""
    ski = issuer.certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    spec: dict[str, Any] = {
        "subject": x509.Name([]),
        "not_before": NOW - timedelta(minutes=1),
        "not_after": NOW + timedelta(hours=1),
        "signing_key": issuer.key,
        "ext": {
            x509.SubjectAlternativeName.oid: (
                x509.SubjectAlternativeName([x509.UniformResourceIdentifier(NODE_URI)]),
                True,
            ),
            x509.BasicConstraints.oid: (x509.BasicConstraints(ca=False, path_length=None), True),
            x509.KeyUsage.oid: (_ku_digital(), True),
            x509.ExtendedKeyUsage.oid: (x509.ExtendedKeyUsage(_BOTH), False),
            x509.SubjectKeyIdentifier.oid: (
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                False,
            ),
            x509.AuthorityKeyIdentifier.oid: (
                x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski),
                False,
            ),
        },
    }
    mutate(spec)
    builder = (
        x509.CertificateBuilder()
        .subject_name(spec["subject"])
        .issuer_name(issuer.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(spec["not_before"])
        .not_valid_after(spec["not_after"])
    )
    for value, critical in spec["ext"].values():
        builder = builder.add_extension(value, critical=critical)
    return builder.sign(spec["signing_key"], hashes.SHA256())


def _set_ext(make: Callable[[], x509.ExtensionType], critical: bool) -> _Mutator:
    """Sets the extension ``make()`` builds when the case runs: built at import time, a value the
    installed cryptography refuses would break the collection of the whole module."""

    def mutate(spec: dict[str, Any]) -> None:
        value = make()
        spec["ext"][value.oid] = (value, critical)

    return mutate


def _drop_ext(cls: type[x509.ExtensionType]) -> _Mutator:
    return lambda spec: spec["ext"].pop(cls.oid)


def _uris(*uris: str) -> _Mutator:
    return _set_ext(
        lambda: x509.SubjectAlternativeName([x509.UniformResourceIdentifier(u) for u in uris]), True
    )


def _empty_san() -> x509.UnrecognizedExtension:
    """A subjectAltName with no names (DER ``30 00``): RFC 5280 forbids it and cryptography >= 51
    will not build one, but a forger's certificate can carry it."""
    return x509.UnrecognizedExtension(ExtensionOID.SUBJECT_ALTERNATIVE_NAME, b"\x30\x00")


def _set(field: str, value: Any) -> _Mutator:
    return lambda spec: spec.__setitem__(field, value)


def test_forged_baseline_verifies(authority: ca.Authority, node_key: ec.EllipticCurvePrivateKey) -> None:
    leaf = _forge(authority, node_key)
    for usage in ("client", "server"):
        assert (
            svid.verify_svid(leaf, roots=[authority.certificate], trust_domain=TD, now=NOW, usage=usage)
            == node_id()
        )


def test_verify_accepts_issued_svid_and_missing_eku(
    authority: ca.Authority, node_key: ec.EllipticCurvePrivateKey
) -> None:
    leaf = _issue(authority, node_key)
    assert svid.verify_svid(leaf, roots=[authority.certificate], trust_domain=TD, now=NOW) == node_id()
    no_eku = _forge(authority, node_key, _drop_ext(x509.ExtendedKeyUsage))  # EKU is only a SHOULD
    assert svid.verify_svid(no_eku, roots=[authority.certificate], trust_domain=TD, now=NOW) == node_id()


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (_set_ext(lambda: x509.BasicConstraints(ca=True, path_length=None), True), "CA certificate"),
        (_drop_ext(x509.BasicConstraints), "basicConstraints"),
        (_uris(NODE_URI, "spiffe://example.org/node/other"), "exactly one URI SAN"),
        (_set_ext(_empty_san, True), "exactly one URI SAN|undecodable extensions"),
        (
            _set_ext(lambda: x509.SubjectAlternativeName([x509.DNSName("a.example")]), True),
            "exactly one URI SAN",
        ),
        (_uris("spiffe://example.org"), "trust-domain ID"),
        (_uris("spiffe://other.org/node/worker-1"), "not in trust domain"),
        (_uris("spiffe://example.org/a/../b"), "not a valid SPIFFE ID"),
        (_uris("https://example.org/node/worker-1"), "not a valid SPIFFE ID"),
        (_set("not_after", NOW - timedelta(seconds=1)), "expired"),
        (_set("not_before", NOW + timedelta(seconds=1)), "not valid before"),
        (
            _set_ext(
                lambda: x509.KeyUsage(True, False, False, False, False, True, False, False, False), True
            ),
            "keyCertSign",
        ),
        (
            _set_ext(
                lambda: x509.KeyUsage(True, False, False, False, False, False, True, False, False), True
            ),
            "cRLSign",
        ),
        (
            _set_ext(
                lambda: x509.KeyUsage(False, False, True, False, False, False, False, False, False), True
            ),
            "digitalSig",
        ),
        (_drop_ext(x509.KeyUsage), "no keyUsage"),
        (_set_ext(_ku_digital, False), "not critical"),
        (_set_ext(lambda: x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False), "clientAuth"),
        (
            _set_ext(lambda: x509.SubjectAlternativeName([x509.UniformResourceIdentifier(NODE_URI)]), False),
            "non-critical subjectAltName",
        ),
        (_drop_ext(x509.AuthorityKeyIdentifier), "does not chain"),
    ],
)
def test_verify_rejects(
    authority: ca.Authority, node_key: ec.EllipticCurvePrivateKey, mutate: _Mutator, match: str
) -> None:
    leaf = _forge(authority, node_key, mutate)
    with pytest.raises(SvidInvalid, match=match) as info:
        svid.verify_svid(leaf, roots=[authority.certificate], trust_domain=TD, now=NOW)
    assert info.value.code == "svid_invalid"


def test_verify_rejects_server_usage_without_server_auth(
    authority: ca.Authority, node_key: ec.EllipticCurvePrivateKey
) -> None:
    leaf = _forge(
        authority, node_key, _set_ext(lambda: x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False)
    )
    assert (
        svid.verify_svid(leaf, roots=[authority.certificate], trust_domain=TD, now=NOW, usage="client")
        == node_id()
    )
    with pytest.raises(SvidInvalid, match="serverAuth"):
        svid.verify_svid(leaf, roots=[authority.certificate], trust_domain=TD, now=NOW, usage="server")


def test_verify_rejects_wrong_signer(authority: ca.Authority, node_key: ec.EllipticCurvePrivateKey) -> None:
    other = ca.new_authority(TD, now=NOW - timedelta(days=1))
    leaf = _issue(other, node_key)
    with pytest.raises(SvidInvalid, match="does not chain"):
        svid.verify_svid(leaf, roots=[authority.certificate], trust_domain=TD, now=NOW)
    # Same issuer name and key id as our root, but signed by an impostor key.
    impostor = replace(authority, key=ec.generate_private_key(ec.SECP256R1()))
    forged = _forge(impostor, node_key)
    with pytest.raises(SvidInvalid, match="does not chain"):
        svid.verify_svid(forged, roots=[authority.certificate], trust_domain=TD, now=NOW)
    assert svid.verify_svid(leaf, roots=[authority.certificate, other.certificate], trust_domain=TD, now=NOW)


def test_verify_rejects_empty_roots_and_other_trust_domain(
    authority: ca.Authority, node_key: ec.EllipticCurvePrivateKey
) -> None:
    leaf = _issue(authority, node_key)
    with pytest.raises(SvidInvalid, match="no trusted roots"):
        svid.verify_svid(leaf, roots=[], trust_domain=TD, now=NOW)
    with pytest.raises(SvidInvalid, match="not in trust domain"):
        svid.verify_svid(leaf, roots=[authority.certificate], trust_domain="other.org", now=NOW)


def test_verify_rejects_when_root_expired(node_key: ec.EllipticCurvePrivateKey) -> None:
    short = ca.new_authority(TD, now=NOW, ttl=timedelta(hours=2))
    leaf = _issue(short, node_key, ttl=timedelta(hours=1))
    assert svid.verify_svid(leaf, roots=[short.certificate], trust_domain=TD, now=NOW)
    with pytest.raises(SvidInvalid, match="expired"):
        svid.verify_svid(leaf, roots=[short.certificate], trust_domain=TD, now=NOW + timedelta(hours=3))


def test_verify_rejects_leaf_signed_by_a_leaf(
    authority: ca.Authority, node_key: ec.EllipticCurvePrivateKey
) -> None:
    # A valid SVID's key must not act as a CA, even when the SVID is offered as a root.
    parent = _issue(authority, node_key)
    child_key = ec.generate_private_key(ec.SECP256R1())
    fake_issuer = ca.Authority(key=node_key, certificate=parent, created_at=NOW)
    pid = parent.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value

    def as_child(spec: dict[str, Any]) -> None:
        spec["ext"][x509.AuthorityKeyIdentifier.oid] = (
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(pid),
            False,
        )
        spec["ext"][x509.SubjectAlternativeName.oid] = (
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier("spiffe://example.org/node/evil")]),
            True,
        )

    child = _forge(fake_issuer, child_key, as_child)
    with pytest.raises(SvidInvalid, match="does not chain"):
        svid.verify_svid(child, roots=[authority.certificate], trust_domain=TD, now=NOW)
    with pytest.raises(SvidInvalid, match="does not chain"):
        svid.verify_svid(child, roots=[parent], trust_domain=TD, now=NOW)


def test_verify_argument_errors(authority: ca.Authority, node_key: ec.EllipticCurvePrivateKey) -> None:
    leaf = _issue(authority, node_key)
    with pytest.raises(ValueError, match="usage"):
        svid.verify_svid(leaf, roots=[authority.certificate], trust_domain=TD, now=NOW, usage="peer")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timezone-aware"):
        svid.verify_svid(leaf, roots=[authority.certificate], trust_domain=TD, now=datetime(2026, 7, 1))


def test_subject_with_name_allows_noncritical_san(
    authority: ca.Authority, node_key: ec.EllipticCurvePrivateKey
) -> None:
    def named(spec: dict[str, Any]) -> None:
        spec["subject"] = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "worker-1")])
        spec["ext"][x509.SubjectAlternativeName.oid] = (
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(NODE_URI)]),
            False,
        )

    leaf = _forge(authority, node_key, named)
    assert svid.verify_svid(leaf, roots=[authority.certificate], trust_domain=TD, now=NOW) == node_id()


# -- bundles -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rsa_root() -> x509.Certificate:
    key = rsa.generate_private_key(65537, 2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rsa root")])
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(NOW - timedelta(days=1))
        .not_valid_after(NOW + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def test_bundle_document_shape(authority: ca.Authority, rsa_root: x509.Certificate) -> None:
    doc = svid.bundle_document([authority.certificate, rsa_root], sequence=7, refresh_hint=300)
    assert set(doc) == {"keys", "spiffe_sequence", "spiffe_refresh_hint"}
    assert doc["spiffe_sequence"] == 7
    assert doc["spiffe_refresh_hint"] == 300
    ec_entry, rsa_entry = doc["keys"]
    assert set(ec_entry) == {"kty", "crv", "x", "y", "use", "x5c"}
    assert ec_entry["kty"] == "EC"
    assert ec_entry["crv"] == "P-256"
    assert ec_entry["use"] == "x509-svid"
    pub = authority.certificate.public_key()
    assert isinstance(pub, ec.EllipticCurvePublicKey)
    nums = pub.public_numbers()
    assert ec_entry["x"] == _b64url(nums.x.to_bytes(32, "big"))
    assert ec_entry["y"] == _b64url(nums.y.to_bytes(32, "big"))
    assert len(ec_entry["x"]) == 43
    assert "=" not in ec_entry["x"]
    der = authority.certificate.public_bytes(serialization.Encoding.DER)
    assert ec_entry["x5c"] == [base64.b64encode(der).decode()]  # standard alphabet, padded
    assert set(rsa_entry) == {"kty", "n", "e", "use", "x5c"}
    assert rsa_entry["e"] == "AQAB"
    assert base64.urlsafe_b64decode(rsa_entry["n"] + "==")[0] != 0
    assert all("kid" not in k for k in doc["keys"])


def test_bundle_round_trip(authority: ca.Authority, rsa_root: x509.Certificate) -> None:
    doc = svid.bundle_document([authority.certificate, rsa_root], sequence=2**40, refresh_hint=60)
    certs, seq = svid.parse_bundle_document(json.dumps(doc).encode())
    assert certs == [authority.certificate, rsa_root]
    assert seq == 2**40
    assert svid.parse_bundle_document(
        json.dumps(svid.bundle_document([], sequence=3, refresh_hint=0)).encode()
    ) == ([], 3)


def test_bundle_pem(authority: ca.Authority, rsa_root: x509.Certificate) -> None:
    pem = svid.bundle_pem([authority.certificate, rsa_root])
    assert x509.load_pem_x509_certificates(pem) == [authority.certificate, rsa_root]


def test_bundle_ignores_other_entries(authority: ca.Authority) -> None:
    doc = svid.bundle_document([authority.certificate], sequence=1, refresh_hint=60)
    doc["keys"] += [
        {"kty": "EC", "crv": "P-256", "x": "AA", "y": "AA", "use": "jwt-svid", "kid": "k1"},
        {"kty": "OKP", "crv": "Ed25519", "x": "AA", "use": "x509-svid", "x5c": ["AA=="]},
        {"kty": "EC", "x5c": ["garbage"]},  # no use
        {"kty": "EC", "use": "X509-SVID", "x5c": ["garbage"]},  # use is case-sensitive
    ]
    doc["future_extension"] = {"anything": True}
    assert svid.parse_bundle_document(json.dumps(doc).encode()) == ([authority.certificate], 1)


def _doc_bytes(authority: ca.Authority) -> bytes:
    return json.dumps(svid.bundle_document([authority.certificate], sequence=1, refresh_hint=60)).encode()


def _edit(authority: ca.Authority, change: Callable[[dict[str, Any]], None]) -> bytes:
    doc = svid.bundle_document([authority.certificate], sequence=1, refresh_hint=60)
    change(doc)
    return json.dumps(doc).encode()


def test_bundle_parser_rejects_malformed(authority: ca.Authority, rsa_root: x509.Certificate) -> None:
    good = _doc_bytes(authority)
    entry = json.dumps(svid.bundle_document([authority.certificate], sequence=1, refresh_hint=1)["keys"][0])
    der_other = base64.b64encode(rsa_root.public_bytes(serialization.Encoding.DER)).decode()
    der_self = svid.bundle_document([authority.certificate], sequence=1, refresh_hint=1)["keys"][0]["x5c"][0]
    cases: list[tuple[bytes, str]] = [
        (b'{"keys": [], "keys": []}', "duplicate key 'keys'"),
        (f'{{"keys": [{entry[:-1]}, "use": "x509-svid"}}]}}'.encode(), "duplicate key 'use'"),
        (good + b" x", "not valid JSON"),
        (good + b"{}", "not valid JSON"),
        (b"[]", "JSON object"),
        (b'{"keys": {}}', "'keys' list"),
        (b"{}", "'keys' list"),
        (b'{"keys": [1]}', "not a JSON object"),
        (b'{"keys": [], "spiffe_sequence": -1}', "spiffe_sequence"),
        (b'{"keys": [], "spiffe_sequence": true}', "spiffe_sequence"),
        (b'{"keys": [], "spiffe_sequence": 1.5}', "spiffe_sequence"),
        (b'{"keys": [], "spiffe_sequence": NaN}', "NaN"),
        (b'{"keys": [], "spiffe_refresh_hint": "60"}', "spiffe_refresh_hint"),
        (b"\xff\xfe", "not valid JSON"),
        (_edit(authority, lambda d: d["keys"][0]["x5c"].append(der_self)), "exactly one"),
        (_edit(authority, lambda d: d["keys"][0].__setitem__("x5c", [])), "exactly one"),
        (_edit(authority, lambda d: d["keys"][0].pop("x5c")), "exactly one"),
        (_edit(authority, lambda d: d["keys"][0].__setitem__("x5c", der_self)), "exactly one"),
        (_edit(authority, lambda d: d["keys"][0].__setitem__("kid", "a")), "kid"),
        (_edit(authority, lambda d: d["keys"][0]["x5c"].__setitem__(0, der_self[:-1])), "base64"),
        (_edit(authority, lambda d: d["keys"][0]["x5c"].__setitem__(0, "AAAA")), "certificate"),
        (_edit(authority, lambda d: d["keys"][0]["x5c"].__setitem__(0, der_other)), "does not match"),
        (_edit(authority, lambda d: d["keys"][0].__setitem__("x", d["keys"][0]["y"])), "'x' does not match"),
        (_edit(authority, lambda d: d["keys"][0].__setitem__("crv", "P-384")), "'crv' does not match"),
        (_edit(authority, lambda d: d["keys"][0].__setitem__("kty", "RSA")), "'kty' does not match"),
        (
            _edit(authority, lambda d: d["keys"][0].__setitem__("y", d["keys"][0]["y"] + "=")),
            "'y' does not match",
        ),
    ]
    for data, match in cases:
        with pytest.raises(BundleInvalid, match=match) as info:
            svid.parse_bundle_document(data)
        assert info.value.code == "bundle_invalid"
        assert isinstance(info.value, SvidInvalid)


def test_bundle_parser_rejects_url_safe_base64_and_padding_abuse(rsa_root: x509.Certificate) -> None:
    # Find a certificate whose std-base64 uses '+' or '/', then present it url-safe.
    doc = svid.bundle_document([rsa_root], sequence=1, refresh_hint=1)
    std = doc["keys"][0]["x5c"][0]
    assert "+" in std or "/" in std
    doc["keys"][0]["x5c"][0] = std.replace("+", "-").replace("/", "_")
    with pytest.raises(BundleInvalid, match="base64"):
        svid.parse_bundle_document(json.dumps(doc).encode())
    doc["keys"][0]["x5c"][0] = std[:10] + "\n" + std[10:]
    with pytest.raises(BundleInvalid, match="base64"):
        svid.parse_bundle_document(json.dumps(doc).encode())


def test_bundle_parser_size_limit(authority: ca.Authority) -> None:
    good = _doc_bytes(authority)
    assert svid.parse_bundle_document(good, max_bytes=len(good))[1] == 1
    with pytest.raises(BundleInvalid, match="exceeds"):
        svid.parse_bundle_document(good, max_bytes=len(good) - 1)
    with pytest.raises(BundleInvalid, match="exceeds"):
        svid.parse_bundle_document(b" " * (256 * 1024 + 1))
    with pytest.raises(BundleInvalid, match="bytes"):
        svid.parse_bundle_document("{}")  # type: ignore[arg-type]
    deep = b'{"keys": [], "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(BundleInvalid):
        svid.parse_bundle_document(deep, max_bytes=len(deep))


def test_bundle_parser_sequence_defaults_to_zero() -> None:
    assert svid.parse_bundle_document(b'{"keys": []}') == ([], 0)


def test_bundle_document_rejects_bad_numbers(authority: ca.Authority) -> None:
    with pytest.raises(ValueError, match="spiffe_sequence"):
        svid.bundle_document([authority.certificate], sequence=-1, refresh_hint=1)
    with pytest.raises(ValueError, match="spiffe_refresh_hint"):
        svid.bundle_document([authority.certificate], sequence=1, refresh_hint=True)


@given(st.binary(max_size=400) | st.text(max_size=200).map(str.encode))
def test_bundle_parser_raises_only_bundle_invalid(data: bytes) -> None:
    with contextlib.suppress(BundleInvalid):
        svid.parse_bundle_document(data)
