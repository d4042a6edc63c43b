"""The NodeWright / Skyhook package CRs as nodegate reads them: tolerant of fields upstream adds,
strict about the types of the fields it acts on."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from admission.violations import Violation
from attest import validation

PACKAGE_GROUPS = {"nodewright.nvidia.com": "NodeWright", "skyhook.nvidia.com": "Skyhook"}


class LaxModel(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True, frozen=True)


class Requirement(LaxModel):
    key: str
    operator: str
    values: list[str] = Field(default_factory=list)


class Selector(LaxModel):
    match_labels: dict[str, str] = Field(default_factory=dict, alias="matchLabels")
    match_expressions: list[Requirement] = Field(default_factory=list, alias="matchExpressions")


class Interrupt(LaxModel):
    type: str
    services: list[str] = Field(default_factory=list)


class Resources(LaxModel):
    cpu_request: str | int | float | None = Field(default=None, alias="cpuRequest")
    cpu_limit: str | int | float | None = Field(default=None, alias="cpuLimit")
    memory_request: str | int | float | None = Field(default=None, alias="memoryRequest")
    memory_limit: str | int | float | None = Field(default=None, alias="memoryLimit")


class Uninstall(LaxModel):
    enabled: bool = False
    apply: bool = False


class EnvVar(LaxModel):
    name: str
    value: str | None = None
    value_from: dict[str, Any] | None = Field(default=None, alias="valueFrom")


class Toleration(LaxModel):
    key: str | None = None
    operator: str | None = None
    value: str | None = None
    effect: str | None = None


class DrainConfig(LaxModel):
    timeout: str | None = None
    grace_period: str | None = Field(default=None, alias="gracePeriod")


class Package(LaxModel):
    name: str | None = None
    version: str | None = None
    image: str | None = None
    container_sha: str | None = Field(default=None, alias="containerSHA")
    agent_image_override: str | None = Field(default=None, alias="agentImageOverride")
    interrupt: Interrupt | None = None
    config_interrupts: dict[str, Interrupt] = Field(default_factory=dict, alias="configInterrupts")
    config_map: dict[str, str] = Field(default_factory=dict, alias="configMap")
    depends_on: dict[str, str] = Field(default_factory=dict, alias="dependsOn")
    env: list[EnvVar] = Field(default_factory=list)
    resources: Resources | None = None
    uninstall: Uninstall | None = None
    graceful_shutdown: str | None = Field(default=None, alias="gracefulShutdown")
    stage_timeout: str | None = Field(default=None, alias="stageTimeout")


class BudgetSpec(LaxModel):
    percent: int | None = None
    count: int | None = None


class PackageSpec(LaxModel):
    node_selectors: Selector | None = Field(default=None, alias="nodeSelectors")
    pod_non_interrupt_labels: Selector | None = Field(default=None, alias="podNonInterruptLabels")
    drain_config: DrainConfig | None = Field(default=None, alias="drainConfig")
    interruption_budget: BudgetSpec | None = Field(default=None, alias="interruptionBudget")
    deployment_policy: str | None = Field(default=None, alias="deploymentPolicy")
    packages: dict[str, Package] = Field(default_factory=dict)
    additional_tolerations: list[Toleration] = Field(default_factory=list, alias="additionalTolerations")
    runtime_required: bool = Field(default=False, alias="runtimeRequired")
    auto_taint_new_nodes: bool = Field(default=False, alias="autoTaintNewNodes")
    priority: int = 200


class Metadata(LaxModel):
    name: str = ""
    annotations: dict[str, str] = Field(default_factory=dict)


class PackageCR(LaxModel):
    api_version: str = Field(alias="apiVersion")
    kind: Literal["NodeWright", "Skyhook"]
    metadata: Metadata = Field(default_factory=Metadata)
    spec: PackageSpec = Field(default_factory=PackageSpec)

    @property
    def selector(self) -> Selector:
        return self.spec.node_selectors or Selector()

    @cached_property
    def package_items(self) -> tuple[tuple[str, str, Package], ...]:
        """(key, field path, package) for every package; every rule walks these."""
        return tuple((key, f"spec.packages.{key}", pkg) for key, pkg in self.spec.packages.items())


def parse_package_cr(obj: Mapping[str, Any]) -> PackageCR | list[Violation]:
    """The CR, or violations naming each field that does not have the shape the operator reads."""
    group = str(obj.get("apiVersion", "")).split("/", 1)[0]
    if PACKAGE_GROUPS.get(group) != obj.get("kind"):
        return [
            Violation(
                "kind",
                "apiVersion",
                f"not a package CR: {obj.get('apiVersion')}/{obj.get('kind')}",
                "send NodeWright (nodewright.nvidia.com) or Skyhook (skyhook.nvidia.com) objects",
            )
        ]
    try:
        return PackageCR.model_validate(obj)
    except ValidationError as exc:
        return [
            Violation("schema", where or "<root>", what, "fix the field's type")
            for where, what in validation.pairs(exc, PackageCR)
        ]


def loc_path(loc: tuple[int | str, ...]) -> str:
    names = {"node_selectors": "nodeSelectors", "interruption_budget": "interruptionBudget"}
    return ".".join(names.get(str(p), str(p)) for p in loc) or "<root>"


# ------------------------------------------------------------------------------------------
# Views: what the rules read, taken from the dict by ``admission.reading.structural`` without building
# the models above (which stay the reference: where the reader is unsure, they decide). Whether
# two specs are the same is :mod:`admission.reading.godecode`'s to say.


@dataclass(slots=True)
class PackageView:
    key: str
    raw: dict[str, Any]  # as given, for equality
    version: str | None
    image: str | None
    container_sha: str | None
    agent_image_override: str | None
    interrupt: str | None  # interrupt.type
    config_interrupts: tuple[tuple[str, str], ...]  # (configMap glob, interrupt type)
    depends_on: Mapping[str, str]
    value_from: tuple[int, ...]  # indices of the env entries with valueFrom
    uninstall: tuple[bool, bool] | None  # (enabled, apply)
    reboot: bool  # some interrupt of the package is a reboot

    @property
    def path(self) -> str:
        """spec.packages.<key>: built only for the texts of a violation."""
        return f"spec.packages.{self.key}"


@dataclass(slots=True)
class CrView:
    """A package CR as the rules read it: every field the models validate, with their values."""

    api_version: str
    kind: str
    name: str
    annotations: Mapping[str, str]
    raw_spec: dict[str, Any] | None  # the spec as given (None when missing), for equality
    match_labels: Mapping[str, str]
    match_expressions: tuple[tuple[str, str, tuple[str, ...]], ...]  # (key, operator, values)
    budget: tuple[int | None, int | None] | None  # (percent, count)
    deployment_policy: str | None
    packages: tuple[PackageView, ...]
    by_key: dict[str, PackageView]
    tolerations: tuple[tuple[str | None, str | None, str | None, str | None], ...]  # key, op, value, effect
    runtime_required: bool
    auto_taint_new_nodes: bool
    priority: int
    interrupt_kinds: frozenset[str]  # the types of all interrupts of all packages
    # The structural violations found while reading, with the rank of their rule.
    found: tuple[tuple[int, Violation], ...]
    cycle: tuple[str, ...]  # a dependsOn cycle (NodeWright does not refuse one: a warning)
    group: str  # the API group of api_version

    @property
    def reboot(self) -> bool:
        """Some package has a reboot interrupt."""
        return "reboot" in self.interrupt_kinds

    @property
    def selector_empty(self) -> bool:
        return not self.match_labels and not self.match_expressions
