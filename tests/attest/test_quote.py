"""Quote verification: end to end on swtpm, and one test per attack with its machine code."""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from attest import tpm, wire
from attest.errors import (
    ClockUnsafe,
    CounterRegressed,
    MalformedInput,
    NonceMismatch,
    PcrDigestMismatch,
    PcrSelectionMismatch,
    QuoteInvalid,
    QuoteSignatureInvalid,
)
from bootstrap.node.tpm import Agent, Key
from tests.support import fakes
from tests.support.swtpms import TpmInfo

SEL = "sha256:0,1,2,3,4,5,6,7"


@dataclass
class Quoted:
    ak_public: bytes
    quote: bytes
    signature: bytes
    pcrs: dict[str, dict[int, bytes]]
    nonce: bytes

    def verify(
        self,
        *,
        ak_public: bytes | None = None,
        quote: bytes | None = None,
        signature: bytes | None = None,
        **kw: object,
    ) -> tpm.QuoteResult:
        args: dict[str, object] = {"selection": SEL, "pcrs": self.pcrs, "qualifying_data": self.nonce, **kw}
        return tpm.verify_quote(
            self.ak_public if ak_public is None else ak_public,
            self.quote if quote is None else quote,
            self.signature if signature is None else signature,
            **args,  # type: ignore[arg-type]
        )


@pytest.fixture
def node(swtpm: TpmInfo) -> Iterator[tuple[Agent, Key]]:
    with Agent(swtpm.tcti) as agent:
        yield agent, agent.create_ak("ecc")


def _quote(agent: Agent, ak: Key, selection: str = SEL, nonce: bytes | None = None) -> Quoted:
    nonce = nonce if nonce is not None else os.urandom(32)
    quote, sig = agent.quote(ak, selection, nonce)
    return Quoted(ak.public, quote, sig, agent.read_pcrs(selection), nonce)


# -- end to end ----------------------------------------------------------------------------


@pytest.mark.parametrize(("ek_kind", "ak_kind"), [("rsa", "ecc"), ("ecc", "ecc"), ("rsa", "rsa")])
def test_full_attestation_on_swtpm(swtpm: TpmInfo, ek_kind: str, ak_kind: str) -> None:
    """EK certificate chain, AK checks, our MakeCredential activated by the TPM, quote verified."""
    with Agent(swtpm.tcti) as agent:
        ek = agent.create_ek(ek_kind)  # type: ignore[arg-type]
        ak = agent.create_ak(ak_kind)  # type: ignore[arg-type]
        ek_id = tpm.verify_ek(
            ek.public, ek.certificate, roots=[swtpm.root], intermediates=[swtpm.intermediate]
        )
        assert ek_id.trusted_by == "chain:CN=swtpm-localca-rootca"
        ak_id = tpm.verify_ak(ak.public)
        secret = os.urandom(32)
        blob, enc = tpm.make_credential(ek.public, ak_id.name, secret)
        recovered = agent.activate_credential(ak, ek, blob, enc)
        assert recovered == secret
        tpm.verify_credential_proof(secret, "session-1", tpm.credential_proof(recovered, "session-1"))
        csr_hash = hashlib.sha256(b"csr der").digest()
        nonce = os.urandom(32)
        qualifying = hashlib.sha256(nonce + csr_hash).digest()
        q = _quote(agent, ak, nonce=qualifying)
        again = _quote(agent, ak)
    result = q.verify()
    assert result.pcrs == q.pcrs
    later = again.verify(previous=result.counters)  # same power cycle: same epoch, clock on
    assert later.counters.reset_count == result.counters.reset_count
    assert later.counters.clock >= result.counters.clock
    assert result.qualified_signer == tpm.qualified_name(
        tpm.TPM_RH_ENDORSEMENT.to_bytes(4, "big"), ak_id.name
    )
    assert result.firmware_version_str == "8217.4131.22.13878"  # swtpm 0.7 / libtpms 0.9


def test_counters_accepted_when_moving_forward(node: tuple[Agent, Key]) -> None:
    agent, ak = node
    first = _quote(agent, ak).verify()
    second = _quote(agent, ak).verify(previous=first.counters)
    assert second.counters >= first.counters


# -- attacks: freshness ----------------------------------------------------------------------


