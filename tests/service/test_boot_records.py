"""Boot records through the join service over HTTPS (issue 43): an accepted join keeps the record
of the facts its verdict read, with what the EK certificate verified at the start; a renewal
replaces it; and for real firmware logs under several policies, judging the stored record again
(the what-if) gives what a real join of that boot gets."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from attest import eventlog
from attest.bootrecord import judge as whatif
from attest.bootrecord.build import record_facts
from attest.measuredboot import facts as bootfacts
from attest.measuredboot import policy as measuredboot
from attest.measuredboot.model import MeasuredBootClass
from attest.pcr import PcrPolicy
from bootstrap.service import background
from tests.service.test_measured_boot import renew
from tests.store.common import T0, make_att
from tests.support import eventlogs as el
from tests.support.bootrecords import built_from, quoted_of
from tests.support.certs import ca_der
from tests.support.service import EkCa, Running, running, settings_for
from tests.support.shared_data import shared
from tests.support.softnode import SoftNode, post

BOOT_A = "8c1f0b7e-2f6d-4b4f-9c1a-0e5d2a9b7c31"
BOOT_B = "0d4c2b1a-9e8f-4a7b-8c6d-5e4f3a2b1c0d"
PCRS = list(range(10))
_PATH = re.compile(r" \([^()]*\) is not allowed")


@pytest.fixture(scope="module")
def ek_ca() -> EkCa:
    return EkCa.create()


def booted(node: SoftNode, raw: bytes, bank: str = "sha256") -> bytes:
    """The node's TPM holds what the firmware extended: its PCRs are the log's replay."""
    node.tpm.pcrs = quoted_of(raw, bank, range(24))
    return raw


async def join(r: Running, node: SoftNode, log: bytes | None, boot_id: str | None = None) -> tuple[int, Any]:
    async with r.http() as http:
        status, start = await post(http, f"{r.base}/v1/join/start", node.start_body())
        assert status == 200, start
        body = node.finish_body(start, event_log=log, boot_id=boot_id)
        return await post(http, f"{r.base}/v1/join/finish", body)


# -- the record of an accepted join and renewal ---------------------------------------------------


def _authority_policy() -> dict[str, Any]:
    import hashlib

    return {
        "secure_boot": "required",
        "classes": [
            {
                "name": "fleet",
                "authorities": ["sha256:" + hashlib.sha256(ca_der()).hexdigest()],
                "kernel_cmdlines": ["/vmlinuz-6.8 root=/dev/sda1 ro", "/vmlinuz-6.9 root=/dev/sda1 ro"],
                "kernel_cmdline_chains": [["11" * 32, "22" * 32]],
            }
        ],
    }


@pytest.fixture
async def svc(tmp_path: Path, ek_ca: EkCa) -> AsyncIterator[Running]:
    settings = settings_for(
        tmp_path, ek_ca, measured_boot=_authority_policy(), pcr_policy={"pcrs": list(range(9))}
    )
    async with running(settings) as r:
        yield r


async def test_a_join_keeps_the_record_of_what_its_verdict_read(svc: Running, ek_ca: EkCa) -> None:
    node = ek_ca.node("rec-1")
    raw = booted(node, el.build(el.boot(cert_der=ca_der())))
    status, out = await join(svc, node, raw, BOOT_A)
    assert status == 200, out
    stored = await svc.service.store.get("rec-1")
    assert stored is not None
    rec = stored.boot_record
    assert rec is not None
    policy = svc.service.settings.measured_boot
    expected = built_from(raw, quoted_of(raw, "sha256", range(9)), policy, boot_id=BOOT_A).record
    assert rec.measured_boot == expected.measured_boot
    assert rec.pcrs == expected.pcrs
    assert (rec.boot_id, rec.attested_at, rec.reset_count) == (
        BOOT_A,
        stored.attested_at,
        stored.counters.reset_count,
    )  # type: ignore[union-attr]
    assert rec.measured_boot is not None
    assert rec.measured_boot.matched_class == stored.measured_boot_class == "fleet"
    assert rec.measured_boot.kernel_cmdline == "/vmlinuz-6.8 root=/dev/sda1 ro"  # proven by the class
    assert rec.ek is not None
    assert (rec.ek.sha256, rec.ek.issuer, rec.ek.model, rec.ek.version) == (
        stored.ek_sha256,
        "CN=soft TPM manufacturer root",
        "swtpm",
        "id:20191023",
    )
    assert rec.ek.trusted_by.startswith("chain:")
    assert rec.tpm is not None  # the firmware version the TPM signed in the quote
    dbx = rec.measured_boot.dbx
    assert dbx is not None
    assert await svc.service.store.dbx_digests([dbx.sha256]) == {dbx.sha256: b"\xaa" * 32 + b"\xbb" * 32}


async def test_a_renewal_replaces_the_record_and_keeps_the_eks_facts(
    svc: Running, ek_ca: EkCa, tmp_path: Path
) -> None:
    node = ek_ca.node("rec-2")
    raw = booted(node, el.build(el.boot(cert_der=ca_der())))
    status, out = await join(svc, node, raw, BOOT_A)
    assert status == 200, out
    first = await svc.service.store.get("rec-2")
    assert first is not None
    assert first.boot_record is not None
    node.tpm.reset_count += 1  # rebooted into another kernel command line
    again = booted(node, el.build(el.boot(cert_der=ca_der(), kernel="/vmlinuz-6.9 root=/dev/sda1 ro")))
    status, renewed = await renew(svc, node, out, tmp_path, BOOT_B, event_log=again)
    assert status == 200, renewed
    second = await svc.service.store.get("rec-2")
    assert second is not None
    rec = second.boot_record
    assert rec is not None
    assert rec.measured_boot is not None
    assert (rec.boot_id, rec.measured_boot.kernel_cmdline) == (BOOT_B, "/vmlinuz-6.9 root=/dev/sda1 ro")
    assert rec.ek == first.boot_record.ek
    assert rec.attested_at > first.boot_record.attested_at


async def test_a_refused_join_leaves_the_record_of_the_last_accepted_one(svc: Running, ek_ca: EkCa) -> None:
    node = ek_ca.node("rec-3")
    raw = booted(node, el.build(el.boot(cert_der=ca_der())))
    status, out = await join(svc, node, raw, BOOT_A)
    assert status == 200, out
    kept = (await svc.service.store.get("rec-3")).boot_record  # type: ignore[union-attr]
    node.tpm.reset_count += 1
    off = booted(node, el.build(el.boot(secure=False, cert_der=ca_der())))
    status, out = await join(svc, node, off, BOOT_B)
    assert (status, out["code"]) == (403, "measured_boot_violation")
    assert (await svc.service.store.get("rec-3")).boot_record == kept  # type: ignore[union-attr]


# -- what-if against real joins, on real logs ------------------------------------------------------

DATA = shared("eventlogs")
# sha256 logs of real boots (the SHA-1-only ones are judged by the pure tests with a sha1 quote)
REAL = (
    "arch-linux-workstation.bin",
    "gce-rhel8-uefi.bin",
    "gce-ubuntu-2104-no-secure-boot.bin",
    "gce-ubuntu-2404-amd-sev-snp.bin",
    "gdc-host.bin",
    "gke-confidential-debug.bin",
    "go-attestation-sb-cert.bin",
    "keylime-secureboot.bin",
    "tools-sd-boot-fedora37.bin",
    "tools-moklisttrusted.bin",
    "tss-pc-client.bin",
)


@cache
def _facts(name: str) -> bootfacts.BootFacts:
    raw = DATA.read(name)
    facts = record_facts(eventlog.parse(raw), quoted_of(raw, "sha256", PCRS))
    assert facts is not None
    return facts


def _class(name: str, **changes: Any) -> dict[str, Any]:
    learned = measuredboot.learn(
        [_facts(name)], name=name.removesuffix(".bin").replace("_", "-"), cmdlines=True
    )
    doc = {**learned.model_dump(exclude_none=True), **changes}
    MeasuredBootClass.model_validate(doc)
    return doc


def _variant(kind: str) -> dict[str, Any]:
    """The measured_boot policies a rollout might try: what the fleet runs, and tightenings."""
    if kind == "open":
        return {}
    if kind == "learned":
        return {"classes": [_class(n) for n in REAL]}
    if kind == "secure-boot":
        return {"secure_boot": "required", "classes": [_class(n, mode="warn") for n in REAL]}
    if kind == "new-dbx":
        return {
            "classes": [
                _class(n, dbx_required=["ab" * 32]) if i % 2 else _class(n) for i, n in enumerate(REAL)
            ]
        }
    if kind == "no-first-app":
        return {
            "classes": [_class(n, boot_applications=list(_class(n)["boot_applications"][1:])) for n in REAL]
        }
    raise AssertionError(kind)


def _same_detail(whatif_detail: str, join_detail: str) -> bool:
    """The join's detail, but for the boot applications' device paths (not vouched for, so not
    kept). Both are cut at 2000 characters; the join's paths make it cut sooner."""
    a, b = _PATH.sub(" is not allowed", whatif_detail), _PATH.sub(" is not allowed", join_detail)
    if max(len(whatif_detail), len(join_detail)) < 2000:
        return a == b
    n = min(len(a), len(b)) - 300
    return a[:n] == b[:n]


