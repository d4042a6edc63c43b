"""Pods, read-only: the package pods NodeWright runs on a node (the gate names a failing one)."""

from __future__ import annotations

from typing import Any

from bootstrap.kube.core import KubeBase, list_items


class Pods(KubeBase):
    async def list_node_pods(self, node: str) -> list[dict[str, Any]]:
        """The pods bound to ``node`` in every namespace (a field selector on spec.nodeName: the
        API server filters, no pod of another node is sent)."""
        out = await self._json_or_unavailable(
            f"list pods on {node}",
            self._core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={node}", _preload_content=False
            ),
        )
        return list_items(out)
