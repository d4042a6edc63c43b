"""The ``ek_cloud`` section of the config: which cloud vTPMs' EKs may join through their
provider's vTPM CA (attest/cloudek.py; an addition, docs/ek-roots.md, "Cloud vTPMs")."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, field_validator


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GceBinding(_Model):
    # The GCE projects (id or number) and instances (id) whose vTPM EKs may join through Google's
    # vTPM CA (attest/cloudek.py); empty: none (docs/ek-roots.md, "Cloud vTPMs").
    projects: tuple[str, ...] = ()
    instances: tuple[str, ...] = ()

    @field_validator("projects", "instances")
    @classmethod
    def _names(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for x in v:
            if not x or len(x) > 128 or not x.isprintable() or x != x.strip():
                raise ValueError(f"{x!r} is not a project id, project number or instance id")
        return v


class EkCloud(_Model):
    gce: GceBinding = GceBinding()
