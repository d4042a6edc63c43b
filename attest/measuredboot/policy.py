"""Measured-boot policy: what a node's replayed event log must show, per node class.

    measured_boot:
      secure_boot: required                # every node, whatever its class (default: optional)
      classes:
        - name: gpu-ubuntu-2404
          mode: enforce                    # or: warn (report, never refuse)
          authorities: ["CN=Microsoft Corporation UEFI CA 2011,...", "sha256:9f2c..."]
          dbx_required: ["80b4d96931bf0d02fd91a61e19d14f1da452e66db2408ca8604d411f92659f0a"]
          boot_applications: ["<sha256 of shim>", "<sha256 of grub>", "<sha256 of the kernel>"]
          kernel_cmdlines: ["/vmlinuz-6.8.0-45-generic root=UUID=... ro"]

A class lists what it allows; a rule it leaves out is not checked. A node passes when every rule
of some enforced class holds (with no enforced class, it passes and the warn classes' findings
are reported). Facts come from ``facts`` (only what the TPM vouches for, in quoted PCRs). Each
rule depends on PCRs (:data:`RULE_PCRS`): those must be in the quote selection (checked when the
config loads), and every event there that has no vouched-for meaning fails the rule. Every
violation names the event (number, PCR, type) and the rule it broke. Pure.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from attest import validation
from attest.errors import MeasuredBootViolation
from attest.measuredboot.events import BOOT_APPLICATION_PCR, GRUB_STRING_PCR, SECURE_BOOT_PCR
from attest.measuredboot.facts import BootFacts

_HEX64 = re.compile(r"[0-9a-f]{64}")
_MAX_LIST = 4096
_MAX_REPORTED = 8
KERNEL_CMDLINE_PCR = GRUB_STRING_PCR  # grub and systemd-boot measure the command line there
# The PCRs each rule reads: they must be quoted, and nothing uninterpreted may be in them.
RULE_PCRS: dict[str, tuple[int, ...]] = {
    "secure_boot": (SECURE_BOOT_PCR,),
    "authorities": (SECURE_BOOT_PCR,),
    "dbx_required": (SECURE_BOOT_PCR,),
    "boot_applications": (BOOT_APPLICATION_PCR,),
    "kernel_cmdlines": (KERNEL_CMDLINE_PCR,),
}


class MeasuredBootPolicyError(ValueError):
    """A measured-boot policy that cannot be used (raised at load time, never per join)."""


def _digests(values: tuple[str, ...], what: str) -> tuple[str, ...]:
    out = tuple(v.lower().removeprefix("sha256:") for v in values)
    for v in out:
        if not _HEX64.fullmatch(v):
            raise ValueError(f"{what}: {v[:80]!r} is not a SHA-256 in hex")
    return out


class MeasuredBootClass(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=128, pattern=r"\A[A-Za-z0-9][A-Za-z0-9._-]*\z")
    mode: Literal["enforce", "warn"] = "enforce"
    secure_boot: Literal["required", "optional"] | None = None  # None: the policy's default
    authorities: tuple[str, ...] | None = Field(default=None, max_length=_MAX_LIST)
    dbx_required: tuple[str, ...] | None = Field(default=None, max_length=_MAX_LIST)
    boot_applications: tuple[str, ...] | None = Field(default=None, max_length=_MAX_LIST)
    kernel_cmdlines: tuple[str, ...] | None = Field(default=None, max_length=_MAX_LIST)

    @field_validator("dbx_required", "boot_applications")
    @classmethod
    def _hex(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return None if v is None else _digests(v, "digest list")

    @field_validator("authorities")
    @classmethod
    def _authorities(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if v is None:
            return None
        return tuple(
            ("sha256:" + _digests((a,), "authority")[0]) if a.lower().startswith("sha256:") else a for a in v
        )

    @functools.cached_property
    def dbx_required_bytes(self) -> tuple[bytes, ...]:
        return tuple(bytes.fromhex(d) for d in self.dbx_required or ())

    @functools.cached_property
    def allows_authority_digests(self) -> bool:
        """Whether some authority is listed by digest (else a certificate need not be hashed)."""
        return any(a.startswith("sha256:") for a in self.authorities or ())

    def rules(self, default_secure_boot: bool) -> tuple[str, ...]:
        """The rules this class applies (secure_boot from the policy's default when unset)."""
        sb = self.secure_boot == "required" if self.secure_boot else default_secure_boot
        named = ("authorities", "dbx_required", "boot_applications", "kernel_cmdlines")
        return (("secure_boot",) if sb else ()) + tuple(r for r in named if getattr(self, r) is not None)

    @model_validator(mode="after")
    def _some_rule(self) -> MeasuredBootClass:
        rules = (
            self.secure_boot,
            self.authorities,
            self.dbx_required,
            self.boot_applications,
            self.kernel_cmdlines,
        )
        if all(r is None for r in rules):
            raise ValueError(f"class {self.name} has no rule (it would admit every node)")
        return self


class MeasuredBootPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    secure_boot: Literal["required", "optional"] = "optional"
    classes: tuple[MeasuredBootClass, ...] = ()

    @field_validator("classes")
    @classmethod
    def _unique(cls, v: tuple[MeasuredBootClass, ...]) -> tuple[MeasuredBootClass, ...]:
        names = [c.name for c in v]
        if len(set(names)) != len(names):
            raise ValueError("measured_boot class names must be unique")
        return v

    @property
    def enforces_anything(self) -> bool:
        return self.secure_boot == "required" or bool(self.classes)

    @property
    def needs_kernel_cmdline_pcr(self) -> bool:
        return any(c.kernel_cmdlines is not None for c in self.classes)

    def rules(self) -> frozenset[str]:
        """Every rule some class (or the top-level secure_boot) applies."""
        out = {"secure_boot"} if self.secure_boot == "required" else set()
        for c in self.classes:
            out.update(c.rules(self.secure_boot == "required"))
        return frozenset(out)

    def required_pcrs(self) -> dict[int, tuple[str, ...]]:
        """PCR -> the rules that read it; a quote selection without one of them is a config error."""
        out: dict[int, list[str]] = {}
        for rule in sorted(self.rules()):
            for pcr in RULE_PCRS[rule]:
                out.setdefault(pcr, []).append(rule)
        return {pcr: tuple(rules) for pcr, rules in sorted(out.items())}

    def missing_pcrs(self, quoted: Collection[int]) -> str | None:
        """Why a quote selection of ``quoted`` cannot support this policy, or None."""
        missing = {p: r for p, r in self.required_pcrs().items() if p not in quoted}
        if not missing:
            return None
        return "; ".join(f"{', '.join(r)} needs PCR {p} in the quote selection" for p, r in missing.items())


def policy_from_obj(data: object) -> MeasuredBootPolicy:
    try:
        return MeasuredBootPolicy.model_validate({} if data is None else data)
    except ValidationError as exc:
        reasons = validation.summary(exc, MeasuredBootPolicy, 10)
        raise MeasuredBootPolicyError(f"invalid measured_boot policy: {reasons}") from None


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


def _problems(facts: BootFacts, rule: str, cls: str | None) -> list[Finding]:
    """A rule holds only if every event in the PCRs it reads has a vouched-for meaning: an event
    the profile does not define there could be what the rule is about, relabelled (the type and
    data are not signed)."""
    return [
        Finding(
            rule,
            f"{u.reason}: the TPM does not vouch for what it is, so the rule cannot hold",
            u.where(),
            cls,
        )
        for pcr in RULE_PCRS[rule]
        for u in facts.problems(pcr)
    ]


def _secure_boot(facts: BootFacts, required: bool, cls: str | None) -> list[Finding]:
    if not required:
        return []
    out = _problems(facts, "secure_boot", cls)
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
    out = _secure_boot(facts, c.secure_boot == "required" if c.secure_boot else default_sb, c.name)
    if c.authorities is not None:
        out += _problems(facts, "authorities", c.name)
        allowed = set(c.authorities)
        by_digest = c.allows_authority_digests
        subjects: dict[bytes, str | None] = {}  # firmware and shim log some certificates twice
        for a in facts.authorities:
            if by_digest and f"sha256:{a.sha256}" in allowed:
                continue
            cert = a.certificate
            if cert not in subjects:
                subjects[cert] = a.subject
            subject = subjects[cert]
            if subject is None or subject not in allowed:
                who = subject or f"sha256:{a.sha256}"
                out.append(
                    Finding(
                        "authorities",
                        f"authority {who} ({a.variable}) is not allowed",
                        a.event.where(),
                        c.name,
                    )
                )
    if c.dbx_required is not None:
        out += _problems(facts, "dbx_required", c.name)
        present = facts.dbx_hashes()
        required = c.dbx_required_bytes
        # issuperset walks the (often hundreds of) entries in C; the list only names what lacks.
        missing = [] if present.issuperset(required) else [d.hex() for d in required if d not in present]
        if missing:
            out.append(
                Finding(
                    "dbx_required",
                    f"dbx lacks {len(missing)} required entries, e.g. {missing[0]}",
                    None,
                    c.name,
                )
            )
    if c.boot_applications is not None:
        out += _problems(facts, "boot_applications", c.name)
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
        out += _problems(facts, "kernel_cmdlines", c.name)
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
    findings = {c.name: _class_findings(c, facts, default_sb) for c in classes}
    for c in classes:
        if c.mode == "enforce" and not findings[c.name]:
            return MeasuredBootResult(True, c.name, (), ())
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


def learn(known_good: list[BootFacts], *, name: str = "learned", cmdlines: bool = False) -> MeasuredBootClass:
    """A class that admits exactly what the known-good logs show: Secure Boot required when every
    log shows it on; every authority (by subject when it parses, else by digest) and boot
    application seen; the dbx entries every log has; kernel command lines only with ``cmdlines``
    (they need PCR 8 in the quote selection)."""
    if not known_good:
        raise MeasuredBootPolicyError("learning a measured_boot class needs at least one event log")
    authorities: dict[str, None] = {}
    apps: dict[str, None] = {}
    lines: dict[str, None] = {}
    for facts in known_good:
        for a in facts.authorities:
            authorities[a.subject or f"sha256:{a.sha256}"] = None
        for app in facts.boot_applications:
            apps[app.digest] = None
        for line in facts.kernel_cmdlines:
            lines[line.text] = None
    dbx = set.intersection(*(set(f.dbx_digests()) for f in known_good))
    return MeasuredBootClass(
        name=name,
        secure_boot="required" if all(f.secure_boot is True for f in known_good) else "optional",
        authorities=tuple(authorities),
        dbx_required=tuple(sorted(dbx)) or None,
        boot_applications=tuple(apps),
        kernel_cmdlines=tuple(lines) if cmdlines and lines else None,
    )
