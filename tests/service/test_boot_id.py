"""Once a boot id is recorded for a node, every later attestation carries one (issue 21, finding 5).

A renewal without a boot id used to replace the recorded one with nothing: the NodeAttestation's
``status.bootID`` was cleared, the gate's reboot hold ("rebooted since its last attestation") had
nothing to compare the Node's boot with and let go, and the next boot id was then accepted without
a TPM reset. Now join, renewal and ``nodegate attest`` (a renewal, or a join) are refused with
``boot_id_required`` (400) and the record keeps its boot. Over real HTTPS, sqlite store; the store
contract (tests/store/test_contract.py) holds both backends to it, tests/gate/test_boot_hold.py the
gate."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.service.test_measured_boot import BOOT_A, BOOT_B, join, renew
from tests.support.service import EkCa, Running, running, settings_for


@pytest.fixture(scope="module")
def ek_ca() -> EkCa:
    return EkCa.create()


@pytest.fixture
async def plain(tmp_path: Path, ek_ca: EkCa) -> AsyncIterator[Running]:
    async with running(settings_for(tmp_path, ek_ca)) as r:
        yield r


async def test_a_renewal_without_a_boot_id_is_refused_once_one_is_recorded(
    plain: Running, ek_ca: EkCa, tmp_path: Path
) -> None:
    node = ek_ca.node("bid-1")
    status, out = await join(plain, node, boot_id=BOOT_A)
    assert status == 200, out
    node.tpm.reset_count += 1  # the machine rebooted (a NodeWright reboot interrupt)
    status, refused = await renew(plain, node, out, tmp_path, None)
    assert (status, refused["code"]) == (400, "boot_id_required")
    assert "boot_id" in refused["detail"]
    record = await plain.service.store.get("bid-1")
    assert record is not None
    assert record.boot_id == BOOT_A  # the gate still compares the Node's new boot with this one
    audit = await plain.service.store.audit("bid-1")
    assert ("refused", "boot_id_required") in [(e.action, e.code) for e in audit]
    # The new boot, proven: accepted (the TPM was reset), and recorded.
    status, renewed = await renew(plain, node, out, tmp_path, BOOT_B)
    assert status == 200, renewed
    record = await plain.service.store.get("bid-1")
    assert record is not None
    assert record.boot_id == BOOT_B


async def test_a_join_without_a_boot_id_is_refused_once_one_is_recorded(plain: Running, ek_ca: EkCa) -> None:
    """`nodegate attest` falls back to a join when its SVID cannot renew: the same rule."""
    node = ek_ca.node("bid-2")
    status, out = await join(plain, node, boot_id=BOOT_A)
    assert status == 200, out
    status, refused = await join(plain, node)
    assert (status, refused["code"]) == (400, "boot_id_required")
    status, out = await join(plain, node, boot_id=BOOT_A)
    assert status == 200, out


async def test_a_node_that_never_sent_a_boot_id_renews_without_one(
    plain: Running, ek_ca: EkCa, tmp_path: Path
) -> None:
    """Agents that send no boot id (nothing recorded) keep working as before."""
    node = ek_ca.node("bid-3")
    status, out = await join(plain, node)
    assert status == 200, out
    status, renewed = await renew(plain, node, out, tmp_path, None)
    assert status == 200, renewed
    status, renewed = await renew(plain, node, renewed, tmp_path, BOOT_A)  # from now on: required
    assert status == 200, renewed
    status, refused = await renew(plain, node, renewed, tmp_path, None)
    assert (status, refused["code"]) == (400, "boot_id_required")
