"""The only module that talks to the Kubernetes API (through kubernetes_asyncio).

Written for a real API server: every call has a timeout, watches resume from the last
resourceVersion and report 410 Gone so the caller re-lists, and errors surface as two kinds,
:class:`KubeUnavailable` (retry later) and :class:`WatchExpired` (re-list now).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes_asyncio import client as kc
from kubernetes_asyncio import watch as kw
from kubernetes_asyncio.client.rest import ApiException

from admission.rbac import ResourceAttributes, UserInfo

DEFAULT_TIMEOUT = 5.0
WATCH_SECONDS = 300  # server-side watch timeout; the stream is reopened from the last rv


class KubeUnavailable(Exception):
    """The API server could not be reached or answered with an error."""


class WatchExpired(Exception):
    """410 Gone: the resourceVersion is too old; list again."""


@dataclass(frozen=True, slots=True)
class AccessDecision:
    allowed: bool
    denied: bool  # an authorizer said no outright (not merely "no opinion")
    reason: str


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK
    object: dict[str, Any]


class Kube:
    """A thin, typed adapter over one ApiClient."""

    def __init__(self, api: kc.ApiClient, timeout: float = DEFAULT_TIMEOUT) -> None:
        self._api = api
        self._timeout = timeout
        self._authz = kc.AuthorizationV1Api(api)
        self._custom = kc.CustomObjectsApi(api)

    @classmethod
    def for_host(cls, host: str, timeout: float = DEFAULT_TIMEOUT) -> Kube:
        """For tests and explicit endpoints (kubeconfig and in-cluster loading come with serve)."""
        return cls(kc.ApiClient(configuration=kc.Configuration(host=host.rstrip("/"))), timeout)

    async def close(self) -> None:
        await self._api.close()

    async def _call(self, what: str, coro: Any) -> Any:
        try:
            return await asyncio.wait_for(coro, self._timeout)
        except TimeoutError:
            raise KubeUnavailable(f"{what}: no answer within {self._timeout:g} s") from None
        except ApiException as exc:
            raise KubeUnavailable(f"{what}: HTTP {exc.status} {exc.reason}") from None
        except (aiohttp.ClientError, OSError, ValueError) as exc:  # ValueError: an unreadable body
            raise KubeUnavailable(f"{what}: {type(exc).__name__}: {exc}") from None

    @staticmethod
    async def _raw(call: Any) -> dict[str, Any]:
        """Read a response as plain JSON: the generated models reject what they do not expect,
        and a surprising answer must become "unavailable", not an exception."""
        resp = await call
        try:
            if not 200 <= resp.status < 300:
                raise ApiException(status=resp.status, reason=resp.reason)
            data = json.loads(await resp.read())
        finally:
            resp.release()
        if not isinstance(data, dict):
            raise ValueError("the response is not a JSON object")  # noqa: TRY004  (_call maps ValueError)
        return data

    async def subject_access_review(self, user: UserInfo, attrs: ResourceAttributes) -> AccessDecision:
        """Ask the API server's authorizers; user, uid, groups and extra are always passed."""
        resource: dict[str, Any] = {
            "verb": attrs.verb,
            "group": attrs.group,
            "resource": attrs.resource,
            "subresource": attrs.subresource,
            "name": attrs.name,
        }
        if attrs.namespace:
            resource["namespace"] = attrs.namespace
        body: Any = {  # a plain dict: the client serialises it as is
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user.username,
                "uid": user.uid,
                "groups": list(user.groups),
                "extra": {k: list(v) for k, v in user.extra.items()},
                "resourceAttributes": resource,
            },
        }
        out = await self._call(
            "SubjectAccessReview",
            self._raw(self._authz.create_subject_access_review(body, _preload_content=False)),
        )
        status = out.get("status") if isinstance(out.get("status"), dict) else {}
        return AccessDecision(
            allowed=status.get("allowed") is True,
            denied=status.get("denied") is True,
            reason=str(
                status.get("reason") or status.get("evaluation_error") or status.get("evaluationError") or ""
            ),
        )

    async def list_cluster_objects(
        self, group: str, version: str, plural: str
    ) -> tuple[list[dict[str, Any]], str]:
        """Every object of a cluster-scoped custom resource and the list's resourceVersion."""
        out = _as_dict(
            await self._call(
                f"list {plural}", self._custom.list_cluster_custom_object(group, version, plural)
            )
        )
        items = [i for i in out.get("items", []) if isinstance(i, dict)]
        return items, str(out.get("metadata", {}).get("resourceVersion", ""))

    async def watch_cluster_objects(
        self, group: str, version: str, plural: str, resource_version: str
    ) -> AsyncIterator[WatchEvent]:
        """Events after ``resource_version`` until the server ends the stream. Raises WatchExpired
        on 410 Gone and KubeUnavailable on other failures."""
        watcher = kw.Watch()
        stream = watcher.stream(
            self._custom.list_cluster_custom_object,
            group,
            version,
            plural,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SECONDS,
        )
        try:
            async for event in stream:
                kind = str(event.get("type", ""))
                obj = event.get("raw_object") or event.get("object")
                if kind == "ERROR":
                    _raise_watch_error(plural, obj)
                if isinstance(obj, dict):
                    yield WatchEvent(kind, obj)
        except ApiException as exc:
            if exc.status == 410:
                raise WatchExpired(str(exc.reason)) from None
            raise KubeUnavailable(f"watch {plural}: HTTP {exc.status} {exc.reason}") from None
        except (aiohttp.ClientError, OSError, ValueError, KeyError) as exc:  # a malformed line
            raise KubeUnavailable(f"watch {plural}: {type(exc).__name__}: {exc}") from None
        except Exception as exc:  # kubernetes_asyncio raises bare Exception for malformed events
            if type(exc) is not Exception:
                raise
            raise KubeUnavailable(f"watch {plural}: {exc}"[:300]) from None
        finally:
            watcher.stop()


def _raise_watch_error(plural: str, obj: object) -> None:
    if isinstance(obj, Mapping) and obj.get("code") == 410:
        raise WatchExpired(str(obj.get("message", "resourceVersion too old")))
    raise KubeUnavailable(f"watch {plural}: error event {obj!r}"[:300])


def _as_dict(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        out = to_dict()
        return out if isinstance(out, dict) else {}
    return {}
