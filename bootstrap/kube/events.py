"""core/v1 Events: what an operator sees in ``kubectl describe`` about a node or an object."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from bootstrap.kube.core import KubeBase
from bootstrap.times import rfc3339

EVENT_MESSAGE_LIMIT = 1024
# Where the API server accepts a core/v1 Event about a cluster-scoped object (an Event without
# eventTime: "default" only; see pkg/apis/core/validation/events.go, ValidateEventCreate).
CLUSTER_SCOPED_EVENTS = "default"


class Events(KubeBase):
    async def create_event(
        self,
        *,
        involved: Mapping[str, str],
        reason: str,
        message: str,
        type_: str = "Warning",
        namespace: str = "default",
        component: str = "nodegate",
    ) -> None:
        """Record a core/v1 Event about ``involved`` (keys kind, name, uid, apiVersion and,
        for namespaced objects, namespace). The message is cut to 1 KiB.

        The API server decides where it may live: an Event about a namespaced object lives in that
        object's namespace, one about a cluster-scoped object (a Node, a NodeAttestation) in
        ``default`` (422 "involvedObject.namespace: does not match event.namespace" anywhere
        else; the kubelet and the node controller write there too). ``namespace`` (the config's
        ``kubernetes.events_namespace``) therefore no longer decides anything; it stays for the
        callers."""
        obj = {
            k: str(involved[k]) for k in ("kind", "name", "uid", "apiVersion", "namespace") if involved.get(k)
        }
        namespace = obj.get("namespace") or CLUSTER_SCOPED_EVENTS
        now = rfc3339(datetime.now(UTC))
        body: Any = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                # Names are at most 253 characters: leave room for the random suffix.
                "name": f"{obj.get('name', 'nodegate')[:236]}.{secrets.token_hex(8)}",
                "namespace": namespace,
            },
            "involvedObject": obj,
            "reason": reason,
            "message": _cap_utf8(message, EVENT_MESSAGE_LIMIT),
            "type": type_,
            "source": {"component": component},
            "reportingComponent": component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        await self._json_or_unavailable(
            f"create event {reason}",
            self._core.create_namespaced_event(namespace, body, _preload_content=False),
        )


def _cap_utf8(text: str, limit: int) -> str:
    raw = text.encode("utf-8")
    return text if len(raw) <= limit else raw[:limit].decode("utf-8", errors="ignore")
