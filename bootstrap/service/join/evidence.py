"""The quote-time evidence of a finish (join or renewal), judged in one place: the quote over the
session's nonce (and the boot id, when the node sends one), the PCR policy, and the measured-boot
event log replayed against the quoted PCRs and judged by the measured_boot policy
(docs/measured-boot.md). Pure checks from ``attest``; nothing here does I/O.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from attest import eventlog, pcr, tpm
from attest.bootrecord.build import Built, build_record, record_facts
from attest.bootrecord.model import EkFacts
from attest.bootrecord.verdict import measured_boot_verdict
from attest.errors import BootNotReset
from attest.measuredboot import facts as bootfacts
from attest.measuredboot import policy as measuredboot
from bootstrap.config import Settings
from bootstrap.problems import BootIdRequired
from bootstrap.protocol import QuoteEvidence
from bootstrap.service.join.sessions import Session

log = logging.getLogger("nodegate.join")


# The refusals of a node's own evidence: the quote, the PCRs, the event log and the boot they
# describe. They are reached only after the TPM proved itself (the credential proof of a join) or
# the node's current SVID authenticated it (a renewal), so nobody else can cause one; each takes the
# node's SPIRE agents away until it attests again (docs/spire.md). Client faults, session and
# binding refusals are not among them.
REFUSES_THE_BOOT: Final = frozenset(
    {
        "quote_invalid",
        "quote_signature_invalid",
        "nonce_mismatch",
        "pcr_selection_mismatch",
        "pcr_digest_mismatch",
        "pcr_policy_violation",
        "clock_unsafe",
        "counter_regressed",
        "event_log_invalid",
        "event_log_mismatch",
        "measured_boot_violation",
        "boot_not_reset",
        "boot_id_required",
    }
)


@dataclass(frozen=True, slots=True)
class Evidence:
    quote: tpm.QuoteResult
    pcr_class: str | None  # the PCR policy class that matched
    measured_boot_class: str | None  # the measured_boot class that matched
    boot_id: str | None
    log: eventlog.EventLog | None = None  # the replayed event log (None: the node sent none)
    # Its facts, as the verdict read them: the boot record keeps them, and a disk-key release
    # checks its own classes on them (bootstrap.service.disk.eligibility).
    facts: bootfacts.BootFacts | None = None


def judge(
    settings: Settings, session: Session, req: QuoteEvidence, previous: tpm.Counters | None
) -> Evidence:
    """Every check of a finish body's evidence, in order; raises the first failure's error."""
    quote = tpm.verify_quote(
        session.ak_public,
        req.quote,
        req.signature,
        selection=session.selection,
        pcrs=req.pcrs,
        qualifying_data=session.qualifying_data_for(req.boot_id),
        previous=previous,
    )
    verdict = pcr.enforce(settings.pcr_policy, quote.pcrs)
    _warn_pcrs(session.node_name, verdict)
    log, facts, mb_class = judge_log(settings.measured_boot, req.event_log, quote.pcrs, session.node_name)
    return Evidence(quote, verdict.matched_class, mb_class, req.boot_id, log, facts)


def judge_event_log(
    policy: measuredboot.MeasuredBootPolicy,
    raw: bytes | None,
    quoted: dict[str, dict[int, bytes]],
    node_name: str,
) -> str | None:
    """Replay ``raw`` against the verified (signed) PCR values and judge it; returns the class
    that matched. Without a log: refused when the policy enforces anything, else nothing to do."""
    return judge_log(policy, raw, quoted, node_name)[2]


def judge_log(
    policy: measuredboot.MeasuredBootPolicy,
    raw: bytes | None,
    quoted: dict[str, dict[int, bytes]],
    node_name: str,
) -> tuple[eventlog.EventLog | None, bootfacts.BootFacts | None, str | None]:
    """:func:`judge_event_log`, also returning the log and its facts (what the boot record
    keeps: the verdict read exactly these)."""
    parsed = facts = None
    if raw is not None:
        parsed = eventlog.parse(raw)
        eventlog.verify_replay(parsed, quoted)
        facts = record_facts(parsed, quoted)
    result = measured_boot_verdict(policy, facts, quoted, sent_log=raw is not None)
    if result is None:
        return parsed, facts, None
    if result.warnings:
        text = "; ".join(str(w) for w in result.warnings[:5])
        log.warning("the event log breaks a warn-mode class", extra={"node": node_name, "error": text[:500]})
    return parsed, facts, result.matched_class


def boot_record(
    judged: Evidence, policy: measuredboot.MeasuredBootPolicy, *, attested_at: datetime, ek: EkFacts | None
) -> Built:
    """The boot record of an accepted attestation: what its verdict read (docs/fleet.md)."""
    return build_record(
        attested_at=attested_at,
        quoted=judged.quote.pcrs,
        boot_id=judged.boot_id,
        counters=judged.quote.counters,
        pcr_class=judged.pcr_class,
        firmware_version=judged.quote.firmware_version,
        ek=ek,
        log=judged.log,
        facts=judged.facts,
        policy=policy,
        matched_class=judged.measured_boot_class,
    )


def check_boot(
    previous_boot_id: str | None,
    previous: tpm.Counters | None,
    boot_id: str | None,
    counters: tpm.Counters,
) -> None:
    """A new boot id must come with a TPM reset (resetCount grows at every platform reset), and
    a reset with an unchanged boot id: either way the boot id is lying or the quote is stale.
    Once a boot id is recorded, every later attestation carries one (``boot_id_required``):
    without it the record would lose the boot the gate compares the Node's with."""
    if previous_boot_id is not None and boot_id is None:
        raise BootIdRequired(
            "this node's last attestation recorded its boot id; send the kernel's boot id "
            "(/proc/sys/kernel/random/boot_id) with every join, renewal and attestation"
        )
    if previous_boot_id is None or boot_id is None or previous is None:
        return
    reset = counters.reset_count > previous.reset_count
    if boot_id != previous_boot_id and not reset:
        raise BootNotReset(
            f"boot id changed ({previous_boot_id} -> {boot_id}) but the TPM's resetCount did not grow "
            f"({counters.reset_count}): the boot id or the quote is not from a new boot"
        )
    if boot_id == previous_boot_id and reset:
        raise BootNotReset(
            f"the TPM was reset (resetCount {previous.reset_count} -> {counters.reset_count}) but the "
            f"boot id is still {boot_id}: the machine rebooted and reports its old boot"
        )


def _warn_pcrs(node_name: str, verdict: pcr.PcrPolicyResult) -> None:
    """Classes in ``warn`` mode do not refuse; their mismatches are logged (a rollout of a new
    firmware class starts in warn mode, and this is how an operator sees what it would refuse)."""
    if verdict.warnings:
        text = "; ".join(str(w) for w in verdict.warnings[:5])
        log.warning(
            "PCR values differ from a warn-mode class", extra={"node": node_name, "error": text[:500]}
        )
