"""Secrets (v1): read, create and replace one (the disk-key document, docs/disk-keys.md). Calls
never echo the server's message: the body carries key material the server might repeat."""

from __future__ import annotations

from typing import Any

from bootstrap.kube.core import KubeBase
from bootstrap.kube.errors import NotFound


class Secrets(KubeBase):
    async def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Secret, or None when there is none."""
        try:
            return await self._json(
                f"get secret {namespace}/{name}",
                self._core.read_namespaced_secret(name, namespace, _preload_content=False),
                echo=False,
            )
        except NotFound:
            return None

    async def create_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create and return the stored Secret; Conflict if one of that name exists."""
        name = str(body.get("metadata", {}).get("name", ""))
        secret: Any = body  # a plain dict: the client serialises it as is
        return await self._json(
            f"create secret {namespace}/{name}",
            self._core.create_namespaced_secret(namespace, secret, _preload_content=False),
            echo=False,
        )

    async def replace_secret(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """Replace the Secret (PUT), guarded by ``metadata.resourceVersion`` (the one read): stale ->
        Conflict, missing -> NotFound."""
        if not str(body.get("metadata", {}).get("resourceVersion") or ""):
            raise ValueError("replace_secret needs metadata.resourceVersion")
        secret: Any = body
        return await self._json(
            f"replace secret {namespace}/{name}",
            self._core.replace_namespaced_secret(name, namespace, secret, _preload_content=False),
            echo=False,
        )