def test_replayed_nonce_is_refused(node: tuple[Agent, Key]) -> None:
    agent, ak = node
    old = _quote(agent, ak)
    with pytest.raises(NonceMismatch) as exc:
        old.verify(qualifying_data=os.urandom(32))  # the server's new nonce
    assert exc.value.code == "nonce_mismatch"


def test_wrong_qualifying_data_is_refused(node: tuple[Agent, Key]) -> None:
    """The node quoted the bare nonce instead of SHA256(nonce || SHA256(csr))."""
    agent, ak = node
    nonce = os.urandom(32)
    q = _quote(agent, ak, nonce=nonce)
    expected = hashlib.sha256(nonce + hashlib.sha256(b"csr").digest()).digest()
    with pytest.raises(NonceMismatch) as exc:
        q.verify(qualifying_data=expected)
    assert exc.value.code == "nonce_mismatch"


def test_counter_regression_is_refused(node: tuple[Agent, Key]) -> None:
    agent, ak = node
    q = _quote(agent, ak)
    current = q.verify().counters
    later = tpm.Counters(current.reset_count + 1, 0, 0)
    with pytest.raises(CounterRegressed) as exc:
        q.verify(previous=later)
    assert exc.value.code == "counter_regressed"


def _soft_quote(
    ak: fakes.SoftAk, **fields: object
) -> tuple[bytes, bytes, dict[str, dict[int, bytes]], bytes]:
    pcrs = fakes.standard_pcrs()
    nonce = os.urandom(32)
    quote = ak.fake(nonce, pcr_digest=fakes.pcr_digest(pcrs["sha256"]), **fields).build()
    return quote, ak.sign(quote), pcrs, nonce


@pytest.mark.parametrize(
    ("now", "previous"),
    [
        ({"clock": 500, "reset_count": 3}, (3, 0, 900)),  # same epoch
        ({"clock": 500, "reset_count": 4}, (3, 0, 900)),  # Clock survives a TPM reset: still refused
        ({"clock": 5000, "reset_count": 3, "restart_count": 1}, (3, 2, 900)),  # restartCount went back
        ({"clock": 5000, "reset_count": 2, "restart_count": 9}, (3, 0, 900)),  # resetCount went back
    ],
)
def test_counter_or_clock_going_back_is_refused(now: dict[str, int], previous: tuple[int, int, int]) -> None:
    ak = fakes.SoftAk()
    quote, sig, pcrs, nonce = _soft_quote(ak, **now)
    with pytest.raises(CounterRegressed) as exc:
        tpm.verify_quote(
            ak.public,
            quote,
            sig,
            selection=SEL,
            pcrs=pcrs,
            qualifying_data=nonce,
            previous=tpm.Counters(*previous),
        )
    assert exc.value.code == "counter_regressed"


def test_counters_moving_forward_across_a_reset_are_accepted() -> None:
    ak = fakes.SoftAk()
    quote, sig, pcrs, nonce = _soft_quote(ak, clock=5000, reset_count=4, restart_count=0)
    result = tpm.verify_quote(
        ak.public, quote, sig, selection=SEL, pcrs=pcrs, qualifying_data=nonce, previous=(3, 7, 4000)
    )
    assert result.counters == (4, 0, 5000)


@pytest.mark.parametrize("previous", [(1, 2), "abc", (1, 2, -1), (1, 2, None), 7])
def test_malformed_previous_counters_are_refused(previous: object) -> None:
    ak = fakes.SoftAk()
    quote, sig, pcrs, nonce = _soft_quote(ak)
    with pytest.raises(MalformedInput):
        tpm.verify_quote(
            ak.public, quote, sig, selection=SEL, pcrs=pcrs, qualifying_data=nonce, previous=previous
        )  # type: ignore[arg-type]


def test_clock_not_safe_is_refused() -> None:
    ak = fakes.SoftAk()
    pcrs = fakes.standard_pcrs()
    nonce = os.urandom(32)
    quote = ak.fake(nonce, pcr_digest=fakes.pcr_digest(pcrs["sha256"]), safe=0).build()
    with pytest.raises(ClockUnsafe) as exc:
        tpm.verify_quote(ak.public, quote, ak.sign(quote), selection=SEL, pcrs=pcrs, qualifying_data=nonce)
    assert exc.value.code == "clock_unsafe"


# -- attacks: PCR selection and values -------------------------------------------------------


