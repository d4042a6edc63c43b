"""The few kinds of failure the Kubernetes adapter reports; callers decide by kind, not by status."""

from __future__ import annotations


class KubeUnavailable(Exception):
    """The API server could not be reached or answered with an error."""


class NotServed(KubeUnavailable):
    """404 on a collection: the API group or the custom resource is not installed."""


class WatchListRefused(KubeUnavailable):
    """400 or 422 to a streaming list (a watch with sendInitialEvents): this server does not serve
    it (the WatchList feature is off, or the server predates it). List instead."""


class WatchExpired(Exception):
    """410 Gone: the resourceVersion is too old; list again."""


class KubeConfigError(KubeUnavailable):
    """The kubeconfig (or in-cluster configuration) cannot be used."""


class Conflict(Exception):
    """409: a stale resourceVersion or an object that already exists. Re-read and retry."""


class NotFound(Exception):
    """404 where the caller needs to know (getters return None instead)."""


class CsrDenied(Exception):
    """The CertificateSigningRequest was Denied or Failed."""
