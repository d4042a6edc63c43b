"""Cluster-scoped custom objects (the CRDs nodegate serves): list, get, create, patch, delete, watch."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any, TypeVar

from bootstrap.kube.core import MERGE_PATCH, KubeBase, list_items, list_version
from bootstrap.kube.decode import PLAIN, ObjectDecoder
from bootstrap.kube.errors import NotFound
from bootstrap.kube.watch import WatchEvent, watch_events

T = TypeVar("T")


class CustomObjects(KubeBase):
    async def list_cluster_objects(
        self, group: str, version: str, plural: str, *, label_selector: str | None = None
    ) -> tuple[list[dict[str, Any]], str]:
        """Every object of a cluster-scoped custom resource (optionally only those matching
        ``label_selector``) and the list's resourceVersion."""
        kwargs: dict[str, Any] = {"_preload_content": False}
        if label_selector:
            kwargs["label_selector"] = label_selector
        out = await self._json_or_unavailable(
            f"list {plural}", self._custom.list_cluster_custom_object(group, version, plural, **kwargs)
        )
        return list_items(out), list_version(out)

    async def list_cluster_objects_as(
        self, group: str, version: str, plural: str, decoder: ObjectDecoder[T]
    ) -> tuple[list[T], str]:
        """``list_cluster_objects`` with each object decoded once, in ``decoder``'s form (for
        objects too large to decode whole when a part is all the caller reads)."""
        call = self._custom.list_cluster_custom_object(group, version, plural, _preload_content=False)
        return await self._list_as(f"list {plural}", call, decoder)

    async def get_cluster_object(
        self, group: str, version: str, plural: str, name: str
    ) -> dict[str, Any] | None:
        """The object, or None when there is none."""
        try:
            return await self._json(
                f"get {plural}/{name}",
                self._custom.get_cluster_custom_object(group, version, plural, name, _preload_content=False),
            )
        except NotFound:
            return None

    async def create_cluster_object(
        self, group: str, version: str, plural: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        """Create and return the stored object; Conflict if one of that name exists."""
        name = str(body.get("metadata", {}).get("name", ""))
        return await self._json_or_unavailable(
            f"create {plural}/{name}",
            self._custom.create_cluster_custom_object(group, version, plural, body, _preload_content=False),
        )

    async def patch_cluster_object(
        self,
        group: str,
        version: str,
        plural: str,
        name: str,
        patch: dict[str, Any],
        *,
        status: bool = False,
    ) -> dict[str, Any]:
        """JSON merge patch (``status=True``: of the /status subresource). Put
        ``metadata.resourceVersion`` in the patch for optimistic locking: a stale one -> Conflict.
        A missing object -> NotFound."""
        # Any: the stubs omit _content_type, which the generated functions accept
        call: Any = (
            self._custom.patch_cluster_custom_object_status
            if status
            else self._custom.patch_cluster_custom_object
        )
        return await self._json(
            f"patch {plural}/{name}{'/status' if status else ''}",
            call(group, version, plural, name, patch, _content_type=MERGE_PATCH, _preload_content=False),
        )

    async def delete_cluster_object(self, group: str, version: str, plural: str, name: str) -> None:
        """Delete; an object that is already gone is fine."""
        try:
            await self._json(
                f"delete {plural}/{name}",
                self._custom.delete_cluster_custom_object(
                    group, version, plural, name, _preload_content=False
                ),
            )
        except NotFound:
            return

    async def watch_cluster_objects(
        self, group: str, version: str, plural: str, resource_version: str, *, initial_events: bool = False
    ) -> AsyncGenerator[WatchEvent[dict[str, Any]], None]:
        """Events after ``resource_version`` until the server ends the stream (``initial_events``:
        a streaming list, bootstrap.kube.watch). Raises WatchExpired on 410 Gone, NotServed on
        404, WatchListRefused when a streaming list is refused, KubeUnavailable on other failures."""
        async for event in self.watch_cluster_objects_as(
            group, version, plural, resource_version, PLAIN, initial_events=initial_events
        ):
            yield event

    async def watch_cluster_objects_as(
        self,
        group: str,
        version: str,
        plural: str,
        resource_version: str,
        decoder: ObjectDecoder[T],
        *,
        initial_events: bool = False,
    ) -> AsyncGenerator[WatchEvent[T], None]:
        """``watch_cluster_objects`` with each object decoded once, in ``decoder``'s form."""
        async for event in watch_events(
            plural,
            self._list_custom_objects,
            group,
            version,
            plural,
            resource_version=resource_version,
            decoder=decoder,
            initial_events=initial_events,
        ):
            yield event

    def _list_custom_objects(self, group: str, version: str, plural: str, **kwargs: Any) -> Any:
        """``list_cluster_custom_object`` as the generated client sends it, for the query
        parameters its signature lacks (``send_initial_events``): keyword names in snake_case
        become the API's camelCase (``_preload_content`` is the client's own)."""
        preload = kwargs.pop("_preload_content", True)
        query = [(_camel(k), v) for k, v in kwargs.items() if v is not None]
        return self._api.call_api(
            "/apis/{group}/{version}/{plural}",
            "GET",
            {"group": group, "version": version, "plural": plural},
            query,
            {"Accept": "application/json"},
            response_types_map={200: "object"},
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
            _preload_content=preload,
        )


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)