def test_swapped_pcr_selection_is_refused(node: tuple[Agent, Key]) -> None:
    """The node quotes PCRs 16-23 (resettable/debug) and presents them as the requested 0-7."""
    agent, ak = node
    q = _quote(agent, ak, selection="sha256:16,17,18,19,20,21,22,23")
    relabelled = {"sha256": dict(zip(range(8), q.pcrs["sha256"].values(), strict=True))}
    with pytest.raises(PcrSelectionMismatch) as exc:
        q.verify(pcrs=relabelled)
    assert exc.value.code == "pcr_selection_mismatch"


def test_quote_of_fewer_pcrs_is_refused(node: tuple[Agent, Key]) -> None:
    agent, ak = node
    q = _quote(agent, ak, selection="sha256:0,1,2")
    with pytest.raises(PcrSelectionMismatch):
        q.verify()


def test_tampered_pcr_value_is_refused(node: tuple[Agent, Key]) -> None:
    agent, ak = node
    q = _quote(agent, ak)
    tampered = {"sha256": dict(q.pcrs["sha256"])}
    tampered["sha256"][7] = bytes([0xAA]) * 32
    with pytest.raises(PcrDigestMismatch) as exc:
        q.verify(pcrs=tampered)
    assert exc.value.code == "pcr_digest_mismatch"


@pytest.mark.parametrize(
    "pcrs",
    [
        {"sha256": {i: bytes(32) for i in range(7)}},  # one missing
        {"sha256": {i: bytes(32) for i in range(9)}},  # one extra, not covered by the signature
        {"sha256": {i: bytes(32) for i in range(8)}, "sha1": {0: bytes(20)}},  # extra bank
        {},
    ],
)
def test_supplied_pcrs_must_match_the_selection_exactly(node: tuple[Agent, Key], pcrs: dict) -> None:  # type: ignore[type-arg]
    agent, ak = node
    q = _quote(agent, ak)
    with pytest.raises(PcrSelectionMismatch):
        q.verify(pcrs=pcrs)


def test_pcr_value_of_wrong_length_is_malformed(node: tuple[Agent, Key]) -> None:
    agent, ak = node
    q = _quote(agent, ak)
    bad = {"sha256": dict(q.pcrs["sha256"])}
    bad["sha256"][0] = b"\x00" * 20
    with pytest.raises(MalformedInput):
        q.verify(pcrs=bad)


def test_duplicate_bank_in_signed_selection_is_refused() -> None:
    """Duplicated selections (the Dstack DoS shape) never reach PCR hashing."""
    ak = fakes.SoftAk()
    nonce = os.urandom(32)
    entry = struct.pack(">HB", wire.Alg.SHA256, 3) + b"\xff\x00\x00"
    raw = struct.pack(">I", 2) + entry + entry
    quote = ak.fake(nonce, raw_selection=raw, pcr_digest=bytes(32)).build()
    with pytest.raises(QuoteInvalid) as exc:
        tpm.verify_quote(
            ak.public, quote, ak.sign(quote), selection=SEL, pcrs=fakes.standard_pcrs(), qualifying_data=nonce
        )
    assert "twice" in exc.value.detail


def test_oversized_signed_selection_is_refused() -> None:
    ak = fakes.SoftAk()
    nonce = os.urandom(32)
    raw = struct.pack(">I", 10_000) + (struct.pack(">HB", wire.Alg.SHA256, 3) + b"\xff\x00\x00") * 3
    quote = ak.fake(nonce, raw_selection=raw, pcr_digest=bytes(32)).build()
    with pytest.raises(QuoteInvalid) as exc:
        tpm.verify_quote(
            ak.public, quote, ak.sign(quote), selection=SEL, pcrs=fakes.standard_pcrs(), qualifying_data=nonce
        )
    assert exc.value.code == "quote_invalid"


@pytest.mark.parametrize(
    "selection",
    ["sha256:0,1,1", "sha256:0+sha256:1", "sha256:24", "sha999:0", "sha256:", "", "sha256:0,,1", "x" * 600],
)
def test_bad_requested_selection_is_malformed(node: tuple[Agent, Key], selection: str) -> None:
    agent, ak = node
    q = _quote(agent, ak)
    with pytest.raises(MalformedInput):
        q.verify(selection=selection)


# -- attacks: quote bytes and signature -------------------------------------------------------


