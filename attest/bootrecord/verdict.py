"""The measured-boot verdict on a log's facts: the one function the join and a what-if call. Pure.

The join replays the log against the quote first (``attest.eventlog.verify_replay``) and then
asks this; a what-if asks it about the facts a boot record kept (``recorded.facts_of``), so both
reach their verdict through the same code, in the same order.
"""

from __future__ import annotations

from collections.abc import Collection

from attest.errors import MeasuredBootViolation
from attest.measuredboot import policy as measuredboot
from attest.measuredboot.facts import BootFacts

__all__ = ["NO_LOG", "measured_boot_verdict"]

NO_LOG = (
    "the node sent no event log; the measured_boot policy needs the firmware's (binary_bios_measurements)"
)


def measured_boot_verdict(
    policy: measuredboot.MeasuredBootPolicy,
    facts: BootFacts | None,
    quoted_banks: Collection[str],
    *,
    sent_log: bool,
) -> measuredboot.MeasuredBootResult | None:
    """None when the policy enforces nothing (nothing to judge); the result (with the class that
    matched, and warn-mode findings) when the facts pass. Raises MeasuredBootViolation
    (``measured_boot_violation``) otherwise: no log under a policy, a quote in a bank no rule
    reads, or facts that match no enforced class. ``facts`` are those of the bank
    ``judged_bank`` picks (``build.record_facts``)."""
    if not sent_log:
        if policy.enforces_anything:
            raise MeasuredBootViolation(NO_LOG)
        return None
    if not policy.enforces_anything:
        return None
    bank = measuredboot.judged_bank(policy, quoted_banks)  # 403 naming the banks, never StopIteration
    if facts is None or facts.bank != bank:
        raise MeasuredBootViolation(f"the event log's facts in {bank} are not at hand")
    return measuredboot.enforce(policy, facts)
