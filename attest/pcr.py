"""PCR policy: classes of golden values per bank and PCR index, enforced or only warned about.

    bank: sha256
    pcrs: [0, 1, 2, 3, 4, 5, 6, 7]         # what the join quotes
    classes:
      - name: dgx-h100-fw-1.2
        mode: enforce                      # or: warn (report mismatches, never refuse)
        golden:
          sha256:
            0: ["3d45...", "9a1f..."]      # any listed value is good
            7: ["b5ac..."]

A node passes when its quoted values match every golden entry of some class (or of the class it
is assigned to). With no enforced class it passes with warnings; with no classes at all the
values are only recorded. Results name each PCR that failed and what was expected.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from attest import validation, yamlsafe
from attest.errors import PcrPolicyViolation
from attest.wire import BANK_NAMES, DIGEST_SIZES

MAX_POLICY_BYTES = 1024 * 1024
_MAX_REPORTED = 8


class PolicyError(ValueError):
    """A PCR policy document that cannot be used (raised at load time, never per join)."""


class PcrClass(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=128, pattern=r"\A[A-Za-z0-9][A-Za-z0-9._-]*\z")
    mode: Literal["enforce", "warn"] = "enforce"
    golden: dict[str, dict[int, tuple[str, ...]]]

    @field_validator("golden")
    @classmethod
    def _golden(cls, value: dict[str, dict[int, tuple[str, ...]]]) -> dict[str, dict[int, tuple[str, ...]]]:
        out: dict[str, dict[int, tuple[str, ...]]] = {}
        if not any(value.values()):
            raise ValueError(
                "a class needs at least one golden value (an empty class would admit every node)"
            )
        for bank, entries in value.items():
            if bank not in BANK_NAMES:
                raise ValueError(f"unknown PCR bank {bank!r}")
            size = DIGEST_SIZES[BANK_NAMES[bank]]
            out[bank] = {}
            for index, allowed in entries.items():
                if not 0 <= index <= 23:
                    raise ValueError(f"PCR index {index} is outside 0-23")
                if not allowed:
                    raise ValueError(f"{bank}:{index} lists no golden value")
                norm = []
                for v in allowed:
                    try:
                        raw = bytes.fromhex(v)
                    except ValueError:
                        raise ValueError(f"{bank}:{index} value {v!r} is not hex") from None
                    if len(raw) != size:
                        raise ValueError(f"{bank}:{index} value {v!r} is not {size} bytes")
                    norm.append(raw.hex())
                out[bank][index] = tuple(norm)
        return out


class PcrPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    bank: str = "sha256"
    pcrs: tuple[int, ...] = (0, 1, 2, 3, 4, 5, 6, 7)
    classes: tuple[PcrClass, ...] = ()

    @model_validator(mode="after")
    def _consistent(self) -> PcrPolicy:
        if self.bank not in BANK_NAMES:
            raise ValueError(f"unknown PCR bank {self.bank!r}")
        if not self.pcrs or len(set(self.pcrs)) != len(self.pcrs):
            raise ValueError("pcrs must list distinct PCR indices")
        if any(not 0 <= i <= 23 for i in self.pcrs):
            raise ValueError("pcrs must be within 0-23")
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise ValueError("class names must be unique")
        for c in self.classes:
            for bank, entries in c.golden.items():
                if bank != self.bank:
                    raise ValueError(
                        f"class {c.name}: golden values for {bank}, but the policy quotes {self.bank}"
                    )
                extra = sorted(set(entries) - set(self.pcrs))
                if extra:
                    raise ValueError(f"class {c.name}: PCRs {extra} have golden values but are not quoted")
        return self

    @property
    def selection(self) -> str:
        """The PCR selection to request in quotes, e.g. ``"sha256:0,1,2,3,4,5,6,7"``."""
        return f"{self.bank}:{','.join(str(i) for i in sorted(self.pcrs))}"


@dataclass(frozen=True, slots=True)
class PcrMismatch:
    pcr_class: str
    bank: str
    index: int
    actual: str | None  # hex; None when the PCR was not supplied
    expected: tuple[str, ...]

    def __str__(self) -> str:
        got = self.actual if self.actual is not None else "missing"
        expected = ", ".join(self.expected)
        return f"class {self.pcr_class}: {self.bank}:{self.index} is {got}, expected one of [{expected}]"


@dataclass(frozen=True, slots=True)
class PcrPolicyResult:
    ok: bool
    matched_class: str | None
    violations: tuple[PcrMismatch, ...]  # from enforced classes; non-empty only when not ok
    warnings: tuple[PcrMismatch, ...]  # from classes in warn mode
    reason: str = ""  # one line for people when not ok


def load_policy(text: str | bytes) -> PcrPolicy:
    """Parse a YAML PCR policy document; raise PolicyError with a readable reason."""
    if not isinstance(text, str | bytes):
        raise PolicyError(f"PCR policy must be text, not {type(text).__name__}")
    if len(text) > MAX_POLICY_BYTES:
        raise PolicyError(f"PCR policy is larger than {MAX_POLICY_BYTES} bytes")
    try:
        data = yamlsafe.load(text)
    except (yaml.YAMLError, RecursionError) as exc:
        reason = exc if isinstance(exc, yaml.YAMLError) else "nested too deeply"
        raise PolicyError(f"PCR policy is not valid YAML: {reason}") from None
    return policy_from_obj({} if data is None else data)


def policy_from_obj(data: object) -> PcrPolicy:
    """Build a policy from already-parsed config (the ``pcr_policy`` key of the service config)."""
    try:
        return PcrPolicy.model_validate(data)
    except ValidationError as exc:
        # Never echo the input: it can be huge. Location and message are enough.
        reasons = validation.summary(exc, PcrPolicy, 10)
        raise PolicyError(f"invalid PCR policy: {reasons}") from None
    except RecursionError:
        raise PolicyError("invalid PCR policy: nested too deeply") from None


def _mismatches(c: PcrClass, pcrs: Mapping[str, Mapping[int, bytes]]) -> list[PcrMismatch]:
    out = []
    for bank, entries in c.golden.items():
        values = pcrs.get(bank, {})
        for index, allowed in entries.items():
            raw = values.get(index)
            actual = raw.hex() if raw is not None else None
            if actual not in allowed:
                out.append(PcrMismatch(c.name, bank, index, actual, allowed))
    return out


def evaluate(
    policy: PcrPolicy, pcrs: Mapping[str, Mapping[int, bytes]], node_class: str | None = None
) -> PcrPolicyResult:
    """Judge verified PCR values (from ``verify_quote``) against the policy; never raises for a
    failing node (see :func:`enforce`). ``node_class`` restricts the judgement to one class."""
    classes = policy.classes
    if node_class is not None:
        classes = tuple(c for c in classes if c.name == node_class)
        if not classes:
            return PcrPolicyResult(False, None, (), (), f"PCR policy has no class named {node_class!r}")
    if not classes:
        return PcrPolicyResult(True, None, (), ())
    found = {c.name: _mismatches(c, pcrs) for c in classes}
    for c in classes:
        if not found[c.name]:
            return PcrPolicyResult(True, c.name, (), ())
    enforced = [m for c in classes if c.mode == "enforce" for m in found[c.name]]
    warned = tuple(m for c in classes if c.mode == "warn" for m in found[c.name])
    if not enforced:
        return PcrPolicyResult(True, None, (), warned)
    shown = "; ".join(str(m) for m in enforced[:_MAX_REPORTED])
    more = len(enforced) - _MAX_REPORTED
    reason = "PCR values match no enforced class: " + shown + (f"; and {more} more" if more > 0 else "")
    return PcrPolicyResult(False, None, tuple(enforced), warned, reason)


def enforce(
    policy: PcrPolicy, pcrs: Mapping[str, Mapping[int, bytes]], node_class: str | None = None
) -> PcrPolicyResult:
    """:func:`evaluate`, raising PcrPolicyViolation (code ``pcr_policy_violation``) on failure."""
    result = evaluate(policy, pcrs, node_class)
    if not result.ok:
        raise PcrPolicyViolation(result.reason)
    return result
