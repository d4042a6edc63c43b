"""Policy files: loading them (``bootstrap.service.webhook.policyload``) and judging reviews and CRs with
them offline (``bootstrap.service.webhook.policytest``: ``nodegate policy test`` / ``audit``)."""

from __future__ import annotations

from bootstrap.service.webhook.policyload import MAX_FILE, ToolError, documents, load_policies, load_rbac
from bootstrap.service.webhook.policytest import DEFAULT_OWNER, audit, audit_objects, run

__all__ = [
    "DEFAULT_OWNER",
    "MAX_FILE",
    "ToolError",
    "audit",
    "audit_objects",
    "documents",
    "load_policies",
    "load_rbac",
    "run",
]
