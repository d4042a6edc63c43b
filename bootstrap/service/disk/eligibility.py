"""Which ``disk_keys`` class a judged boot belongs to (pure: no I/O). Each named class is judged
on its own, so a boot that some keyless class also matches still gets its keys, and a class in
``disk_keys.classes`` counts only where it is enforced (config validation refuses the rest)."""

from __future__ import annotations

from collections.abc import Mapping

from attest import pcr
from attest.measuredboot import policy as measuredboot
from attest.measuredboot.facts import BootFacts
from bootstrap.diskconfig import DiskKeysSettings


def disk_class(
    keys: DiskKeysSettings,
    pcr_policy: pcr.PcrPolicy,
    boot_policy: measuredboot.MeasuredBootPolicy,
    pcrs: Mapping[str, Mapping[int, bytes]],
    facts: BootFacts | None,
) -> str | None:
    """The first class of ``keys.classes`` (in their order) that accepts the quoted PCRs or the
    event log's facts; None when none does. With ``require_measured_boot`` only measured_boot
    classes count, and only on facts from a log that replayed to the quote."""
    boot = {c.name for c in boot_policy.classes if c.mode == "enforce"}
    quoted = {c.name for c in pcr_policy.classes if c.mode == "enforce"}
    for name in keys.classes:
        if name in boot and facts is not None:
            result = measuredboot.evaluate(boot_policy, facts, name)
            if result.ok and result.matched_class == name:
                return name
        if name in quoted and not keys.require_measured_boot:
            verdict = pcr.evaluate(pcr_policy, pcrs, name)
            if verdict.ok and verdict.matched_class == name:
                return name
    return None
