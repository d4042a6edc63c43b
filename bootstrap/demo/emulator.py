"""The emulated Kubernetes API for `nodegate demo` and the tests: kmock's KubernetesEmulator with a
shim. It is not a Kubernetes API server: no TLS, no authentication, no admission, no RBAC; the
demo labels it as emulated wherever it shows it.

kmock is the extra ``nodegate[demo]`` (``pip install -e '.[demo]'``, which ``make demo`` runs);
this module is only imported by the demo and the tests, never by the service.
tests/support/kshim.py re-exports it.

The shim fills the gaps that matter to nodegate's Kubernetes code:

- creates answer 201 with uid, creationTimestamp and resourceVersion, and 409 AlreadyExists (the
  API server's reason) for a name that exists; a null label or annotation value in a create body
  is stored as "" (as the API server does);
- every PATCH and PUT stamps a fresh resourceVersion, and a write whose body carries a
  ``metadata.resourceVersion`` other than the stored one answers 409 Conflict, as a real server does;
- PUT (``replace_*``) works; on the ``status`` and ``approval`` subresources it changes only the
  status (approval: only the conditions), landing on the main object as kmock does for PATCH;
- kubernetes_asyncio's ``watch=True`` is a watch; equality label and field selectors filter lists
  and watches;
- a watch with ``sendInitialEvents=true`` is a streaming list (every object as ADDED, then the
  BOOKMARK annotated ``k8s.io/initial-events-end``, then the changes), or with
  ``watch_list=False`` refused with 422, as a server with the WatchList feature off refuses it;
- SubjectAccessReviews and TokenReviews are answered by test-supplied functions (kmock has no
  authorizer or authenticator);
- ``script(verb, resource, answer)`` answers the next matching request once with an error status or
  (for a watch) a short stream of events (kmock's own reactions answer every matching request);
- an optional ``signer`` plays kube-controller-manager: when an approval write approves a CSR, the
  certificate it returns lands in ``status.certificate`` within that same write, so watches see it
  (kmock emits no watch event for direct edits of ``kmock.objects``).

A rewritten write's recorded ``.data`` is the whole-object replace; ``.body`` holds what was sent.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import itertools
import json
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp.web
import attrs
import kmock
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kmock._internal import (
    dicts,
    enums,
    k8s,
)  # kmock 0.8 internals; the version is pinned by the tests' needs

from bootstrap.demo import tables
from bootstrap.service.join import kubelet

__all__ = [
    "SAR_PATH",
    "TOKEN_REVIEW_PATH",
    "SarAnswer",
    "ShimEmulator",
    "Signer",
    "TokenReviewAnswer",
    "cluster_signer",
    "kubeconfig",
    "status_body",
]

INITIAL_EVENTS_END = "k8s.io/initial-events-end"  # the API server's; spelled out: it plays the server
SAR_PATH = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
TOKEN_REVIEW_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"  # noqa: S105  (a URL path)
SarAnswer = Callable[[dict[str, Any]], "dict[str, Any] | int"]
TokenReviewAnswer = Callable[[dict[str, Any]], "dict[str, Any] | int"]
Signer = Callable[[dict[str, Any]], "bytes | None"]


def status_body(code: int, reason: str, message: str, **details: Any) -> dict[str, Any]:
    """A Status error body shaped like a real API server's."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": details,
        "code": code,
    }


def _selector(text: str) -> list[tuple[str, str, str | None]]:
    """Equality selectors only: ``a=b``, ``a==b``, ``a!=b``, ``a`` (exists), ``!a`` (absent)."""
    out: list[tuple[str, str, str | None]] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "!=" in part:
            key, value = part.split("!=", 1)
            out.append((key.strip(), "!=", value.strip()))
        elif "=" in part:
            key, value = part.split("==", 1) if "==" in part else part.split("=", 1)
            out.append((key.strip(), "=", value.strip()))
        elif part.startswith("!"):
            out.append((part[1:].strip(), "absent", None))
        elif " " in part or "(" in part:
            raise kmock.KubernetesError(
                status=400, reason="BadRequest", message=f"unsupported selector {part!r}"
            )
        else:
            out.append((part, "exists", None))
    return out


def _matches(terms: list[tuple[str, str, str | None]], values: dict[str, str]) -> bool:
    for key, op, value in terms:
        have = values.get(key)
        if (
            (op == "=" and have != value)
            or (op == "!=" and have == value)
            or (op == "exists" and have is None)
            or (op == "absent" and have is not None)
        ):
            return False
    return True


