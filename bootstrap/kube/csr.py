"""CertificateSigningRequests (certificates.k8s.io/v1): submit a kubelet's, approve it, wait for the
certificate the signer issues."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import aiohttp
from kubernetes_asyncio import watch as kw
from kubernetes_asyncio.client.rest import ApiException

from bootstrap.kube.core import KubeBase, dict_field
from bootstrap.kube.errors import Conflict, CsrDenied, KubeUnavailable, NotFound
from bootstrap.kube.watch import watch_arguments
from bootstrap.times import rfc3339

CSR_MIN_EXPIRATION = 600  # the API's minimum for spec.expirationSeconds
_CERT_LIMIT = 1 << 20


class Csrs(KubeBase):
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
            status = dict_field(csr, "status")
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
        kwargs = {"field_selector": f"metadata.name={name}", **watch_arguments(resource_version)}
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
