"""What a policy change would do to the fleet: every stored boot record judged by the new
policies (``judge``) and compared with what it got before. Pure.

Before is the current policies' verdict when they are given, else what the record itself shows
(its last attestation was accepted, with the classes it names). Each node lands in one kind:

    refused        passes now, the new policies refuse it (the join's code, rule and event)
    still-refused  the current policies already refuse it; the new ones too
    passes         the current policies refuse it; the new ones let it pass
    class          passes both, but another PCR or measured-boot class matches
    unknown        the record cannot show what the next quote would (see ``judge``)
    same           nothing changes
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from attest import pcr
from attest.bootrecord.judge import Verdict, judge
from attest.bootrecord.model import BootRecord
from attest.measuredboot.model import MeasuredBootPolicy

__all__ = ["KINDS", "Change", "Kind", "Policies", "compare", "recorded"]

Kind = Literal["refused", "still-refused", "passes", "class", "unknown", "same"]
KINDS: tuple[Kind, ...] = ("refused", "still-refused", "passes", "class", "unknown", "same")


@dataclass(frozen=True, slots=True)
class Policies:
    """``pcr`` None: the quote selection each record was made with, and no PCR classes (a
    measured-boot class file judged alone)."""

    measured_boot: MeasuredBootPolicy
    pcr: pcr.PcrPolicy | None = None


@dataclass(frozen=True, slots=True)
class Change:
    node: str
    kind: Kind
    before: Verdict
    after: Verdict
    stale: bool = False  # the node booted again since its record


def recorded(rec: BootRecord) -> Verdict:
    """The verdict the record itself shows: accepted, with its classes."""
    mb = rec.measured_boot
    return Verdict("pass", pcr_class=rec.pcr_class, measured_boot_class=mb.matched_class if mb else None)


def _selection_of(rec: BootRecord) -> pcr.PcrPolicy:
    bank, values = next(iter(rec.pcrs.items()))
    return pcr.PcrPolicy(bank=bank, pcrs=tuple(sorted(values)))


def _judge(rec: BootRecord, policies: Policies, dbx: Mapping[str, bytes]) -> Verdict:
    mb = rec.measured_boot
    digests = dbx.get(mb.dbx.sha256) if mb is not None and mb.dbx is not None else None
    if policies.pcr is None and not rec.pcrs:
        return Verdict("unknown", reason="the record holds no quoted PCRs")
    selection = policies.pcr if policies.pcr is not None else _selection_of(rec)
    return judge(rec, selection, policies.measured_boot, digests)


def _kind(before: Verdict, after: Verdict) -> Kind:
    if after.outcome == "unknown":
        return "unknown"
    if after.outcome == "refuse":
        return "still-refused" if before.outcome == "refuse" else "refused"
    if before.outcome == "refuse":
        return "passes"
    moved = (before.pcr_class, before.measured_boot_class) != (after.pcr_class, after.measured_boot_class)
    return "class" if moved else "same"


def compare(
    records: Iterable[tuple[str, BootRecord]],
    new: Policies,
    current: Policies | None = None,
    dbx: Mapping[str, bytes] | None = None,
    stale: Collection[str] = (),
) -> list[Change]:
    """One change per record, in the order given. ``dbx``: the digests of the records' dbx
    values by identity (``dbx_required`` needs them); ``stale``: nodes that booted again since."""
    digests = dbx or {}
    out = []
    for name, rec in records:
        after = _judge(rec, new, digests)
        before = recorded(rec)
        if current is not None:
            judged = _judge(rec, current, digests)
            if judged.outcome != "unknown":
                before = judged
        out.append(Change(name, _kind(before, after), before, after, name in stale))
    return out
