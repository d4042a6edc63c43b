"""The ``encoded-default`` quirk (Intel PTT EK certificates): an explicitly encoded DEFAULT FALSE
in Extension.critical or BasicConstraints.cA is read, the signature is still checked over the
issuer's own bytes, and every other encoded default or BOOLEAN oddity is still refused.

The certificates are built here on test keys (tests/attest/ekbuild.py); the real Intel answers are
in tests/node/test_real_intel_answers.py.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.x509.oid import ExtensionOID
from hypothesis import given, settings
from hypothesis import strategies as st

from attest import certparse, tpm
from attest.errors import EkUntrusted, MalformedInput
from tests.attest import ekbuild as b

FALSE, TRUE = bytes.fromhex("010100"), bytes.fromhex("0101ff")
BC = bytes.fromhex("0603551d13")  # basicConstraints
EKU = bytes.fromhex("0603551d25")  # extKeyUsage
KU = bytes.fromhex("0603551d0f")  # keyUsage
NC = bytes.fromhex("0603551d1e")  # nameConstraints

Fields = list[bytes]  # one Extension's TLVs: extnID, [critical], extnValue


# The test PKI, made when a test first asks (key generation and certificate building are the
# installed cryptography's; a refusal there fails the tests that use it, not the collection).
@functools.cache
def root_ca() -> b.Ca:
    return b.make_ca(b.cn("PTT EK Root"))


@functools.cache
def inter_ca() -> b.Ca:
    return b.make_ca(b.cn("PTT EK intermediate for SPTH"), parent=root_ca())


@functools.cache
def _ek() -> tuple[b.PublicKey, bytes]:
    return b.ek_pair("rsa")


def ek_key() -> b.PublicKey:
    return _ek()[0]


def ek_public() -> bytes:
    return _ek()[1]


def _root(der: bytes) -> certparse.Cert:
    return certparse.read_certificate(der, "EK root", trailing=certparse.FILE_WHITESPACE)


def edit_extension(oid: bytes, change: Callable[[Fields], Fields]) -> b.Edit:
    """Rewrite the extension ``oid`` of a TBS (every enclosing length re-encoded)."""

    def edit(tbs: bytes) -> bytes:
        parts = b.children(tbs)
        (at,) = [i for i, p in enumerate(parts) if p[0] == 0xA3]
        (seq,) = b.children(parts[at])
        exts = b.children(seq)
        hits = [i for i, e in enumerate(exts) if b.children(e)[0] == oid]
        assert len(hits) == 1, "the extension to edit is not in the TBS"
        exts[hits[0]] = b.tlv(0x30, b"".join(change(b.children(exts[hits[0]]))))
        parts[at] = b.tlv(0xA3, b.tlv(0x30, b"".join(exts)))
        return b.tlv(0x30, b"".join(parts))

    return edit


def critical(flag: bytes | None) -> Callable[[Fields], Fields]:
    """Set the critical field to the TLV ``flag`` (None: absent)."""
    return lambda f: [f[0], *([flag] if flag else []), f[-1]]


def basic_constraints(content: bytes) -> Callable[[Fields], Fields]:
    """Replace the BasicConstraints SEQUENCE content (keeping extnID and critical)."""
    return lambda f: [*f[:-1], b.tlv(0x04, b.tlv(0x30, content))]


def leaf(edit: b.Edit, *, issuer: b.Ca | None = None) -> bytes:
    issuer = inter_ca() if issuer is None else issuer
    return b.issue_ek(issuer, b.ek_builder(issuer.name, ek_key(), san=b.cn("tpm")), edit=edit)


def verify(der: bytes) -> tpm.EkIdentity:
    return tpm.verify_ek(ek_public(), der, roots=[root_ca().cert], intermediates=[_root(inter_ca().der)])


CA_FALSE = edit_extension(BC, basic_constraints(FALSE))  # 30 03 01 01 00, as Intel writes it
EKU_FALSE = edit_extension(EKU, critical(FALSE))  # extension ... 01 01 00, as Intel writes it


@functools.cache
def intel_style() -> bytes:
    return leaf(b.chain_edits(CA_FALSE, EKU_FALSE))


def test_cryptography_refuses_the_reproduced_intel_encoding() -> None:
    for edit in (CA_FALSE, EKU_FALSE):
        with pytest.raises(ValueError, match="EncodedDefault"):
            _ = x509.load_der_x509_certificate(leaf(edit)).extensions  # decoded lazily


@pytest.mark.parametrize("edit", [CA_FALSE, EKU_FALSE, b.chain_edits(CA_FALSE, EKU_FALSE)])
def test_encoded_default_false_verifies_and_is_reported(edit: b.Edit) -> None:
    der = leaf(edit)
    ident = verify(der)
    assert ident.quirks == (certparse.ENCODED_DEFAULT,)
    assert ident.links[0].der == der
    ext = ident.links[0].view.extensions
    assert ext.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert ext.get_extension_for_class(x509.BasicConstraints).critical is True
    assert ext.get_extension_for_class(x509.ExtendedKeyUsage).critical is False


def test_a_non_critical_basic_constraints_with_encoded_ca_false_is_read() -> None:
    """basicConstraints without its critical field: the Extension has two fields."""
    der = leaf(b.chain_edits(edit_extension(BC, critical(None)), CA_FALSE))
    cert = certparse.read_certificate(der)
    assert cert.quirks == (certparse.ENCODED_DEFAULT,)
    basic = cert.view.extensions.get_extension_for_class(x509.BasicConstraints)
    assert (basic.critical, basic.value.ca) == (False, False)


def test_an_intermediate_with_an_encoded_default_reports_it_on_its_link() -> None:
    inter = b.make_ca(
        b.cn("PTT EK intermediate for GLK"), parent=root_ca(), edit=edit_extension(KU, critical(FALSE))
    )
    der = b.issue_ek(inter, b.ek_builder(inter.name, ek_key(), san=b.cn("tpm")))
    ident = tpm.verify_ek(ek_public(), der, roots=[root_ca().cert], intermediates=[_root(inter.der)])
    assert [link.quirks for link in ident.links] == [(), (certparse.ENCODED_DEFAULT,), ()]
    assert ident.quirks == (certparse.ENCODED_DEFAULT,)


# -- the signature is over the issuer's bytes ----------------------------------------------------


def test_the_canonical_copy_with_the_issuers_signature_does_not_verify() -> None:
    """What a re-encoding verifier would check: the same fields as DER. The CA signed the other
    bytes, so this must fail; the quirk cannot make a certificate say what was not signed."""
    cert = certparse.read_certificate(intel_style())
    _tbs, algorithm, _sig = b.children(intel_style())
    copy = b.assemble(cert.view.tbs_certificate_bytes, algorithm, cert.signature)
    _ = x509.load_der_x509_certificate(copy).extensions  # strict DER: no quirk needed
    with pytest.raises(EkUntrusted, match="does not verify") as caught:
        verify(copy)
    assert caught.value.code == "ek_untrusted"


@pytest.mark.parametrize(
    "edit",
    [
        CA_FALSE,  # a default added to a certificate the CA signed without it
        EKU_FALSE,
        edit_extension(BC, critical(None)),  # basicConstraints made non-critical
    ],
)
def test_an_encoded_default_added_after_signing_does_not_verify(edit: b.Edit) -> None:
    signed = b.issue_ek(inter_ca(), b.ek_builder(inter_ca().name, ek_key(), san=b.cn("tpm")))
    tbs, algorithm, signature = b.children(signed)
    tampered = b.tlv(0x30, edit(tbs) + algorithm + signature)
    with pytest.raises(EkUntrusted, match="does not verify") as caught:
        verify(tampered)
    assert caught.value.code == "ek_untrusted"


def test_a_tampered_tbs_with_the_quirk_does_not_verify() -> None:
    tbs, algorithm, signature = b.children(intel_style())
    pos = tbs.index(b"tpm")
    tampered = b.tlv(0x30, tbs[:pos] + b"tpn" + tbs[pos + 3 :] + algorithm + signature)
    assert certparse.read_certificate(tampered).quirks == (certparse.ENCODED_DEFAULT,)
    with pytest.raises(EkUntrusted, match="does not verify"):
        verify(tampered)


# -- TRUE is legal DER and means TRUE ------------------------------------------------------------


def test_encoded_critical_true_is_plain_der_and_stays_critical() -> None:
    der = leaf(edit_extension(EKU, critical(TRUE)))
    _ = x509.load_der_x509_certificate(der).extensions
    cert = certparse.read_certificate(der)
    assert cert.quirks == ()
    assert cert.view.extensions.get_extension_for_class(x509.ExtendedKeyUsage).critical is True


def test_encoded_ca_true_is_not_tolerated_into_false() -> None:
    """An EK certificate saying cA TRUE is a CA certificate: no quirk, refused as the CA it is."""
    signed_true = leaf(edit_extension(BC, basic_constraints(TRUE)))
    assert certparse.read_certificate(signed_true).quirks == ()
    assert (
        certparse.read_certificate(signed_true)
        .view.extensions.get_extension_for_class(x509.BasicConstraints)
        .value.ca
    )
    with pytest.raises(EkUntrusted, match="is a CA certificate"):
        verify(signed_true)


# -- everything else stays refused ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        # not DER BOOLEANs: TRUE is FF only, FALSE 00 only, one octet
        (edit_extension(EKU, critical(bytes.fromhex("010101"))), "not a valid X.509"),
        (edit_extension(BC, basic_constraints(bytes.fromhex("010101"))), "not a valid X.509"),
        (edit_extension(EKU, critical(bytes.fromhex("01020000"))), "not a valid X.509"),
        # a non-BOOLEAN DEFAULT: version v1 written out (Certificate.version DEFAULT v1)
        (b.replace_in_tbs(bytes.fromhex("a003020102"), bytes.fromhex("a003020100")), "EncodedDefault"),
        # BOOLEAN FALSE in places that are not DEFAULT FALSE
        (edit_extension(EKU, lambda f: [f[0], FALSE, FALSE, f[-1]]), "not a valid X.509"),
        (edit_extension(EKU, lambda f: [f[0], f[-1], FALSE]), "not a valid X.509"),
        (edit_extension(EKU, lambda f: [FALSE, f[0], f[-1]]), "not a valid X.509"),
        (edit_extension(BC, basic_constraints(FALSE + FALSE)), "not a valid X.509"),
        (edit_extension(BC, basic_constraints(bytes.fromhex("020100") + FALSE)), "not a valid X.509"),
        # cA FALSE with a path length: only a CA may have one (not turned into a valid certificate)
        (edit_extension(BC, basic_constraints(FALSE + bytes.fromhex("020100"))), "not a valid X.509"),
    ],
)
def test_other_encoded_defaults_and_booleans_are_malformed(edit: b.Edit, why: str) -> None:
    der = leaf(edit)
    with pytest.raises(MalformedInput, match=why) as caught:
        verify(der)
    assert caught.value.code == "malformed_request"


def test_an_encoded_default_inside_name_constraints_is_malformed() -> None:
    """GeneralSubtree.minimum BaseDistance DEFAULT 0 written out: an INTEGER default, not listed."""
    subtree = b.tlv(0x30, b.tlv(0x82, b"a.example") + bytes.fromhex("800100"))
    value = b.tlv(0x30, b.tlv(0xA0, subtree))
    builder = b.ca_builder(b.cn("NC CA"), root_ca().name, root_ca().key.public_key()).add_extension(
        x509.NameConstraints(permitted_subtrees=[x509.DNSName("a.example")], excluded_subtrees=None),
        critical=True,
    )
    cert = builder.sign(root_ca().key, hashes.SHA384())
    der = b.resign(cert, root_ca().key, edit_extension(NC, lambda f: [*f[:-1], b.tlv(0x04, value)]))
    with pytest.raises(MalformedInput, match="EncodedDefault"):
        _root(der)


# -- property: the quirk changes the encoding only ------------------------------------------------

_CHOICES = {"ca": CA_FALSE, "eku": EKU_FALSE, "bc-noncrit": edit_extension(BC, critical(None))}


@settings(max_examples=20, deadline=None)
@given(st.sets(st.sampled_from(sorted(_CHOICES))))
def test_encoded_defaults_decode_to_the_same_extensions(chosen: set[str]) -> None:
    plain = b.ek_builder(inter_ca().name, ek_key(), san=b.cn("tpm")).sign(inter_ca().key, hashes.SHA256())
    order = [k for k in ("bc-noncrit", "ca", "eku") if k in chosen]
    der = b.resign(plain, inter_ca().key, b.chain_edits(*(_CHOICES[k] for k in order)))
    cert = certparse.read_certificate(der)
    quirky = chosen & {"ca", "eku"}
    assert cert.quirks == ((certparse.ENCODED_DEFAULT,) if quirky else ())
    want = {e.oid: (e.critical, e.value) for e in plain.extensions}
    if "bc-noncrit" in chosen:
        want[ExtensionOID.BASIC_CONSTRAINTS] = (False, want[ExtensionOID.BASIC_CONSTRAINTS][1])
    assert {e.oid: (e.critical, e.value) for e in cert.view.extensions} == want
    assert cert.tbs == b.children(der)[0]  # what is verified is what was signed
    verify(der)
