"""EK certificates as vendors ship them: each tolerated encoding quirk verifies, each is checked
over the bytes the vendor signed, and anything else is still refused with its code.

The certificates are built here (tests/attest/ekbuild.py says which vendor file each one
reproduces); no vendor certificate is in the repository.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from hypothesis import given, settings
from hypothesis import strategies as st

from attest import certparse, ekcert, tpm, wire
from attest.errors import AttestationError, EkMismatch, EkUntrusted, MalformedInput
from attest.keys import public_key, spki_der
from tests.attest import ekbuild as b

# -- Nuvoton: a multi-valued RDN whose SET is not in DER order ----------------------------------------

# Each vendor's certificates are made when a test first asks for them (functools.cache), not at
# import: built by the installed cryptography, a refusal there fails those tests, not the collection.


@dataclass(frozen=True)
class Nuvoton:
    root_name: b.MultiName
    san: b.MultiName
    root: b.Ca
    ek_key: b.PublicKey
    ek_public: bytes
    vendor_order: b.Edit
    leaf: bytes


@functools.cache
def nuvoton() -> Nuvoton:
    root_name, san = b.nuvoton_name(), b.tpm_san_name()
    root = b.make_ca(root_name.name, edit=b.replace_in_tbs(root_name.sorted_der, root_name.vendor_der))
    ek_key, ek_public = b.ek_pair("rsa")
    vendor_order = b.chain_edits(
        b.replace_in_tbs(root_name.sorted_der, root_name.vendor_der),
        b.replace_in_tbs(san.sorted_der, san.vendor_der),
    )
    leaf = b.issue_ek(root, b.ek_builder(root_name.name, ek_key, san=san.name), edit=vendor_order)
    return Nuvoton(root_name, san, root, ek_key, ek_public, vendor_order, leaf)


def _root(der: bytes) -> certparse.Cert:
    return certparse.read_certificate(der, "EK root", trailing=certparse.FILE_WHITESPACE)


def test_cryptography_refuses_the_reproduced_nuvoton_certificates() -> None:
    """The fixtures carry the quirk (else every test below proves nothing)."""
    nuvo = nuvoton()
    for der in (nuvo.root.der, nuvo.leaf):
        with pytest.raises(ValueError, match="InvalidSetOrdering"):
            x509.load_der_x509_certificate(der)
    with pytest.raises(MalformedInput):
        ekcert.parse_certificate_der(nuvo.leaf)  # the strict parser (SPIFFE bundles) stays strict


def test_nuvoton_ek_chains_to_its_root() -> None:
    nuvo = nuvoton()
    ident = tpm.verify_ek(nuvo.ek_public, nuvo.leaf, roots=[_root(nuvo.root.der)])
    assert ident.trusted_by == "chain:C=TW+CN=Nuvoton TPM Root CA 2111+O=Nuvoton Technology Corporation"
    assert ident.quirks == (certparse.UNSORTED_SET,)
    assert [link.der for link in ident.links] == [nuvo.leaf, nuvo.root.der]
    assert ident.certificate is not None
    san = ident.certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DirectoryName) == [nuvo.san.name]  # decoded, order-free


def test_the_signature_is_checked_over_the_vendor_bytes_never_a_re_encoding() -> None:
    """keylime's trap (re-encode, then verify the re-encoding) in both directions: a certificate
    whose CA signed the sorted TBS but that carries the vendor order, and one signed in the vendor
    order but sorted afterwards, are both refused; their decoded fields are identical."""
    nuvo = nuvoton()
    root = _root(nuvo.root.der)
    signed_sorted = (
        b.ek_builder(nuvo.root_name.name, nuvo.ek_key, san=nuvo.san.name)
        .sign(nuvo.root.key, hashes.SHA256())
        .public_bytes(serialization.Encoding.DER)
    )
    reordered = signed_sorted.replace(nuvo.root_name.sorted_der, nuvo.root_name.vendor_der)
    resorted = nuvo.leaf.replace(nuvo.root_name.vendor_der, nuvo.root_name.sorted_der).replace(
        nuvo.san.vendor_der, nuvo.san.sorted_der
    )
    for forged in (reordered, resorted):
        with pytest.raises(EkUntrusted, match=r"signature by .* does not verify") as exc:
            tpm.verify_ek(nuvo.ek_public, forged, roots=[root])
        assert exc.value.code == "ek_untrusted"
    assert tpm.verify_ek(nuvo.ek_public, signed_sorted, roots=[root]).links[0].quirks == ()


def test_a_leaf_in_vendor_order_matches_a_root_in_der_order() -> None:
    """Names are compared decoded (RFC 5280 7.1): set order is not part of a name."""
    nuvo = nuvoton()
    clean_root = b.make_ca(nuvo.root_name.name, key=nuvo.root.key)
    assert clean_root.der != nuvo.root.der
    ident = tpm.verify_ek(nuvo.ek_public, nuvo.leaf, roots=[clean_root.cert])
    assert ident.quirks == (certparse.UNSORTED_SET,)


@settings(max_examples=12, deadline=None)
@given(order=st.permutations(range(3)))
def test_every_member_order_verifies_when_signed_in_that_order(order: list[int]) -> None:
    nuvo = nuvoton()
    members = b.children(b.children(nuvo.root_name.sorted_der)[0])
    permuted = b.tlv(0x30, b.tlv(0x31, b"".join(members[i] for i in order)))
    leaf = b.issue_ek(
        nuvo.root,
        b.ek_builder(nuvo.root_name.name, nuvo.ek_key),
        edit=lambda tbs: (
            b.replace_in_tbs(nuvo.root_name.sorted_der, permuted)(tbs)
            if permuted != nuvo.root_name.sorted_der
            else tbs
        ),
    )
    ident = tpm.verify_ek(nuvo.ek_public, leaf, roots=[_root(nuvo.root.der)])
    assert ident.links[0].quirks == (() if list(order) == [0, 1, 2] else (certparse.UNSORTED_SET,))


# -- Intel OnDie CA: ecdsa-with-SHA384 with explicit NULL parameters ---------------------------------

WITH_NULL = b.replace_in_tbs(b.ECDSA_SHA384, b.ECDSA_SHA384_NULL)


def _add_null(alg: bytes) -> bytes:
    return alg.replace(b.ECDSA_SHA384, b.ECDSA_SHA384_NULL)


@dataclass(frozen=True)
class OnDie:
    root: b.Ca
    inter: b.Ca


@functools.cache
def ondie() -> OnDie:
    root = b.make_ca(b.cn("OnDie CA Root Cert Signing"), edit=WITH_NULL, outer_alg=_add_null)
    inter = b.make_ca(b.cn("OnDie CA CSME Intermediate CA"), parent=root, edit=WITH_NULL, outer_alg=_add_null)
    return OnDie(root, inter)


def test_intel_ondie_chain_with_null_ecdsa_parameters_verifies() -> None:
    intel = ondie()
    for der in (intel.root.der, intel.inter.der):
        with pytest.raises(ValueError, match="ExtraData"):
            x509.load_der_x509_certificate(der)
    key, public = b.ek_pair("ecc")
    leaf = b.issue_ek(intel.inter, b.ek_builder(intel.inter.name, key), hash_alg=hashes.SHA384())
    ident = tpm.verify_ek(public, leaf, roots=[_root(intel.root.der)], intermediates=[_root(intel.inter.der)])
    assert ident.trusted_by == "chain:CN=OnDie CA Root Cert Signing"
    assert ident.quirks == (certparse.ECDSA_NULL_PARAMS,)
    assert ident.links[1].quirks == (certparse.ECDSA_NULL_PARAMS,)


def test_null_parameters_the_ca_did_not_sign_are_refused() -> None:
    """An EK certificate signed without NULL, NULL added afterwards (in both places)."""
    intel = ondie()
    key, public = b.ek_pair("ecc")
    leaf = b.issue_ek(intel.inter, b.ek_builder(intel.inter.name, key), hash_alg=hashes.SHA384())
    tbs, alg, sig = b.children(leaf)
    forged = b.tlv(0x30, WITH_NULL(tbs) + _add_null(alg) + sig)
    with pytest.raises(EkUntrusted, match="does not verify"):
        tpm.verify_ek(public, forged, roots=[_root(intel.root.der)], intermediates=[_root(intel.inter.der)])


@pytest.mark.parametrize(
    ("edit", "outer", "why"),
    [
        (WITH_NULL, None, "differs from signatureAlgorithm"),  # NULL in the TBS only
        (None, _add_null, "differs from signatureAlgorithm"),  # NULL in signatureAlgorithm only
        (
            b.replace_in_tbs(b.ECDSA_SHA384, bytes.fromhex("300e06082a8648ce3d04030305000500")),
            lambda alg: alg.replace(b.ECDSA_SHA384, bytes.fromhex("300e06082a8648ce3d04030305000500")),
            "not a valid X.509 certificate",  # two NULLs: not the quirk
        ),
        (
            b.replace_in_tbs(b.ECDSA_SHA384, bytes.fromhex("300f06082a8648ce3d040303" + "06032a0304")),
            lambda alg: alg.replace(b.ECDSA_SHA384, bytes.fromhex("300f06082a8648ce3d040303" + "06032a0304")),
            "not a valid X.509 certificate",  # an OID as parameters
        ),
    ],
)
def test_other_algorithm_identifier_deviations_are_malformed(
    edit: b.Edit | None, outer: b.Edit | None, why: str
) -> None:
    intel = ondie()
    key, public = b.ek_pair("ecc")
    cert = b.ek_builder(intel.inter.name, key).sign(intel.inter.key, hashes.SHA384())
    der = b.resign(cert, intel.inter.key, edit or (lambda t: t), outer_alg=outer)
    with pytest.raises(MalformedInput, match=why) as exc:
        tpm.verify_ek(public, der, roots=[_root(intel.root.der)], intermediates=[_root(intel.inter.der)])
    assert exc.value.code == "malformed_request"


# -- STMicro: NV padding and a serial with leading zero octets -----------------------------------------


@dataclass(frozen=True)
class Stm:
    root: b.Ca
    inter: b.Ca
    ek_key: b.PublicKey
    ek_public: bytes
    leaf: bytes
    padded: bytes


@functools.cache
def stm() -> Stm:
    root = b.make_ca(
        b.cn("STM TPM EK Root CA"),
        key=rsa.generate_private_key(public_exponent=65537, key_size=2048),
        hash_alg=hashes.SHA256(),
    )
    inter = b.make_ca(
        b.cn("STM TPM EK Intermediate CA 05"),
        parent=root,
        key=rsa.generate_private_key(public_exponent=65537, key_size=2048),
        serial=1,
        edit=b.replace_in_tbs(bytes.fromhex("020101"), bytes.fromhex("020400000001")),
        hash_alg=hashes.SHA256(),
    )
    ek_key, ek_public = b.ek_pair("rsa")
    leaf = b.issue_ek(inter, b.ek_builder(inter.name, ek_key, san=b.cn("tpm")))
    return Stm(root, inter, ek_key, ek_public, leaf, leaf + b"\xff" * (1600 - len(leaf)))


def test_stmicro_padded_certificate_and_first_issue_intermediate_verify() -> None:
    stmicro = stm()
    with pytest.raises(ValueError, match="InvalidValue"):
        x509.load_der_x509_certificate(stmicro.inter.der)
    ident = tpm.verify_ek(
        stmicro.ek_public, stmicro.padded, roots=[stmicro.root.cert], intermediates=[_root(stmicro.inter.der)]
    )
    assert ident.quirks == (certparse.NV_PADDING, certparse.SERIAL_LEADING_ZEROS)
    assert ident.links[0].der == stmicro.leaf
    assert ident.links[1].view.serial_number == 1


@pytest.mark.parametrize(
    ("blob", "why"),
    [
        (lambda: stm().leaf + b"\x00", "trailing bytes"),  # zero padding: no vendor needs it
        (lambda: stm().leaf + b"\xff" * 8 + b"\x00", "trailing bytes"),
        (lambda: stm().leaf + b"\n", "trailing bytes"),  # whitespace is for files, not TPM evidence
        (lambda: stm().leaf + stm().leaf, "trailing bytes"),  # two certificates back to back
        (lambda: b"\x30\x83\x00" + stm().leaf[2:], "shortest form"),
        (lambda: b"\x30\x80" + stm().leaf[4:] + b"\x00\x00", "indefinite length"),
        (lambda: b"\xff" * 100, "not DER"),
    ],
    ids=[
        "zero-padding",
        "ff-padding-then-zero",
        "newline",
        "two-certificates",
        "long-form-length",
        "indefinite-length",
        "not-der",
    ],
)
def test_bytes_outside_the_list_are_malformed(blob: Callable[[], bytes], why: str) -> None:
    stmicro = stm()
    with pytest.raises(MalformedInput, match=why) as exc:
        tpm.verify_ek(
            stmicro.ek_public, blob(), roots=[stmicro.root.cert], intermediates=[_root(stmicro.inter.der)]
        )
    assert exc.value.code == "malformed_request"


def test_a_non_minimal_length_inside_the_tbs_is_not_tolerated_with_a_quirk() -> None:
    """The canonical copy never re-encodes lengths: BER inside a quirky certificate stays refused."""
    nuvo = nuvoton()
    ber_issuer = b"\x30\x81" + nuvo.root_name.vendor_der[1:]  # length 0x5x written in long form
    edit = b.chain_edits(nuvo.vendor_order, b.replace_in_tbs(nuvo.root_name.vendor_der, ber_issuer))
    leaf = b.issue_ek(
        nuvo.root,
        b.ek_builder(nuvo.root_name.name, nuvo.ek_key, san=nuvo.san.name),
        edit=edit,
    )
    with pytest.raises(MalformedInput, match="shortest form"):
        tpm.verify_ek(nuvo.ek_public, leaf, roots=[_root(nuvo.root.der)])


def test_negative_serial_padding_is_not_the_leading_zero_quirk() -> None:
    edit = b.replace_in_tbs(bytes.fromhex("020101"), bytes.fromhex("0203ffff81"))
    root = b.make_ca(b.cn("r"), serial=1, edit=edit)
    with pytest.raises(MalformedInput):
        _root(root.der)


def test_deep_nesting_is_refused_without_recursion_errors() -> None:
    stmicro = stm()
    nested = b"\x05\x00"
    for _ in range(2000):
        nested = b.tlv(0x31, nested)
    key, public = b.ek_pair("rsa")
    base = b.ek_builder(stmicro.inter.name, key).sign(stmicro.inter.key, hashes.SHA256())
    tbs, alg, sig = b.children(base.public_bytes(serialization.Encoding.DER))
    start, end = b.split(tbs)
    bad = b.tlv(0x30, b.tlv(0x30, tbs[start:end] + nested) + alg + sig)
    assert len(bad) < certparse.MAX_CERT_DER
    with pytest.raises(MalformedInput, match="nested too deeply"):
        tpm.verify_ek(public, bad, roots=[stmicro.root.cert])


def test_an_issuer_name_in_another_string_type_still_matches() -> None:
    """STMicro ECC intermediates name their issuer in UTF8String, the root's subject is in
    PrintableString (carl-wallace/tpm_roots@04900ccc6ac60d033b528e552618139837a4143c TrustedTPM,
    STM_TPM_ECC_Intermediate_CA_02 under STM ECC Root CA 01): equal names, different bytes.
    ``cryptography``'s verify_directly_issued_by refuses the link; RFC 5280 7.1 matches it."""
    utf8 = b.atv(NameOID.COMMON_NAME, "STM TPM ECC Root CA 01")
    printable = utf8.replace(b"\x0c\x16", b"\x13\x16")
    assert printable != utf8
    root = b.make_ca(b.cn("STM TPM ECC Root CA 01"), edit=b.replace_in_tbs(utf8, printable))
    inter = b.make_ca(b.cn("STM TPM ECC Intermediate CA 02"), parent=root)
    root_view, inter_view = _root(root.der).view, inter.cert
    assert root_view.subject.public_bytes() != inter_view.issuer.public_bytes()
    with pytest.raises(ValueError, match="does not match"):
        inter_view.verify_directly_issued_by(root_view)
    key, public = b.ek_pair("ecc")
    leaf = b.issue_ek(inter, b.ek_builder(inter.name, key, san=b.cn("tpm")))
    ident = tpm.verify_ek(public, leaf, roots=[_root(root.der)], intermediates=[inter.cert])
    assert ident.trusted_by == "chain:CN=STM TPM ECC Root CA 01"