@pytest.mark.parametrize("offset", [0, 6, 40, 70, 100, -1])
def test_tampered_quote_byte_is_refused(node: tuple[Agent, Key], offset: int) -> None:
    agent, ak = node
    q = _quote(agent, ak)
    b = bytearray(q.quote)
    b[offset] ^= 0x01
    with pytest.raises(QuoteSignatureInvalid) as exc:
        q.verify(quote=bytes(b))
    assert exc.value.code == "quote_signature_invalid"


def test_trailing_bytes_on_quote_are_refused(node: tuple[Agent, Key]) -> None:
    agent, ak = node
    q = _quote(agent, ak)
    with pytest.raises(QuoteSignatureInvalid):
        q.verify(quote=q.quote + b"\x00")


def test_trailing_bytes_on_signature_are_refused(node: tuple[Agent, Key]) -> None:
    agent, ak = node
    q = _quote(agent, ak)
    with pytest.raises(MalformedInput) as exc:
        q.verify(signature=q.signature + b"\x00")
    assert "trailing" in exc.value.detail


def test_trailing_bytes_on_signed_quote_are_refused() -> None:
    """Even a signature over the trailing bytes does not make them acceptable."""
    ak = fakes.SoftAk()
    pcrs = fakes.standard_pcrs()
    nonce = os.urandom(32)
    quote = ak.fake(nonce, pcr_digest=fakes.pcr_digest(pcrs["sha256"])).build() + b"\x00\x00"
    with pytest.raises(QuoteInvalid):
        tpm.verify_quote(ak.public, quote, ak.sign(quote), selection=SEL, pcrs=pcrs, qualifying_data=nonce)


@pytest.mark.parametrize("hash_alg", [wire.Alg.SHA1, wire.Alg.SHA384])
def test_signature_with_another_hash_is_refused(hash_alg: int) -> None:
    """The AK declares ECDSA-SHA256; a signature claiming SHA-1 (or SHA-384) is a downgrade."""
    ak = fakes.SoftAk()
    pcrs = fakes.standard_pcrs()
    nonce = os.urandom(32)
    quote = ak.fake(nonce, pcr_digest=fakes.pcr_digest(pcrs["sha256"])).build()
    with pytest.raises(QuoteSignatureInvalid) as exc:
        tpm.verify_quote(
            ak.public, quote, ak.sign(quote, hash_alg), selection=SEL, pcrs=pcrs, qualifying_data=nonce
        )
    assert exc.value.code == "quote_signature_invalid"


def test_signature_by_another_key_is_refused(node: tuple[Agent, Key]) -> None:
    agent, ak = node
    q = _quote(agent, ak)
    forger = fakes.SoftAk()
    with pytest.raises(QuoteSignatureInvalid):
        q.verify(signature=forger.sign(q.quote))


def test_rsa_signature_on_ecc_ak_is_refused(swtpm: TpmInfo) -> None:
    with Agent(swtpm.tcti) as agent:
        ecc_ak, rsa_ak = agent.create_ak("ecc"), agent.create_ak("rsa")
        q = _quote(agent, rsa_ak)
    with pytest.raises(QuoteSignatureInvalid):
        q.verify(ak_public=ecc_ak.public)


@pytest.mark.parametrize(
    ("magic", "st"),
    [(0xFF544346, wire.TPM_ST_ATTEST_QUOTE), (wire.TPM_GENERATED_VALUE, 0x8017)],  # bad magic; CERTIFY
)
def test_signed_structure_that_is_not_a_quote_is_refused(magic: int, st: int) -> None:
    """A (non-restricted) key signing a lookalike: magic and type are checked after the signature."""
    ak = fakes.SoftAk()
    pcrs = fakes.standard_pcrs()
    nonce = os.urandom(32)
    quote = ak.fake(nonce, pcr_digest=fakes.pcr_digest(pcrs["sha256"]), magic=magic, type=st).build()
    with pytest.raises(QuoteInvalid) as exc:
        tpm.verify_quote(ak.public, quote, ak.sign(quote), selection=SEL, pcrs=pcrs, qualifying_data=nonce)
    assert exc.value.code == "quote_invalid"


def test_a_well_formed_software_quote_passes_the_quote_checks() -> None:
    """The fakes are faithful: without a defect they verify (so each refusal above is the defect)."""
    ak = fakes.SoftAk()
    pcrs = fakes.standard_pcrs()
    nonce = os.urandom(32)
    quote = ak.fake(nonce, pcr_digest=fakes.pcr_digest(pcrs["sha256"])).build()
    result = tpm.verify_quote(
        ak.public, quote, ak.sign(quote), selection=SEL, pcrs=pcrs, qualifying_data=nonce
    )
    assert result.counters == tpm.Counters(3, 0, 1_000_000)


