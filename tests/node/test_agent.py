"""Node-side TPM operations: PCR reads in chunks, clear errors without a TPM or in lockout."""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from attest.errors import MalformedInput
from bootstrap.demo import swtpm as harness
from bootstrap.node.tpm import Agent, TpmError, TpmLockedOut, TpmUnavailable, trim_der
from tests.support.swtpms import TpmInfo

ALL_PCRS = "sha256:" + ",".join(str(i) for i in range(24))


def test_reads_all_24_pcrs_in_chunks_of_8(swtpm: TpmInfo) -> None:
    with Agent(swtpm.tcti) as agent:
        values = agent.read_pcrs(ALL_PCRS)["sha256"]
        assert sorted(values) == list(range(24))
        before = values[16]
        agent.extend_pcr(16, hashlib.sha256(b"x").digest())
        after = agent.read_pcrs("sha256:16")["sha256"][16]
    assert after == hashlib.sha256(before + hashlib.sha256(b"x").digest()).digest()


def test_inactive_bank_is_reported(swtpm: TpmInfo) -> None:
    with Agent(swtpm.tcti) as agent, pytest.raises(TpmError, match="sha1 bank active"):
        agent.read_pcrs("sha1:0,1")


def test_quote_refuses_a_bad_selection_before_touching_the_tpm(swtpm: TpmInfo) -> None:
    with Agent(swtpm.tcti) as agent:
        ak = agent.create_ak()
        with pytest.raises(MalformedInput):
            agent.quote(ak, "sha256:0,0", b"n" * 32)


def test_no_tpm_gives_a_clear_error() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(TpmUnavailable) as exc, Agent(f"swtpm:host=127.0.0.1,port={port}"):
        pass
    assert "no TPM reachable" in str(exc.value)
    with pytest.raises(TpmUnavailable) as exc2, Agent("device:/dev/nonexistent-tpm"):
        pass
    assert "/dev/nonexistent-tpm" in str(exc2.value)


@pytest.fixture
def fresh_tpm(local_ca: harness.LocalCa, tmp_path: Path) -> Iterator[harness.Swtpm]:
    harness.manufacture(local_ca, tmp_path / "tpm")
    server = harness.start(local_ca, tmp_path / "tpm")
    try:
        yield server
    finally:
        server.stop()


def test_lockout_gives_a_clear_error(fresh_tpm: harness.Swtpm) -> None:
    from tpm2_pytss import (
        ESYS_TR,
        TPM2_ALG,
        TPM2_RH,
        TPM2B_PUBLIC,
        TPM2B_SENSITIVE_CREATE,
        TPMA_OBJECT,
        TPMT_PUBLIC,
        TPMT_SIG_SCHEME,
        TPMT_TK_HASHCHECK,
        TSS2_Exception,
    )

    with Agent(fresh_tpm.tcti) as agent:
        ctx = agent.ctx
        ctx.dictionary_attack_parameters(1, 3600, 3600, session1=ESYS_TR.PASSWORD)
        sensitive = TPM2B_SENSITIVE_CREATE()
        sensitive.sensitive.userAuth = b"right"
        attrs = TPMA_OBJECT.SIGN_ENCRYPT | TPMA_OBJECT.FIXEDTPM | TPMA_OBJECT.FIXEDPARENT
        attrs |= TPMA_OBJECT.SENSITIVEDATAORIGIN | TPMA_OBJECT.USERWITHAUTH
        tmpl = TPM2B_PUBLIC(TPMT_PUBLIC.parse("ecc256:ecdsa-sha256:null", objectAttributes=attrs))
        handle, *_ = ctx.create_primary(sensitive, tmpl, ESYS_TR.OWNER)
        agent._handles.append(handle)
        ctx.tr_set_auth(handle, b"wrong")
        ticket = TPMT_TK_HASHCHECK(tag=0x8024, hierarchy=TPM2_RH.NULL)
        scheme = TPMT_SIG_SCHEME(scheme=TPM2_ALG.NULL)
        with pytest.raises(TSS2_Exception):  # fails authorization: the DA counter trips
            ctx.sign(handle, b"\x00" * 32, scheme, ticket)
        ak = agent.create_ak()  # endorsement-hierarchy auth is not DA-protected
        with pytest.raises(TpmLockedOut) as exc:
            agent.quote(ak, "sha256:0", b"n" * 32)
    assert "lockout" in str(exc.value)


def test_trim_der_keeps_exactly_one_certificate() -> None:
    cert = b"\x30\x82\x00\x04abcd"
    assert trim_der(cert + b"\xff" * 100) == cert
    assert trim_der(b"\x30\x03abc\x00") == b"\x30\x03abc"
    assert trim_der(b"\x10\x01\x00\x00\x08" + cert + b"\xff") == cert  # TCG NV header
    for bad in (b"", b"\x31\x01a", b"\x30\x82\x01\x00abc", b"\x30\x80abc"):
        with pytest.raises(TpmError):
            trim_der(bad)


def test_malformed_challenge_gives_a_clear_error(swtpm: TpmInfo) -> None:
    with Agent(swtpm.tcti) as agent:
        ek, ak = agent.create_ek("rsa"), agent.create_ak()
        for blob, secret in ((b"\x00", b"\x00\x01"), (b"\x00\x02ab", b"\x00\x00junk")):
            with pytest.raises(TpmError, match="challenge"):
                agent.activate_credential(ak, ek, blob, secret)


def test_quote_with_pcrs_returns_the_values_the_quote_covers(swtpm: TpmInfo) -> None:
    from attest import tpm

    with Agent(swtpm.tcti) as agent:
        ak = agent.create_ak()
        agent.extend_pcr(5, hashlib.sha256(b"boot step").digest())
        quote, sig, pcrs = agent.quote_with_pcrs(ak, ALL_PCRS, b"q" * 32)
    result = tpm.verify_quote(ak.public, quote, sig, selection=ALL_PCRS, pcrs=pcrs, qualifying_data=b"q" * 32)
    assert result.pcrs == pcrs


def test_quote_with_pcrs_retries_when_a_pcr_moves(swtpm: TpmInfo, monkeypatch: pytest.MonkeyPatch) -> None:
    """An extend between the reads around the quote (IMA, a boot service) forces a retry, so the
    values handed to the server are the ones the quote covers."""
    from attest import tpm

    with Agent(swtpm.tcti) as agent:
        ak = agent.create_ak()
        real_quote = agent.quote
        calls: list[int] = []

        def racing_quote(key: object, selection: str, qd: bytes) -> tuple[bytes, bytes]:
            out = real_quote(key, selection, qd)  # type: ignore[arg-type]
            calls.append(1)
            if len(calls) == 1:
                agent.extend_pcr(3, hashlib.sha256(b"late measurement").digest())
            return out

        monkeypatch.setattr(agent, "quote", racing_quote)
        quote, sig, pcrs = agent.quote_with_pcrs(ak, "sha256:0,1,2,3", b"q" * 32)
    assert len(calls) == 2
    tpm.verify_quote(ak.public, quote, sig, selection="sha256:0,1,2,3", pcrs=pcrs, qualifying_data=b"q" * 32)