# -- the usual refusals, on quirky certificates -------------------------------------------------------


def test_quirky_certificates_are_refused_like_any_other() -> None:
    nuvo = nuvoton()
    root = _root(nuvo.root.der)
    expired = b.issue_ek(
        nuvo.root,
        b.ek_builder(
            nuvo.root_name.name,
            nuvo.ek_key,
            not_before=b.NOW - timedelta(days=900),
            not_after=b.NOW - timedelta(days=1),
        ),
        edit=b.replace_in_tbs(nuvo.root_name.sorted_der, nuvo.root_name.vendor_der),
    )
    with pytest.raises(EkUntrusted, match="expired"):
        tpm.verify_ek(nuvo.ek_public, expired, roots=[root])
    _, other_public = b.ek_pair("rsa")
    with pytest.raises(EkMismatch) as exc:
        tpm.verify_ek(other_public, nuvo.leaf, roots=[root])
    assert exc.value.code == "ek_mismatch"
    with pytest.raises(EkUntrusted, match="does not chain"):
        tpm.verify_ek(nuvo.ek_public, nuvo.leaf, roots=[_root(ondie().root.der)])
    impostor = b.make_ca(
        nuvo.root_name.name,
        edit=b.replace_in_tbs(nuvo.root_name.sorted_der, nuvo.root_name.vendor_der),
    )
    with pytest.raises(EkUntrusted, match="does not verify"):
        tpm.verify_ek(nuvo.ek_public, nuvo.leaf, roots=[_root(impostor.der)])


