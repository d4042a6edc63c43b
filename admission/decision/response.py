"""What the webhook answers: a :class:`Decision`, and its AdmissionReview v1 response as bytes.

The response is composed from its few strings (byte for byte what ``json.dumps`` writes) rather
than through the generic encoder: the webhook answers every review, so this is its hot path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from admission.violations import Violation

MAX_LISTED = 20  # violations listed in a denial's message; the rest are counted


@dataclass
class Decision:
    allowed: bool
    message: str = ""
    violations: list[Violation] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    audit: dict[str, str] = field(default_factory=dict)

    def response(self, uid: str) -> dict[str, Any]:
        out: dict[str, Any] = {"uid": uid, "allowed": self.allowed}
        if not self.allowed:
            out["status"] = {"code": 403, "reason": "Forbidden", "message": self.status_message()}
        if self.warnings:
            out["warnings"] = [w[:120] for w in self.warnings[:10]]
        if self.audit:
            out["auditAnnotations"] = self.audit
        return out

    def status_message(self) -> str:
        """A denial's message: the message, then the violations (the first MAX_LISTED)."""
        lines = [self.message, *(f"- {v}" for v in self.violations[:MAX_LISTED])]
        if len(self.violations) > MAX_LISTED:
            lines.append(f"- and {len(self.violations) - MAX_LISTED} more")
        return "\n".join(lines)


_ESC = json.encoder.encode_basestring_ascii  # what json.dumps writes for a str (ensure_ascii)
_HEAD = '{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {"uid": '


# Warnings (cut at 120 characters) and audit annotations repeat the same few texts: their
# encodings are memoised (bounded; the uid and a denial's message are encoded each time).
_esc_short = lru_cache(maxsize=1024)(_ESC)


def encode_review_response(decision: Decision, uid: str) -> bytes:
    """The AdmissionReview for ``decision.response(uid)``, byte for byte what ``json.dumps`` of
    it writes; composed from its few strings without the generic encoder (for a Decision itself,
    straight from its fields, without the response dict)."""
    try:
        return _compose_decision(decision, uid)
    except TypeError:  # not the shape response() gives (a str that is not one): the generic encoder
        resp = decision.response(uid)
        out = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": resp}
        return json.dumps(out).encode()


def _compose_decision(decision: Decision, uid: str) -> bytes:
    """The encoding of ``decision.response(uid)``, read from the decision's fields; TypeError for
    a field not of the type ``response()`` gives."""
    allowed, warnings, audit = decision.allowed, decision.warnings, decision.audit
    if type(allowed) is not bool:
        raise TypeError
    parts = [_HEAD, _ESC(uid), ', "allowed": true' if allowed else ', "allowed": false']
    if not allowed:
        parts += [
            ', "status": {"code": 403, "reason": "Forbidden", "message": ',
            _ESC(decision.status_message()),
            "}",
        ]
    if warnings:
        parts += [', "warnings": [', ", ".join([_esc_short(w[:120]) for w in warnings[:10]]), "]"]
    if audit:
        if type(audit) is not dict:
            raise TypeError
        parts += [
            ', "auditAnnotations": {',
            ", ".join([f"{_esc_short(k)}: {_esc_short(v)}" for k, v in audit.items()]),
            "}",
        ]
    parts.append("}}")
    return "".join(parts).encode()
