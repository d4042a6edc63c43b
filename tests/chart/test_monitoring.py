"""The chart's optional PrometheusRule and Grafana dashboard: off by default; when on, every
metric they use is one /metrics serves (docs/operations.md's table, kept in step by a test)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from tests.chart.test_chart import CHART, helm_path, render
from tests.service.test_docs_in_step import documented_metrics

_METRIC = re.compile(r"\bnodegate_[a-z_]+")


@pytest.fixture(scope="module")
def helm() -> str:
    return helm_path()


def _family(name: str) -> str:
    for suffix in ("_bucket", "_count", "_sum"):
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def _known(name: str) -> bool:
    docs = documented_metrics()
    return _family(name) in docs or name in docs


def test_off_by_default(helm: str, tmp_path: Path) -> None:
    kinds = {d["kind"] for d in render(helm, tmp_path)}
    assert "PrometheusRule" not in kinds
    assert not [d for d in render(helm, tmp_path) if d["metadata"]["name"].endswith("-dashboard")]


def test_rule_and_dashboard_use_served_metrics(helm: str, tmp_path: Path) -> None:
    values = {
        "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "grafanaDashboard": {"enabled": True},
    }
    docs = render(helm, tmp_path, values)
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    alerts = rule["spec"]["groups"][0]["rules"]
    assert len(alerts) >= 6
    for alert in alerts:
        assert set(alert) >= {"alert", "expr", "labels", "annotations"}
        used = _METRIC.findall(alert["expr"])
        assert used, alert["alert"]
        assert all(_known(m) for m in used), (alert["alert"], used)
    assert "{{ $labels.certificate }}" in yaml.safe_dump(alerts)  # Prometheus templates pass through
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(cm["data"]["nodegate-fleet.json"])
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in _METRIC.findall(e)}
    assert {"nodegate_held_nodes", "nodegate_release_seconds_bucket"} <= used
    assert all(_known(m) for m in used), used
    assert dashboard == json.loads((CHART / "files" / "dashboard.json").read_text())
