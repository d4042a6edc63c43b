"""Strict parsers: real structures round-trip, and arbitrary bytes only ever raise MalformedInput."""

from __future__ import annotations

import contextlib
import functools
import os
import struct
from dataclasses import dataclass

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attest import tpm, wire
from attest.errors import AttestationError, MalformedInput
from tests.support import fakes

PARSERS = {
    "public": wire.parse_public,
    "quote": wire.parse_quote,
    "signature": wire.parse_signature,
}


@dataclass(frozen=True)
class AkMaterial:
    ec_key: ec.EllipticCurvePrivateKey
    ecc_ak: bytes
    rsa_ak: bytes
    quote: bytes
    sig: bytes
    rsa_sig: bytes


@functools.cache
def ak_material() -> AkMaterial:
    """Keys, AKs, a quote and its signatures, made when a test first asks (hypothesis: when it first
    draws), not at import: a refusal by the installed cryptography fails those tests, not the collection."""
    ec_key = ec.generate_private_key(ec.SECP256R1())
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    quote = fakes.FakeQuote(os.urandom(32), pcr_digest=os.urandom(32)).build()
    return AkMaterial(
        ec_key,
        fakes.ecc_public(ec_key.public_key()),
        fakes.rsa_public(rsa_key.public_key()),
        quote,
        fakes.sign_ecdsa(ec_key, quote),
        fakes.sign_rsassa(rsa_key, quote),
    )


def samples(kind: str) -> list[bytes]:
    m = ak_material()
    return {"public": [m.ecc_ak, m.rsa_ak], "quote": [m.quote], "signature": [m.sig, m.rsa_sig]}[kind]


def test_real_structures_parse() -> None:
    m = ak_material()
    pub = wire.parse_public(m.ecc_ak)
    assert (pub.type, pub.curve, pub.scheme, pub.scheme_hash) == (
        wire.Alg.ECC,
        wire.Curve.NIST_P256,
        wire.Alg.ECDSA,
        wire.Alg.SHA256,
    )
    assert wire.parse_public(m.rsa_ak).rsa_bits == 2048
    q = wire.parse_quote(m.quote)
    assert q.selection == wire.parse_selection_string("sha256:0,1,2,3,4,5,6,7")
    assert wire.parse_signature(m.sig).alg == wire.Alg.ECDSA


@pytest.mark.parametrize("kind", list(PARSERS))
def test_every_truncation_and_extension_is_refused(kind: str) -> None:
    for sample in samples(kind):
        for cut in range(len(sample)):
            with pytest.raises(MalformedInput):
                PARSERS[kind](sample[:cut])
        with pytest.raises(MalformedInput, match="trailing"):
            PARSERS[kind](sample + b"\x00")


def test_oversized_inputs_are_refused_before_parsing() -> None:
    for parse in PARSERS.values():
        with pytest.raises(MalformedInput, match="exceeds the limit"):
            parse(b"\x00" * 5000)


def test_tpm2b_sizes_are_bounded() -> None:
    # A quote whose extraData claims 65 bytes (TPM2B_DATA holds at most 64).
    bad = (
        struct.pack(">IH", wire.TPM_GENERATED_VALUE, wire.TPM_ST_ATTEST_QUOTE)
        + wire.tpm2b(b"")
        + wire.tpm2b(b"x" * 65)
    )
    with pytest.raises(MalformedInput, match="exceeds 64"):
        wire.parse_quote(bad + bytes(100))


def test_selection_with_too_many_select_bytes_is_refused() -> None:
    raw = struct.pack(">I", 1) + struct.pack(">HB", wire.Alg.SHA256, 5) + b"\xff" * 5
    quote = fakes.FakeQuote(b"n", raw_selection=raw, pcr_digest=bytes(32)).build()
    with pytest.raises(MalformedInput, match="sizeofSelect"):
        wire.parse_quote(quote)


def test_reserved_attribute_bits_are_refused() -> None:
    with pytest.raises(MalformedInput, match="reserved"):
        wire.parse_public(fakes.ecc_public(ak_material().ec_key.public_key(), attrs=fakes.AK_ATTRS | 1))


def test_non_bytes_inputs_are_refused() -> None:
    for parse in PARSERS.values():
        with pytest.raises(MalformedInput):
            parse("not bytes")  # type: ignore[arg-type]


def test_selection_string_round_trips() -> None:
    sel = wire.parse_selection_string("sha256:7,0,3+sha1:1")
    assert wire.format_selection(sel) == "sha256:0,3,7+sha1:1"


# -- hypothesis: nothing but MalformedInput, ever -----------------------------------------------


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=1200), kind=st.sampled_from(list(PARSERS)))
def test_parsers_raise_only_their_error_on_random_bytes(data: bytes, kind: str) -> None:
    with contextlib.suppress(MalformedInput):
        PARSERS[kind](data)


