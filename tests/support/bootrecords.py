"""Boot records for tests: built from a synthetic (tests.support.eventlogs) or real log through
the join's own steps (parse, replay against the quote, facts, verdict, build)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import UTC, datetime

from attest import eventlog
from attest.bootrecord.build import Built, build_record
from attest.bootrecord.model import EkFacts
from attest.measuredboot.model import MeasuredBootPolicy
from attest.tpm import Counters
from bootstrap.service.join.evidence import judge_log
from tests.support import eventlogs as el

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


@functools.cache
def infineon_ek() -> EkFacts:
    """What an Infineon EK certificate states (validated when a test first asks, not at import)."""
    return EkFacts(
        sha256="e" * 64,
        trusted_by="chain:CN=Test EK Root",
        issuer="CN=Test EK CA",
        manufacturer="id:49465800",
        vendor="IFX",
        model="SLB 9670 TPM2.0",
        version="id:0728",
    )


def quoted_of(
    raw: bytes, bank: str = "sha256", pcrs: Sequence[int] = range(8)
) -> dict[str, dict[int, bytes]]:
    """What a TPM that lived through ``raw`` would quote: its replay (reset values where no event
    extends a PCR)."""
    log = eventlog.parse(raw)
    replayed = log.replay([bank]).get(bank, {})
    size = {"sha1": 20, "sha256": 32, "sha384": 48, "sha512": 64, "sm3_256": 32}[bank]
    return {bank: {i: replayed.get(i, log.reset_value(i, size)) for i in pcrs}}


def built_from(
    raw: bytes | None,
    quoted: dict[str, dict[int, bytes]],
    policy: MeasuredBootPolicy | None = None,
    *,
    boot_id: str | None = None,
    pcr_class: str | None = None,
    at: datetime = T0,
    ek: bool = True,
) -> Built:
    """The record a join accepted under ``policy`` would keep (the verdict must pass); ``ek``: with
    what an EK certificate states (:func:`infineon_ek`), else none."""
    policy = policy or MeasuredBootPolicy()
    log, facts, matched = judge_log(policy, raw, quoted, "node")  # the join's own steps
    return build_record(
        attested_at=at,
        quoted=quoted,
        boot_id=boot_id,
        counters=Counters(3, 0, 1000),
        pcr_class=pcr_class,
        firmware_version=0x0007_0055_0000_0000,
        ek=infineon_ek() if ek else None,
        log=log,
        facts=facts,
        policy=policy,
        matched_class=matched,
    )


def synthetic(events: list[el.Ev] | None = None, **kw: object) -> Built:
    events = events if events is not None else el.boot()
    raw = el.build(events)
    return built_from(raw, quoted_of(raw), **kw)  # type: ignore[arg-type]
