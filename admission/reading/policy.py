"""PackagePolicy (`packagepolicies.nodegate.io/v1alpha1`): a node pool and the limits for the
NodeWright / Skyhook package CRs that target it.

    spec:
      nodeSelector: {matchLabels: {nodegate.io/pool: h100}}   # the pool; {} = every node
      images: {registries: ["registry.example.com/nodewright"], requireDigest: true,
               tagMustEqualVersion: true}                   # "*" admits any registry
      versions: semver                                      # or: upstream (the default)
      interrupts: {allowed: [noop, service, restartAllServices]}  # reboot only if listed
      maxInterruptionBudget: {percent: 33}                  # or count
      allowRuntimeRequired: false
      allowSecretEnv: false
      allowAgentImageOverride: false
      priority: {min: 100, max: 1000}                       # optional bounds

Omitted limits on what a package may do take the strict side: no registry, only ``noop``
interrupts, no runtime-required CRs, no secret env, no agent image override. The limits on how a
CR is written (``versions``, ``tagMustEqualVersion``, ``requireDigest``) default to what NodeWright
itself accepts.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

InterruptType = Literal["noop", "service", "restartAllServices", "reboot"]
INTERRUPT_TYPES: tuple[InterruptType, ...] = ("noop", "service", "restartAllServices", "reboot")

# Optional DNS-subdomain prefix and "/", then a name segment (Kubernetes label key syntax).
# Anchored at the true end: fullmatch in Python, \A...\z for pydantic's Rust regex.
_LABEL_KEY_BODY = (
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)
_LABEL_KEY = rf"\A{_LABEL_KEY_BODY}\z"
_LABEL_KEY_RE = re.compile(_LABEL_KEY_BODY)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class LabelSelectorRequirement(_Model):
    key: str = Field(min_length=1, max_length=317, pattern=_LABEL_KEY)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _values(self) -> LabelSelectorRequirement:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"{self.operator} needs at least one value")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"{self.operator} takes no values")
        return self


class LabelSelector(_Model):
    match_labels: dict[str, str] = Field(default_factory=dict, alias="matchLabels")
    match_expressions: tuple[LabelSelectorRequirement, ...] = Field(default=(), alias="matchExpressions")

    @field_validator("match_labels")
    @classmethod
    def _keys(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not _LABEL_KEY_RE.fullmatch(key) or len(key) > 317:
                raise ValueError(f"invalid label key {key!r}")
        return value

    @property
    def empty(self) -> bool:
        return not self.match_labels and not self.match_expressions


class Budget(_Model):
    percent: int | None = Field(default=None, ge=0, le=100)
    count: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _exactly_one(self) -> Budget:
        if (self.percent is None) == (self.count is None):
            raise ValueError("set exactly one of percent or count")
        return self


ANY_REGISTRY = "*"


class ImagesPolicy(_Model):
    registries: tuple[str, ...] = ()  # "host[:port]/path" prefixes, compared part by part; "*": any
    require_digest: bool = Field(default=False, alias="requireDigest")
    # An image tag, where the operator drops it, must equal the version (no misleading tags).
    tag_must_equal_version: bool = Field(default=False, alias="tagMustEqualVersion")


class InterruptsPolicy(_Model):
    allowed: tuple[InterruptType, ...] = ("noop",)


class PriorityBounds(_Model):
    min: int = Field(default=1, ge=1)
    max: int | None = None

    @model_validator(mode="after")
    def _order(self) -> PriorityBounds:
        if self.max is not None and self.max < self.min:
            raise ValueError("priority.max is below priority.min")
        return self


class PackagePolicySpec(_Model):
    node_selector: LabelSelector = Field(default_factory=LabelSelector, alias="nodeSelector")
    images: ImagesPolicy = Field(default_factory=ImagesPolicy)
    # "semver": versions are semver.org's MAJOR.MINOR.PATCH (no "v", no 1.2 shorthand); "upstream":
    # whatever NodeWright accepts.
    versions: Literal["upstream", "semver"] = "upstream"
    interrupts: InterruptsPolicy = Field(default_factory=InterruptsPolicy)
    max_interruption_budget: Budget | None = Field(default=None, alias="maxInterruptionBudget")
    allow_runtime_required: bool = Field(default=False, alias="allowRuntimeRequired")
    allow_secret_env: bool = Field(default=False, alias="allowSecretEnv")
    allow_agent_image_override: bool = Field(default=False, alias="allowAgentImageOverride")
    priority: PriorityBounds | None = None

    @field_validator("node_selector")
    @classmethod
    def _pool_is_labels(cls, value: LabelSelector) -> LabelSelector:
        # A pool is a set of required labels; expressions would make containment undecidable
        # in the simple, auditable sense the policy promises.
        if value.match_expressions:
            raise ValueError("a pool is defined by matchLabels only")
        return value


class ObjectMeta(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    name: str = Field(min_length=1, max_length=253)


class PackagePolicy(_Model):
    api_version: Literal["nodegate.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["PackagePolicy"]
    metadata: ObjectMeta
    spec: PackagePolicySpec
    status: dict[str, object] | None = None

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def pool(self) -> dict[str, str]:
        return self.spec.node_selector.match_labels
