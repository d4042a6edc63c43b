"""The ``disk_keys`` section of the config (docs/disk-keys.md), and the rule ``serve`` starts by:
no disk key without an enforced quote policy that judged the boot."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from attest.measuredboot.policy import MeasuredBootPolicy
from attest.pcr import PcrPolicy


class DiskKeysSettings(BaseModel):
    """Disk keys released to attested boots. Absent from the config: off."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # The classes whose nodes get disk keys: names of enforced classes of pcr_policy or
    # measured_boot, so a key is never released on a quote no policy judged.
    classes: tuple[str, ...] = Field(min_length=1, max_length=64)
    # The release must carry an event log that one of the measured_boot classes above accepts.
    require_measured_boot: bool = True
    # with store: kubernetes, the Secret (in kubernetes.namespace) that holds the server secret;
    # with sqlite, state_dir/disk-keys.json (docs/disk-keys.md, "Where the secret lives").
    secret_name: str = Field(default="nodegate-disk-keys", pattern=r"\A[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\z")


def check_disk_keys(keys: DiskKeysSettings, pcr_policy: PcrPolicy, measured_boot: MeasuredBootPolicy) -> None:
    """ValueError (a config error) unless every class named is an enforced class of pcr_policy or
    measured_boot, and a measured_boot one is among them when measured boot is required."""
    pcr = {c.name for c in pcr_policy.classes if c.mode == "enforce"}
    boot = {c.name for c in measured_boot.classes if c.mode == "enforce"}
    unknown = [c for c in keys.classes if c not in pcr | boot]
    if unknown:
        raise ValueError(
            f"disk_keys.classes {unknown} are not enforced classes of pcr_policy or measured_boot: "
            "a disk key is released only to a boot an enforced quote policy accepted"
        )
    if keys.require_measured_boot and not set(keys.classes) & boot:
        raise ValueError(
            "disk_keys.require_measured_boot needs at least one measured_boot class in disk_keys.classes"
        )