def _selected(request: kmock.Request, obj: object) -> bool:
    if not isinstance(obj, dict):
        return True
    meta: dict[str, Any] = obj.get("metadata") or {}
    labels: dict[str, str] = meta.get("labels") or {}
    fields = {
        "metadata.name": str(meta.get("name", "")),
        "metadata.namespace": str(meta.get("namespace", "")),
        "spec.nodeName": str((obj.get("spec") or {}).get("nodeName", "")),  # pods by node
    }
    return _matches(_selector(request.params.get("labelSelector", "")), labels) and _matches(
        _selector(request.params.get("fieldSelector", "")), fields
    )


def _approved(obj: dict[str, Any]) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Approved" and c.get("status") == "True" for c in conditions)


@attrs.define(kw_only=True)
class ShimEmulator(kmock.KubernetesEmulator):
    sar: SarAnswer | None = None
    token_review: TokenReviewAnswer | None = None
    signer: Signer | None = None
    # resource key -> a CRD's additionalPrinterColumns, for Table answers (kubectl get)
    printer_columns: dict[str, Any] = attrs.field(factory=dict)
    watch_list: bool = True  # serve streaming lists (sendInitialEvents); False: refuse them with 422
    _versions: Any = attrs.field(factory=lambda: itertools.count(1000), init=False)
    # Check-then-write must be atomic or two writers with the same resourceVersion both win.
    _writes: asyncio.Lock = attrs.field(factory=asyncio.Lock, init=False)
    _scripted: list[tuple[str, str, int | tuple[dict[str, Any], ...]]] = attrs.field(factory=list, init=False)

    def script(self, verb: str, resource: str, answer: int | Sequence[dict[str, Any]]) -> None:
        """Answer the next ``verb`` (list, watch, fetch, create, patch, put, delete) of ``resource``
        (``v1/nodes``, ``group/version/plural``) once: with ``answer`` as an error status, or for a
        watch a stream of these events that then ends. Scripts are used in the order given."""
        self._scripted.append((verb.lower(), resource, answer if isinstance(answer, int) else tuple(answer)))

    def _scripted_answer(self, request: kmock.Request) -> aiohttp.web.StreamResponse | None:
        res = request.resource
        if res is None or not self._scripted:
            return None
        key = f"{res.group}/{res.version}/{res.plural}" if res.group else f"{res.version}/{res.plural}"
        verbs = {
            str(request.action.value).lower() if request.action else "",
            str(request.method.value).lower(),
        }
        for i, (verb, resource, answer) in enumerate(self._scripted):
            if resource == key and verb in verbs:
                del self._scripted[i]
                if isinstance(answer, int):
                    body = status_body(answer, "Scripted", f"scripted {answer}")
                    return aiohttp.web.json_response(body, status=answer)
                lines = b"".join(json.dumps(e).encode() + b"\n" for e in answer)
                return aiohttp.web.Response(body=lines, content_type="application/json")
        return None

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        review = self._review(request)
        if review is not None:
            return review
        if request.params.get("watch") in ("True", "1") and request.action == enums.action.LIST:
            object.__setattr__(request, "action", enums.action.WATCH)
        scripted = self._scripted_answer(request)
        if scripted is not None:
            return scripted
        if request.action == enums.action.WATCH and "sendInitialEvents" in request.params:
            refusal = self._watch_list_refusal(request)
            if refusal is not None:
                return refusal
        if request.action == enums.action.CREATE and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
            meta["resourceVersion"] = str(next(self._versions))
            # A null label or annotation value means "remove" only in a merge patch; a real API
            # server stores it from a create body as "" (kmock kept the null).
            for key in ("labels", "annotations"):
                if isinstance(meta.get(key), dict):
                    meta[key] = {k: "" if v is None else v for k, v in meta[key].items()}
        if (
            request.resource is not None
            and request.name is not None
            and request.method in (enums.method.PATCH, enums.method.PUT)
        ):
            async with self._writes:
                refusal = self._prepare_write(request)
                if refusal is not None:
                    return refusal
                return await super()._handle(request)
        try:
            return await super()._handle(request)
        except k8s.KubernetesObjectConflictError:
            # kmock's reason is "Object Already Exists"; the API server's is AlreadyExists
            # (tests/cluster/test_contract.py holds the two side by side).
            data = request.data if isinstance(request.data, dict) else {}
            name = str(data.get("metadata", {}).get("name", ""))
            plural = request.resource.plural if request.resource is not None else "object"
            body = status_body(409, "AlreadyExists", f'{plural} "{name}" already exists', name=name)
            return aiohttp.web.json_response(body, status=409)

    def _watch_list_refusal(self, request: kmock.Request) -> aiohttp.web.StreamResponse | None:
        """404 for a resource that is not served (kmock's own watch streams whatever is asked),
        422 for a streaming list this emulator does not serve (``watch_list=False``) or one the
        API server would refuse (without resourceVersionMatch=NotOlderThan)."""
        if request.resource not in self._get_resources():
            body = status_body(404, "NotFound", "the server could not find the requested resource")
            return aiohttp.web.json_response(body, status=404)
        if not self.watch_list:
            why = "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"
        elif request.params.get("resourceVersionMatch") != "NotOlderThan":
            why = "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"
        else:
            return None
        body = status_body(422, "Invalid", f"ListOptions.meta.k8s.io is invalid: {why}")
        return aiohttp.web.json_response(body, status=422)

    def _review(self, request: kmock.Request) -> aiohttp.web.StreamResponse | None:
        """SubjectAccessReview / TokenReview: the test's function answers; none set -> 403."""
        if request.method != enums.method.POST:
            return None
        if request.url.path == SAR_PATH:
            answer_with = self.sar
        elif request.url.path == TOKEN_REVIEW_PATH:
            answer_with = self.token_review
        else:
            return None
        answer = answer_with(request.data) if answer_with is not None else 403
        if isinstance(answer, int):
            return aiohttp.web.json_response(status_body(answer, "Failure", "scripted"), status=answer)
        return aiohttp.web.json_response({**request.data, "status": answer}, status=201)

    def _prepare_write(self, request: kmock.Request) -> aiohttp.web.StreamResponse | None:
        """Turn a PATCH or PUT into a whole-object replace carrying a fresh resourceVersion,
        or answer 409 for a stale one. Missing objects are left to kmock (404)."""
        object.__setattr__(request, "action", enums.action.UPDATE)  # kmock does not route PUT
        key: Any = (request.resource, request.namespace, request.name)  # both set: see _handle
        if key not in self.objects or self.objects[key].deleted:
            return None
        stored: dict[str, Any] = copy.deepcopy(self.objects[key].raw)
        stored_meta = stored.get("metadata") or {}
        data = request.data
        if isinstance(data, dict):
            wanted = (data.get("metadata") or {}).get("resourceVersion")
            if wanted is not None and wanted != stored_meta.get("resourceVersion"):
                message = (
                    f"Operation cannot be fulfilled on {request.resource.plural} {request.name!r}: "  # type: ignore[union-attr]
                    "the object has been modified; please apply your changes to the latest version"
                )
                body = status_body(409, "Conflict", message, name=request.name)
                return aiohttp.web.json_response(body, status=409)
        if request.method == enums.method.PUT:
            if not isinstance(data, dict):
                body = status_body(400, "BadRequest", "a PUT body must be an object")
                return aiohttp.web.json_response(body, status=400)
            result = self._replaced(request.subresource, stored, data)
        else:
            try:
                result = dict(dicts.patch_dict(stored, data))
            except Exception:  # noqa: BLE001  (kmock answers the original request with its own error)
                return None
        if request.subresource == "approval":
            self._sign(result)
        result.setdefault("metadata", {})["resourceVersion"] = str(next(self._versions))
        object.__setattr__(request, "data", [{"op": "replace", "path": "", "value": result}])
        return None

    @staticmethod
    def _replaced(subresource: str | None, stored: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
        if subresource == "status":
            return {**stored, "status": data.get("status") or {}}
        if subresource == "approval":
            status = dict(stored.get("status") or {})
            status["conditions"] = (data.get("status") or {}).get("conditions") or []
            return {**stored, "status": status}
        # The server owns identity fields: a replace keeps them.
        meta = dict(data.get("metadata") or {})
        for field in ("uid", "creationTimestamp"):
            if field in (stored.get("metadata") or {}):
                meta[field] = stored["metadata"][field]
        return {**data, "metadata": meta}

    def _sign(self, obj: dict[str, Any]) -> None:
        status = obj.setdefault("status", {})
        if self.signer is None or not _approved(obj) or status.get("certificate"):
            return
        pem = self.signer(obj)
        if pem is not None:
            status["certificate"] = base64.b64encode(pem).decode("ascii")

    async def _serve_create(self, request: kmock.Request) -> kmock.Payload:
        payload = await super()._serve_create(request)
        return kmock.Response(status=201, payload=payload)  # type: ignore[attr-defined]

    async def _serve_list(self, request: kmock.Request) -> kmock.Payload:
        out = await super()._serve_list(request)
        if isinstance(out, dict) and isinstance(out.get("items"), list):
            out["items"] = [i for i in out["items"] if _selected(request, i)]
            return self._as_served(request, out)
        return out

    def _as_served(self, request: kmock.Request, out: dict[str, Any]) -> dict[str, Any]:
        """The list as the API server answers it (tables.py): kind, apiVersion, resourceVersion,
        and a Table when kubectl asks for one."""
        res = request.resource
        if res is None:
            return out
        key = f"{res.group}/{res.version}/{res.plural}" if res.group else f"{res.version}/{res.plural}"
        info = self.resources.get(key) if hasattr(self.resources, "get") else None
        kind = getattr(info, "kind", None) or ""
        version = str((out.get("metadata") or {}).get("resourceVersion", ""))  # opaque, as kmock has it
        if tables.wants_table(request.headers.get("Accept", "")):
            return tables.table(out["items"], self.printer_columns.get(key), version)
        api_version = f"{res.group}/{res.version}" if res.group else str(res.version)
        return tables.as_list(out, kind, api_version, version)

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[kmock.Payload]:
        if request.params.get("sendInitialEvents") in ("True", "true", "1"):
            async for event in self._serve_watch_list(request):
                yield event
            return
        async for event in super()._serve_watch(request):
            if not isinstance(event, dict) or _selected(request, event.get("object")):
                yield event

    async def _serve_watch_list(self, request: kmock.Request) -> AsyncIterator[kmock.Payload]:
        """A streaming list: the objects now, the bookmark that ends them, then the changes (the
        bus is joined under the lock that the snapshot is taken under: no change is lost)."""
        yield b""  # the headers go now (kmock's own watch does the same)
        res = request.resource
        assert res is not None  # noqa: S101  (a watch names its resource)
        bus = self._buses[res]
        async with self._lock:
            marker = await bus.mark()
            version = str(next(self._versions))  # the bookmark's: newer than every object's
            snapshot = [
                obj.raw
                for (resource, namespace, _name), obj in self.objects.items()
                if resource == res
                and (request.namespace is None or namespace == request.namespace)
                and not obj.deleted
            ]
        try:
            for raw in snapshot:
                if _selected(request, raw):
                    yield {"type": "ADDED", "object": raw}
            api_version = f"{res.group}/{res.version}" if res.group else str(res.version)
            meta = {"resourceVersion": version, "annotations": {INITIAL_EVENTS_END: "true"}}
            yield {"type": "BOOKMARK", "object": {"apiVersion": api_version, "metadata": meta}}
            async for event in bus.stream(since=marker):
                if isinstance(event, dict) and _selected(request, event.get("object")):
                    yield event
        finally:
            await bus.unmark(marker)


def cluster_signer() -> Callable[[dict[str, Any]], bytes | None]:
    """Plays kube-controller-manager's kubelet client signer for the emulated API: signs approved
    CSRs for that signer with a throwaway cluster CA, as a real cluster would."""
    key = ec.generate_private_key(ec.SECP256R1())
    issuer = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes (emulated cluster CA)")])

    def sign(csr: dict[str, Any]) -> bytes | None:
        if csr.get("spec", {}).get("signerName") != kubelet.SIGNER:
            return None
        request = x509.load_pem_x509_csr(base64.b64decode(csr["spec"]["request"]))
        now = datetime.now(UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(request.subject)
            .issuer_name(issuer)
            .public_key(request.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=1))
            .not_valid_after(now + timedelta(hours=24))
            .sign(key, hashes.SHA256())
        )
        return cert.public_bytes(serialization.Encoding.PEM)

    return sign


def kubeconfig(url: str) -> dict[str, Any]:
    """A kubeconfig (as a mapping) for the emulated API at ``url``: no credentials."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulated", "cluster": {"server": url.rstrip("/")}}],
        "users": [{"name": "nodegate", "user": {}}],
        "contexts": [{"name": "emulated", "context": {"cluster": "emulated", "user": "nodegate"}}],
        "current-context": "emulated",
    }
