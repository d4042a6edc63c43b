"""Nodes (core/v1): get, create, merge-patch the object and its status, list, watch."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from bootstrap.kube.core import MERGE_PATCH, KubeBase, list_items, list_version
from bootstrap.kube.decode import PLAIN
from bootstrap.kube.errors import NotFound
from bootstrap.kube.watch import WatchEvent, watch_events


class Nodes(KubeBase):
    async def get_node(self, name: str) -> dict[str, Any] | None:
        try:
            return await self._json(f"get node {name}", self._core.read_node(name, _preload_content=False))
        except NotFound:
            return None

    async def create_node(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create and return the stored Node; Conflict if one of that name exists."""
        name = str(body.get("metadata", {}).get("name", ""))
        node: Any = body  # a plain dict: the client serialises it as is
        return await self._json_or_unavailable(
            f"create node {name}", self._core.create_node(node, _preload_content=False)
        )

    async def patch_node(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """JSON merge patch (lists such as spec.taints are replaced whole). Put
        ``metadata.resourceVersion`` in the patch: a stale one -> Conflict. Missing -> NotFound."""
        call: Any = self._core.patch_node  # Any: the stubs omit _content_type
        return await self._json(
            f"patch node {name}", call(name, patch, _content_type=MERGE_PATCH, _preload_content=False)
        )

    async def patch_node_status(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """JSON merge patch of the node's /status subresource. A merge patch replaces
        status.conditions whole, so read-modify-write it with ``metadata.resourceVersion`` in the
        patch: a stale one -> Conflict. Missing -> NotFound."""
        call: Any = self._core.patch_node_status  # Any: the stubs omit _content_type
        return await self._json(
            f"patch node {name}/status",
            call(name, patch, _content_type=MERGE_PATCH, _preload_content=False),
        )

    async def list_nodes(self, label_selector: str | None = None) -> tuple[list[dict[str, Any]], str]:
        """Every Node (optionally only those matching ``label_selector``) and the list's
        resourceVersion."""
        kwargs: dict[str, Any] = {"_preload_content": False}
        if label_selector:
            kwargs["label_selector"] = label_selector
        out = await self._json_or_unavailable("list nodes", self._core.list_node(**kwargs))
        return list_items(out), list_version(out)

    async def watch_nodes(
        self, resource_version: str, label_selector: str | None = None, *, initial_events: bool = False
    ) -> AsyncGenerator[WatchEvent[dict[str, Any]], None]:
        """Node events after ``resource_version`` until the server ends the stream
        (``initial_events``: a streaming list, bootstrap.kube.watch). Raises WatchExpired on 410
        Gone, WatchListRefused when a streaming list is refused, KubeUnavailable on other failures."""
        async for event in watch_events(
            "nodes",
            self._core.list_node,
            resource_version=resource_version,
            decoder=PLAIN,
            label_selector=label_selector,
            initial_events=initial_events,
        ):
            yield event
