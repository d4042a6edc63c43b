"""Measured-boot policy: what a node's replayed event log must show, per node class.

    measured_boot:
      secure_boot: required                # every node, whatever its class (default: optional)
      classes:
        - name: gpu-ubuntu-2404
          mode: enforce                    # or: warn (report, never refuse)
          authorities: ["sha256:<of the DER certificate>", ...]   # by digest, never by subject
          dbx_required: ["80b4d96931bf0d02fd91a61e19d14f1da452e66db2408ca8604d411f92659f0a"]
          boot_applications: ["<sha256 of shim>", "<sha256 of grub>", "<sha256 of the kernel>"]
          kernel_cmdlines: ["/vmlinuz-6.8.0-45-generic root=UUID=... ro"]
          kernel_cmdline_chains: [["<sha256 of shim>", "<sha256 of grub>"]]
          efi_actions: ["Security Level is Downgraded to 0"]

A class lists what it allows; a rule it leaves out is not checked. A node passes when every rule
of some enforced class holds (with no enforced class, it passes and the warn classes' findings
are reported). Facts come from ``facts`` (only what the TPM vouches for, in quoted PCRs). Each
rule depends on PCRs (:data:`RULE_PCRS`): those must be in the quote selection (checked when the
config loads), and every event there that has no vouched-for meaning fails the rule. Every
violation names the event (number, PCR, type) and the rule it broke. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from attest.errors import MeasuredBootViolation
from attest.measuredboot.events import (
    BOOT_OPTION_RETURNS,
    GRUB_IMAGE_COMMANDS,
    Action,
    Application,
)
from attest.measuredboot.facts import BootFacts
from attest.measuredboot.model import (
    JUDGED_BANKS,
    KERNEL_CMDLINE_PCR,
    RULE_PCRS,
    SHA256_ONLY_RULES,
    MeasuredBootClass,
    MeasuredBootPolicy,
    MeasuredBootPolicyError,
    judged_bank,
    policy_from_obj,
)

__all__ = [
    "JUDGED_BANKS",
    "KERNEL_CMDLINE_PCR",
    "RULE_PCRS",
    "SHA256_ONLY_RULES",
    "Finding",
    "MeasuredBootClass",
    "MeasuredBootPolicy",
    "MeasuredBootPolicyError",
    "MeasuredBootResult",
    "UnlearnableLog",
    "enforce",
    "evaluate",
    "judged_bank",
    "learn",
    "policy_from_obj",
]
_MAX_REPORTED = 8


@dataclass(frozen=True, slots=True)
class Finding:
    """One broken rule: which class, which rule, which event (None: the log lacks the event)."""

    rule: str
    detail: str
    where: str | None = None
    pcr_class: str | None = None

    def __str__(self) -> str:
        head = f"class {self.pcr_class}: " if self.pcr_class else ""
        at = f"{self.where}: " if self.where else ""
        return f"{head}{at}{self.detail} (rule {self.rule})"


@dataclass(frozen=True, slots=True)
class MeasuredBootResult:
    ok: bool
    matched_class: str | None
    violations: tuple[Finding, ...]
    warnings: tuple[Finding, ...]
    reason: str = ""


def _problems(facts: BootFacts, rule: str, cls: MeasuredBootClass | None) -> list[Finding]:
    """A rule holds only if every event in the PCRs it reads has a vouched-for meaning: an event
    the profile does not define there could be what the rule is about, relabelled (the type and
    data are not signed). A vendor's action string has a vouched-for text but no defined meaning:
    it passes only where the class names it."""
    name = cls.name if cls is not None else None
    allowed = cls.efi_actions if cls is not None else ()
    out = [
        Finding(
            rule,
            f"{u.reason}: the TPM does not vouch for what it is, so the rule cannot hold",
            u.where(),
            name,
        )
        for pcr in RULE_PCRS[rule]
        for u in facts.problems(pcr)
    ]
    for pcr in RULE_PCRS[rule]:
        for a in facts.vendor_problems(pcr, allowed):
            out.append(
                Finding(
                    rule,
                    f"EFI action {a.text!r} is not one the firmware profile defines, and the class "
                    "does not allow it (efi_actions)",
                    a.event.where(),
                    name,
                )
            )
    return out


def _secure_boot(facts: BootFacts, required: bool, c: MeasuredBootClass | None) -> list[Finding]:
    if not required:
        return []
    cls = c.name if c is not None else None
    out = _problems(facts, "secure_boot", c)
    if facts.debug_mode is not None:
        out.append(
            Finding("secure_boot", "the firmware is in UEFI debug mode", facts.debug_mode.where(), cls)
        )
    if facts.secure_boot is True:
        return out
    if facts.secure_boot is False and facts.secure_boot_event is not None:
        return [Finding("secure_boot", "Secure Boot is off", facts.secure_boot_event.where(), cls), *out]
    return [
        Finding(
            "secure_boot",
            "the log does not show Secure Boot on (no SecureBoot variable before PCR 7's separator)",
            None,
            cls,
        ),
        *out,
    ]


def _class_findings(c: MeasuredBootClass, facts: BootFacts, default_sb: bool) -> list[Finding]:
    out = _secure_boot(facts, c.secure_boot == "required" if c.secure_boot else default_sb, c)
    if c.authorities is not None:
        out += _problems(facts, "authorities", c)
        allowed = set(c.authorities)
        for a in facts.authorities:
            digest = f"sha256:{a.sha256}"
            if digest not in allowed:
                out.append(
                    Finding(
                        "authorities",
                        f"authority {a.subject or digest} ({a.variable}) is not allowed; its "
                        f"certificate is {digest}",
                        a.event.where(),
                        c.name,
                    )
                )
    if c.dbx_required is not None:
        out += _problems(facts, "dbx_required", c)
        present = facts.dbx_hashes()
        required = c.dbx_required_bytes
        # issuperset walks the (often hundreds of) entries in C; only the first lacking one is
        # shown, so only it is turned into text (a fleet's what-if judges thousands of records).
        if not present.issuperset(required):
            missing = [d for d in required if d not in present]
            out.append(
                Finding(
                    "dbx_required",
                    f"dbx lacks {len(missing)} required entries, e.g. {missing[0].hex()}",
                    None,
                    c.name,
                )
            )
    if c.boot_applications is not None:
        out += _problems(facts, "boot_applications", c)
        allowed = set(c.boot_applications)
        for app in facts.boot_applications:
            if app.digest not in allowed:
                path = app.path
                out.append(
                    Finding(
                        "boot_applications",
                        f"boot application {app.digest}{f' ({path})' if path else ''} is not allowed",
                        app.event.where(),
                        c.name,
                    )
                )
    if c.kernel_cmdlines is not None:
        out += _problems(facts, "kernel_cmdlines", c)
        out += _cmdline_proof(c, facts)
        allowed = set(c.kernel_cmdlines)
        if not facts.kernel_cmdlines:
            out.append(
                Finding(
                    "kernel_cmdlines",
                    f"the log shows no kernel command line in PCR {KERNEL_CMDLINE_PCR}",
                    None,
                    c.name,
                )
            )
        for line in facts.kernel_cmdlines:
            if line.text not in allowed:
                out.append(
                    Finding(
                        "kernel_cmdlines",
                        f"kernel command line {line.text[:200]!r} is not allowed",
                        line.event.where(),
                        c.name,
                    )
                )
    return out


def _cmdline_proof(c: MeasuredBootClass, facts: BootFacts) -> list[Finding]:
    """Whether the kernel's command line is the one in PCR 8. Root can append a grub ``linux``
    command and an allowed line to PCR 8 after any boot, so a line counts only when PCR 4 (whose
    order the replay vouches for, and which root can only append to) begins with a chain that
    ends in a loader known to measure every line it starts a kernel with; after that loader the
    firmware started nothing else (no return from the boot option), and grub started no image
    by a command that measures no line (chainloader, exit...)."""
    out: list[Finding] = []
    pcr4 = facts.pcr4()
    apps = [t for t in pcr4 if type(t) is Application]
    digests = [a.digest for a in apps]
    chains = [ch for ch in c.kernel_cmdline_chains or () if digests[: len(ch)] == list(ch)]
    if not chains:
        first = apps[0].event.where() if apps else None
        out.append(
            Finding(
                "kernel_cmdlines",
                "PCR 4's boot applications do not begin with a chain in kernel_cmdline_chains (a "
                "loader that measures the kernel command line): this boot's line is not proven, "
                "whatever PCR 8 shows",
                first,
                c.name,
            )
        )
    else:
        loader = apps[min(len(ch) for ch in chains) - 1].event  # the earliest: strictest
        after = False
        for t in pcr4:
            if t[0] is loader:
                after = True
            elif after and type(t) is Action and t.text in BOOT_OPTION_RETURNS:
                out.append(
                    Finding(
                        "kernel_cmdlines",
                        f"{t.text!r} after the loader: the firmware went on to another boot "
                        "option, so the kernel need not be the one the loader measured",
                        t.event.where(),
                        c.name,
                    )
                )
    for cmd in facts.grub_commands:
        if cmd.word in GRUB_IMAGE_COMMANDS:
            out.append(
                Finding(
                    "kernel_cmdlines",
                    f"grub's {cmd.command} command starts an image whose command line grub does not measure",
                    cmd.event.where(),
                    c.name,
                )
            )
    return out


def evaluate(
    policy: MeasuredBootPolicy, facts: BootFacts, node_class: str | None = None
) -> MeasuredBootResult:
    """Judge the facts; never raises for a failing node (see :func:`enforce`)."""
    default_sb = policy.secure_boot == "required"
    classes = policy.classes
    if node_class is not None:
        classes = tuple(c for c in classes if c.name == node_class)
        if not classes:
            return MeasuredBootResult(False, None, (), (), f"measured_boot has no class named {node_class!r}")
    if not classes:
        found = _secure_boot(facts, default_sb, None)
        return MeasuredBootResult(not found, None, tuple(found), (), "; ".join(map(str, found)))
    # The first enforced class without findings matches; the others are judged only when none
    # does (their findings are the refusal's), so a policy of many classes costs what it needs.
    findings: dict[str, list[Finding]] = {}
    for c in classes:
        if c.mode == "enforce":
            findings[c.name] = _class_findings(c, facts, default_sb)
            if not findings[c.name]:
                return MeasuredBootResult(True, c.name, (), ())
    for c in classes:
        if c.mode == "warn":
            findings[c.name] = _class_findings(c, facts, default_sb)
    enforced = [f for c in classes if c.mode == "enforce" for f in findings[c.name]]
    warned = tuple(f for c in classes if c.mode == "warn" for f in findings[c.name])
    if not any(c.mode == "enforce" for c in classes):
        base = _secure_boot(facts, default_sb, None)
        return MeasuredBootResult(not base, None, tuple(base), warned, "; ".join(map(str, base)))
    shown = "; ".join(str(f) for f in enforced[:_MAX_REPORTED])
    more = len(enforced) - _MAX_REPORTED
    reason = "the event log matches no enforced class: " + shown + (f"; and {more} more" if more > 0 else "")
    return MeasuredBootResult(False, None, tuple(enforced), warned, reason)


def enforce(
    policy: MeasuredBootPolicy, facts: BootFacts, node_class: str | None = None
) -> MeasuredBootResult:
    """:func:`evaluate`, raising MeasuredBootViolation (``measured_boot_violation``) on failure."""
    result = evaluate(policy, facts, node_class)
    if not result.ok:
        raise MeasuredBootViolation(result.reason[:2000])
    return result


class UnlearnableLog(MeasuredBootPolicyError):
    """A known-good log no class may admit (UEFI debug mode): ``learn`` says so in one line."""


def learn(known_good: list[BootFacts], *, name: str = "learned", cmdlines: bool = False) -> MeasuredBootClass:
    """A class that admits exactly what the known-good logs show: Secure Boot required when every
    log shows it on; every authority (by certificate digest) and boot application seen; the dbx
    entries every log has; the vendor EFI action strings seen; kernel command lines only with
    ``cmdlines`` (they need PCRs 4 and 8 in the quote selection), with the chain of boot
    applications logged before the loader measured the first line. A log in UEFI debug mode
    raises :class:`UnlearnableLog` (the firmware's own checks are off: no class admits it)."""
    if not known_good:
        raise MeasuredBootPolicyError("learning a measured_boot class needs at least one event log")
    authorities: dict[str, None] = {}
    apps: dict[str, None] = {}
    lines: dict[str, None] = {}
    chains: dict[tuple[str, ...], None] = {}
    actions: dict[str, None] = {}
    for i, facts in enumerate(known_good):
        if facts.debug_mode is not None:
            raise UnlearnableLog(
                f"log {i + 1} is from firmware in UEFI debug mode ({facts.debug_mode.where()}): "
                "no class can admit it"
            )
        for a in facts.authorities:
            authorities[f"sha256:{a.sha256}"] = None
        for app in facts.boot_applications:
            apps[app.digest] = None
        for line in facts.kernel_cmdlines:
            lines[line.text] = None
        for act in facts.vendor_actions:
            actions[act.text] = None
        anchor = facts.cmdline_anchor
        if anchor is not None:
            # A known-good log's order between PCRs is trusted here (it is not at a join): the
            # applications logged before the loader measured the line are the ones that led to it.
            chain = tuple(a.digest for a in facts.boot_applications if a.event.number < anchor.number)
            if chain:
                chains[chain] = None
    dbx = set.intersection(*(set(f.dbx_digests()) for f in known_good))
    # Chains are Authenticode SHA-256s: only a sha256 bank's application digests are those.
    with_lines = cmdlines and bool(lines) and bool(chains) and all(f.bank == "sha256" for f in known_good)
    return MeasuredBootClass(
        name=name,
        secure_boot="required" if all(f.secure_boot is True for f in known_good) else "optional",
        authorities=tuple(authorities),
        dbx_required=tuple(sorted(dbx)) or None,
        boot_applications=tuple(apps),
        kernel_cmdlines=tuple(lines) if with_lines else None,
        kernel_cmdline_chains=tuple(chains) if with_lines else None,
        efi_actions=tuple(actions),
    )
