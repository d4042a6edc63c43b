"""The only code that talks to the Kubernetes API (kubernetes_asyncio underneath)."""

from __future__ import annotations

from bootstrap.kube.client import (
    AccessDecision,
    Conflict,
    CsrDenied,
    Kube,
    KubeConfigError,
    KubeUnavailable,
    NotFound,
    NotServed,
    WatchEvent,
    WatchExpired,
    read_ca_bundle,
)

__all__ = [
    "AccessDecision",
    "Conflict",
    "CsrDenied",
    "Kube",
    "KubeConfigError",
    "KubeUnavailable",
    "NotFound",
    "NotServed",
    "WatchEvent",
    "WatchExpired",
    "read_ca_bundle",
]
