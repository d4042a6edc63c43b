"""`nodegate join` sends the EK chain certificates its TPM keeps in the TCG EK chain NV indices
(0x01C00100-0x01C001FF) as ``ek_chain``; the server uses them like fetched intermediates: they
complete a path to a root it trusts, and add no trust of their own (docs/ek-roots.md)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from tpm2_pytss import ESYS_TR, TPM2_ALG, TPM2B_AUTH, TPM2B_NV_PUBLIC, TPMA_NV, TPMS_NV_PUBLIC

from attest import svid
from bootstrap.config import settings_from_obj
from bootstrap.node.join import JoinFailed, JoinOptions, join
from bootstrap.node.tpm import EK_CHAIN_FIRST, Agent, split_ders
from tests.support.certs import self_signed
from tests.support.service import Running, running
from tests.support.swtpms import TpmInfo

pytestmark = pytest.mark.swtpm


def store_chain(tpm: TpmInfo, index: int, data: bytes) -> None:
    """What a TPM maker does at manufacturing: the chain into an NV index (padded, as vendors do)."""
    with Agent(tpm.tcti) as agent:
        public = TPM2B_NV_PUBLIC(
            nvPublic=TPMS_NV_PUBLIC(
                nvIndex=index,
                nameAlg=TPM2_ALG.SHA256,
                attributes=TPMA_NV.OWNERWRITE | TPMA_NV.OWNERREAD | TPMA_NV.AUTHREAD | TPMA_NV.NO_DA,
                dataSize=len(data),
            )
        )
        handle = agent.ctx.nv_define_space(TPM2B_AUTH(), public, ESYS_TR.OWNER)
        for offset in range(0, len(data), 512):
            agent.ctx.nv_write(handle, data[offset : offset + 512], offset, ESYS_TR.OWNER)


def settings(tmp: Path, tpm: TpmInfo) -> Any:
    root = tmp / "root.pem"  # the vendor root only: the intermediate is the TPM's to send
    root.write_bytes(tpm.root.public_bytes(serialization.Encoding.PEM))
    return settings_from_obj(
        {
            "trust_domain": "fleet.test",
            "listen": "127.0.0.1:0",
            "state_dir": str(tmp / "state"),
            "ek_roots": [str(root)],
            "ek_aia": {"enabled": False},
            "server_names": ["localhost", "127.0.0.1"],
            "admission": {"listen": "127.0.0.1:0"},
        }
    )


def opts(svc: Running, tpm: TpmInfo, tmp: Path, name: str) -> JoinOptions:
    bundle = tmp / f"{name}-ca.pem"
    bundle.write_bytes(svid.bundle_pem(svc.service.cas.roots(datetime.now(UTC))))
    return JoinOptions(
        server=svc.base, ca_bundle=bundle, node_name=name, tcti=tpm.tcti, out=tmp / name, attempts=1
    )


def test_split_ders_reads_certificates_up_to_the_padding() -> None:
    a = self_signed("vendor intermediate")[1].public_bytes(serialization.Encoding.DER)
    b = self_signed("vendor root")[1].public_bytes(serialization.Encoding.DER)
    assert split_ders(a + b + b"\xff" * 64) == [a, b]
    assert split_ders(b"\xff" * 16) == []


async def test_a_join_completes_its_chain_from_the_tpms_nv(fresh_tpm: TpmInfo, tmp_path: Path) -> None:
    async with running(settings(tmp_path, fresh_tpm)) as svc:
        with pytest.raises(JoinFailed) as refused:
            await join(opts(svc, fresh_tpm, tmp_path, "before"))
        assert refused.value.code == "ek_untrusted"

        inter = fresh_tpm.intermediate.public_bytes(serialization.Encoding.DER)
        store_chain(fresh_tpm, EK_CHAIN_FIRST, inter + b"\xff" * 100)
        with Agent(fresh_tpm.tcti) as agent:
            assert agent.read_ek_chain() == (inter,)
        await join(opts(svc, fresh_tpm, tmp_path, "after"))
        assert await svc.service.store.get("after") is not None


async def test_a_chain_certificate_that_does_not_link_adds_no_trust(
    fresh_tpm: TpmInfo, tmp_path: Path
) -> None:
    unrelated = fresh_tpm.root.public_bytes(serialization.Encoding.DER)  # the root: no new link
    store_chain(fresh_tpm, EK_CHAIN_FIRST + 1, unrelated)
    async with running(settings(tmp_path, fresh_tpm)) as svc:
        with pytest.raises(JoinFailed) as refused:
            await join(opts(svc, fresh_tpm, tmp_path, "n1"))
    assert refused.value.code == "ek_untrusted"
