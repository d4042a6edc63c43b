"""The CA certificates the kubernetes store's SVIDs were issued under, remembered in one Lease
(``nodegate-trust-anchors`` in nodegate's namespace, annotation ``nodegate.io/trust-anchors``):
replicas share it, and nodegate may already write Leases there (its EK claims). A Lease rather
than a NodeAttestation: it belongs to no node."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, Final

from bootstrap.kube import Conflict, Kube, NotFound
from bootstrap.store.kube.objects import exhausted, field
from bootstrap.store.model import merged_anchors

__all__ = ["ANCHORS_ANNOTATION", "ANCHORS_LEASE", "TrustAnchors"]

ANCHORS_LEASE: Final = "nodegate-trust-anchors"
ANCHORS_ANNOTATION: Final = "nodegate.io/trust-anchors"


def _anchors(lease: dict[str, Any] | None) -> list[str]:
    text = field(field(lease, "metadata"), "annotations").get(ANCHORS_ANNOTATION)
    try:
        value = json.loads(text) if isinstance(text, str) else []
    except ValueError:
        return []  # unreadable: as if none were remembered (the next start writes them anew)
    return [a for a in value if isinstance(a, str)] if isinstance(value, list) else []


class TrustAnchors:
    def __init__(
        self, kube: Kube, *, namespace: str, attempts: int, pause: Callable[[int], Awaitable[None]]
    ) -> None:
        self._kube = kube
        self._namespace = namespace
        self._attempts = attempts
        self._pause = pause

    async def read(self) -> frozenset[str]:
        return frozenset(_anchors(await self._kube.get_lease(self._namespace, ANCHORS_LEASE)))

    async def add(self, anchors: frozenset[str]) -> None:
        ns = self._namespace
        for attempt in range(self._attempts):
            lease = await self._kube.get_lease(ns, ANCHORS_LEASE)
            known = _anchors(lease)
            merged = merged_anchors(known, anchors)
            if merged == known:
                return
            value = json.dumps(merged, separators=(",", ":"))
            try:
                if lease is None:
                    meta = {
                        "name": ANCHORS_LEASE,
                        "namespace": ns,
                        "annotations": {ANCHORS_ANNOTATION: value},
                    }
                    await self._kube.create_lease(
                        ns,
                        {
                            "apiVersion": "coordination.k8s.io/v1",
                            "kind": "Lease",
                            "metadata": meta,
                            "spec": {},
                        },
                    )
                else:
                    meta = dict(field(lease, "metadata"))
                    meta["annotations"] = {**field(meta, "annotations"), ANCHORS_ANNOTATION: value}
                    await self._kube.replace_lease(ns, ANCHORS_LEASE, {**lease, "metadata": meta})
            except (Conflict, NotFound):
                await self._pause(attempt)
                continue
            return
        raise exhausted(ANCHORS_LEASE, self._attempts)
