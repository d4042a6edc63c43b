"""The only code that talks to the Kubernetes API (kubernetes_asyncio underneath)."""

from __future__ import annotations

from bootstrap.kube.client import Kube
from bootstrap.kube.configuration import read_ca_bundle
from bootstrap.kube.errors import (
    Conflict,
    CsrDenied,
    KubeConfigError,
    KubeUnavailable,
    NotFound,
    NotServed,
    WatchExpired,
    WatchListRefused,
)
from bootstrap.kube.reviews import AccessDecision
from bootstrap.kube.watch import INITIAL_EVENTS_END, WatchEvent, ends_initial_events

__all__ = [
    "INITIAL_EVENTS_END",
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
    "WatchListRefused",
    "ends_initial_events",
    "read_ca_bundle",
]
