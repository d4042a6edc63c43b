"""`POST /admission/validate`: AdmissionReview v1 in, AdmissionReview v1 out.

Always HTTP 200 with the request's uid for a well-formed review; 400 (problem+json) for a body
that is not one; never a 500. Decisions fail closed: no policies loaded, or an authorizer that
cannot answer, is a denial that says so.

The decision for a NodeWright / Skyhook CREATE or UPDATE:
1. the CR parses and passes every structural rule;
2. an UPDATE that changes nothing the operator acts on (spec, pause/disable) is allowed;
3. among the PackagePolicies whose pool contains the CR's selector (name order), the first for
   which the requester holds ``deploy`` on ``packagepolicies/<name>`` (group nodegate.io), plus
   ``reboot`` when the change fires a reboot interrupt, and whose limits all hold, admits it;
4. otherwise the denial lists, per candidate policy, the missing verb or the violated limits.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from admission import deploymentpolicy, nodes, rules
from admission.crs import PACKAGE_GROUPS, PackageCR, parse_package_cr
from admission.policy import PackagePolicy
from admission.rbac import RbacEvaluator, ResourceAttributes, UserInfo
from admission.violations import Violation

log = logging.getLogger("nodegate.admission")

MAX_REVIEW_BYTES = 4 * 1024 * 1024  # two objects of etcd's 1.5 MiB limit plus the envelope
MAX_LISTED = 20
POLICY_GROUP = "nodegate.io"
POLICY_RESOURCE = "packagepolicies"


class AuthorizerUnavailable(Exception):
    """The authorizer could not answer (API down, timeout): the webhook denies and says so."""


class Authorizer(Protocol):
    async def allowed(self, user: UserInfo, attrs: ResourceAttributes) -> bool: ...


class PolicySource(Protocol):
    def policies(self) -> list[PackagePolicy] | None:
        """The current PackagePolicies, or None while they are not loaded (not ready)."""


@dataclass
class StaticPolicies:
    items: list[PackagePolicy]

    def policies(self) -> list[PackagePolicy] | None:
        return self.items


@dataclass
class LocalRbac:
    """Authorizer over RBAC manifests (``admission.rbac_files``, ``nodegate policy test``)."""

    evaluator: RbacEvaluator

    async def allowed(self, user: UserInfo, attrs: ResourceAttributes) -> bool:
        return self.evaluator.allowed(user, attrs)


# ------------------------------------------------------------------------------------------
# Wire models


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True, frozen=True)


class GroupVersionKind(_Wire):
    group: str = ""
    version: str = ""
    kind: str


class WireUserInfo(_Wire):
    username: str = ""
    uid: str = ""
    groups: list[str] = Field(default_factory=list)
    extra: dict[str, list[str]] = Field(default_factory=dict)


class AdmissionRequest(_Wire):
    uid: str = Field(min_length=1, max_length=256)
    kind: GroupVersionKind
    operation: Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
    name: str = ""
    namespace: str = ""
    sub_resource: str = Field(default="", alias="subResource")
    user_info: WireUserInfo = Field(alias="userInfo")
    object: dict[str, Any] | None = None
    old_object: dict[str, Any] | None = Field(default=None, alias="oldObject")
    dry_run: bool = Field(default=False, alias="dryRun")


class AdmissionReview(_Wire):
    api_version: Literal["admission.k8s.io/v1"] = Field(alias="apiVersion")
    kind: Literal["AdmissionReview"]
    request: AdmissionRequest


class ReviewError(Exception):
    """A body that is not an AdmissionReview v1 (answered with 400)."""


def parse_review(body: bytes) -> AdmissionReview:
    """Parse and validate in one pass (pydantic's JSON parser, which also bounds nesting)."""
    try:
        return AdmissionReview.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors(include_input=False)[0]
        if first["type"] == "json_invalid":
            raise ReviewError(f"body is not JSON: {first['msg']}") from None
        where = ".".join(str(p) for p in first["loc"]) or "<root>"
        raise ReviewError(f"not an AdmissionReview v1: {where}: {first['msg']}") from None
    except RecursionError:
        raise ReviewError("not an AdmissionReview v1: nested too deeply") from None


# ------------------------------------------------------------------------------------------
# Decisions


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
            lines = [self.message, *(f"- {v}" for v in self.violations[:MAX_LISTED])]
            if len(self.violations) > MAX_LISTED:
                lines.append(f"- and {len(self.violations) - MAX_LISTED} more")
            out["status"] = {"code": 403, "reason": "Forbidden", "message": "\n".join(lines)}
        if self.warnings:
            out["warnings"] = [w[:120] for w in self.warnings[:10]]
        if self.audit:
            out["auditAnnotations"] = self.audit
        return out


def _deny(message: str, violations: list[Violation] | None = None, rule: str = "") -> Decision:
    return Decision(
        False, message, violations or [], audit={"decision": "deny", **({"rule": rule} if rule else {})}
    )


def _user(info: WireUserInfo) -> UserInfo:
    return UserInfo(info.username, info.uid, tuple(info.groups), {k: tuple(v) for k, v in info.extra.items()})


@dataclass
class Decider:
    policy_source: PolicySource
    authorizer: Authorizer
    owner: str  # nodegate's service account username: the only one that may lift the hold taint
    hold_taint_key: str = rules.HOLD_TAINT_KEY

    async def decide(self, req: AdmissionRequest) -> Decision:
        kind, group = req.kind.kind, req.kind.group
        if group == "" and kind == "Node":
            return self._node(req)
        if PACKAGE_GROUPS.get(group) == kind:
            return await self._package(req)
        if kind == "DeploymentPolicy" and group in PACKAGE_GROUPS:
            return self._deployment_policy(req)
        return _deny(f"nodegate's webhook does not judge {group or 'core'}/{kind}; fix the webhook rules")

    def _node(self, req: AdmissionRequest) -> Decision:
        found = nodes.node_violations(
            req.operation,
            req.object,
            req.old_object,
            username=req.user_info.username,
            owner=self.owner,
            hold_taint_key=self.hold_taint_key,
        )
        if found:
            return _deny("Node refused by nodegate", found, "node-hold-taint")
        return Decision(True)

    def _deployment_policy(self, req: AdmissionRequest) -> Decision:
        if req.operation not in ("CREATE", "UPDATE") or req.object is None:
            return Decision(True)
        policies = self.policy_source.policies()
        if policies is None:
            return _deny("PackagePolicies are not loaded yet; nodegate denies until they are (fail closed)")
        found = deploymentpolicy.deployment_policy_violations(req.object, policies)
        return _deny("DeploymentPolicy refused by nodegate", found) if found else Decision(True)

    async def _package(self, req: AdmissionRequest) -> Decision:
        if req.operation == "DELETE":
            found = rules.delete_violations(req.old_object or {})
            return _deny("delete refused by nodegate", found, found[0].rule) if found else Decision(True)
        if req.operation == "CONNECT" or req.object is None:
            return Decision(True)
        cr = parse_package_cr(req.object)
        if isinstance(cr, list):
            return _deny("package CR refused by nodegate: malformed", cr, "schema")
        structural = rules.structural_violations(cr, self.hold_taint_key)
        if structural:
            return _deny("package CR refused by nodegate", structural, structural[0].rule)
        old = parse_package_cr(req.old_object) if req.operation == "UPDATE" and req.old_object else None
        old_cr = old if isinstance(old, PackageCR) else None
        if old_cr is not None and not rules.spec_changed(old_cr, cr):
            return Decision(True, audit={"decision": "allow", "reason": "spec unchanged"})
        policies = self.policy_source.policies()
        if policies is None:
            return _deny("PackagePolicies are not loaded yet; nodegate denies until they are (fail closed)")
        try:
            return await self._authorize(req, cr, old_cr, policies)
        except AuthorizerUnavailable as exc:
            return _deny(
                f"authorization is unavailable ({exc}); nodegate denies until it answers (fail closed)"
            )

    async def _authorize(
        self, req: AdmissionRequest, cr: PackageCR, old: PackageCR | None, policies: list[PackagePolicy]
    ) -> Decision:
        candidates = rules.candidate_policies(cr, policies)
        if not candidates:
            return _deny("package CR refused by nodegate", [rules.no_pool_violation(cr)], "pool")
        user = _user(req.user_info)
        reboots = rules.new_reboots(old, cr)
        verbs = ("deploy", "reboot") if reboots else ("deploy",)
        reasons: list[Violation] = []
        for policy in candidates:
            # Rights first: the limits of a policy the requester may not use are not worth computing.
            missing = [v for v in verbs if not await self.authorizer.allowed(user, _attrs(v, policy.name))]
            if missing:
                reasons.append(_missing_verbs(user, policy.name, missing, reboots))
                continue
            violations = rules.policy_violations(cr, policy)
            if violations:
                reasons += [
                    Violation(v.rule, v.path, f"[{policy.name}] {v.message}", v.fix) for v in violations
                ]
                continue
            audit = {"decision": "allow", "policy": policy.name}
            if reboots:
                audit["reboot"] = ",".join(reboots)
            return Decision(True, warnings=_soft_warnings(cr), audit=audit)
        return _deny(
            "package CR refused by nodegate: no PackagePolicy admits it for this requester",
            reasons,
            reasons[0].rule,
        )


def _missing_verbs(user: UserInfo, policy: str, missing: list[str], reboots: list[str]) -> Violation:
    because = f" (reboots: {', '.join(reboots)})" if "reboot" in missing else ""
    return Violation(
        "rbac",
        f"PackagePolicy {policy}",
        f"{user.username or '<anonymous>'} lacks verb {' and '.join(missing)} on "
        f"{POLICY_RESOURCE}/{policy} in {POLICY_GROUP}{because}",
        "ask for a (Cluster)RoleBinding that grants it, or target another pool",
    )


def _attrs(verb: str, policy: str) -> ResourceAttributes:
    return ResourceAttributes(verb=verb, group=POLICY_GROUP, resource=POLICY_RESOURCE, name=policy)


def _soft_warnings(cr: PackageCR) -> list[str]:
    return [
        f"package {key} is not pinned by digest (containerSHA); tags are mutable"
        for key, pkg in cr.spec.packages.items()
        if not pkg.container_sha
    ]


# ------------------------------------------------------------------------------------------
# HTTP


def problem(status: int, title: str, detail: str, code: str) -> web.Response:
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail, "code": code}
    return web.json_response(body, status=status, content_type="application/problem+json")


