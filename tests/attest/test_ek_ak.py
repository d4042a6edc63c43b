"""EK and AK checks: templates, certificate chains, allow/deny lists, AK attributes."""

from __future__ import annotations

import functools
import hashlib
import struct
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from attest import tpm, wire
from attest.errors import AkInvalid, EkMismatch, EkUntrusted, MalformedInput
from attest.keys import object_name
from attest.templates import EK_TEMPLATES, POLICY_A_SHA256
from bootstrap.node.tpm import Agent, Ek
from tests.support import fakes
from tests.support.swtpms import TpmInfo

NOW = datetime.now(UTC)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_ca(
    cn: str,
    *,
    parent: tuple[rsa.RSAPrivateKey, x509.Certificate] | None = None,
    ca: bool = True,
    days: int = 3650,
    not_before_days: int = -1,
    path_length: int | None = None,
    key_usage: x509.KeyUsage | None = None,
) -> tuple[rsa.RSAPrivateKey, x509.Certificate]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    issuer_key, issuer_name = (parent[0], parent[1].subject) if parent else (key, _name(cn))
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW + timedelta(days=not_before_days))
        .not_valid_after(NOW + timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=path_length if ca else None), critical=True)
    )
    if key_usage is not None:
        cert = cert.add_extension(key_usage, critical=True)
    return key, cert.sign(issuer_key, hashes.SHA256())


def issue_ek_cert(
    issuer: tuple[rsa.RSAPrivateKey, x509.Certificate],
    ek_key: rsa.RSAPublicKey | ec.EllipticCurvePublicKey,
    *,
    not_before: datetime | None = None,
    not_after: datetime | None = None,
    extra: list[tuple[x509.ExtensionType, bool]] | None = None,
) -> bytes:
    b = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([]))
        .issuer_name(issuer[1].subject)
        .public_key(ek_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before or NOW - timedelta(days=1))
        .not_valid_after(not_after or NOW + timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName([x509.DirectoryName(_name("tpm"))]), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.ObjectIdentifier("2.23.133.8.1")]), critical=False)
    )
    for ext, critical in extra or []:
        b = b.add_extension(ext, critical=critical)
    return b.sign(issuer[0], hashes.SHA256()).public_bytes(serialization.Encoding.DER)


@pytest.fixture
def ek(swtpm: TpmInfo) -> Iterator[Ek]:
    with Agent(swtpm.tcti) as agent:
        yield agent.create_ek("rsa")


# -- EK: the good paths ------------------------------------------------------------------------


