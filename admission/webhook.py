"""`POST /admission/validate` and `POST /admission/mutate` on a body: AdmissionReview v1 in,
AdmissionReview v1 out (``make_validator``, ``make_mutation``; the admission listener,
``bootstrap.service.webhook``, frames the HTTP).

Always HTTP 200 with the request's uid for a well-formed review. A body that is not one (not JSON,
not a review, too large, not ``application/json``) raises :class:`WebhookProblem`, which the server
answers as ``application/problem+json`` (400, 413 or 415); never a 500. The decision itself is
:mod:`admission.decision.decider`'s (validating) and :mod:`admission.hold.mutate`'s (the
package CRs' hold tolerations); reading reviews and composing responses are
:mod:`admission.reading.review`'s and :mod:`admission.decision.response`'s. This module also
re-exports the names callers import from it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from admission.decision.decider import (
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
from admission.decision.decisioncache import Cached, DecisionCache
from admission.decision.response import MAX_LISTED, Decision, encode_review_response
from admission.hold.mutate import CrMutator, encode_mutation_response
from admission.reading.review import (
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


def check_media(content_type: str, content_encoding: str) -> None:
    """WebhookProblem (415) unless the body is JSON as sent: ``content_type`` is the media type
    (lowercase, without parameters), ``content_encoding`` the header's value ("" when absent)."""
    if content_encoding.strip().lower() not in ("", "identity"):
        detail = f"Content-Encoding {content_encoding[:32]!r} is not accepted; send the body as is"
        raise WebhookProblem(415, "malformed_request", detail)
    if content_type != "application/json":
        raise WebhookProblem(415, "malformed_request", "send application/json")


def too_large() -> WebhookProblem:
    return WebhookProblem(413, "payload_too_large", f"reviews are limited to {MAX_REVIEW_BYTES} bytes")


def _parse(body: bytes) -> Request:
    try:
        return read_review(body)
    except ReviewError as exc:
        raise WebhookProblem(400, "malformed_request", str(exc)) from None


def _object_of(req: Request) -> str:
    return f"{req.kind.group or 'core'}/{req.kind.kind} {req.name}"


_FUNC = "log_decision"


def log_decision(
    allowed: bool,
    rules: list[str],
    *,
    uid: str,
    dry_run: bool,
    operation: str,
    obj: str,
    user: str,
    allowed_level: int = logging.INFO,
) -> None:
    """One line per review: every denial at info; allowed reviews (the audit trail of who was
    allowed what) at ``allowed_level`` (``admission.log_allowed``, docs/admission.md)."""
    level = allowed_level if allowed else logging.INFO
    if log.isEnabledFor(level):
        # names are fields, not text in msg (searches and alerts need no parsing)
        fields = {
            "uid": uid,
            "dry_run": dry_run,
            "rules": rules,
            "operation": operation,
            "object": obj,
            "user": user,
        }
        verdict = ("allowed" if allowed else "denied",)
        # makeRecord + handle: a logging call without findCaller's walk up the stack, which
        # cost more than the rest of the call (the line shows no source location).
        log.handle(log.makeRecord(log.name, level, __file__, 0, "admission %s", verdict, None, _FUNC, fields))


Validate = Callable[[bytes], Awaitable[bytes]]


def make_validator(
    decider: Decider,
    *,
    cache: DecisionCache | None = None,
    on_cached: Callable[[Decision], None] | None = None,
    allowed_level: int = logging.INFO,
    audit: Callable[..., None] | None = None,
) -> Validate:
    """The validating webhook on a body: the AdmissionReview to answer with (JSON), or
    WebhookProblem. With ``cache``, a review that repeats an earlier one but for its uid
    (``admission.decision.decisioncache``) is answered as that one was, without being parsed or judged
    again; ``on_cached`` sees each decision answered from the cache (the metrics). ``audit``
    writes the line per review (``log_decision``'s arguments; default: ``log_decision``)."""
    log_line = audit or log_decision

    async def validate(body: bytes) -> bytes:
        keyed = None if cache is None else cache.key(body)
        generation = None
        if keyed is not None and cache is not None:
            hit, generation = cache.lookup(keyed[0])
            if hit is not None:
                decision = hit.decision
                if on_cached is not None:
                    on_cached(decision)
                log_line(
                    decision.allowed,
                    [v.rule for v in decision.violations],
                    uid=keyed[1],
                    dry_run=hit.dry_run,
                    operation=hit.operation,
                    obj=hit.object,
                    user=hit.user,
                    allowed_level=allowed_level,
                )
                return b"%b%b%b" % (hit.head, keyed[1].encode(), hit.tail)
        req = _parse(body)
        decision = await decider.decide(req)
        obj = _object_of(req)
        log_line(
            decision.allowed,
            [v.rule for v in decision.violations],
            uid=req.uid,
            dry_run=req.dry_run,
            operation=req.operation,
            obj=obj,
            user=req.user_info.username,
            allowed_level=allowed_level,
        )
        answer = encode_review_response(decision, req.uid)
        if keyed is not None and cache is not None and keyed[1] == req.uid:
            split = _split_answer(answer, req.uid)
            if split is not None:
                entry = Cached(decision, *split, req.operation, obj, req.user_info.username, req.dry_run)
                cache.put(keyed[0], entry, generation)
        return answer

    return validate


def _split_answer(answer: bytes, uid: str) -> tuple[bytes, bytes] | None:
    """The answer before and after its uid (the response's first member: nothing before it can
    hold a uid)."""
    needle = b'"uid": "%b"' % uid.encode()
    at = answer.find(needle)
    if at < 0:
        return None
    start = at + 8  # len('"uid": "')
    return answer[:start], answer[start + len(uid) :]


Mutate = Callable[[bytes], bytes]


def make_mutation(mutator: CrMutator) -> Mutate:
    """The mutating webhook on a body: the AdmissionReview to answer with, or WebhookProblem."""

    def mutate(body: bytes) -> bytes:
        req = _parse(body)
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
        return encode_mutation_response(mutation, req.uid)

    return mutate