@settings(max_examples=400, deadline=None)
@given(
    kind=st.sampled_from(list(PARSERS)), index=st.integers(0, 10_000), flips=st.binary(min_size=1, max_size=4)
)
def test_parsers_raise_only_their_error_on_mutated_structures(kind: str, index: int, flips: bytes) -> None:
    """Random mutations of valid structures explore far deeper than random bytes do."""
    sample = bytearray(samples(kind)[index % len(samples(kind))])
    for k, f in enumerate(flips):
        sample[(index + k * 7) % len(sample)] ^= f or 1
    with contextlib.suppress(MalformedInput):
        PARSERS[kind](bytes(sample))


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=80))
def test_selection_parser_raises_only_its_error(text: str) -> None:
    with contextlib.suppress(MalformedInput):
        wire.parse_selection_string(text)


@settings(max_examples=300, deadline=None)
@given(
    ak=st.deferred(lambda: st.sampled_from(samples("public"))) | st.binary(max_size=600),
    quote=st.deferred(lambda: st.sampled_from(samples("quote"))) | st.binary(max_size=300),
    sig=st.deferred(lambda: st.sampled_from(samples("signature"))) | st.binary(max_size=300),
    qd=st.binary(max_size=64),
)
def test_verify_quote_raises_only_attestation_errors(ak: bytes, quote: bytes, sig: bytes, qd: bytes) -> None:
    with contextlib.suppress(AttestationError):
        tpm.verify_quote(
            ak, quote, sig, selection="sha256:0,1,2,3,4,5,6,7", pcrs=fakes.standard_pcrs(), qualifying_data=qd
        )


@settings(max_examples=200, deadline=None)
@given(ek=st.binary(max_size=600), cert=st.none() | st.binary(max_size=600))
def test_verify_ek_raises_only_attestation_errors(ek: bytes, cert: bytes | None) -> None:
    with contextlib.suppress(AttestationError):
        tpm.verify_ek(ek, cert, roots=[])


# -- hypothesis on the certificate path, the credential and the policy loader --------------------


@functools.cache
def _cert_material() -> tuple[bytes, bytes, list[object]]:
    """(EK public area, its certificate, the roots), made when a test first asks, not at import."""
    from datetime import UTC, datetime, timedelta

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.x509.oid import NameOID

    ca_key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fuzz-ca")])
    now = datetime.now(UTC)
    ca = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(ca_key.public_key())
        .serial_number(1).not_valid_before(now - timedelta(days=1)).not_valid_after(now + timedelta(days=9))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    ek_key = rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key()
    leaf = (
        x509.CertificateBuilder().subject_name(x509.Name([])).issuer_name(name).public_key(ek_key)
        .serial_number(2).not_valid_before(now - timedelta(days=1)).not_valid_after(now + timedelta(days=9))
        .add_extension(x509.SubjectAlternativeName([x509.DirectoryName(name)]), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.ObjectIdentifier("2.23.133.8.1")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    return fakes.rsa_ek_public(ek_key), leaf.public_bytes(serialization.Encoding.DER), [ca]


def test_fuzz_material_verifies() -> None:
    ek_public, ek_cert, ek_roots = _cert_material()
    assert tpm.verify_ek(ek_public, ek_cert, roots=ek_roots).trusted_by == "chain:CN=fuzz-ca"  # type: ignore[arg-type]


@settings(max_examples=500, deadline=None)
@given(index=st.integers(0, 10_000), flips=st.binary(min_size=1, max_size=3), cut=st.integers(0, 3))
def test_verify_ek_on_mutated_certificates_raises_only_attestation_errors(
    index: int, flips: bytes, cut: int
) -> None:
    """Mutations of a certificate for a valid EK reach the chain walk and the extension code."""
    ek_public, ek_cert, ek_roots = _cert_material()
    cert = bytearray(ek_cert)
    for k, f in enumerate(flips):
        cert[(index + k * 13) % len(cert)] ^= f or 1
    with contextlib.suppress(AttestationError):
        tpm.verify_ek(ek_public, bytes(cert[: len(cert) - cut]), roots=ek_roots)  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(
    ek=st.deferred(lambda: st.just(_cert_material()[0])) | st.binary(max_size=400),
    name=st.binary(max_size=70),
    secret=st.binary(max_size=70),
)
def test_make_credential_raises_only_attestation_errors(ek: bytes, name: bytes, secret: bytes) -> None:
    with contextlib.suppress(AttestationError):
        blob, enc = tpm.make_credential(ek, name, secret)
        assert blob
        assert enc


@settings(max_examples=300, deadline=None)
@given(
    doc=st.text(max_size=300)
    | st.sampled_from(["classes: [{name: a, golden: {sha256: {0: [x]}}}]", "pcrs: [a]"])
)
def test_load_policy_raises_only_policy_error(doc: str) -> None:
    from attest import pcr

    with contextlib.suppress(pcr.PolicyError):
        pcr.load_policy(doc)