def test_ca_links_are_judged_per_certificate_even_when_remembered() -> None:
    """CA-to-CA signature checks are cached: a look-alike intermediate (same name, signed by
    another key) stays refused after the genuine one was verified, and the other way round."""
    stmicro = stm()
    impostor_root = b.make_ca(
        stmicro.root.name,
        key=rsa.generate_private_key(public_exponent=65537, key_size=2048),
        hash_alg=hashes.SHA256(),
    )
    look_alike = b.make_ca(
        stmicro.inter.name, parent=impostor_root, key=stmicro.inter.key, hash_alg=hashes.SHA256()
    )
    roots = [stmicro.root.cert]
    assert tpm.verify_ek(
        stmicro.ek_public, stmicro.leaf, roots=roots, intermediates=[_root(stmicro.inter.der)]
    ).links
    for _ in range(2):
        with pytest.raises(EkUntrusted, match="does not verify"):
            tpm.verify_ek(stmicro.ek_public, stmicro.leaf, roots=roots, intermediates=[look_alike.cert])
    ident = tpm.verify_ek(
        stmicro.ek_public,
        stmicro.leaf,
        roots=roots,
        intermediates=[look_alike.cert, _root(stmicro.inter.der)],
    )
    assert ident.links[1].der == stmicro.inter.der