@pytest.fixture(scope="module")
def stored_records(tmp_path_factory: pytest.TempPathFactory, ek_ca: EkCa) -> dict[str, Any]:
    """Each real boot joined once under the open policy: the records a fleet would have."""
    import asyncio

    DATA.require()

    async def collect() -> dict[str, Any]:
        tmp = tmp_path_factory.mktemp("open")
        settings = settings_for(tmp, ek_ca, pcr_policy={"pcrs": PCRS})
        async with running(settings) as r:
            out = {}
            for i, name in enumerate(REAL):
                node = ek_ca.node(f"real-{i}")
                status, body = await join(r, node, booted(node, DATA.read(name)), BOOT_A)
                assert status == 200, body
                rec = await r.service.store.get(node.name)
                assert rec is not None
                assert rec.boot_record is not None
                mb = rec.boot_record.measured_boot
                ids = [mb.dbx.sha256] if mb is not None and mb.dbx is not None else []
                out[name] = (
                    rec.boot_record,
                    (await r.service.store.dbx_digests(ids)).get(ids[0]) if ids else None,
                )
            return out

    return asyncio.run(collect())


@pytest.mark.parametrize("kind", ["learned", "secure-boot", "new-dbx", "no-first-app"])
async def test_whatif_agrees_with_a_real_join_for_every_policy_and_log(
    kind: str, tmp_path: Path, ek_ca: EkCa, stored_records: dict[str, Any]
) -> None:
    mb_doc = _variant(kind)
    settings = settings_for(tmp_path, ek_ca, pcr_policy={"pcrs": PCRS}, measured_boot=mb_doc)
    outcomes = set()
    async with running(settings) as r:
        for i, name in enumerate(REAL):
            node = ek_ca.node(f"{kind}-{i}")
            status, body = await join(r, node, booted(node, DATA.read(name)), BOOT_A)
            record, dbx = stored_records[name]
            verdict = whatif.judge(record, PcrPolicy(pcrs=tuple(PCRS)), settings.measured_boot, dbx)
            outcomes.add(verdict.outcome)
            if status == 200:
                stored = await r.service.store.get(node.name)
                assert stored is not None
                assert (verdict.outcome, verdict.measured_boot_class) == (
                    "pass",
                    stored.measured_boot_class,
                ), name
            else:
                assert (verdict.outcome, verdict.code) == ("refuse", body["code"]), name
                assert _same_detail(verdict.reason, body["detail"]), name
    assert "pass" in outcomes or kind == "no-first-app"
    assert "refuse" in outcomes or kind == "learned"


