"""The disk-key secret with store: kubernetes: a Secret read and written through the API (kmock
through tests/support/kshim.py), every write guarded by the resourceVersion read; and what serve
does at start with it (docs/disk-keys.md, "Where the secret lives")."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest

from bootstrap.config import settings_from_obj
from bootstrap.kube import Kube
from bootstrap.service.disk.secret import open_vault
from bootstrap.service.pki.startup import StartupError
from bootstrap.store.diskkeys import DATA_KEY, KubeVault, VaultDamaged, VaultDoc
from tests.support.kshim import ShimEmulator

pytestmark = pytest.mark.kmock(cls=ShimEmulator)
NOW = datetime(2026, 3, 1, tzinfo=UTC)
NS, NAME = "nodegate", "nodegate-disk-keys"
SECRETS = "v1/secrets"


class HookedKube(Kube):
    """Runs ``after_get`` once a read has its answer: the window a concurrent writer hits."""

    after_get: Any = None

    async def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        out = await super().get_secret(namespace, name)
        hook, self.after_get = self.after_get, None
        if hook is not None:
            await hook()
        return out


@pytest.fixture
async def kubes(kmock: Any) -> AsyncIterator[tuple[HookedKube, HookedKube]]:
    kmock.resources[SECRETS] = {"kind": "Secret", "namespaced": True}
    a = HookedKube.for_host(str(kmock.url), timeout=2.0)
    b = HookedKube.for_host(str(kmock.url), timeout=2.0)
    yield a, b
    await a.close()
    await b.close()


async def _empty(kube: Kube) -> None:
    await kube.create_secret(
        NS, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": NAME, "namespace": NS}}
    )


def _settings() -> Any:
    return settings_from_obj(
        {
            "store": "kubernetes",
            "pcr_policy": {"classes": [{"name": "fleet", "golden": {"sha256": {0: ["00" * 32]}}}]},
            "disk_keys": {"classes": ["fleet"], "require_measured_boot": False},
        }
    )


async def test_serve_fills_the_empty_secret_once_and_refuses_a_missing_one(
    kubes: tuple[HookedKube, HookedKube],
) -> None:
    a, b = kubes
    with pytest.raises(StartupError, match="does not exist"):
        await open_vault(_settings(), a, NOW)
    await _empty(a)
    first = await open_vault(_settings(), a, NOW)
    second = await open_vault(_settings(), b, NOW)  # a second replica: the same document
    assert first is not None
    assert second is not None
    assert await first.read() == await second.read() is not None


async def test_replicas_starting_together_agree_on_one_document(kubes: tuple[HookedKube, HookedKube]) -> None:
    a, b = kubes
    await _empty(a)
    va, vb = KubeVault(a, NS, NAME), KubeVault(b, NS, NAME)
    theirs = VaultDoc.new(NOW)

    async def other_replica_writes() -> None:
        await vb.create(theirs)

    a.after_get = other_replica_writes  # b writes between a's read and a's write
    ours = await va.create(VaultDoc.new(NOW))
    assert ours == theirs == await vb.read()


async def test_a_concurrent_change_is_not_lost(kubes: tuple[HookedKube, HookedKube]) -> None:
    a, b = kubes
    await _empty(a)
    va, vb = KubeVault(a, NS, NAME), KubeVault(b, NS, NAME)
    await va.create(VaultDoc.new(NOW))

    async def other_revokes() -> None:
        await vb.update(lambda d: d.revoked("ab" * 32))

    a.after_get = other_revokes
    rotated = await va.update(lambda d: d.rotated(NOW))  # retried on the 409, over b's change
    assert (rotated.current, rotated.epoch("ab" * 32)) == (2, 1)
    assert await vb.read() == rotated


async def test_a_damaged_secret_is_refused_not_overwritten(
    kmock: Any, kubes: tuple[HookedKube, HookedKube]
) -> None:
    a, _ = kubes
    body = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": NAME, "namespace": NS},
            "data": {DATA_KEY: base64.b64encode(b'{"format": 1}').decode()}}  # fmt: skip
    await a.create_secret(NS, body)
    vault = KubeVault(a, NS, NAME)
    with pytest.raises(VaultDamaged):
        await vault.read()
    with pytest.raises(VaultDamaged):
        await vault.create(VaultDoc.new(NOW))
    with pytest.raises(StartupError, match="not a disk-key document"):
        await open_vault(_settings(), a, NOW)
    stored = kmock.objects[SECRETS, NS, NAME].raw
    assert base64.b64decode(stored["data"][DATA_KEY]) == b'{"format": 1}'
