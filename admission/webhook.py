"""`POST /admission/validate` and `POST /admission/mutate`: AdmissionReview v1 in, AdmissionReview
v1 out.

Always HTTP 200 with the request's uid for a well-formed review. A body that is not one (not JSON,
not a review, too large, not ``application/json``) raises :class:`WebhookProblem`, which the server
answers as ``application/problem+json`` (400, 413 or 415); never a 500. The decision itself is
:mod:`admission.decider`'s (validating) and :mod:`admission.mutate`'s (the package CRs' hold tolerations);
reading reviews and composing responses are :mod:`admission.review`'s and
:mod:`admission.response`'s. This module also re-exports the names callers import from it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from admission.decider import (
    POLICY_GROUP,
    POLICY_RESOURCE,
    Authorizer,
    AuthorizerUnavailable,
    Decider,
    LocalRbac,
    PolicySource,
    StaticPolicies,
    rbac_authorizer,
)
from admission.mutate import CrMutator, encode_mutation_response
from admission.response import MAX_LISTED, Decision, encode_review_response
from admission.review import (
    AdmissionRequest,
    AdmissionReview,
    GroupVersionKind,
    Request,
    RequestKind,
    RequestUser,
    ReviewError,
    WireUserInfo,
    parse_review,
    read_review,
)

__all__ = [
    "MAX_LISTED",
    "MAX_REVIEW_BYTES",
    "POLICY_GROUP",
    "POLICY_RESOURCE",
    "AdmissionRequest",
    "AdmissionReview",
    "Authorizer",
    "AuthorizerUnavailable",
    "CrMutator",
    "Decider",
    "Decision",
    "GroupVersionKind",
    "LocalRbac",
    "PolicySource",
    "Request",
    "RequestKind",
    "RequestUser",
    "ReviewError",
    "StaticPolicies",
    "WebhookProblem",
    "WireUserInfo",
    "encode_review_response",
    "make_handler",
    "make_mutate_handler",
    "parse_review",
    "rbac_authorizer",
    "read_review",
]

log = logging.getLogger("nodegate.admission")

MAX_REVIEW_BYTES = 4 * 1024 * 1024  # two objects of etcd's 1.5 MiB limit plus the envelope


class WebhookProblem(Exception):
    """A body the webhook does not judge. The server renders it as ``application/problem+json``
    with this status, machine code and detail (and closes the connection after a 413)."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail


async def _read(request: web.Request) -> Request:
    """The review's request; WebhookProblem for a body that is not one."""
    if request.content_type != "application/json":
        raise WebhookProblem(415, "malformed_request", "send application/json")
    body = b""
    too_large = request.content_length is not None and request.content_length > MAX_REVIEW_BYTES
    if not too_large:
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            too_large = True
    if too_large:
        raise WebhookProblem(413, "payload_too_large", f"reviews are limited to {MAX_REVIEW_BYTES} bytes")
    try:
        return read_review(body)
    except ReviewError as exc:
        raise WebhookProblem(400, "malformed_request", str(exc)) from None


def make_handler(decider: Decider) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def validate(request: web.Request) -> web.StreamResponse:
        req = await _read(request)
        decision = await decider.decide(req)
        if log.isEnabledFor(logging.INFO):
            # names are fields, not text in msg (searches and alerts need no parsing)
            log.info(
                "admission %s",
                "allowed" if decision.allowed else "denied",
                extra={
                    "uid": req.uid,
                    "dry_run": req.dry_run,
                    "rules": [v.rule for v in decision.violations],
                    "operation": req.operation,
                    "object": f"{req.kind.group or 'core'}/{req.kind.kind} {req.name}",
                    "user": req.user_info.username,
                },
            )
        return web.Response(
            body=encode_review_response(decision, req.uid), content_type="application/json", charset="utf-8"
        )

    return validate


def make_mutate_handler(mutator: CrMutator) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def mutate(request: web.Request) -> web.StreamResponse:
        req = await _read(request)
        mutation = mutator.mutate(req)
        if mutation.patch and log.isEnabledFor(logging.INFO):
            log.info(
                "admission mutated: hold-taint tolerations",
                extra={
                    "uid": req.uid,
                    "dry_run": req.dry_run,
                    "operation": req.operation,
                    # cluster-scoped CRs (Skyhook, NodeWright) have no namespace: no "/demo"
                    "object": f"{req.kind.group or 'core'}/{req.kind.kind} "
                    + "/".join(filter(None, (req.namespace, req.name or "(generated name)"))),
                    "user": req.user_info.username,
                },
            )
        return web.Response(
            body=encode_mutation_response(mutation, req.uid), content_type="application/json", charset="utf-8"
        )

    return mutate