# -- metrics ----------------------------------------------------------------------------------------


async def test_the_boot_metrics_count_nodes_by_class_chain_and_dbx(svc: Running, ek_ca: EkCa) -> None:
    for i in range(3):
        node = ek_ca.node(f"metric-{i}")
        status, out = await join(svc, node, booted(node, el.build(el.boot(cert_der=ca_der()))), BOOT_A)
        assert status == 200, out
    bare = ek_ca.node("metric-bare")
    await svc.service.store.commit(
        replace(
            make_att("metric-bare", "9" * 64),
            boot_record=None,
        ),
        session_id="bare",
        session_expires_at=T0 + timedelta(minutes=1),
        action="join",
        check=lambda _r: None,
    )
    assert bare.name == "metric-bare"
    await background.count_boots(svc.service)
    text = svc.service.metrics.render().decode()
    rec = (await svc.service.store.get("metric-0")).boot_record  # type: ignore[union-attr]
    mb = rec.measured_boot  # type: ignore[union-attr]
    assert (
        f'nodegate_boot_records{{chain="{mb.chain_id}",dbx="{mb.dbx.sha256[:16]}",'  # type: ignore[union-attr]
        f'measured_boot_class="fleet",pcr_class="none"}} 3.0'
    ) in text
    assert "nodegate_boot_records_missing 1.0" in text


async def test_a_session_without_room_for_the_ek_facts_still_joins(
    svc: Running, ek_ca: EkCa, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An RSA-8192 CSR and an EK certificate with long names can leave the sealed session no room
    for the EK's facts: the join goes on without them (the record's ``ek`` is absent), never 500."""
    sealer = svc.service.join.sealer
    seal = sealer.seal

    def tight(session: Any) -> str:
        if session.ek_facts:
            raise ValueError("session token too large (CSR or AK unexpectedly big)")
        return seal(session)

    monkeypatch.setattr(sealer, "seal", tight)
    node = ek_ca.node("tight-1")
    status, out = await join(svc, node, booted(node, el.build(el.boot(cert_der=ca_der()))), BOOT_A)
    assert status == 200, out
    rec = (await svc.service.store.get("tight-1")).boot_record  # type: ignore[union-attr]
    assert rec is not None
    assert rec.ek is None
    assert rec.measured_boot is not None
