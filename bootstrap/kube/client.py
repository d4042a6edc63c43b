"""The Kubernetes adapter: one :class:`Kube` made of a mixin per resource.

Written for a real API server: every call has a timeout, watches resume from the last
resourceVersion and report 410 Gone so the caller re-lists, writes that must not race carry
``metadata.resourceVersion`` (optimistic locking), and errors surface as a few kinds:
:class:`KubeUnavailable` (retry later), :class:`WatchExpired` (re-list now), :class:`Conflict`
(re-read and retry), :class:`NotFound` and :class:`CsrDenied`.

The request discipline lives in :mod:`bootstrap.kube.core`; each resource in its own module
(custom objects, nodes, pods, leases, CSRs, reviews, events, secrets).
"""

from __future__ import annotations

from bootstrap.kube.csr import Csrs
from bootstrap.kube.custom import CustomObjects
from bootstrap.kube.events import Events
from bootstrap.kube.leases import Leases
from bootstrap.kube.nodes import Nodes
from bootstrap.kube.pods import Pods
from bootstrap.kube.reviews import Reviews
from bootstrap.kube.secrets import Secrets


class Kube(CustomObjects, Nodes, Pods, Leases, Csrs, Reviews, Events, Secrets):
    """A thin, typed adapter over one ApiClient: everything nodegate asks the API server."""
