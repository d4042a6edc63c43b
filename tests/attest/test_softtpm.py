"""The benchmark's software TPM: accepted by the verifier, and byte-compatible with swtpm.

The swtpm cross-checks import the soft EK's private key into swtpm (TPM2_Import under a storage
parent), so one and the same MakeCredential blob, made by ``attest.tpm.make_credential`` for the
soft EK, is activated by the real TPM and by :func:`tests.support.softtpm.activate`; tampered blobs are
refused by both with the same TPM response code.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from attest import credential, keys, tpm, wire
from attest.errors import EkUntrusted, MalformedInput, NonceMismatch, PcrDigestMismatch
from attest.wire import Alg, ObjectAttr
from bootstrap.node.tpm import Agent, Ek, Key
from tests.support import fakes, softtpm
from tests.support.softtpm import (
    FIRMWARE_VERSION,
    TPM_RC_ECC_POINT,
    TPM_RC_FAILURE,
    TPM_RC_INTEGRITY,
    ChallengeMalformed,
    CredentialRefused,
    QuoteRefused,
    SoftTpm,
    SoftTpmError,
    activate,
    soft_pool,
)
from tests.support.swtpms import TpmInfo

SEL = "sha256:0,1,2,3,4,5,6,7"
KINDS = ["rsa", "ecc"]


@pytest.fixture(scope="module")
def softs() -> dict[str, SoftTpm]:
    return {"rsa": SoftTpm.create(ek_kind="rsa"), "ecc": SoftTpm.create(ek_kind="ecc")}


# -- accepted by attest.tpm ----------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_ek_and_ak_pass_the_verifier(softs: dict[str, SoftTpm], kind: str) -> None:
    soft = softs[kind]
    ek = tpm.verify_ek(soft.ek_public, None, roots=[], allowlist={soft.ek_sha256})
    assert ek.sha256 == soft.ek_sha256
    assert ek.trusted_by == "allowlist"
    assert ek.template == {"rsa": "L-1 RSA-2048", "ecc": "L-2 ECC-P256"}[kind]
    with pytest.raises(EkUntrusted):
        tpm.verify_ek(soft.ek_public, None, roots=[])
    ak = tpm.verify_ak(soft.ak_public)
    assert ak.name == soft.ak_name
    assert (ak.scheme, ak.hash_alg) == (Alg.ECDSA, Alg.SHA256)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("secret_len", [32, 1])
def test_activates_what_make_credential_sealed(softs: dict[str, SoftTpm], kind: str, secret_len: int) -> None:
    soft = softs[kind]
    secret = os.urandom(secret_len)
    blob, enc = tpm.make_credential(soft.ek_public, tpm.verify_ak(soft.ak_public).name, secret)
    assert soft.activate_credential(blob, enc) == secret


@pytest.mark.parametrize("kind", KINDS)
def test_refuses_a_blob_for_another_ak_name_or_another_ek(softs: dict[str, SoftTpm], kind: str) -> None:
    soft, other = softs[kind], softs["ecc" if kind == "rsa" else "rsa"]
    blob, enc = tpm.make_credential(soft.ek_public, other.ak_name, os.urandom(32))
    with pytest.raises(CredentialRefused) as exc:
        soft.activate_credential(blob, enc)
    assert exc.value.rc == TPM_RC_INTEGRITY
    assert exc.value.code == "credential_refused"
    blob, enc = tpm.make_credential(other.ek_public, soft.ak_name, os.urandom(32))
    with pytest.raises(SoftTpmError):  # ciphertext for another key: wrong size or fails to decrypt
        soft.activate_credential(blob, enc)


@pytest.mark.parametrize("kind", KINDS)
def test_every_flipped_byte_is_refused(softs: dict[str, SoftTpm], kind: str) -> None:
    soft = softs[kind]
    secret = os.urandom(32)
    blob, enc = tpm.make_credential(soft.ek_public, soft.ak_name, secret)
    for i in range(len(blob)):
        bad = bytearray(blob)
        bad[i] ^= 0x01
        with pytest.raises(SoftTpmError):
            soft.activate_credential(bytes(bad), enc)
    for i in range(len(enc)):
        bad = bytearray(enc)
        bad[i] ^= 0x01
        with pytest.raises(SoftTpmError):
            soft.activate_credential(blob, bytes(bad))
    assert soft.activate_credential(blob, enc) == secret  # control


def test_malformed_challenges_are_refused_clearly(softs: dict[str, SoftTpm]) -> None:
    soft = softs["rsa"]
    blob, enc = tpm.make_credential(soft.ek_public, soft.ak_name, os.urandom(32))
    for bad_blob, bad_enc in [
        (blob + b"\x00", enc),
        (blob[:-1], enc),
        (b"", enc),
        (blob, enc + b"\x00"),
        (blob, b"\x00\x00"),
        (wire.tpm2b(b"\x00\x40" + bytes(10)), enc),  # integrity runs past the blob
        (wire.tpm2b(bytes(200)), enc),  # larger than any TPMS_ID_OBJECT
    ]:
        with pytest.raises(SoftTpmError):
            soft.activate_credential(bad_blob, bad_enc)
    with pytest.raises(ChallengeMalformed):
        soft.activate_credential(bytearray(blob), enc)  # type: ignore[arg-type]
    ecc = softs["ecc"]
    blob, enc = tpm.make_credential(ecc.ek_public, ecc.ak_name, os.urandom(32))
    off_curve = wire.tpm2b(wire.tpm2b(bytes(31) + b"\x01") + wire.tpm2b(bytes(31) + b"\x01"))
    with pytest.raises(CredentialRefused) as exc:
        ecc.activate_credential(blob, off_curve)
    assert exc.value.rc == TPM_RC_ECC_POINT
    with pytest.raises(ChallengeMalformed):
        ecc.activate_credential(blob, wire.tpm2b(b"\x00\x21" + bytes(33) + b"\x00\x00"))


def test_quote_verifies_and_binds_the_nonce(softs: dict[str, SoftTpm]) -> None:
    soft = softs["rsa"]
    nonce = os.urandom(32)
    quote, sig, pcrs = soft.quote(SEL, nonce)
    assert pcrs == {"sha256": {i: bytes(32) for i in range(8)}}
    result = tpm.verify_quote(soft.ak_public, quote, sig, selection=SEL, pcrs=pcrs, qualifying_data=nonce)
    assert result.firmware_version == FIRMWARE_VERSION
    assert result.qualified_signer == soft.ak_qualified_name
    with pytest.raises(NonceMismatch) as exc:
        tpm.verify_quote(soft.ak_public, quote, sig, selection=SEL, pcrs=pcrs, qualifying_data=os.urandom(32))
    assert exc.value.code == "nonce_mismatch"
    later = soft.quote(SEL, nonce)
    again = tpm.verify_quote(
        soft.ak_public, later[0], later[1], selection=SEL, pcrs=later[2], qualifying_data=nonce,
        previous=result.counters,
    )  # fmt: skip
    assert again.counters.clock > result.counters.clock
    assert again.counters[:2] == result.counters[:2]


def test_quote_of_given_pcr_values_and_of_the_pcr_state(softs: dict[str, SoftTpm]) -> None:
    soft = SoftTpm(softs["ecc"].ek_key, softs["ecc"].ak_key)  # own PCR state, same keys
    given = fakes.standard_pcrs(fill=7)
    nonce = b"q" * 32
    quote, sig, pcrs = soft.quote(SEL, nonce, given)
    assert pcrs == given
    tpm.verify_quote(soft.ak_public, quote, sig, selection=SEL, pcrs=given, qualifying_data=nonce)
    with pytest.raises(PcrDigestMismatch):
        tpm.verify_quote(
            soft.ak_public, quote, sig, selection=SEL, pcrs=fakes.standard_pcrs(0), qualifying_data=nonce
        )
    soft.pcrs["sha256"][3] = b"\x33" * 32
    quote, sig, pcrs = soft.quote("sha256:3,1", nonce)
    assert pcrs == {"sha256": {1: bytes(32), 3: b"\x33" * 32}}
    tpm.verify_quote(soft.ak_public, quote, sig, selection="sha256:1,3", pcrs=pcrs, qualifying_data=nonce)
    with pytest.raises(QuoteRefused):
        soft.quote(SEL, nonce, {"sha256": {0: bytes(32)}})  # values for PCRs 1-7 missing
    with pytest.raises(QuoteRefused):
        soft.quote(SEL, bytes(65))
    with pytest.raises(MalformedInput):
        soft.quote("sha256:0,0", nonce)


def test_seed_makes_the_same_tpm() -> None:
    for kind in ("ecc", "rsa"):
        a = SoftTpm.create(ek_kind=kind, seed=42)  # type: ignore[arg-type]
        b = SoftTpm.create(ek_kind=kind, seed=42)  # type: ignore[arg-type]
        assert (a.ek_public, a.ak_public) == (b.ek_public, b.ak_public)
        c = SoftTpm.create(ek_kind="ecc", seed=43)
        assert c.ek_public != a.ek_public
        assert c.ak_public != a.ak_public
        blob, enc = tpm.make_credential(a.ek_public, a.ak_name, b"s" * 32)
        assert b.activate_credential(blob, enc) == b"s" * 32
    assert isinstance(a.ek_key, rsa.RSAPrivateKey)
    assert a.ek_key.key_size == 2048
    nums = a.ek_key.private_numbers()
    assert nums.p * nums.q == nums.public_numbers.n
    with pytest.raises(ValueError, match="seed"):
        SoftTpm.create(seed=-1)


@pytest.mark.parametrize(("kind", "n"), [("rsa", 30), ("ecc", 10), ("rsa", 1), ("rsa", 0)])
def test_pool_members_have_their_own_working_keys(kind: str, n: int) -> None:
    pool = soft_pool(n, ek_kind=kind)  # type: ignore[arg-type]
    assert len(pool) == n
    assert len({s.ek_sha256 for s in pool}) == n
    assert len({s.ak_name for s in pool}) == n
    for soft in pool:
        assert soft.ek_kind == kind
        tpm.verify_ek(soft.ek_public, None, roots=[], allowlist={soft.ek_sha256})
        secret = os.urandom(32)
        blob, enc = tpm.make_credential(soft.ek_public, soft.ak_name, secret)
        assert soft.activate_credential(blob, enc) == secret
        if isinstance(soft.ek_key, rsa.RSAPrivateKey):
            assert soft.ek_key.private_numbers().public_numbers.n.bit_length() == 2048
    if pool:  # another member's blob opens nowhere else
        blob, enc = tpm.make_credential(pool[0].ek_public, pool[0].ak_name, b"k" * 32)
        for soft in pool[1:]:
            with pytest.raises(SoftTpmError):
                soft.activate_credential(blob, enc)


def _software_ca(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> x509.Certificate:
    now = datetime.now(UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bench EK CA")])
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - timedelta(days=1))
        .not_valid_after(now + timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


@pytest.mark.parametrize("kind", KINDS)
def test_ek_certificate_from_a_software_ca_chains(softs: dict[str, SoftTpm], kind: str) -> None:
    soft = softs[kind]
    ca_key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        if kind == "rsa"
        else ec.generate_private_key(ec.SECP256R1())
    )
    ca = _software_ca(ca_key)
    der = soft.ek_certificate(ca_key, ca)
    ident = tpm.verify_ek(soft.ek_public, der, roots=[ca])
    assert ident.trusted_by == "chain:CN=bench EK CA"
    assert ident.sha256 == soft.ek_sha256
    with pytest.raises(tpm.EkMismatch):
        tpm.verify_ek(softs["ecc" if kind == "rsa" else "rsa"].ek_public, der, roots=[ca])


# -- byte compatibility with swtpm ---------------------------------------------------------


def _low_ecc_ek(agent: Agent) -> bytes:
    from tpm2_pytss import ESYS_TR, TPM2B_SENSITIVE_CREATE
    from tpm2_pytss.utils import NVReadEK, create_ek_template

    _, tmpl = create_ek_template("EK-ECC256", NVReadEK(agent.ctx))
    handle, pub, *_ = agent.ctx.create_primary(TPM2B_SENSITIVE_CREATE(), tmpl, ESYS_TR.ENDORSEMENT)
    agent._handles.append(handle)
    return bytes(pub.marshal())


def _without_key(public: bytes) -> wire.Public:
    return wire.parse_public(public)._replace(rsa_modulus=b"", ecc_x=b"", ecc_y=b"", area=b"")


@pytest.mark.swtpm
@pytest.mark.parametrize("kind", KINDS)
def test_public_areas_match_swtpm_byte_for_byte_but_the_key(
    swtpm: TpmInfo, softs: dict[str, SoftTpm], kind: str
) -> None:
    soft = softs[kind]
    with Agent(swtpm.tcti) as agent:
        real_ek = agent.create_ek("rsa").public if kind == "rsa" else _low_ecc_ek(agent)
        real_ak = agent.create_ak().public
    for real, ours in ((real_ek, soft.ek_public), (real_ak, soft.ak_public)):
        assert len(real) == len(ours)
        assert _without_key(real) == _without_key(ours)
        # The unique field (TPM2B modulus, or TPM2B x and y) ends the area; all before it is equal.
        cut = 2 + 256 if wire.parse_public(real).type == Alg.RSA else 2 + 32 + 2 + 32
        assert real[:-cut] == ours[:-cut]


def _import_ek(agent: Agent, soft: SoftTpm) -> Ek:
    """Load the soft EK's private key into swtpm as a restricted decryption key. The TPM will
    not import fixedTPM/fixedParent (so not the EK template's attributes), but ActivateCredential
    uses only the key, nameAlg and symmetric definition, which are the EK's."""
    from tpm2_pytss import (
        ESYS_TR,
        TPM2_ALG,
        TPM2B_PUBLIC,
        TPM2B_SENSITIVE,
        TPM2B_SENSITIVE_CREATE,
        TPMA_OBJECT,
        TPMT_PUBLIC,
        TPMT_SENSITIVE,
        TPMT_SYM_DEF_OBJECT,
    )
    from tpm2_pytss.utils import wrap

    storage = TPMA_OBJECT.RESTRICTED | TPMA_OBJECT.DECRYPT | TPMA_OBJECT.FIXEDTPM | TPMA_OBJECT.FIXEDPARENT
    storage |= TPMA_OBJECT.SENSITIVEDATAORIGIN | TPMA_OBJECT.USERWITHAUTH
    template = TPM2B_PUBLIC(TPMT_PUBLIC.parse("ecc256:aes128cfb", objectAttributes=storage))
    parent, parent_pub, *_ = agent.ctx.create_primary(TPM2B_SENSITIVE_CREATE(), template, ESYS_TR.OWNER)
    attrs = ObjectAttr.RESTRICTED | ObjectAttr.DECRYPT | ObjectAttr.USER_WITH_AUTH
    sym = struct.pack(">HHH", Alg.AES, 128, Alg.CFB)
    key = soft.ek_key
    public = (
        fakes.rsa_public(key.public_key(), attrs=attrs, scheme=Alg.NULL, sym=sym)
        if isinstance(key, rsa.RSAPrivateKey)
        else fakes.ecc_public(key.public_key(), attrs=attrs, scheme=Alg.NULL, sym=sym)
    )
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    sensitive = TPMT_SENSITIVE.from_pem(pem)
    sensitive.seedValue = os.urandom(32)  # a restricted decryption key must carry a seed
    pub, _ = TPM2B_PUBLIC.unmarshal(public)
    _, duplicate, seed = wrap(parent_pub.publicArea, pub, TPM2B_SENSITIVE(sensitive))
    private = agent.ctx.import_(
        parent, b"", pub, duplicate, seed, TPMT_SYM_DEF_OBJECT(algorithm=TPM2_ALG.NULL)
    )
    handle = agent.ctx.load(parent, private, pub)
    agent.ctx.flush_context(parent)  # swtpm has three object slots: keep one for the AK
    agent._handles.append(handle)
    return Ek(handle, public, True, "imported soft EK", None)


def _swtpm_activate(agent: Agent, ak: Key, ek: Ek, blob: bytes, enc: bytes) -> bytes | int:
    """The secret, or the TPM's format-1 response code without parameter number and P bit."""
    from tpm2_pytss import ESYS_TR, TPM2B_ENCRYPTED_SECRET, TPM2B_ID_OBJECT, TSS2_Exception

    try:
        out = agent.ctx.activate_credential(
            ak.handle,
            ek.handle,
            TPM2B_ID_OBJECT.unmarshal(blob)[0],
            TPM2B_ENCRYPTED_SECRET.unmarshal(enc)[0],
            session1=ESYS_TR.PASSWORD,
            session2=ESYS_TR.PASSWORD,
        )
    except TSS2_Exception as exc:
        rc = int(exc.rc) & 0xFFFF  # without the TSS layer
        return rc & 0xBF if rc & 0x80 else rc  # format 1: drop parameter number and P bit
    return bytes(out)


def _soft_activate(soft: SoftTpm, name: bytes, blob: bytes, enc: bytes) -> bytes | int:
    try:
        return activate(soft.ek_key, soft.ek_public, name, blob, enc)
    except SoftTpmError as exc:
        return exc.rc


def _flip(data: bytes, i: int) -> bytes:
    out = bytearray(data)
    out[i] ^= 0x80
    return bytes(out)


@pytest.fixture
def imported(
    swtpm: TpmInfo, softs: dict[str, SoftTpm], request: pytest.FixtureRequest
) -> Iterator[tuple[Agent, Key, Ek, SoftTpm]]:
    soft = softs[request.param]
    with Agent(swtpm.tcti) as agent:
        ek = _import_ek(agent, soft)
        yield agent, agent.create_ak(), ek, soft


@pytest.mark.swtpm
@pytest.mark.parametrize("imported", KINDS, indirect=True)
def test_swtpm_and_soft_activation_agree_on_one_blob(imported: tuple[Agent, Key, Ek, SoftTpm]) -> None:
    agent, ak, ek, soft = imported
    ak_name = tpm.verify_ak(ak.public).name
    secret = os.urandom(32)
    # What the server sends: MakeCredential to the *standard* EK public of the soft TPM.
    blob, enc = tpm.make_credential(soft.ek_public, ak_name, secret)
    assert _swtpm_activate(agent, ak, ek, blob, enc) == secret
    assert _soft_activate(soft, ak_name, blob, enc) == secret
    # The same algorithm sealed to the imported public area gives the same kind of blob.
    imported_pub = wire.parse_public(ek.public)
    blob2, enc2 = credential.make_credential(imported_pub, keys.public_key(imported_pub), ak_name, secret)
    assert (len(blob2), len(enc2)) == (len(blob), len(enc)) == (2 + 2 + 32 + 2 + 32, len(enc))
    assert _swtpm_activate(agent, ak, ek, blob2, enc2) == _soft_activate(soft, ak_name, blob2, enc2) == secret

    seed_bad = _flip(enc, 2 + 5)  # RSA: a ciphertext that fails OAEP; ECC: an x off the curve
    cases = {
        "integrity HMAC": (_flip(blob, 2 + 2 + 3), enc),
        "encIdentity": (_flip(blob, len(blob) - 1), enc),
        "encrypted seed": (blob, seed_bad),
        "another AK name": tpm.make_credential(soft.ek_public, soft.ak_name, secret),
    }
    if isinstance(soft.ek_key, rsa.RSAPrivateKey):  # a seed longer than the name digest
        long_seed = soft.ek_key.public_key().encrypt(os.urandom(33), softtpm._OAEP_IDENTITY)
        cases["oversized seed"] = (blob, wire.tpm2b(long_seed))
    for what, (b, e) in cases.items():
        real = _swtpm_activate(agent, ak, ek, b, e)
        ours = _soft_activate(soft, ak_name, b, e)
        assert isinstance(real, int), what
        assert real == ours, f"{what}: swtpm 0x{real:03x}, soft {ours!r}"
    assert {_soft_activate(soft, ak_name, *cases["integrity HMAC"])} == {TPM_RC_INTEGRITY}
    assert _soft_activate(soft, ak_name, *cases["encrypted seed"]) == (
        TPM_RC_FAILURE if soft.ek_kind == "rsa" else TPM_RC_ECC_POINT
    )


def _marshal(att: wire.Attest) -> bytes:
    """TPMS_ATTEST from its parsed fields: equal to the input shows the parser saw every byte."""
    return (
        struct.pack(">IH", wire.TPM_GENERATED_VALUE, wire.TPM_ST_ATTEST_QUOTE)
        + wire.tpm2b(att.qualified_signer)
        + wire.tpm2b(att.extra_data)
        + struct.pack(">QIIBQ", att.clock, att.reset_count, att.restart_count, att.safe, att.firmware_version)
        + wire.marshal_selection(att.selection)
        + wire.tpm2b(att.pcr_digest)
    )


@pytest.mark.swtpm
def test_quotes_have_swtpm_layout(swtpm: TpmInfo, softs: dict[str, SoftTpm]) -> None:
    soft = softs["rsa"]
    nonce = os.urandom(32)
    with Agent(swtpm.tcti) as agent:
        ak = agent.create_ak()
        real_q, real_sig, real_pcrs = agent.quote_with_pcrs(ak, SEL, nonce)
    ours_q, ours_sig, ours_pcrs = soft.quote(SEL, nonce, real_pcrs)
    assert ours_pcrs == real_pcrs
    real, ours = wire.parse_quote(real_q), wire.parse_quote(ours_q)
    assert (_marshal(real), _marshal(ours)) == (real_q, ours_q)
    assert len(real_q) == len(ours_q)
    assert ours_q[:6] == real_q[:6]  # magic, type
    # Fields that must differ: the signer's name and the clock; the rest is equal.
    assert len(real.qualified_signer) == len(ours.qualified_signer) == 34
    assert real.qualified_signer[:2] == ours.qualified_signer[:2] == b"\x00\x0b"
    assert real.qualified_signer != ours.qualified_signer
    assert (ours.extra_data, ours.safe, ours.firmware_version) == (
        real.extra_data,
        real.safe,
        real.firmware_version,
    )
    assert (ours.selection, ours.pcr_digest) == (real.selection, real.pcr_digest)
    tail = len(wire.marshal_selection(real.selection)) + 2 + 32
    assert ours_q[-tail:] == real_q[-tail:]  # the selection bytes (sizeofSelect 3) and pcrDigest
    clock_at = 6 + 2 + 34 + 2 + len(nonce)
    assert ours_q[clock_at + 16 :] == real_q[clock_at + 16 :]  # safe, firmwareVersion, quote info
    assert ours_q[6 + 36 : clock_at] == real_q[6 + 36 : clock_at]  # extraData

    rs, os_ = wire.parse_signature(real_sig), wire.parse_signature(ours_sig)
    assert len(real_sig) == len(ours_sig) == 2 + 2 + 2 + 32 + 2 + 32
    assert ours_sig[:4] == real_sig[:4]  # ECDSA, SHA-256
    assert (len(rs.r), len(rs.s)) == (len(os_.r), len(os_.s)) == (32, 32)
    kw = {"selection": SEL, "pcrs": real_pcrs, "qualifying_data": nonce}
    tpm.verify_quote(ak.public, real_q, real_sig, **kw)  # type: ignore[arg-type]
    tpm.verify_quote(soft.ak_public, ours_q, ours_sig, **kw)  # type: ignore[arg-type]
    with pytest.raises(NonceMismatch):
        tpm.verify_quote(
            soft.ak_public, ours_q, ours_sig, selection=SEL, pcrs=real_pcrs, qualifying_data=b"x"
        )


def _shape(der: bytes) -> list[tuple[str, bool]]:
    return [(e.oid.dotted_string, e.critical) for e in x509.load_der_x509_certificate(der).extensions]


@pytest.mark.swtpm
def test_ek_certificate_is_shaped_like_swtpm_setups(swtpm: TpmInfo, softs: dict[str, SoftTpm]) -> None:
    """Issued with the very CA key swtpm_setup used, the soft EK's certificate chains to the
    same roots, and carries the same extensions in the same order as the swtpm EK's."""
    signer = serialization.load_pem_private_key((swtpm.server.ca.dir / "signkey.pem").read_bytes(), None)
    assert isinstance(signer, rsa.RSAPrivateKey)
    with Agent(swtpm.tcti) as agent:
        real_rsa, real_ecc = agent.create_ek("rsa").certificate, agent.create_ek("ecc").certificate
    assert real_rsa is not None
    assert real_ecc is not None
    for kind, real in (("rsa", real_rsa), ("ecc", real_ecc)):
        soft = softs[kind]
        ours = soft.ek_certificate(signer, swtpm.intermediate)
        ident = tpm.verify_ek(soft.ek_public, ours, roots=[swtpm.root], intermediates=[swtpm.intermediate])
        assert ident.trusted_by == "chain:CN=swtpm-localca-rootca"
        assert _shape(ours) == _shape(real)
        a, b = x509.load_der_x509_certificate(ours), x509.load_der_x509_certificate(real)
        assert (a.subject, a.issuer, a.not_valid_after_utc) == (b.subject, b.issuer, b.not_valid_after_utc)
        for cls in (
            x509.SubjectAlternativeName,
            x509.KeyUsage,
            x509.ExtendedKeyUsage,
            x509.AuthorityKeyIdentifier,
        ):
            assert a.extensions.get_extension_for_class(cls) == b.extensions.get_extension_for_class(cls)
        sda = x509.ObjectIdentifier("2.5.29.9")  # subjectDirectoryAttributes: TPM spec version
        assert a.extensions.get_extension_for_oid(sda) == b.extensions.get_extension_for_oid(sda)