# -- the allowlist: the certificate is not parsed strictly first ----------------------------------------


def _digest(ek_public: bytes) -> str:
    return hashlib.sha256(spki_der(public_key(wire.parse_public(ek_public)))).hexdigest()


@pytest.mark.parametrize(
    "make_certificate",
    [
        lambda: nuvoton().leaf,
        lambda: nuvoton().leaf + b"\x00",
        lambda: b"\x30\x03abc",
        lambda: b"not a certificate",
        lambda: b"",
    ],
    ids=["quirky", "untolerated-trailer", "junk-der", "junk", "empty"],
)
def test_an_allowlisted_ek_is_trusted_whatever_its_certificate_looks_like(
    make_certificate: Callable[[], bytes],
) -> None:
    nuvo = nuvoton()
    certificate = make_certificate()
    digest = _digest(nuvo.ek_public)
    ident = tpm.verify_ek(nuvo.ek_public, certificate, roots=[], allowlist={digest})
    assert ident.trusted_by == "allowlist"
    assert (ident.certificate is not None) == (certificate == nuvo.leaf)
    if certificate != nuvo.leaf:
        with pytest.raises(MalformedInput):
            tpm.verify_ek(nuvo.ek_public, certificate, roots=[_root(nuvo.root.der)])
    with pytest.raises(EkUntrusted, match="denylist"):
        tpm.verify_ek(nuvo.ek_public, certificate, roots=[], allowlist={digest}, denylist={digest})


