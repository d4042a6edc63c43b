"""MakeCredential: our software implementation is activated by a real TPM, and it binds the AK."""

from __future__ import annotations

import os

import pytest
from tpm2_pytss import ESYS_TR, TPM2B_SENSITIVE_CREATE
from tpm2_pytss.utils import NVReadEK, create_ek_template

from attest import credential, tpm
from attest.errors import MalformedInput, ProofInvalid
from bootstrap.node.tpm import Agent, Ek, TpmError
from tests.support import fakes
from tests.support.swtpms import TpmInfo


def _low_ecc_ek(agent: Agent) -> Ek:
    """The L-2 ECC P-256 EK (swtpm certifies only the P-384 one)."""
    _, tmpl = create_ek_template("EK-ECC256", NVReadEK(agent.ctx))
    handle, pub, *_ = agent.ctx.create_primary(TPM2B_SENSITIVE_CREATE(), tmpl, ESYS_TR.ENDORSEMENT)
    agent._handles.append(handle)
    return Ek(handle, pub.marshal(), False, "EK-ECC256", None)


@pytest.mark.parametrize("ek_kind", ["rsa-2048 (L-1)", "ecc-p384 (H-3)", "ecc-p256 (L-2)"])
@pytest.mark.parametrize("secret_len", [32, 1])
def test_tpm_activates_our_credential(swtpm: TpmInfo, ek_kind: str, secret_len: int) -> None:
    with Agent(swtpm.tcti) as agent:
        if ek_kind.startswith("ecc-p256"):
            ek = _low_ecc_ek(agent)
        else:
            ek = agent.create_ek("rsa" if ek_kind.startswith("rsa") else "ecc")
        ak = agent.create_ak()
        secret = os.urandom(secret_len)
        blob, enc = tpm.make_credential(ek.public, tpm.verify_ak(ak.public).name, secret)
        assert agent.activate_credential(ak, ek, blob, enc) == secret


def test_credential_for_another_ek_cannot_be_activated(swtpm: TpmInfo, other_swtpm: TpmInfo) -> None:
    """AK not in the same TPM: the server seals to TPM A's EK, but the AK lives in TPM B.
    No TPM can recover the secret, so no valid proof exists: proof_invalid."""
    with Agent(swtpm.tcti) as a, Agent(other_swtpm.tcti) as b:
        ek_a = a.create_ek("rsa")
        ek_b = b.create_ek("rsa")
        ak_b = b.create_ak()
        secret = os.urandom(32)
        blob, enc = tpm.make_credential(ek_a.public, tpm.verify_ak(ak_b.public).name, secret)
        with pytest.raises(TpmError, match="activating the credential"):
            b.activate_credential(ak_b, ek_b, blob, enc)
        # TPM A has the EK but not the AK: loading B's AK public there does not help.
        foreign = a.load_public(ak_b.public)
        with pytest.raises(TpmError):
            a.activate_credential(foreign, ek_a, blob, enc)
    # Without the secret the best the node can send is a proof over something else.
    for guess in (tpm.credential_proof(os.urandom(32), "session-1"), bytes(32), b""):
        with pytest.raises(ProofInvalid) as exc:
            tpm.verify_credential_proof(secret, "session-1", guess)
        assert exc.value.code == "proof_invalid"
    tpm.verify_credential_proof(secret, "session-1", tpm.credential_proof(secret, "session-1"))  # control


def test_credential_for_another_ak_name_cannot_be_activated(swtpm: TpmInfo) -> None:
    with Agent(swtpm.tcti) as agent:
        ek = agent.create_ek("rsa")
        ak = agent.create_ak()
        other_name = tpm.verify_ak(fakes.SoftAk().public).name
        blob, enc = tpm.make_credential(ek.public, other_name, os.urandom(32))
        with pytest.raises(TpmError):
            agent.activate_credential(ak, ek, blob, enc)


def test_proof_is_bound_to_the_session() -> None:
    secret = os.urandom(32)
    proof = tpm.credential_proof(secret, "session-a")
    tpm.verify_credential_proof(secret, "session-a", proof)
    with pytest.raises(ProofInvalid):
        tpm.verify_credential_proof(secret, "session-b", proof)


def test_make_credential_refuses_bad_inputs() -> None:
    ak_name = tpm.verify_ak(fakes.SoftAk().public).name
    with pytest.raises(tpm.EkUntrusted):  # an AK is not an EK
        tpm.make_credential(fakes.SoftAk().public, ak_name, os.urandom(32))
    ek_like = _rsa_ek_public()
    _blob, enc = tpm.make_credential(
        ek_like, ak_name, os.urandom(32)
    )  # the inputs below differ only by one defect
    assert len(enc) == 2 + 256
    with pytest.raises(MalformedInput):
        tpm.make_credential(ek_like, ak_name[:-1], os.urandom(32))
    with pytest.raises(MalformedInput):
        tpm.make_credential(ek_like, ak_name, os.urandom(33))
    with pytest.raises(MalformedInput):
        tpm.make_credential(ek_like, ak_name, b"")


def _rsa_ek_public() -> bytes:
    from cryptography.hazmat.primitives.asymmetric import rsa

    public = fakes.rsa_ek_public(rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key())
    assert tpm.verify_ek(public, None, roots=[], allowlist={"x"} | {_sha(public)}).template == "L-1 RSA-2048"
    return public


def _sha(public: bytes) -> str:
    import hashlib

    from attest import keys, wire

    return hashlib.sha256(keys.spki_der(keys.public_key(wire.parse_public(public)))).hexdigest()


def test_kdfa_matches_an_independent_sp800_108_implementation() -> None:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.kbkdf import KBKDFHMAC, CounterLocation, Mode

    key, label, u, v = os.urandom(32), b"STORAGE", os.urandom(34), b""
    ours = credential.kdfa("sha256", key, label, u, v, 128)
    ref = KBKDFHMAC(
        algorithm=hashes.SHA256(),
        mode=Mode.CounterMode,
        length=16,
        rlen=4,
        llen=4,
        location=CounterLocation.BeforeFixed,
        label=label,
        context=u + v,
        fixed=None,
    ).derive(key)
    assert ours == ref
