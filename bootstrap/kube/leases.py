"""Leases (coordination.k8s.io/v1): read, take over (with the version read) and release one."""

from __future__ import annotations

from typing import Any

from bootstrap.kube.core import KubeBase
from bootstrap.kube.errors import NotFound


class Leases(KubeBase):
    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Lease, or None when there is none."""
        try:
            return await self._json(
                f"get lease {namespace}/{name}",
                self._coordination.read_namespaced_lease(name, namespace, _preload_content=False),
            )
        except NotFound:
            return None

    async def create_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create and return the stored Lease; Conflict if one of that name exists."""
        name = str(body.get("metadata", {}).get("name", ""))
        lease: Any = body  # a plain dict: the client serialises it as is
        return await self._json_or_unavailable(
            f"create lease {namespace}/{name}",
            self._coordination.create_namespaced_lease(namespace, lease, _preload_content=False),
        )

    async def replace_lease(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """Replace the Lease (PUT). The body must carry ``metadata.resourceVersion`` (the one read):
        a lease taken over without it could silently overwrite another holder. Stale -> Conflict,
        missing -> NotFound."""
        if not str(body.get("metadata", {}).get("resourceVersion") or ""):
            raise ValueError("replace_lease needs metadata.resourceVersion")
        lease: Any = body
        return await self._json(
            f"replace lease {namespace}/{name}",
            self._coordination.replace_namespaced_lease(name, namespace, lease, _preload_content=False),
        )

    async def delete_lease(self, namespace: str, name: str) -> None:
        """Delete; a Lease that is already gone is fine."""
        try:
            await self._json(
                f"delete lease {namespace}/{name}",
                self._coordination.delete_namespaced_lease(name, namespace, _preload_content=False),
            )
        except NotFound:
            return
