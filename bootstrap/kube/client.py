"""The only module that talks to the Kubernetes API (through kubernetes_asyncio).

Written for a real API server: every call has a timeout, watches resume from the last
resourceVersion and report 410 Gone so the caller re-lists, writes that must not race carry
``metadata.resourceVersion`` (optimistic locking), and errors surface as a few kinds:
:class:`KubeUnavailable` (retry later), :class:`WatchExpired` (re-list now), :class:`Conflict`
(re-read and retry), :class:`NotFound` and :class:`CsrDenied`.

Objects are read and returned as the API's own JSON (camelCase dicts), never as generated
models: the models reject what they do not expect and their ``to_dict`` renames every field.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import aiohttp
import yaml
from kubernetes_asyncio import client as kc
from kubernetes_asyncio import config as kconfig
from kubernetes_asyncio import watch as kw
from kubernetes_asyncio.client.rest import ApiException

from admission.rbac import ResourceAttributes, UserInfo
from bootstrap.times import rfc3339

if TYPE_CHECKING:
    from bootstrap.config import KubernetesSettings

DEFAULT_TIMEOUT = 5.0
WATCH_SECONDS = 300  # server-side watch timeout; the stream is reopened from the last rv
MERGE_PATCH = "application/merge-patch+json"  # never the client's default: see research §4
SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"  # noqa: S105  (a path)
SERVICE_ACCOUNT_CA = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
CSR_MIN_EXPIRATION = 600  # the API's minimum for spec.expirationSeconds
EVENT_MESSAGE_LIMIT = 1024
_ERROR_BODY_LIMIT = 4096
_CA_LIMIT = 1 << 20
_CERT_LIMIT = 1 << 20


class KubeUnavailable(Exception):
    """The API server could not be reached or answered with an error."""


class NotServed(KubeUnavailable):
    """404 on a collection: the API group or the custom resource is not installed."""


class WatchExpired(Exception):
    """410 Gone: the resourceVersion is too old; list again."""


class KubeConfigError(KubeUnavailable):
    """The kubeconfig (or in-cluster configuration) cannot be used."""


class Conflict(Exception):
    """409: a stale resourceVersion or an object that already exists. Re-read and retry."""


class NotFound(Exception):
    """404 where the caller needs to know (getters return None instead)."""


class CsrDenied(Exception):
    """The CertificateSigningRequest was Denied or Failed."""


@dataclass(frozen=True, slots=True)
class AccessDecision:
    allowed: bool
    denied: bool  # an authorizer said no outright (not merely "no opinion")
    reason: str


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK
    object: dict[str, Any]


def read_ca_bundle(path: str | os.PathLike[str], what: str) -> bytes:
    """A PEM CA bundle for a kubeconfig (at most 1 MiB); KubeConfigError names ``what``."""
    try:
        with open(path, "rb") as f:
            pem = f.read(_CA_LIMIT + 1)
    except OSError as exc:
        raise KubeConfigError(f"{what} {path}: {exc.strerror}") from None
    if len(pem) > _CA_LIMIT or b"-----BEGIN CERTIFICATE-----" not in pem:
        raise KubeConfigError(f"{what} {path}: not a PEM certificate bundle")
    return pem


class Kube:
    """A thin, typed adapter over one ApiClient."""

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
    def for_host(cls, host: str, timeout: float = DEFAULT_TIMEOUT) -> Kube:
        """For tests and explicit endpoints: no credentials, no CA."""
        return cls(kc.ApiClient(configuration=kc.Configuration(host=host.rstrip("/"))), timeout)

    @classmethod
    async def from_config(cls, kubeconfig: str | None, *, timeout: float = DEFAULT_TIMEOUT) -> Kube | None:
        """A kubeconfig file when one is named; else the pod's service account when running in a
        cluster; else None (no cluster). Async because kubernetes_asyncio loads kubeconfigs
        asynchronously (exec and OIDC credential plugins). Each Kube gets a fresh Configuration:
        the library's global default is never touched. A file that cannot be used raises
        KubeConfigError."""
        cfg = kc.Configuration()
        if kubeconfig is not None:
            try:
                await kconfig.load_kube_config(
                    config_file=kubeconfig, client_configuration=cfg, persist_config=False
                )
            except (kconfig.ConfigException, OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                raise KubeConfigError(f"kubeconfig {kubeconfig}: {type(exc).__name__}: {exc}"[:300]) from None
            except yaml.YAMLError as exc:
                raise KubeConfigError(f"kubeconfig {kubeconfig}: not YAML: {exc}"[:300]) from None
        elif os.environ.get("KUBERNETES_SERVICE_HOST") and os.path.isfile(SERVICE_ACCOUNT_TOKEN):
            try:
                kconfig.load_incluster_config(  # type: ignore[no-untyped-call]
                    client_configuration=cfg,
                    token_filename=SERVICE_ACCOUNT_TOKEN,
                    cert_filename=SERVICE_ACCOUNT_CA,
                )
            except (kconfig.ConfigException, OSError) as exc:
                raise KubeConfigError(f"in-cluster config: {exc}"[:300]) from None
        else:
            return None
        ca_pem = read_ca_bundle(cfg.ssl_ca_cert, "cluster CA") if cfg.ssl_ca_cert else None
        cfg.host = str(cfg.host).rstrip("/")
        return cls(kc.ApiClient(configuration=cfg), timeout, ca_pem=ca_pem)

    @classmethod
    async def from_settings(cls, settings: KubernetesSettings) -> Kube | None:
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

    @staticmethod
    async def _raw(call: Any) -> dict[str, Any]:
        """Read a response as plain JSON: the generated models reject what they do not expect,
        and a surprising answer must become "unavailable", not an exception."""
        resp = await call
        try:
            body = await resp.read()
            if not 200 <= resp.status < 300:
                exc = ApiException(status=resp.status, reason=resp.reason)
                exc.body = body[:_ERROR_BODY_LIMIT]
                raise exc
            data = json.loads(body)
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
        out = await self._json_or_unavailable(
            "SubjectAccessReview", self._authz.create_subject_access_review(body, _preload_content=False)
        )
        status = _field(out, "status")
        return AccessDecision(
            allowed=status.get("allowed") is True,
            denied=status.get("denied") is True,
            reason=str(
                status.get("reason") or status.get("evaluation_error") or status.get("evaluationError") or ""
            ),
        )

    # -- custom objects, cluster scoped ---------------------------------------------------------

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
        return _items(out), _list_version(out)

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

    # -- nodes -----------------------------------------------------------------------------------

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
        """JSON merge patch (lists such as spec.taints are replaced whole, research §6.2). Put
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
        return _items(out), _list_version(out)

    async def watch_nodes(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        """Node events after ``resource_version`` until the server ends the stream. Raises
        WatchExpired on 410 Gone and KubeUnavailable on other failures."""
        async for event in self._watch("nodes", self._core.list_node, resource_version=resource_version):
            yield event

    # -- leases (coordination.k8s.io/v1) ---------------------------------------------------------

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

    # -- certificate signing requests (certificates.k8s.io/v1) ----------------------------------

    async def create_csr(
        self,
        name: str,
        request_pem: bytes,
        *,
        signer: str,
        usages: Sequence[str],
        expiration_seconds: int | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """Submit a CSR; Conflict if one of that name exists."""
        if expiration_seconds is not None and expiration_seconds < CSR_MIN_EXPIRATION:
            raise ValueError(f"expiration_seconds must be at least {CSR_MIN_EXPIRATION}")
        meta: dict[str, Any] = {"name": name}
        if labels:
            meta["labels"] = dict(labels)
        spec: dict[str, Any] = {
            "request": base64.b64encode(request_pem).decode("ascii"),
            "signerName": signer,
            "usages": list(usages),
        }
        if expiration_seconds is not None:
            spec["expirationSeconds"] = expiration_seconds
        body: Any = {
            "apiVersion": "certificates.k8s.io/v1",
            "kind": "CertificateSigningRequest",
            "metadata": meta,
            "spec": spec,
        }
        return await self._json_or_unavailable(
            f"create CSR {name}", self._certs.create_certificate_signing_request(body, _preload_content=False)
        )

    async def get_csr(self, name: str) -> dict[str, Any] | None:
        try:
            return await self._json(
                f"get CSR {name}", self._certs.read_certificate_signing_request(name, _preload_content=False)
            )
        except NotFound:
            return None

    async def delete_csr(self, name: str) -> None:
        """Delete; a CSR that is already gone is fine."""
        try:
            await self._json(
                f"delete CSR {name}",
                self._certs.delete_certificate_signing_request(name, _preload_content=False),
            )
        except NotFound:
            return

    async def approve_csr(self, name: str, *, reason: str, message: str, attempts: int = 5) -> None:
        """Add the Approved condition through the approval subresource. Already approved: done.
        Denied or Failed: CsrDenied. Missing: NotFound. The write carries the resourceVersion
        that was read, so a concurrent change answers 409; then read again (``attempts`` times
        in all, the last Conflict is raised)."""
        for attempt in range(1, max(attempts, 1) + 1):
            csr = await self.get_csr(name)
            if csr is None:
                raise NotFound(f"approve CSR {name}: it does not exist")
            conditions = _csr_conditions(csr)
            _raise_if_denied(name, conditions)
            if _has_condition(conditions, "Approved"):
                return
            status = _field(csr, "status")
            body: Any = {
                **csr,
                "status": {
                    **status,
                    "conditions": [
                        *conditions,
                        {
                            "type": "Approved",
                            "status": "True",
                            "reason": reason,
                            "message": message,
                            "lastUpdateTime": rfc3339(datetime.now(UTC)),
                        },
                    ],
                },
            }
            try:
                await self._json(
                    f"approve CSR {name}",
                    self._certs.replace_certificate_signing_request_approval(
                        name, body, _preload_content=False
                    ),
                )
            except Conflict:
                if attempt >= attempts:
                    raise
                continue
            return

    async def wait_csr_certificate(self, name: str, *, timeout: float) -> bytes:
        """The issued certificate (PEM bytes from status.certificate). Reads the CSR, then
        follows a watch on it, reading again whenever the stream ends. CsrDenied when it is
        Denied or Failed, NotFound when it disappears, KubeUnavailable when ``timeout`` passes."""
        try:
            async with asyncio.timeout(timeout):
                quiet = 0
                while True:
                    csr = await self.get_csr(name)
                    if csr is None:
                        raise NotFound(f"CSR {name}: it does not exist")
                    cert = _csr_certificate(name, csr)
                    if cert is not None:
                        return cert
                    rv = str(csr.get("metadata", {}).get("resourceVersion", ""))
                    cert, events = await self._watch_csr(name, rv)
                    if cert is not None:
                        return cert
                    # A server that keeps ending streams without events must not make this spin.
                    quiet = quiet + 1 if events == 0 else 0
                    if quiet:
                        await asyncio.sleep(min(0.1 * 2**quiet, 5.0))
        except TimeoutError:
            raise KubeUnavailable(f"CSR {name}: no certificate within {timeout:g} s") from None

    async def _watch_csr(self, name: str, resource_version: str) -> tuple[bytes | None, int]:
        """Follow one watch stream of the CSR: (certificate or None when the stream ended, events)."""
        watcher = kw.Watch(return_type="object")  # plain dicts, no model validation
        kwargs: dict[str, Any] = {
            "field_selector": f"metadata.name={name}",
            "allow_watch_bookmarks": True,
            "timeout_seconds": WATCH_SECONDS,
        }
        if resource_version:
            kwargs["resource_version"] = resource_version
        events = 0
        try:
            async for event in watcher.stream(self._certs.list_certificate_signing_request, **kwargs):
                events += 1
                obj = event.get("raw_object") if isinstance(event, dict) else None
                if not isinstance(obj, dict) or obj.get("metadata", {}).get("name") != name:
                    continue  # the field selector is not trusted alone
                cert = _csr_event_certificate(name, str(event.get("type", "")), obj)
                if cert is not None:
                    return cert, events
        except ApiException as exc:
            if exc.status == 410:
                return None, events  # too old: read again and watch from there
            raise KubeUnavailable(f"watch CSR {name}: HTTP {exc.status} {exc.reason}") from None
        except (aiohttp.ClientError, OSError, ValueError, KeyError) as exc:
            raise KubeUnavailable(f"watch CSR {name}: {type(exc).__name__}: {exc}"[:300]) from None
        except Exception as exc:  # kubernetes_asyncio raises bare Exception for malformed events
            if type(exc) is not Exception:
                raise
            raise KubeUnavailable(f"watch CSR {name}: {exc}"[:300]) from None
        finally:
            watcher.stop()
            await watcher.close()
        return None, events

    # -- events and authentication --------------------------------------------------------------

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
        for namespaced objects, namespace). The message is cut to 1 KiB."""
        obj = {
            k: str(involved[k]) for k in ("kind", "name", "uid", "apiVersion", "namespace") if involved.get(k)
        }
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

    async def token_review(self, token: str, audiences: Sequence[str] = ()) -> UserInfo | None:
        """Who a bearer token belongs to (TokenReview), or None when it does not authenticate.
        When ``audiences`` are given, the server must confirm one of them. The token never
        appears in an error or a log."""
        body: Any = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": list(audiences)},
        }
        out = await self._json_or_unavailable(
            "TokenReview", self._authn.create_token_review(body, _preload_content=False), echo=False
        )
        return _token_user(out, audiences)

    async def watch_cluster_objects(
        self, group: str, version: str, plural: str, resource_version: str
    ) -> AsyncIterator[WatchEvent]:
        """Events after ``resource_version`` until the server ends the stream. Raises WatchExpired
        on 410 Gone and KubeUnavailable on other failures."""
        async for event in self._watch(
            plural,
            self._custom.list_cluster_custom_object,
            group,
            version,
            plural,
            resource_version=resource_version,
        ):
            yield event

    async def _watch(
        self, what: str, list_call: Any, *args: Any, resource_version: str
    ) -> AsyncIterator[WatchEvent]:
        # return_type "object": plain dicts; the generated models reject what they do not expect.
        watcher = kw.Watch(return_type="object")
        kwargs: dict[str, Any] = {"allow_watch_bookmarks": True, "timeout_seconds": WATCH_SECONDS}
        if resource_version:
            kwargs["resource_version"] = resource_version
        stream = watcher.stream(list_call, *args, **kwargs)
        try:
            async for event in stream:
                kind = str(event.get("type", ""))
                obj = event.get("raw_object") or event.get("object")
                if kind == "ERROR":
                    _raise_watch_error(what, obj)
                if isinstance(obj, dict):
                    yield WatchEvent(kind, obj)
        except ApiException as exc:
            if exc.status == 410:
                raise WatchExpired(str(exc.reason)) from None
            raise KubeUnavailable(f"watch {what}: HTTP {exc.status} {exc.reason}") from None
        except (aiohttp.ClientError, OSError, ValueError, KeyError) as exc:  # a malformed line
            raise KubeUnavailable(f"watch {what}: {type(exc).__name__}: {exc}"[:300]) from None
        except Exception as exc:  # kubernetes_asyncio raises bare Exception for malformed events
            if type(exc) is not Exception:
                raise
            raise KubeUnavailable(f"watch {what}: {exc}"[:300]) from None
        finally:
            watcher.stop()
            await watcher.close()


def _csr_conditions(csr: Mapping[str, Any]) -> list[dict[str, Any]]:
    status = csr.get("status")
    conditions = status.get("conditions") if isinstance(status, dict) else None
    return [c for c in conditions if isinstance(c, dict)] if isinstance(conditions, list) else []


def _has_condition(conditions: list[dict[str, Any]], kind: str) -> bool:
    # Denied and Failed count unless explicitly "False": fail closed on odd values.
    if kind == "Approved":
        return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)
    return any(c.get("type") == kind and c.get("status") != "False" for c in conditions)


def _raise_if_denied(name: str, conditions: list[dict[str, Any]]) -> None:
    for kind in ("Denied", "Failed"):
        if _has_condition(conditions, kind):
            found = next(c for c in conditions if c.get("type") == kind)
            why = f"{found.get('reason') or ''}: {found.get('message') or ''}".strip(": ")
            raise CsrDenied(f"CSR {name} is {kind}" + (f" ({why})"[:300] if why else ""))


def _csr_certificate(name: str, csr: Mapping[str, Any]) -> bytes | None:
    """status.certificate decoded, None while there is none; CsrDenied when it never will be."""
    _raise_if_denied(name, _csr_conditions(csr))
    status = csr.get("status")
    cert = status.get("certificate") if isinstance(status, dict) else None
    if not cert:
        return None
    if not isinstance(cert, str) or len(cert) > _CERT_LIMIT:
        raise KubeUnavailable(f"CSR {name}: status.certificate is not usable")
    try:
        pem = base64.b64decode(cert, validate=True)
    except ValueError:
        raise KubeUnavailable(f"CSR {name}: status.certificate is not base64") from None
    if b"-----BEGIN CERTIFICATE-----" not in pem:
        raise KubeUnavailable(f"CSR {name}: status.certificate is not a PEM certificate")
    return pem


def _csr_event_certificate(name: str, kind: str, obj: Mapping[str, Any]) -> bytes | None:
    if kind == "DELETED":
        raise NotFound(f"CSR {name}: deleted while waiting for its certificate")
    return _csr_certificate(name, obj) if kind in ("ADDED", "MODIFIED") else None


def _field(obj: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = obj.get(key)
    return value if isinstance(value, dict) else {}


def _token_user(out: Mapping[str, Any], audiences: Sequence[str]) -> UserInfo | None:
    status = out.get("status")
    if not isinstance(status, dict) or status.get("authenticated") is not True:
        return None
    if audiences:
        granted = status.get("audiences")
        # An authenticator that does not say which audience it checked is not trusted for one.
        if not isinstance(granted, list) or not set(audiences) & {a for a in granted if isinstance(a, str)}:
            return None
    user = status.get("user")
    if not isinstance(user, dict):
        return None
    username = user.get("username")
    if not isinstance(username, str) or not username:
        return None
    uid = user.get("uid")
    groups = user.get("groups")
    extra = user.get("extra")
    return UserInfo(
        username=username,
        uid=uid if isinstance(uid, str) else "",
        groups=tuple(g for g in groups if isinstance(g, str)) if isinstance(groups, list) else (),
        extra={
            k: tuple(x for x in v if isinstance(x, str))
            for k, v in (extra.items() if isinstance(extra, dict) else ())
            if isinstance(k, str) and isinstance(v, list)
        },
    )


def _cap_utf8(text: str, limit: int) -> str:
    raw = text.encode("utf-8")
    return text if len(raw) <= limit else raw[:limit].decode("utf-8", errors="ignore")


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


def _items(out: Mapping[str, Any]) -> list[dict[str, Any]]:
    items = out.get("items")
    return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


def _list_version(out: Mapping[str, Any]) -> str:
    meta = out.get("metadata")
    return str(meta.get("resourceVersion", "")) if isinstance(meta, dict) else ""


def _raise_watch_error(plural: str, obj: object) -> None:
    if isinstance(obj, Mapping) and obj.get("code") == 410:
        raise WatchExpired(str(obj.get("message", "resourceVersion too old")))
    raise KubeUnavailable(f"watch {plural}: error event {obj!r}"[:300])
