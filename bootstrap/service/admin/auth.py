"""Who may call the admin endpoints: an admin SVID (mTLS, IDs listed in ``admin.spiffe_ids``) or a
Kubernetes bearer token (TokenReview, then a SubjectAccessReview per endpoint permission, within
the budget and refusal cache of ``bootstrap.service.admin.bearer``).

Permissions map to RBAC requests on nodeattestations.nodegate.io (``list``, ``revoke``, and
``delete`` for ``forget``), authorities.nodegate.io (``rotate``) and metrics.nodegate.io (``get``,
for Prometheus), so a cluster operator grants them with ordinary Roles.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from cryptography import x509

from admission.rbac.evaluator import ResourceAttributes
from attest import ca, svid
from attest.errors import AttestationError
from bootstrap.kube import KubeUnavailable
from bootstrap.problems import Forbidden, Unauthenticated, Unavailable
from bootstrap.service.admin.bearer import TokenChecks

GROUP = "nodegate.io"
PERMISSIONS: Mapping[str, tuple[str, str]] = {
    "list": ("list", "nodeattestations"),
    "revoke": ("revoke", "nodeattestations"),
    "forget": ("delete", "nodeattestations"),
    "rotate": ("rotate", "authorities"),
    "metrics": ("get", "metrics"),
}
MAX_TOKEN = 16 * 1024


@dataclass(frozen=True, slots=True)
class Caller:
    actor: str  # SPIFFE ID or Kubernetes username, for the audit trail


class AdminAuth:
    def __init__(
        self,
        *,
        trust_domain: str,
        spiffe_ids: Mapping[str, tuple[str, ...]],
        authorities: Callable[[], ca.CaSet],
        tokens: TokenChecks | None,
        audiences: tuple[str, ...] = (),
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._td = trust_domain
        self._ids = {k: frozenset(v) for k, v in spiffe_ids.items()}
        self._authorities = authorities
        self._tokens = tokens
        self._audiences = audiences
        self._now = now

    async def authorize(
        self, permission: str, *, peer: x509.Certificate | None, authorization: str | None, name: str = ""
    ) -> Caller:
        verb, resource = PERMISSIONS[permission]
        if authorization is not None:
            return await self._bearer(authorization, verb, resource, name, permission)
        if peer is not None:
            now = self._now()
            try:
                sid = str(
                    svid.verify_svid(
                        peer, roots=self._authorities().roots(now), trust_domain=self._td, now=now
                    )
                )
            except AttestationError as exc:
                raise Unauthenticated(f"client certificate: {exc.detail}") from None
            granted = next((p for i, p in self._ids.items() if hmac.compare_digest(i, sid)), None)
            if granted is None:
                raise Forbidden(f"{sid} is not an admin identity")
            if permission not in granted:
                raise Forbidden(f"{sid} may not {permission}")
            return Caller(sid)
        raise Unauthenticated("admin endpoints need an admin SVID (mTLS) or a Kubernetes bearer token")

    async def _bearer(self, header: str, verb: str, resource: str, name: str, permission: str) -> Caller:
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token or len(token) > MAX_TOKEN:
            raise Unauthenticated("Authorization must be 'Bearer <token>'")
        if self._tokens is None:
            raise Unauthenticated("bearer tokens need a cluster (kubernetes.kubeconfig or in-cluster)")
        try:
            user = await self._tokens.user(token, self._audiences)
            if user is None:
                raise Unauthenticated("the token was not accepted by the cluster")
            decision = await self._tokens.decision(
                user, ResourceAttributes(verb=verb, group=GROUP, resource=resource, name=name)
            )
        except KubeUnavailable as exc:
            raise Unavailable(f"cannot check the token: {exc}", retry_after=2) from None
        if not decision.allowed or decision.denied:
            raise Forbidden(f"{user.username} may not {verb} {resource}.{GROUP} ({permission})")
        return Caller(user.username)
