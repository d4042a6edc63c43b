"""One ApiClient, the call discipline every request follows, and the mapping of failures to errors.

Every call has a timeout; a 409 becomes :class:`Conflict`, a 404 :class:`NotFound` (or
:class:`NotServed` for a collection), anything else :class:`KubeUnavailable`. Answers are read as the
API's own JSON (camelCase dicts), never as generated models: the models reject what they do not
expect and their ``to_dict`` renames every field.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any, Self, TypeVar

import aiohttp
from kubernetes_asyncio import client as kc
from kubernetes_asyncio.client.rest import ApiException

from bootstrap.config import KubernetesSettings
from bootstrap.kube.configuration import load_configuration, read_ca_bundle
from bootstrap.kube.decode import ObjectDecoder, decode_list, loads
from bootstrap.kube.errors import Conflict, KubeUnavailable, NotFound, NotServed

DEFAULT_TIMEOUT = 5.0
# Always named: a merge patch replaces lists (spec.taints, status.conditions) whole, which is what
# the read-modify-write callers rely on, and custom resources accept no strategic merge patch.
MERGE_PATCH = "application/merge-patch+json"
_ERROR_BODY_LIMIT = 4096
T = TypeVar("T")


class KubeBase:
    """The ApiClient, its API groups and the request helpers the resource mixins build on."""

    def __init__(
        self, api: kc.ApiClient, timeout: float = DEFAULT_TIMEOUT, *, ca_pem: bytes | None = None
    ) -> None:
        self._api = api
        self._timeout = timeout
        self._ca_pem = ca_pem
        self._authz = kc.AuthorizationV1Api(api)
        self._custom = kc.CustomObjectsApi(api)
        self._core = kc.CoreV1Api(api)
        self._certs = kc.CertificatesV1Api(api)
        self._authn = kc.AuthenticationV1Api(api)
        self._coordination = kc.CoordinationV1Api(api)

    @classmethod
    def for_host(cls, host: str, timeout: float = DEFAULT_TIMEOUT) -> Self:
        """For tests and explicit endpoints: no credentials, no CA."""
        return cls(kc.ApiClient(configuration=kc.Configuration(host=host.rstrip("/"))), timeout)

    @classmethod
    async def from_config(
        cls, kubeconfig: str | None, *, timeout: float = DEFAULT_TIMEOUT, context: str | None = None
    ) -> Self | None:
        """A kubeconfig file when one is named; else the pod's service account when running in a
        cluster; else None (no cluster). Each Kube gets a fresh Configuration. A file that cannot
        be used raises KubeConfigError."""
        cfg = await load_configuration(kubeconfig, context)  # context: kubectl's --context
        if cfg is None:
            return None
        ca_pem = read_ca_bundle(cfg.ssl_ca_cert, "cluster CA") if cfg.ssl_ca_cert else None
        return cls(kc.ApiClient(configuration=cfg), timeout, ca_pem=ca_pem)

    @classmethod
    async def from_settings(cls, settings: KubernetesSettings) -> Self | None:
        """``from_config`` with the service config's kubeconfig and call timeout."""
        path = settings.kubeconfig
        return await cls.from_config(str(path) if path else None, timeout=settings.timeout.total_seconds())

    def api_server(self) -> tuple[str, bytes | None]:
        """(server URL, CA bundle PEM or None): what a kubelet kubeconfig needs to reach the API."""
        return str(self._api.configuration.host), self._ca_pem

    async def close(self) -> None:
        await self._api.close()

    async def _call(self, what: str, coro: Any, *, echo: bool = True) -> Any:
        """Await one API call within the adapter timeout; 409 -> Conflict, 404 -> NotFound,
        everything else that goes wrong -> KubeUnavailable. ``echo=False`` leaves the server's
        message out of the error (for requests that carry a secret the server might repeat)."""
        try:
            return await asyncio.wait_for(coro, self._timeout)
        except TimeoutError:
            raise KubeUnavailable(f"{what}: no answer within {self._timeout:g} s") from None
        except ApiException as exc:
            detail = f"{what}: HTTP {exc.status} {exc.reason}{_status_message(exc) if echo else ''}"
            if exc.status == 409:
                raise Conflict(detail) from None
            if exc.status == 404:
                raise NotFound(detail) from None
            raise KubeUnavailable(detail) from None
        except (aiohttp.ClientError, OSError, ValueError) as exc:  # ValueError: an unreadable body
            raise KubeUnavailable(f"{what}: {type(exc).__name__}: {exc}"[:300]) from None

    async def _json(self, what: str, call: Any, *, echo: bool = True) -> dict[str, Any]:
        """_call over _raw: one call whose answer is read as plain JSON."""
        out: dict[str, Any] = await self._call(what, self._raw(call), echo=echo)
        return out

    async def _json_or_unavailable(self, what: str, call: Any, *, echo: bool = True) -> dict[str, Any]:
        """For calls where 404 means the API (or the CRD) is not served: retry later."""
        try:
            return await self._json(what, call, echo=echo)
        except NotFound as exc:
            raise NotServed(str(exc)) from None

    async def _list_as(self, what: str, call: Any, decoder: ObjectDecoder[T]) -> tuple[list[T], str]:
        """A list call whose items are decoded once, in ``decoder``'s form (404: NotServed)."""
        try:
            body: bytes = await self._call(what, self._body(call))
            return decode_list(body, decoder)
        except NotFound as exc:
            raise NotServed(str(exc)) from None
        except ValueError as exc:
            raise KubeUnavailable(f"{what}: {type(exc).__name__}: {exc}"[:300]) from None

    @staticmethod
    async def _body(call: Any) -> bytes:
        """A response's body; a status other than 2xx raises ApiException for _call to map."""
        resp = await call
        try:
            body: bytes = await resp.read()
            if not 200 <= resp.status < 300:
                exc = ApiException(status=resp.status, reason=resp.reason)
                exc.body = body[:_ERROR_BODY_LIMIT]
                raise exc
        finally:
            resp.release()
        return body

    @staticmethod
    async def _raw(call: Any) -> dict[str, Any]:
        """Read a response as plain JSON: the generated models reject what they do not expect,
        and a surprising answer must become "unavailable", not an exception."""
        data = loads(await KubeBase._body(call))
        if not isinstance(data, dict):
            raise ValueError("the response is not a JSON object")  # noqa: TRY004  (_call maps ValueError)
        return data


def dict_field(obj: Mapping[str, Any], key: str) -> dict[str, Any]:
    """``obj[key]`` when it is an object, else an empty one."""
    value = obj.get(key)
    return value if isinstance(value, dict) else {}


def list_items(out: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The objects of a list answer (anything else in ``items`` is dropped)."""
    items = out.get("items")
    return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


def list_version(out: Mapping[str, Any]) -> str:
    """The resourceVersion of a list answer, to watch from."""
    meta = out.get("metadata")
    return str(meta.get("resourceVersion", "")) if isinstance(meta, dict) else ""


def _status_message(exc: ApiException) -> str:
    """The message of a Kubernetes Status error body, briefly (never the request)."""
    body = getattr(exc, "body", None)
    if not isinstance(body, (bytes, str)) or not body:
        return ""
    try:
        data = json.loads(body)
    except ValueError:
        return ""
    message = data.get("message") if isinstance(data, dict) else None
    return f": {message}"[:300] if isinstance(message, str) and message else ""
