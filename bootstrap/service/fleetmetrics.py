"""Metrics computed when Prometheus scrapes: the build, how long the CA and the serving
certificate have left, and the nodes the gate holds by reason and pool. Nothing here runs between
scrapes, and a value that cannot be read is left out rather than reported as zero (an expiry of 0
would page)."""

from __future__ import annotations

import platform
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from cryptography import x509
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from bootstrap.files import read_limited
from bootstrap.service.state import Service
from bootstrap.version import version

POOL_LABEL: Final = "nodegate.io/pool"  # the Node label that names a node's pool in the metrics
_MAX_CERT_FILE = 1024 * 1024


class FleetCollector(Collector):
    def __init__(self, service: Service) -> None:
        self._service = service

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        info = GaugeMetricFamily(
            "nodegate_build_info", "nodegate's version (value 1).", labels=["version", "python"]
        )
        info.add_metric([version(), platform.python_version()], 1.0)
        yield info
        expiry = GaugeMetricFamily(
            "nodegate_certificate_expiry_seconds",
            "Seconds until a certificate expires: the CA that signs SVIDs (ca) and the serving "
            "certificate (serving).",
            labels=["certificate"],
        )
        now = datetime.now(UTC)
        signer = self._service.cas.signer.certificate
        expiry.add_metric(["ca"], (signer.not_valid_after_utc - now).total_seconds())
        serving = _serving_expiry(self._service)
        if serving is not None:
            expiry.add_metric(["serving"], (serving - now).total_seconds())
        yield expiry
        boots = self._service.boots
        if boots is not None:
            records = GaugeMetricFamily(
                "nodegate_boot_records",
                "Nodes by attested boot: the pcr_policy and measured_boot classes that matched, the "
                "boot chain id and the dbx identity (16 hex digits; at most 64 chain/dbx series, the "
                "rest counted as other); from the store's boot records, every few minutes.",
                labels=["pcr_class", "measured_boot_class", "chain", "dbx"],
            )
            for key, count in sorted(boots.groups.items()):
                records.add_metric(list(key), float(count))
            yield records
            without = GaugeMetricFamily(
                "nodegate_boot_records_missing",
                "Nodes in the store without a boot record (attested before records were kept).",
            )
            without.add_metric([], float(boots.without))
            yield without
        gate = self._service.gate
        if gate is not None:
            held = GaugeMetricFamily(
                "nodegate_held_nodes",
                f"Nodes carrying the hold taint, by reason and pool (Node label {POOL_LABEL}).",
                labels=["reason", "pool"],
            )
            for (reason, pool), count in sorted(gate.held_nodes(POOL_LABEL).items()):
                held.add_metric([reason, pool], float(count))
            yield held
            errors = CounterMetricFamily(
                "nodegate_gate_reconcile_errors",
                "Gate reconciles that failed and were retried (API errors, conflicts past retries).",
            )
            errors.add_metric([], float(gate.reconcile_errors))
            yield errors
            backlog = GaugeMetricFamily(
                "nodegate_gate_backlog", "Nodes waiting for the gate's decision or being decided now."
            )
            backlog.add_metric([], float(gate.backlog))
            yield backlog
            synced = GaugeMetricFamily(
                "nodegate_gate_synced", "1 when every cache the gate decides on is listed and current."
            )
            synced.add_metric([], 1.0 if gate.in_sync() else 0.0)
            yield synced
            leader = GaugeMetricFamily(
                "nodegate_gate_leader", "1 when this replica holds the gate's Lease (it alone writes)."
            )
            leader.add_metric([], 1.0 if gate.is_leader() else 0.0)
            yield leader


def _serving_expiry(service: Service) -> datetime | None:
    settings = service.settings
    path = settings.tls.cert_file or settings.state_dir / "tls" / "server.pem"
    return _not_after(Path(path))


def _not_after(path: Path) -> datetime | None:
    try:
        return x509.load_pem_x509_certificate(read_limited(path, _MAX_CERT_FILE)).not_valid_after_utc
    except (OSError, ValueError):
        return None


def register(service: Service) -> None:
    service.metrics.registry.register(FleetCollector(service))