def make_handler(decider: Decider) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def validate(request: web.Request) -> web.StreamResponse:
        if request.content_type != "application/json":
            return problem(415, "Unsupported Media Type", "send application/json", "malformed_request")
        body = b""
        too_large = request.content_length is not None and request.content_length > MAX_REVIEW_BYTES
        if not too_large:
            try:
                body = await request.read()
            except web.HTTPRequestEntityTooLarge:
                too_large = True
        if too_large:
            resp = problem(
                413,
                "Payload Too Large",
                f"reviews are limited to {MAX_REVIEW_BYTES} bytes",
                "payload_too_large",
            )
            resp.force_close()  # the unread body would otherwise keep the connection busy
            return resp
        try:
            review = parse_review(body)
        except ReviewError as exc:
            return problem(400, "Bad Request", str(exc), "malformed_request")
        decision = await decider.decide(review.request)
        req = review.request
        log.info(
            "admission %s %s/%s %s by %s: %s",
            req.operation,
            req.kind.group or "core",
            req.kind.kind,
            req.name,
            req.user_info.username,
            "allowed" if decision.allowed else "denied",
            extra={"uid": req.uid, "dry_run": req.dry_run, "rules": [v.rule for v in decision.violations]},
        )
        out = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": decision.response(req.uid),
        }
        return web.json_response(out)

    return validate


def make_app(decider: Decider) -> web.Application:
    """The webhook alone (the join service mounts the same handler on its listener). ``/readyz``
    answers 200 once PackagePolicies are loaded, 503 before (the webhook denies meanwhile)."""
    app = web.Application(client_max_size=MAX_REVIEW_BYTES)
    app.router.add_post("/admission/validate", make_handler(decider))

    async def readyz(_request: web.Request) -> web.Response:
        if decider.policy_source.policies() is None:
            return web.Response(status=503, text="PackagePolicies not loaded\n")
        return web.Response(text="ok\n")

    app.router.add_get("/readyz", readyz)
    return app


def rbac_authorizer(objects: list[Mapping[str, Any]]) -> LocalRbac:
    return LocalRbac(RbacEvaluator.from_objects(objects))