def test_an_allowlisted_ek_with_a_readable_certificate_for_another_key_is_a_mismatch() -> None:
    _, other_public = b.ek_pair("rsa")
    with pytest.raises(EkMismatch):
        tpm.verify_ek(other_public, nuvoton().leaf, roots=[], allowlist={_digest(other_public)})


# -- EK profile: Google Cloud's certificates ----------------------------------------------------------


@dataclass(frozen=True)
class Gce:
    root: b.Ca
    inter: b.Ca
    subject: x509.Name


@functools.cache
def gce() -> Gce:
    root = b.make_ca(b.cn("EK/AK CA Root"))
    inter = b.make_ca(b.cn("EK/AK CA Intermediate"), parent=root)
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.LOCALITY_NAME, "us-central1-a"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Google Compute Engine"),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "project-id"),
            x509.NameAttribute(NameOID.COMMON_NAME, "218557372616137117"),
        ]
    )
    return Gce(root, inter, subject)


def test_google_cloud_ek_certificate_without_eku_or_san_verifies() -> None:
    """go-tpm-tools@67670e5c021a24f2366eb1808db2659211af5eb2 internal/test/certificates/
    pca_tpm_{rsa,ecc}_enc_cert.pem: subject names the instance, no EKU, no SAN."""
    google = gce()
    for kind in ("rsa", "ecc"):
        key, public = b.ek_pair(kind)
        leaf = b.issue_ek(
            google.inter, b.ek_builder(google.inter.name, key, eku=False, subject=google.subject)
        )
        ident = tpm.verify_ek(public, leaf, roots=[google.root.cert], intermediates=[google.inter.cert])
        assert ident.trusted_by == "chain:CN=EK/AK CA Root"


