"""Prometheus metrics of one service instance (its own registry: tests run several in a process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "nodegate_requests",
            "API requests by endpoint and result code (ok or a machine code).",
            ["endpoint", "code"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "nodegate_request_seconds",
            "API request latency by endpoint.",
            ["endpoint"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.inflight = Gauge(
            "nodegate_inflight_requests", "Join requests being worked on.", registry=self.registry
        )
        self.events_dropped = Counter(
            "nodegate_events_dropped",
            "Kubernetes Events not sent because too many were pending or the API failed.",
            registry=self.registry,
        )
        self.bundle_sequence = Gauge(
            "nodegate_bundle_sequence", "spiffe_sequence of the served trust bundle.", registry=self.registry
        )
        # Clients that misbehave or go away are not server errors: they are counted here, apart
        # from nodegate_requests_total, whose "unavailable" code means the service failed.
        self.client_errors = Counter(
            "nodegate_client_errors",
            "Requests and connections the client did not complete: reason aborted (closed mid-body), "
            "body_timeout, header_timeout, idle_timeout, handshake_failed.",
            ["endpoint", "reason"],
            registry=self.registry,
        )
        self.connections = Gauge(
            "nodegate_connections",
            "Open client connections, TLS handshakes included.",
            registry=self.registry,
        )
        self.ek_roots_skipped = Gauge(
            "nodegate_ek_roots_skipped_files",
            "ek_roots files that could not be used and were skipped at start (listed by /readyz).",
            registry=self.registry,
        )
        self.connections_refused = Counter(
            "nodegate_connections_refused",
            "Connections closed at accept: reason address_limit or total_limit.",
            ["reason"],
            registry=self.registry,
        )

        self.refusals = Counter(
            "nodegate_attestation_refusals",
            "Joins and renewals refused, by machine code (event_log_mismatch, measured_boot_violation, "
            "pcr_policy_violation, ek_untrusted, ...).",
            ["code"],
            registry=self.registry,
        )

        self.release_seconds = Histogram(
            "nodegate_release_seconds",
            "Seconds from a node's attestation to the gate lifting its hold (join to ready).",
            buckets=(30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 43200, 86400),
            registry=self.registry,
        )

        self.webhook_decisions = Counter(
            "nodegate_webhook_decisions",
            "Admission verdicts by result (allowed, denied) and denying rule.",
            ["result", "rule"],
            registry=self.registry,
        )

        # Issue 21 (finding 7): connections the join listener closed on purpose, reason max_age,
        # max_requests or evicted (an idle one closed to admit a new connection at the cap).
        self.connections_recycled = Counter(
            "nodegate_connections_recycled",
            "Connections closed by the server: reason max_age, max_requests or evicted (idle, at the cap).",
            ["reason"],
            registry=self.registry,
        )
        # The admission listener's in-flight limit (admission.max_inflight, per route).
        self.admission_busy = Counter(
            "nodegate_admission_busy",
            "Reviews answered 503 because every slot of their route stayed busy for the queue time, "
            "or because the listener held as many bodies' bytes as it may.",
            ["route"],
            registry=self.registry,
        )

        # Disk-key releases (docs/disk-keys.md): class "none" until a boot matched one.
        self.disk_releases = Counter(
            "nodegate_disk_releases",
            "Disk-key releases (code ok) and refusals (the machine code), by disk_keys class.",
            ["class", "code"],
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
