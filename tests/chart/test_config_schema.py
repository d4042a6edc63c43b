"""The chart's values.schema.json refuses unknown ``config.*`` keys (issue 24): a typo in a
security setting fails ``helm install`` instead of the pod's start. The schema lists exactly the
config model's keys (plus keys other branches add or remove while they are merged)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from bootstrap.config import Settings
from tests.chart.test_chart import CHART, helm_path, render, render_error


@pytest.fixture(scope="module")
def helm() -> str:
    return helm_path()


def _config_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())["properties"]["config"]
    return schema


def _model_keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    out = set()
    for name, field in model.model_fields.items():
        out.add(prefix + name)
        kind = field.annotation
        # the config's own sections (bootstrap.config and the modules it is split into)
        ours = isinstance(kind, type) and kind.__module__.startswith("bootstrap.")
        if ours and isinstance(kind, type) and issubclass(kind, BaseModel):
            out |= _model_keys(kind, f"{prefix}{name}.")
    return out


def _schema_keys(node: dict[str, Any], prefix: str = "") -> set[str]:
    out = set()
    for name, sub in node.get("properties", {}).items():
        out.add(prefix + name)
        if sub.get("additionalProperties") is False:
            out |= _schema_keys(sub, f"{prefix}{name}.")
    return out


def test_the_schema_lists_the_models_keys() -> None:
    schema = _config_schema()
    assert schema["additionalProperties"] is False
    model, listed = _model_keys(Settings), _schema_keys(schema)
    closed = {k for k, v in schema["properties"].items() if v.get("additionalProperties") is False}
    # every section the schema closes lists every key the model has there
    assert {k for k in model - listed if k.split(".")[0] in closed or "." not in k} == set()
    assert listed - model == set()


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ({"trust_domain": "a.org", "trust_domian": "a.org"}, "trust_domian"),
        ({"trust_domain": "a.org", "gate": {"taint_keys": "x"}}, "taint_keys"),
        ({"trust_domain": "a.org", "admission": {"policy_file": ["/p"]}}, "policy_file"),
        ({"trust_domain": "a.org", "kubernetes": {"timeout_s": 5}}, "timeout_s"),
        ({"trust_domain": "a.org", "limits": {"join_rates": 5}}, "join_rates"),
        (
            {"trust_domain": "a.org", "admin": {"spiffe_ids": {"spiffe://a.org/x": ["delete"]}}},
            "value must be one of",
        ),
    ],
)
def test_unknown_config_keys_are_refused(
    helm: str, tmp_path: Path, config: dict[str, Any], needle: str
) -> None:
    err = render_error(helm, tmp_path, {"config": config})
    assert "values don't meet the specifications of the schema" in err, err
    assert needle in err, err


def test_known_keys_render(helm: str, tmp_path: Path) -> None:
    config = {
        "trust_domain": "a.org",
        "admission": {"max_inflight": 16},  # admission.listen is the chart's own
        "nodewright": {"inject_tolerations": True},
        "gate": {"stability_window": "1m", "enabled": True},
        "limits": {"join_rate": 20},
        "admin": {"spiffe_ids": {"spiffe://a.org/ops": ["list", "forget"]}},
    }
    assert render(helm, tmp_path, {"config": config})