def test_an_ak_certificate_does_not_pass_as_an_ek_certificate() -> None:
    """pca_tpm_*_sign_cert.pem: the same CA certifies AKs (keyUsage digitalSignature). Presented
    with an EK-template public area around the AK's key it is refused by its key usage (and the
    TPM could not activate a credential with a signing key anyway)."""
    google = gce()
    key, public = b.ek_pair("ecc")
    signing_only = x509.KeyUsage(True, False, False, False, False, False, False, False, False)
    builder = b.ek_builder(google.inter.name, key, eku=False, subject=google.subject, key_usage=signing_only)
    leaf = b.issue_ek(google.inter, builder)
    with pytest.raises(EkUntrusted, match="neither keyEncipherment nor keyAgreement"):
        tpm.verify_ek(public, leaf, roots=[google.root.cert], intermediates=[google.inter.cert])


def test_an_eku_without_the_tcg_purpose_is_refused() -> None:
    google = gce()
    key, public = b.ek_pair("rsa")
    builder = b.ek_builder(google.inter.name, key, eku=False, subject=google.subject).add_extension(
        x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
    )
    with pytest.raises(EkUntrusted, match="lacks tcg-kp-EKCertificate"):
        tpm.verify_ek(
            public,
            b.issue_ek(google.inter, builder),
            roots=[google.root.cert],
            intermediates=[google.inter.cert],
        )