# -- attacks: where the AK lives ------------------------------------------------------------


def test_ak_outside_the_endorsement_hierarchy_is_refused(swtpm: TpmInfo) -> None:
    """An AK under the SRK gets obfuscated counters and firmware version: with a new AK each
    join a node could dodge counter_regressed. The signed qualifiedSigner gives it away."""
    from tpm2_pytss import ESYS_TR, TPM2_ALG, TPM2B_PUBLIC, TPM2B_SENSITIVE_CREATE, TPMA_OBJECT, TPMT_PUBLIC

    from bootstrap.node.tpm import _AK_ATTRS

    srk_attrs = (
        TPMA_OBJECT.RESTRICTED | TPMA_OBJECT.DECRYPT | TPMA_OBJECT.FIXEDTPM | TPMA_OBJECT.FIXEDPARENT
        | TPMA_OBJECT.SENSITIVEDATAORIGIN | TPMA_OBJECT.USERWITHAUTH
    )  # fmt: skip
    srk_t = TPM2B_PUBLIC(
        TPMT_PUBLIC.parse("ecc256:null:aes128cfb", nameAlg=TPM2_ALG.SHA256, objectAttributes=srk_attrs)
    )
    ak_t = TPM2B_PUBLIC(
        TPMT_PUBLIC.parse("ecc256:ecdsa-sha256:null", nameAlg=TPM2_ALG.SHA256, objectAttributes=_AK_ATTRS)
    )
    with Agent(swtpm.tcti) as agent:
        srk, srk_pub, *_ = agent.ctx.create_primary(TPM2B_SENSITIVE_CREATE(), srk_t, ESYS_TR.OWNER)
        agent._handles.append(srk)
        private, public, *_ = agent.ctx.create(srk, TPM2B_SENSITIVE_CREATE(), ak_t)
        handle = agent.ctx.load(srk, private, public)
        agent._handles.append(handle)
        q = _quote(agent, Key(handle, public.marshal(), True))
    tpm.verify_ak(q.ak_public)  # its attributes are fine...
    with pytest.raises(tpm.AkInvalid) as exc:  # ...but its place is not
        q.verify()
    assert exc.value.code == "ak_invalid"
    assert "endorsement hierarchy" in exc.value.detail
    # A verifier that knows the construction can say so explicitly.
    tpm_rh_owner = (0x40000001).to_bytes(4, "big")
    owner_qn = tpm.qualified_name(tpm_rh_owner, srk_pub.get_name().marshal()[2:])
    expected = tpm.qualified_name(owner_qn, tpm.verify_ak(q.ak_public).name)
    assert q.verify(qualified_signer=expected).pcrs == q.pcrs


def test_wrong_qualified_signer_is_refused() -> None:
    ak = fakes.SoftAk()
    quote, sig, pcrs, nonce = _soft_quote(ak, qualified_signer=b"\x00\x0b" + bytes(32))
    with pytest.raises(tpm.AkInvalid):
        tpm.verify_quote(ak.public, quote, sig, selection=SEL, pcrs=pcrs, qualifying_data=nonce)


# -- hostile types ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        {"ak_public": bytearray(b"x")},
        {"ak_public": "text"},
        {"quote": bytearray(b"x")},
        {"signature": None},
        {"selection": None},
        {"selection": "sha256:\u00b2"},  # superscript two: isdigit() but not a digit
        {"selection": "sha256:\u0663"},  # Arabic-Indic three
        {"qualifying_data": b""},
        {"qualifying_data": "nonce"},
        {"pcrs": None},
        {"pcrs": {"sha256": [b"x"] * 8}},
    ],
)
def test_hostile_argument_types_are_malformed(change: dict[str, object]) -> None:
    ak = fakes.SoftAk()
    quote, sig, pcrs, nonce = _soft_quote(ak)
    args: dict[str, object] = {
        "ak_public": ak.public, "quote": quote, "signature": sig, "selection": SEL, "pcrs": pcrs,
        "qualifying_data": nonce, **change,
    }  # fmt: skip
    with pytest.raises((MalformedInput, PcrSelectionMismatch)):
        tpm.verify_quote(args.pop("ak_public"), args.pop("quote"), args.pop("signature"), **args)  # type: ignore[arg-type]
