"""Asking the API server about a caller: TokenReview (who is this?) and SubjectAccessReview (may they?)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from admission.rbac.evaluator import ResourceAttributes, UserInfo
from bootstrap.kube.core import KubeBase, dict_field


@dataclass(frozen=True, slots=True)
class AccessDecision:
    allowed: bool
    denied: bool  # an authorizer said no outright (not merely "no opinion")
    reason: str


class Reviews(KubeBase):
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
        status = dict_field(out, "status")
        return AccessDecision(
            allowed=status.get("allowed") is True,
            denied=status.get("denied") is True,
            reason=str(
                status.get("reason") or status.get("evaluation_error") or status.get("evaluationError") or ""
            ),
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
