"""The measured_boot policy's configuration: classes, their rules, the PCRs and banks each rule
reads, validated when the config loads (never per join). ``policy`` judges facts with it. Pure.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from attest import validation
from attest.errors import MeasuredBootViolation
from attest.measuredboot.events import (
    BOOT_APPLICATION_PCR,
    GRUB_STRING_PCR,
    MAX_ACTION_CHARS,
    SECURE_BOOT_PCR,
    UEFI_DEBUG_MODE,
)

_HEX64 = re.compile(r"[0-9a-f]{64}")
_MAX_LIST = 4096
KERNEL_CMDLINE_PCR = GRUB_STRING_PCR  # grub and systemd-boot measure the command line there
# The PCRs each rule reads: they must be quoted, and nothing uninterpreted may be in them.
RULE_PCRS: dict[str, tuple[int, ...]] = {
    "secure_boot": (SECURE_BOOT_PCR,),
    "authorities": (SECURE_BOOT_PCR,),
    "dbx_required": (SECURE_BOOT_PCR,),
    "boot_applications": (BOOT_APPLICATION_PCR,),
    # PCR 4 too: the command line counts only when the loader that measures it started the kernel.
    "kernel_cmdlines": (BOOT_APPLICATION_PCR, KERNEL_CMDLINE_PCR),
}
# The banks whose events the interpreter reads, in the order a quote's banks are preferred. SM3-256
# logs replay (log.py), but no rule is defined over them: refused at load, 403 at a join.
JUDGED_BANKS: tuple[str, ...] = ("sha256", "sha384", "sha512", "sha1")
# Rules whose configured digests are SHA-256 of what the bank's digest covers in sha256 only
# (Authenticode hashes of boot applications): another bank vouches for another hash of the image.
SHA256_ONLY_RULES: tuple[str, ...] = ("boot_applications", "kernel_cmdlines")


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
    # PCR 4's boot applications from the first, in order, up to the loader that measured the
    # command line into PCR 8: the line counts only when the boot began with one of these.
    kernel_cmdline_chains: tuple[tuple[str, ...], ...] | None = Field(default=None, max_length=256)
    # Vendor EV_EFI_ACTION strings (PCRs 4 and 7) this class allows, by their exact text.
    efi_actions: tuple[str, ...] = Field(default=(), max_length=64)

    @field_validator("dbx_required", "boot_applications")
    @classmethod
    def _hex(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return None if v is None else _digests(v, "digest list")

    @field_validator("authorities")
    @classmethod
    def _authorities(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if v is None:
            return None
        out = []
        for a in v:
            digest = a.lower().removeprefix("sha256:")
            if not _HEX64.fullmatch(digest):
                raise ValueError(
                    f"authority {a[:120]!r} is not a certificate digest: authorities are matched by "
                    "'sha256:' + the SHA-256 of the DER certificate (`nodegate eventlog inspect` and "
                    "`nodegate policy learn` show it); a subject name would admit any certificate "
                    "with that subject and another key"
                )
            out.append("sha256:" + digest)
        return tuple(out)

    @field_validator("kernel_cmdline_chains")
    @classmethod
    def _chains(cls, v: tuple[tuple[str, ...], ...] | None) -> tuple[tuple[str, ...], ...] | None:
        if v is None:
            return None
        for chain in v:
            if not chain:
                raise ValueError("kernel_cmdline_chains: a chain lists at least the loader")
        return tuple(_digests(chain, "kernel_cmdline_chains") for chain in v)

    @field_validator("efi_actions")
    @classmethod
    def _actions(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for a in v or ():
            if not 0 < len(a) <= MAX_ACTION_CHARS or not all(" " <= c <= "~" for c in a):
                raise ValueError(f"efi_actions: {a[:80]!r} is not a printable ASCII action string")
            if a == UEFI_DEBUG_MODE:
                raise ValueError("efi_actions: UEFI Debug Mode is never allowed (firmware checks off)")
        return v

    @functools.cached_property
    def dbx_required_bytes(self) -> tuple[bytes, ...]:
        return tuple(bytes.fromhex(d) for d in self.dbx_required or ())

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
        if self.kernel_cmdlines is not None and not self.kernel_cmdline_chains:
            raise ValueError(
                f"class {self.name}: kernel_cmdlines needs kernel_cmdline_chains, the boot "
                "applications (PCR 4, in order) up to the loader that measures the command line "
                "into PCR 8: without them a boot that measured no line (shim or firmware starting "
                "the kernel, grub's chainloader, systemd-boot v251+) could be given one by root "
                "after boot; `nodegate policy learn --kernel-cmdlines` writes them"
            )
        if self.kernel_cmdline_chains is not None and self.kernel_cmdlines is None:
            raise ValueError(f"class {self.name}: kernel_cmdline_chains without kernel_cmdlines")
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
        return self._rules

    @functools.cached_property
    def _rules(self) -> frozenset[str]:  # the policy is frozen: computed once, asked per join
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

    def bank_problem(self, bank: str) -> str | None:
        """Why a quote in ``bank`` cannot support this policy, or None."""
        if not self.enforces_anything:
            return None
        if bank not in JUDGED_BANKS:
            return (
                f"measured boot judges the event log in the quoted bank, and no rule is defined over "
                f"{bank} events; quote one of {', '.join(JUDGED_BANKS)}"
            )
        rules = [r for r in SHA256_ONLY_RULES if r in self.rules()]
        if bank != "sha256" and rules:
            return (
                f"{', '.join(rules)} list SHA-256 digests (Authenticode hashes of boot "
                f"applications), which only a sha256 quote vouches for; the bank is {bank}"
            )
        return None

    def missing_pcrs(self, quoted: Collection[int]) -> str | None:
        """Why a quote selection of ``quoted`` cannot support this policy, or None."""
        missing = {p: r for p, r in self.required_pcrs().items() if p not in quoted}
        if not missing:
            return None
        return "; ".join(f"{', '.join(r)} needs PCR {p} in the quote selection" for p, r in missing.items())


def judged_bank(policy: MeasuredBootPolicy, quoted: Collection[str]) -> str:
    """The quoted bank to judge the log in; ``measured_boot_violation`` (403) naming the banks
    when none can be (the config load refuses such a policy first: this is the join's guard)."""
    for bank in JUDGED_BANKS:
        if bank in quoted:
            problem = policy.bank_problem(bank)
            if problem:
                raise MeasuredBootViolation(problem)
            return bank
    shown = ", ".join(sorted(quoted)) or "no bank"
    raise MeasuredBootViolation(
        f"the quote covers {shown}; measured boot judges only {', '.join(JUDGED_BANKS)}"
    )


def policy_from_obj(data: object) -> MeasuredBootPolicy:
    try:
        return MeasuredBootPolicy.model_validate({} if data is None else data)
    except ValidationError as exc:
        reasons = validation.summary(exc, MeasuredBootPolicy, 10)
        raise MeasuredBootPolicyError(f"invalid measured_boot policy: {reasons}") from None