# -- no input raises anything but an AttestationError ---------------------------------------------------


def _samples() -> list[bytes]:
    stmicro = stm()
    return [nuvoton().leaf, stmicro.padded, stmicro.inter.der, ondie().inter.der]


# deferred: the certificates are made when hypothesis first draws, not when the module is imported
SAMPLES = st.deferred(lambda: st.sampled_from(_samples()))


@settings(max_examples=400, deadline=None)
@given(
    sample=SAMPLES,
    index=st.integers(0, 2000),
    flips=st.binary(min_size=1, max_size=3),
    cut=st.integers(0, 5),
)
def test_mutated_quirky_certificates_raise_only_attestation_errors(
    sample: bytes, index: int, flips: bytes, cut: int
) -> None:
    stmicro = stm()
    nuvo = nuvoton()
    cert = bytearray(sample)
    for k, f in enumerate(flips):
        cert[(index + k * 7) % len(cert)] ^= f or 1
    with contextlib.suppress(AttestationError):
        tpm.verify_ek(
            nuvo.ek_public,
            bytes(cert[: len(cert) - cut]),
            roots=[_root(nuvo.root.der), stmicro.root.cert],
            intermediates=[_root(stmicro.inter.der)],
        )
    with contextlib.suppress(MalformedInput):
        certparse.read_certificate(bytes(cert), trailing=certparse.FILE_WHITESPACE)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=600), sample=SAMPLES, at=st.integers(0, 1600))
def test_spliced_bytes_raise_only_malformed_input(data: bytes, sample: bytes, at: int) -> None:
    blob = sample[:at] + data + sample[at + len(data) :]
    with contextlib.suppress(MalformedInput):
        certparse.read_certificate(blob)


def test_reading_a_certificate_twice_gives_the_same_answer() -> None:
    nuvo = nuvoton()
    for der in (nuvo.leaf, stm().padded, nuvo.root.der):
        one, two = certparse.read_certificate(der), certparse.read_certificate(der)
        assert (one.der, one.tbs, one.signature, one.quirks, one.sha256) == (
            two.der,
            two.tbs,
            two.signature,
            two.quirks,
            two.sha256,
        )


def test_every_quirk_is_documented() -> None:
    assert set(certparse.QUIRKS) == {
        certparse.NV_PADDING,
        certparse.FILE_WHITESPACE,
        certparse.UNSORTED_SET,
        certparse.ECDSA_NULL_PARAMS,
        certparse.SERIAL_LEADING_ZEROS,
        certparse.ENCODED_DEFAULT,
    }
    assert all(certparse.QUIRKS.values())


@pytest.mark.parametrize("serial_der", ["020100", "0201ff"])
def test_a_non_positive_serial_is_refused(serial_der: str) -> None:
    """RFC 5280 forbids zero and negative serials; no vendor needs them (cryptography still loads
    them with a deprecation warning): refused as malformed, not tolerated."""
    stmicro = stm()
    inter = b.make_ca(
        b.cn("STM TPM EK Intermediate CA 06"),
        parent=stmicro.root,
        key=rsa.generate_private_key(public_exponent=65537, key_size=2048),
        serial=1,
        edit=b.replace_in_tbs(bytes.fromhex("020101"), bytes.fromhex(serial_der)),
        hash_alg=hashes.SHA256(),
    )
    leaf = b.issue_ek(inter, b.ek_builder(inter.name, stmicro.ek_key, san=b.cn("tpm")))
    with pytest.raises(AttestationError) as info:
        tpm.verify_ek(stmicro.ek_public, leaf, roots=[stmicro.root.cert], intermediates=[_root(inter.der)])
    assert info.value.code in ("malformed_request", "ek_untrusted")
