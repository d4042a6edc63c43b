"""Judge a stored boot record by a (new) policy, as the join would judge that boot. Pure.

The join checks, after the quote itself: the PCR policy on the quoted values, then the
measured-boot policy on the log's facts (``verdict.measured_boot_verdict``). This does the same,
in the same order, on what the record kept: the same ``attest.pcr.evaluate`` and the same
measured-boot verdict on the facts rebuilt from the record (``recorded.facts_of``). Where the
record cannot show what the next quote would (a PCR or bank it did not cover, a list it had to
cut short, a dbx whose digests are not at hand), the answer is ``unknown``, with why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from attest import pcr
from attest.bootrecord.model import BootRecord
from attest.bootrecord.recorded import DbxContentMismatch, facts_of
from attest.bootrecord.verdict import measured_boot_verdict
from attest.errors import MeasuredBootViolation
from attest.measuredboot import policy as measuredboot

__all__ = ["Outcome", "Verdict", "judge", "needs_dbx"]

Outcome = Literal["pass", "refuse", "unknown"]


@dataclass(frozen=True, slots=True)
class Verdict:
    outcome: Outcome
    pcr_class: str | None = None
    measured_boot_class: str | None = None
    code: str | None = None  # the join's machine code for a refusal
    reason: str = ""  # the join's detail for a refusal; why, for unknown
    findings: tuple[measuredboot.Finding, ...] = ()  # measured-boot: rule, event, class
    mismatches: tuple[pcr.PcrMismatch, ...] = ()  # PCR policy: which PCR, which class
    warnings: tuple[str, ...] = ()  # warn-mode classes' findings (never refuse)


def needs_dbx(policy: measuredboot.MeasuredBootPolicy) -> bool:
    return any(c.dbx_required is not None for c in policy.classes)


def judge(
    record: BootRecord,
    pcr_policy: pcr.PcrPolicy,
    measured_boot: measuredboot.MeasuredBootPolicy,
    dbx: bytes | None = None,
) -> Verdict:
    """The verdict a join of this boot would get under these policies. ``dbx``: the image
    digests of the record's dbx (the store keeps them once per distinct dbx)."""
    quoted = {bank: {i: bytes.fromhex(v) for i, v in values.items()} for bank, values in record.pcrs.items()}
    unknown = _pcr_unknown(quoted, pcr_policy)
    if unknown:
        return Verdict("unknown", reason=unknown)
    pcr_result = pcr.evaluate(pcr_policy, quoted)
    if not pcr_result.ok:
        return Verdict(
            "refuse", code="pcr_policy_violation", reason=pcr_result.reason, mismatches=pcr_result.violations
        )
    warnings = tuple(str(w) for w in pcr_result.warnings)
    mb = record.measured_boot
    unknown = _mb_unknown(record, quoted, pcr_policy, measured_boot, dbx)
    if unknown:
        return Verdict("unknown", pcr_class=pcr_result.matched_class, reason=unknown)
    facts = None
    if mb is not None and mb.bank in measuredboot.JUDGED_BANKS:
        try:
            facts = facts_of(mb, dbx)
        except DbxContentMismatch as exc:
            return Verdict("unknown", pcr_class=pcr_result.matched_class, reason=str(exc))
    try:
        result = measured_boot_verdict(measured_boot, facts, quoted, sent_log=mb is not None)
    except MeasuredBootViolation as exc:
        findings = measuredboot.evaluate(measured_boot, facts).violations if facts is not None else ()
        return Verdict(
            "refuse",
            pcr_class=pcr_result.matched_class,
            code=exc.code,
            reason=exc.detail,
            findings=findings,
            warnings=warnings,
        )
    if result is not None:
        warnings += tuple(str(w) for w in result.warnings)
    return Verdict(
        "pass",
        pcr_class=pcr_result.matched_class,
        measured_boot_class=result.matched_class if result is not None else None,
        warnings=warnings,
    )


def _pcr_unknown(quoted: Mapping[str, Mapping[int, bytes]], policy: pcr.PcrPolicy) -> str | None:
    """Golden values for a PCR (or bank) the stored quote did not cover: the next quote will."""
    missing = sorted(
        {
            (bank, index)
            for c in policy.classes
            for bank, entries in c.golden.items()
            for index in entries
            if index not in quoted.get(bank, {})
        }
    )
    if not missing:
        return None
    shown = ", ".join(f"{b}:{i}" for b, i in missing[:8])
    return f"the stored quote does not cover {shown}, which the PCR policy checks"


def _mb_unknown(
    record: BootRecord,
    quoted: Mapping[str, Mapping[int, bytes]],
    pcr_policy: pcr.PcrPolicy,
    policy: measuredboot.MeasuredBootPolicy,
    dbx: bytes | None,
) -> str | None:
    mb = record.measured_boot
    if mb is None or not policy.enforces_anything:
        return None
    if pcr_policy.bank not in quoted:
        shown = ", ".join(sorted(quoted)) or "no bank"
        return f"the stored quote is in {shown}; the policy quotes {pcr_policy.bank}"
    missing = policy.missing_pcrs(quoted[pcr_policy.bank])
    if missing:
        return f"the stored quote did not cover what the policy reads ({missing})"
    if mb.truncated:
        return f"the record had to leave out part of {', '.join(mb.truncated)}"
    if needs_dbx(policy) and mb.dbx is not None and dbx is None:
        return f"the digests of dbx {mb.dbx.sha256[:16]} are not at hand (dbx_required cannot be judged)"
    return None
