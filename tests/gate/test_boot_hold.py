"""The reboot hold outlives a renewal without a boot id (issue 21, finding 5), end to end: the join
service's kubernetes store writes the NodeAttestation, the gate reads it, against kmock.

Before the fix the store committed the renewal and published ``status.bootID`` empty, and the gate
released the rebooted node (nothing left to compare its new boot with). Now the commit is refused
with ``boot_id_required``, the NodeAttestation keeps the boot it proved, and the node stays held
``unattested`` until a quote from its new boot arrives."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from bootstrap.gate import Gate
from bootstrap.kube import Kube
from bootstrap.problems import BootIdRequired
from bootstrap.store.kube import KubeStore
from tests.gate.test_gate import ATT, Clock, hold, hold_taints, make_gate, node_body, register, stored
from tests.gate.test_reboot import BOOT_1, BOOT_2, boot, decide
from tests.store.common import T0, Ticker, commit, make_att
from tests.support.kshim import ShimEmulator

pytestmark = pytest.mark.kmock(cls=ShimEmulator)


@pytest.fixture
async def api(kmock: Any) -> AsyncIterator[Kube]:
    register(kmock)
    k = Kube.for_host(str(kmock.url), timeout=2.0)
    yield k
    await k.close()


async def test_a_renewal_without_a_boot_id_does_not_end_the_reboot_hold(kmock: Any, api: Kube) -> None:
    clock = Clock()
    gate: Gate = make_gate(api, clock)
    store = KubeStore(api, clock=Ticker(), backoff=0.0)
    await api.create_node(node_body("w1", hold("unattested"), pool="gpu"))
    await boot(api, "w1", BOOT_1)
    joined = await commit(store, replace(make_att("w1"), boot_id=BOOT_1), "s1")
    assert stored(kmock, ATT, "w1")["status"]["bootID"] == BOOT_1
    await decide(gate)  # attested, nothing to install: the stability window starts
    clock.advance(seconds=30)
    assert await decide(gate) is None
    assert hold_taints(kmock, "w1") == []

    await boot(api, "w1", BOOT_2)  # rebooted (a NodeWright reboot interrupt)
    assert await decide(gate) == "unattested"
    renewal = make_att("w1", serial="02", at=T0 + timedelta(minutes=5))  # no boot id
    with pytest.raises(BootIdRequired):
        await commit(store, renewal, "s2", "renew")
    assert await store.get("w1") == joined
    assert stored(kmock, ATT, "w1")["status"]["bootID"] == BOOT_1
    clock.advance(minutes=5)
    assert await decide(gate) == "unattested"
    assert "rebooted since its last attestation" in stored(kmock, ATT, "w1")["status"]["message"]
    assert hold_taints(kmock, "w1") == [hold("unattested")]

    # The new boot, proven (TPM reset): released again after the window.
    proven = replace(renewal, boot_id=BOOT_2, counters=renewal.counters._replace(reset_count=2))
    await commit(store, proven, "s3", "renew")
    assert stored(kmock, ATT, "w1")["status"]["bootID"] == BOOT_2
    await decide(gate)
    clock.advance(seconds=30)
    assert await decide(gate) is None
    await store.close()