def test_swtpm_rsa_and_ecc_eks_verify_against_the_local_ca(swtpm: TpmInfo) -> None:
    with Agent(swtpm.tcti) as agent:
        for kind, template in (("rsa", "L-1 RSA-2048"), ("ecc", "H-3 ECC-P384")):
            ek = agent.create_ek(kind)  # type: ignore[arg-type]
            ident = tpm.verify_ek(
                ek.public, ek.certificate, roots=[swtpm.root], intermediates=[swtpm.intermediate]
            )
            assert ident.template == template
            assert ident.trusted_by == "chain:CN=swtpm-localca-rootca"
            assert [c.subject for c in ident.chain] == [
                ek_cert.subject for ek_cert in (x509.load_der_x509_certificate(ek.certificate or b""),)
            ] + [swtpm.intermediate.subject, swtpm.root.subject]
            spki = ident.key.public_bytes(
                serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            assert ident.sha256 == hashlib.sha256(spki).hexdigest()


def test_an_operator_may_trust_the_intermediate_directly(swtpm: TpmInfo, ek: Ek) -> None:
    ident = tpm.verify_ek(ek.public, ek.certificate, roots=[swtpm.intermediate])
    assert ident.trusted_by == "chain:CN=swtpm-localca"


def test_agent_picks_the_certified_ecc_ek(swtpm: TpmInfo) -> None:
    with Agent(swtpm.tcti) as agent:
        template, cert = agent.read_ek_certificate("ecc")
        ecc = agent.create_ek("ecc")
    assert template == "EK-HIGH-ECC384"
    assert cert is not None
    ident = tpm.verify_ek(ecc.public, ecc.certificate, roots=[swtpm.root], intermediates=[swtpm.intermediate])
    assert ident.template == "H-3 ECC-P384"


def test_ek_without_certificate_needs_the_allowlist(swtpm: TpmInfo) -> None:
    """TPMs without an NV certificate (here the L-2 P-256 EK, which swtpm does not certify) are
    accepted only when their SPKI hash is allowlisted, never silently."""
    from tpm2_pytss import ESYS_TR, TPM2B_SENSITIVE_CREATE
    from tpm2_pytss.utils import NVReadEK, create_ek_template

    with Agent(swtpm.tcti) as agent:
        cert, tmpl = create_ek_template("EK-ECC256", NVReadEK(agent.ctx))
        handle, pub, *_ = agent.ctx.create_primary(TPM2B_SENSITIVE_CREATE(), tmpl, ESYS_TR.ENDORSEMENT)
        agent.ctx.flush_context(handle)
    assert cert is None
    p256 = pub.marshal()
    with pytest.raises(EkUntrusted) as exc:
        tpm.verify_ek(p256, None, roots=[swtpm.root])
    assert exc.value.code == "ek_untrusted"
    ident = tpm.verify_ek(p256, None, roots=[], allowlist={"00" * 32, _sha(p256)})
    assert (ident.sha256, ident.template, ident.trusted_by) == (_sha(p256), "L-2 ECC-P256", "allowlist")


def _sha(ek_public: bytes) -> str:
    from attest.keys import public_key, spki_der

    return hashlib.sha256(spki_der(public_key(wire.parse_public(ek_public)))).hexdigest()


# -- EK: attacks -----------------------------------------------------------------------------


def test_ek_certificate_from_an_untrusted_ca_is_refused(ek: Ek) -> None:
    rogue = make_ca("rogue-tpm-vendor")
    cert = issue_ek_cert(rogue, tpm.verify_ek(ek.public, None, roots=[], allowlist={_sha(ek.public)}).key)
    real_root = make_ca("real-vendor")[1]
    with pytest.raises(EkUntrusted) as exc:
        tpm.verify_ek(ek.public, cert, roots=[real_root])
    assert exc.value.code == "ek_untrusted"
    assert "does not chain" in exc.value.detail


def test_ca_with_the_right_name_but_another_key_is_refused(ek: Ek) -> None:
    genuine = make_ca("vendor")
    impostor = make_ca("vendor")  # same subject, different key
    cert = issue_ek_cert(impostor, _ek_key(ek))
    with pytest.raises(EkUntrusted) as exc:
        tpm.verify_ek(ek.public, cert, roots=[genuine[1]])
    assert "signature" in exc.value.detail


def test_certificate_for_another_key_is_refused(swtpm: TpmInfo, other_swtpm: TpmInfo) -> None:
    """TPM B's genuine certificate presented with TPM A's EK."""
    with Agent(swtpm.tcti) as a, Agent(other_swtpm.tcti) as b:
        ek_a, ek_b = a.create_ek("rsa"), b.create_ek("rsa")
    with pytest.raises(EkMismatch) as exc:
        tpm.verify_ek(ek_a.public, ek_b.certificate, roots=[swtpm.root], intermediates=[swtpm.intermediate])
    assert exc.value.code == "ek_mismatch"


def test_expired_ek_certificate_is_refused(ek: Ek) -> None:
    vendor = make_ca("vendor")
    cert = issue_ek_cert(
        vendor, _ek_key(ek), not_before=NOW - timedelta(days=800), not_after=NOW - timedelta(days=1)
    )
    with pytest.raises(EkUntrusted) as exc:
        tpm.verify_ek(ek.public, cert, roots=[vendor[1]])
    assert exc.value.code == "ek_untrusted"
    assert "expired" in exc.value.detail


def test_expired_intermediate_is_refused(ek: Ek) -> None:
    root = make_ca("root")
    inter = make_ca("inter", parent=root, days=-1)  # notAfter yesterday
    cert = issue_ek_cert(inter, _ek_key(ek))
    with pytest.raises(EkUntrusted) as exc:
        tpm.verify_ek(ek.public, cert, roots=[root[1]], intermediates=[inter[1]])
    assert "EK intermediate CN=inter expired" in exc.value.detail


def test_not_yet_valid_intermediate_and_leaf_are_refused(ek: Ek) -> None:
    root = make_ca("root")
    inter = make_ca("inter", parent=root, not_before_days=10)
    with pytest.raises(EkUntrusted) as exc:
        tpm.verify_ek(ek.public, issue_ek_cert(inter, _ek_key(ek)), roots=[root[1]], intermediates=[inter[1]])
    assert "EK intermediate CN=inter is not valid before" in exc.value.detail
    early = issue_ek_cert(root, _ek_key(ek), not_before=NOW + timedelta(days=2))
    with pytest.raises(EkUntrusted) as exc2:
        tpm.verify_ek(ek.public, early, roots=[root[1]])
    assert "EK certificate" in exc2.value.detail
    assert "not valid before" in exc2.value.detail


def test_an_intermediate_is_not_a_trust_anchor(ek: Ek) -> None:
    root = make_ca("root")
    inter = make_ca("inter", parent=root)
    cert = issue_ek_cert(inter, _ek_key(ek))
    with pytest.raises(EkUntrusted):
        tpm.verify_ek(ek.public, cert, roots=[], intermediates=[inter[1]])
    assert (
        tpm.verify_ek(ek.public, cert, roots=[root[1]], intermediates=[inter[1]]).trusted_by
        == "chain:CN=root"
    )


def test_path_length_is_enforced(ek: Ek) -> None:
    root = make_ca("root", path_length=0)  # may only issue leaves
    inter = make_ca("inter", parent=root)
    with pytest.raises(EkUntrusted) as exc:
        tpm.verify_ek(ek.public, issue_ek_cert(inter, _ek_key(ek)), roots=[root[1]], intermediates=[inter[1]])
    assert "path length" in exc.value.detail


def test_issuer_without_key_cert_sign_is_refused(ek: Ek) -> None:
    ku = x509.KeyUsage(True, False, False, False, False, False, False, False, False)  # digitalSignature only
    vendor = make_ca("vendor", key_usage=ku)
    with pytest.raises(EkUntrusted) as exc:
        tpm.verify_ek(ek.public, issue_ek_cert(vendor, _ek_key(ek)), roots=[vendor[1]])
    assert "keyUsage" in exc.value.detail


def test_issuer_that_is_not_a_ca_is_refused(ek: Ek) -> None:
    root = make_ca("root")
    not_ca = make_ca("leafy", parent=root, ca=False)
    cert = issue_ek_cert(not_ca, _ek_key(ek))
    with pytest.raises(EkUntrusted) as exc:
        tpm.verify_ek(ek.public, cert, roots=[root[1]], intermediates=[not_ca[1]])
    assert "not a CA" in exc.value.detail


def test_unknown_critical_extension_is_refused(ek: Ek) -> None:
    vendor = make_ca("vendor")
    weird = x509.UnrecognizedExtension(x509.ObjectIdentifier("1.3.6.1.4.1.99999.1"), b"\x05\x00")
    cert = issue_ek_cert(vendor, _ek_key(ek), extra=[(weird, True)])
    with pytest.raises(EkUntrusted) as exc:
        tpm.verify_ek(ek.public, cert, roots=[vendor[1]])
    assert "critical extension" in exc.value.detail


def test_certificate_with_wrong_usage_is_refused(ek: Ek) -> None:
    vendor = make_ca("vendor")
    ku = x509.KeyUsage(True, False, False, False, False, False, False, False, False)  # signing only
    cert = issue_ek_cert(vendor, _ek_key(ek), extra=[(ku, True)])
    with pytest.raises(EkUntrusted) as exc:
        tpm.verify_ek(ek.public, cert, roots=[vendor[1]])
    assert "neither keyEncipherment nor keyAgreement" in exc.value.detail


def test_denylist_wins_over_chain_and_allowlist(swtpm: TpmInfo, ek: Ek) -> None:
    digest = _sha(ek.public)
    with pytest.raises(EkUntrusted) as exc:
        tpm.verify_ek(
            ek.public,
            ek.certificate,
            roots=[swtpm.root, swtpm.intermediate],
            allowlist={digest},
            denylist={digest.upper()},
        )
    assert "denylist" in exc.value.detail


@pytest.mark.parametrize(
    ("offset", "value", "why"),
    [
        (4 + 2, 0x000300B2 | wire.ObjectAttr.SIGN, "attributes"),  # signing EK (swtpm --allow-signing)
        (4 + 2, 0x000300B2 | wire.ObjectAttr.USER_WITH_AUTH, "attributes"),  # low range + userWithAuth
        (4 + 2, 0x000300B2 & ~wire.ObjectAttr.FIXED_TPM, "attributes"),
    ],
)
def test_non_standard_ek_template_is_refused(ek: Ek, offset: int, value: int, why: str) -> None:
    b = bytearray(ek.public)
    struct.pack_into(">I", b, offset, value)
    with pytest.raises(EkUntrusted) as exc:
        tpm.verify_ek(bytes(b), None, roots=[], allowlist={_sha(ek.public)})
    assert why in exc.value.detail


def test_ek_with_foreign_policy_is_refused(ek: Ek) -> None:
    b = bytearray(ek.public)
    b[12] ^= 0xFF  # first byte of the 32-byte authPolicy
    with pytest.raises(EkUntrusted) as exc:
        tpm.verify_ek(bytes(b), None, roots=[], allowlist={_sha(ek.public)})
    assert "authPolicy" in exc.value.detail


def test_ek_certificate_with_trailing_bytes_is_malformed(swtpm: TpmInfo, ek: Ek) -> None:
    assert ek.certificate is not None
    with pytest.raises(MalformedInput):
        tpm.verify_ek(ek.public, ek.certificate + b"\x00", roots=[swtpm.root, swtpm.intermediate])
    with pytest.raises(MalformedInput):
        tpm.verify_ek(ek.public, b"\x30\x80" + ek.certificate[2:], roots=[swtpm.root])
    with pytest.raises(MalformedInput):
        tpm.verify_ek(ek.public, b"\x30" * 20000, roots=[swtpm.root])


def test_our_templates_match_the_tcg_templates_in_tpm2_pytss() -> None:
    from tpm2_pytss.internal.templates import ek_template

    names = {
        "L-1 RSA-2048": "EK-RSA2048",
        "L-2 ECC-P256": "EK-ECC256",
        "H-1 RSA-2048": "EK-HIGH-RSA2048",
        "H-2 ECC-P256": "EK-HIGH-ECC256",
        "H-3 ECC-P384": "EK-HIGH-ECC384",
    }
    for ours in EK_TEMPLATES:
        theirs = ek_template.lookup(names[ours.name]).template.publicArea
        assert int(theirs.objectAttributes) == ours.attributes
        assert bytes(theirs.authPolicy) == ours.auth_policy
        assert int(theirs.nameAlg) == ours.name_alg
        assert int(theirs.parameters.asymDetail.symmetric.keyBits.sym) == ours.sym_bits


def _ek_key(ek: Ek) -> rsa.RSAPublicKey | ec.EllipticCurvePublicKey:
    from attest.keys import public_key

    return public_key(wire.parse_public(ek.public))


# -- AK -----------------------------------------------------------------------------------------


def test_real_aks_verify_and_their_name_matches_the_tpm(swtpm: TpmInfo) -> None:
    from tpm2_pytss import TPM2B_PUBLIC

    with Agent(swtpm.tcti) as agent:
        for kind in ("ecc", "rsa"):
            ak = agent.create_ak(kind)  # type: ignore[arg-type]
            ident = tpm.verify_ak(ak.public)
            tpm_name = agent.ctx.tr_get_name(ak.handle).marshal()[2:]
            assert ident.name == tpm_name
            assert ident.name == TPM2B_PUBLIC.unmarshal(ak.public)[0].get_name().marshal()[2:]
            assert ident.name == object_name(wire.parse_public(ak.public))


_ALL = fakes.AK_ATTRS


@functools.cache
def _ec() -> ec.EllipticCurvePublicKey:
    return ec.generate_private_key(ec.SECP256R1()).public_key()


@pytest.mark.parametrize(
    ("public", "missing"),
    [
        (lambda: fakes.ecc_public(_ec(), attrs=_ALL & ~wire.ObjectAttr.FIXED_TPM), "fixedTPM"),
        (lambda: fakes.ecc_public(_ec(), attrs=_ALL & ~wire.ObjectAttr.RESTRICTED), "restricted"),
        (lambda: fakes.ecc_public(_ec(), attrs=_ALL | wire.ObjectAttr.DECRYPT), "decrypt"),
        (lambda: fakes.ecc_public(_ec(), attrs=_ALL & ~wire.ObjectAttr.FIXED_PARENT), "fixedParent"),
        (
            lambda: fakes.ecc_public(_ec(), attrs=_ALL & ~wire.ObjectAttr.SENSITIVE_DATA_ORIGIN),
            "sensitiveDataOrigin",
        ),
        (lambda: fakes.ecc_public(_ec(), attrs=_ALL & ~wire.ObjectAttr.SIGN), "sign"),
        (lambda: fakes.ecc_public(_ec(), attrs=_ALL & ~wire.ObjectAttr.USER_WITH_AUTH), "userWithAuth"),
        (lambda: fakes.ecc_public(_ec(), scheme_hash=wire.Alg.SHA1), "SHA-256"),
        (lambda: fakes.ecc_public(_ec(), scheme=wire.Alg.NULL), "explicit ECDSA"),
        (lambda: fakes.ecc_public(_ec(), name_alg=wire.Alg.SHA1), "name algorithm"),
        (
            lambda: fakes.ecc_public(
                _ec(), kdf=wire.Alg.NULL, sym=struct.pack(">HHH", wire.Alg.AES, 128, wire.Alg.CFB)
            ),
            "symmetric",
        ),
        (
            lambda: fakes.rsa_public(
                rsa.generate_private_key(public_exponent=65537, key_size=1024).public_key()  # noqa: S505
            ),
            "below 2048",
        ),
        (
            lambda: fakes.rsa_public(
                rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key(),
                scheme=wire.Alg.RSAPSS,
            ),
            "RSASSA",
        ),
    ],
    ids=[
        "no-fixedTPM",
        "no-restricted",
        "decrypt",
        "no-fixedParent",
        "no-sensitiveDataOrigin",
        "no-sign",
        "no-userWithAuth",
        "sha1-scheme",
        "null-scheme",
        "sha1-name-alg",
        "symmetric",
        "rsa-1024",
        "rsapss",
    ],
)
def test_ak_attacks_are_refused(public: Callable[[], bytes], missing: str) -> None:
    with pytest.raises(AkInvalid) as exc:
        tpm.verify_ak(public())
    assert exc.value.code == "ak_invalid"
    assert missing in exc.value.detail


def test_unrestricted_signing_key_from_a_real_tpm_is_refused(swtpm: TpmInfo) -> None:
    """TPM2_Sign with such a key could sign a forged TPMS_ATTEST: it must not pass as an AK."""
    from tpm2_pytss import ESYS_TR, TPM2_ALG, TPM2B_PUBLIC, TPM2B_SENSITIVE_CREATE, TPMA_OBJECT, TPMT_PUBLIC

    attrs = (
        TPMA_OBJECT.SIGN_ENCRYPT
        | TPMA_OBJECT.FIXEDTPM
        | TPMA_OBJECT.FIXEDPARENT
        | TPMA_OBJECT.SENSITIVEDATAORIGIN
        | TPMA_OBJECT.USERWITHAUTH
    )
    tmpl = TPM2B_PUBLIC(
        TPMT_PUBLIC.parse("ecc256:ecdsa-sha256:null", nameAlg=TPM2_ALG.SHA256, objectAttributes=attrs)
    )
    with Agent(swtpm.tcti) as agent:
        handle, pub, *_ = agent.ctx.create_primary(TPM2B_SENSITIVE_CREATE(), tmpl, ESYS_TR.ENDORSEMENT)
        agent.ctx.flush_context(handle)
    with pytest.raises(AkInvalid) as exc:
        tpm.verify_ak(pub.marshal())
    assert "restricted" in exc.value.detail


def test_ak_with_point_off_the_curve_is_malformed() -> None:
    good = bytearray(fakes.SoftAk().public)
    good[-1] ^= 0x01
    with pytest.raises(MalformedInput):
        tpm.verify_ak(bytes(good))


def test_trailing_or_oversized_public_areas_are_malformed(swtpm: TpmInfo) -> None:
    with Agent(swtpm.tcti) as agent:
        ek, ak = agent.create_ek("rsa"), agent.create_ak()
    for bad in (ak.public + b"\x00", ak.public[:-1], b"\x00" * 2000):
        with pytest.raises(MalformedInput) as exc:
            tpm.verify_ak(bad)
        assert exc.value.code == "malformed_request"
    with pytest.raises(MalformedInput):
        tpm.verify_ek(ek.public + b"\x00", ek.certificate, roots=[swtpm.root])
    with pytest.raises(MalformedInput):
        tpm.make_credential(ek.public + b"\x00", tpm.verify_ak(ak.public).name, b"s" * 32)


_EK_SYM = struct.pack(">HHH", wire.Alg.AES, 128, wire.Alg.CFB)


@functools.cache
def _rsa_ek_key() -> rsa.RSAPublicKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key()


@functools.cache
def _ecc_ek_key() -> ec.EllipticCurvePublicKey:
    return ec.generate_private_key(ec.SECP256R1()).public_key()


def _ecc_ek(key: ec.EllipticCurvePublicKey | None = None, kdf: int = wire.Alg.NULL) -> bytes:
    """A public area following the L-2 ECC P-256 EK template (or deviating in curve or KDF)."""
    return fakes.ecc_public(
        _ecc_ek_key() if key is None else key,
        attrs=0x000300B2,
        scheme=wire.Alg.NULL,
        policy=POLICY_A_SHA256,
        sym=_EK_SYM,
        kdf=kdf,
    )


@pytest.mark.parametrize(
    ("public", "why"),
    [
        (lambda: fakes.rsa_ek_public(_rsa_ek_key()), None),
        (_ecc_ek, None),
        (
            lambda: fakes.rsa_public(
                _rsa_ek_key(), attrs=0x000300B2, scheme=wire.Alg.RSASSA, policy=POLICY_A_SHA256, sym=_EK_SYM
            ),
            "scheme",
        ),
        (
            lambda: fakes.rsa_public(
                _rsa_ek_key(), attrs=0x000300B2, scheme=wire.Alg.NULL, policy=POLICY_A_SHA256
            ),
            "symmetric",
        ),
        (
            lambda: fakes.rsa_public(
                _rsa_ek_key(),
                attrs=0x000300B2,
                scheme=wire.Alg.NULL,
                policy=POLICY_A_SHA256,
                sym=struct.pack(">HHH", wire.Alg.AES, 256, wire.Alg.CFB),
            ),
            "symmetric",
        ),
        (lambda: _ecc_ek(kdf=wire.Alg.KDF1_SP800_108), "KDF"),
        (
            lambda: _ecc_ek(key=ec.generate_private_key(ec.SECP384R1()).public_key()),
            "matches no TCG EK template",
        ),
        (
            lambda: fakes.rsa_ek_public(
                rsa.generate_private_key(public_exponent=3, key_size=2048).public_key()
            ),
            "exponent",
        ),
    ],
    ids=[
        "rsa-l1",
        "ecc-l2",
        "rsa-rsassa",
        "rsa-no-symmetric",
        "rsa-aes256",
        "ecc-kdf",
        "ecc-p384",
        "rsa-exponent-3",
    ],
)
def test_ek_template_deviations(public: Callable[[], bytes], why: str | None) -> None:
    area = public()
    if why is None:
        assert tpm.verify_ek(area, None, roots=[], allowlist={_sha(area)}).template.startswith("L-")
        return
    with pytest.raises(EkUntrusted) as exc:
        tpm.verify_ek(area, None, roots=[], allowlist={_sha(area)})
    assert why in exc.value.detail


def test_ak_on_an_unsupported_curve_or_with_a_kdf_is_refused() -> None:
    p521 = fakes.ecc_public(ec.generate_private_key(ec.SECP521R1()).public_key())
    with pytest.raises(AkInvalid, match="P-256 or P-384"):
        tpm.verify_ak(p521)
    with_kdf = fakes.ecc_public(_ec(), kdf=wire.Alg.KDF1_SP800_108)
    with pytest.raises(AkInvalid, match="KDF"):
        tpm.verify_ak(with_kdf)
