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

The hot path avoids per-review work that does not change the answer: reviews are read with
pydantic's JSON parser into plain objects (:func:`read_review`; the models decide whenever a
value is not exactly of its type), the CR is read and checked in one pass
(:mod:`admission.structural`), policies are compiled when the source hands out new ones, texts of
candidates that do not admit are only built for a denial, and the response is composed from its
strings. ``parse_review`` and ``AdmissionRequest`` remain the typed API (``nodegate policy test``).
"""

from __future__ import annotations

import json
import logging
import operator
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import from_json

from admission import deploymentpolicy, nodes, rules
from admission.crs import PACKAGE_GROUPS, CrView
from admission.policy import PackagePolicy
from admission.rbac import RbacEvaluator, ResourceAttributes, UserInfo
from admission.rules import CompiledPolicy
from admission.structural import read_package_cr
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


# What the decider reads of a request: an AdmissionRequest, or the lighter _Request below.


class RequestKind(Protocol):
    @property
    def group(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def kind(self) -> str: ...


class RequestUser(Protocol):
    @property
    def username(self) -> str: ...
    @property
    def uid(self) -> str: ...
    @property
    def groups(self) -> list[str]: ...
    @property
    def extra(self) -> dict[str, list[str]]: ...


class Request(Protocol):
    @property
    def uid(self) -> str: ...
    @property
    def kind(self) -> RequestKind: ...
    @property
    def operation(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def sub_resource(self) -> str: ...
    @property
    def user_info(self) -> RequestUser: ...
    @property
    def object(self) -> dict[str, Any] | None: ...
    @property
    def old_object(self) -> dict[str, Any] | None: ...
    @property
    def dry_run(self) -> bool: ...


@dataclass(slots=True)
class _Kind:
    group: str
    version: str
    kind: str


@dataclass(slots=True)
class _User:
    username: str
    uid: str
    groups: list[str]
    extra: dict[str, list[str]]


@dataclass(slots=True)
class _Request:
    uid: str
    kind: _Kind
    operation: str
    name: str
    namespace: str
    sub_resource: str
    user_info: _User
    object: dict[str, Any] | None
    old_object: dict[str, Any] | None
    dry_run: bool


_OPERATIONS = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT"})
# populate_by_name: these would set fields as well, so a review using them goes to the models.
_REVIEW_NAMES = frozenset({"api_version"})
_REQUEST_NAMES = frozenset({"sub_resource", "user_info", "old_object", "dry_run"})


def read_review(body: bytes) -> Request:
    """``parse_review(body).request``, without building its models for a review whose values
    all have exactly their types; others (and bad bodies) go through :func:`parse_review`.

    The JSON parser is pydantic's own (the same acceptance, nesting bound and values), but into
    Python objects directly, which also beats the json module."""
    try:
        doc = from_json(body)
    except ValueError:
        doc = None  # parse_review says why
    request = _exact_request(doc) if type(doc) is dict else None
    return parse_review(body).request if request is None else request


def _str(obj: dict[str, Any], key: str) -> bool:
    """The key is absent (its default is "") or a string."""
    return type(obj.get(key, "")) is str


def _exact_request(doc: dict[str, Any]) -> _Request | None:
    req = doc.get("request")
    if (
        doc.get("apiVersion") != "admission.k8s.io/v1"
        or doc.get("kind") != "AdmissionReview"
        or type(req) is not dict
        or not _REVIEW_NAMES.isdisjoint(doc)
        or not _REQUEST_NAMES.isdisjoint(req)
    ):
        return None
    uid, kind, user, operation = req.get("uid"), req.get("kind"), req.get("userInfo"), req.get("operation")
    obj, old, dry_run = req.get("object"), req.get("oldObject"), req.get("dryRun", False)
    if not (
        type(uid) is str
        and 1 <= len(uid) <= 256
        and type(kind) is dict
        and type(kind.get("kind")) is str
        and _str(kind, "group")
        and _str(kind, "version")
        and type(operation) is str
        and operation in _OPERATIONS
        and _str(req, "name")
        and _str(req, "namespace")
        and _str(req, "subResource")
        and type(user) is dict
        and _str(user, "username")
        and _str(user, "uid")
        and (obj is None or type(obj) is dict)
        and (old is None or type(old) is dict)
        and type(dry_run) is bool
    ):
        return None
    groups, extra = user.get("groups", []), user.get("extra", {})
    if type(groups) is not list or not all(type(g) is str for g in groups) or type(extra) is not dict:
        return None
    for values in extra.values():
        if type(values) is not list or not all(type(v) is str for v in values):
            return None
    return _Request(
        uid,
        _Kind(kind.get("group", ""), kind.get("version", ""), kind["kind"]),
        operation,
        req.get("name", ""),
        req.get("namespace", ""),
        req.get("subResource", ""),
        _User(user.get("username", ""), user.get("uid", ""), groups, extra),
        obj,
        old,
        dry_run,
    )


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


def _user(info: RequestUser) -> UserInfo:
    extra = info.extra
    values = dict(zip(extra, map(tuple, extra.values()), strict=True)) if extra else {}
    return UserInfo(info.username, info.uid, tuple(info.groups), values)


@dataclass(frozen=True, slots=True)
class _Candidate:
    """A policy compiled for decisions, with the access checks it needs built once."""

    rules: CompiledPolicy
    deploy: ResourceAttributes
    reboot: ResourceAttributes

    @property
    def name(self) -> str:
        return self.rules.name


def _compile(policy: PackagePolicy) -> _Candidate:
    return _Candidate(
        rules.compile_policy(policy), _attrs("deploy", policy.name), _attrs("reboot", policy.name)
    )


_NOT_LOADED = "PackagePolicies are not loaded yet; nodegate denies until they are (fail closed)"


@dataclass
class Decider:
    policy_source: PolicySource
    authorizer: Authorizer
    owner: str  # nodegate's service account username: the only one that may lift the hold taint
    hold_taint_key: str = rules.HOLD_TAINT_KEY
    # The policies last seen (by identity) and their compiled forms in name order: a source hands
    # out the same objects until a policy changes, so compiling happens when policies load.
    _seen: tuple[PackagePolicy, ...] = field(default=(), init=False, repr=False, compare=False)
    _compiled: tuple[_Candidate, ...] = field(default=(), init=False, repr=False, compare=False)

    async def decide(self, req: Request) -> Decision:
        kind, group = req.kind.kind, req.kind.group
        if group == "" and kind == "Node":
            return self._node(req)
        if PACKAGE_GROUPS.get(group) == kind:
            return await self._package(req)
        if kind == "DeploymentPolicy" and group in PACKAGE_GROUPS:
            return self._deployment_policy(req)
        return _deny(f"nodegate's webhook does not judge {group or 'core'}/{kind}; fix the webhook rules")

    def compiled_policies(self) -> tuple[_Candidate, ...] | None:
        """The source's policies compiled, in name order; None while they are not loaded."""
        policies = self.policy_source.policies()
        if policies is None:
            return None
        seen = self._seen
        if len(seen) != len(policies) or not all(map(operator.is_, seen, policies)):
            self._compiled = tuple(sorted(map(_compile, policies), key=lambda c: c.name))
            self._seen = tuple(policies)
        return self._compiled

    def _node(self, req: Request) -> Decision:
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

    def _deployment_policy(self, req: Request) -> Decision:
        if req.operation not in ("CREATE", "UPDATE") or req.object is None:
            return Decision(True)
        policies = self.policy_source.policies()
        if policies is None:
            return _deny(_NOT_LOADED)
        found = deploymentpolicy.deployment_policy_violations(req.object, policies)
        return _deny("DeploymentPolicy refused by nodegate", found) if found else Decision(True)

    async def _package(self, req: Request) -> Decision:
        if req.operation == "DELETE":
            found = rules.delete_violations(req.old_object or {})
            return _deny("delete refused by nodegate", found, found[0].rule) if found else Decision(True)
        if req.operation == "CONNECT" or req.object is None:
            return Decision(True)
        cr = read_package_cr(req.object)
        if isinstance(cr, list):
            return _deny("package CR refused by nodegate: malformed", cr, "schema")
        structural = rules.structural_violations(cr, self.hold_taint_key)
        if structural:
            return _deny("package CR refused by nodegate", structural, structural[0].rule)
        old = read_package_cr(req.old_object) if req.operation == "UPDATE" and req.old_object else None
        old_cr = old if isinstance(old, CrView) else None
        if old_cr is not None and not rules.spec_changed(old_cr, cr):
            return Decision(True, audit={"decision": "allow", "reason": "spec unchanged"})
        compiled = self.compiled_policies()
        if compiled is None:
            return _deny(_NOT_LOADED)
        try:
            return await self._authorize(req, cr, old_cr, compiled)
        except AuthorizerUnavailable as exc:
            return _deny(
                f"authorization is unavailable ({exc}); nodegate denies until it answers (fail closed)"
            )

    async def _authorize(
        self, req: Request, cr: CrView, old: CrView | None, compiled: tuple[_Candidate, ...]
    ) -> Decision:
        labels = cr.match_labels if not cr.match_expressions else rules.required_labels_of(cr)
        candidates = [c for c in compiled if c.rules.contains(cr, labels)]
        if not candidates:
            return _deny("package CR refused by nodegate", [rules.no_pool_violation(cr)], "pool")
        user = _user(req.user_info)
        reboots = rules.new_reboots(old, cr) if cr.reboot else []
        allowed = self.authorizer.allowed
        # Why each candidate before the admitting one fails; their texts are only built for a denial.
        refused: list[tuple[_Candidate, list[str], list[Violation]]] = []
        for candidate in candidates:
            # Rights first: the limits of a policy the requester may not use are not worth computing.
            missing = [] if await allowed(user, candidate.deploy) else ["deploy"]
            if reboots and not await allowed(user, candidate.reboot):
                missing.append("reboot")
            if missing:
                refused.append((candidate, missing, []))
                continue
            violations = rules.compiled_violations(cr, candidate.rules)
            if violations:
                refused.append((candidate, [], violations))
                continue
            audit = {"decision": "allow", "policy": candidate.name}
            if reboots:
                audit["reboot"] = ",".join(reboots)
            return Decision(True, warnings=_soft_warnings(cr), audit=audit)
        reasons: list[Violation] = []
        for candidate, missing, violations in refused:
            if missing:
                reasons.append(_missing_verbs(user, candidate.name, missing, reboots))
            else:
                reasons += [
                    Violation(v.rule, v.path, f"[{candidate.name}] {v.message}", v.fix) for v in violations
                ]
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


def _soft_warnings(cr: CrView) -> list[str]:
    return [
        f"package {pkg.key} is not pinned by digest (containerSHA); tags are mutable"
        for pkg in cr.packages
        if not pkg.container_sha
    ]


# ------------------------------------------------------------------------------------------
# HTTP


_ESC = json.encoder.encode_basestring_ascii  # what json.dumps writes for a str (ensure_ascii)
_HEAD = '{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {"uid": '
_RESPONSE_KEYS = frozenset({"uid", "allowed", "status", "warnings", "auditAnnotations"})
_STATUS_KEYS = frozenset({"code", "reason", "message"})


def encode_review_response(decision: Decision, uid: str) -> bytes:
    """The AdmissionReview for ``decision.response(uid)``, byte for byte what ``json.dumps`` of
    it writes; composed from its few strings without the generic encoder."""
    resp = decision.response(uid)
    try:
        return _compose(resp)
    except TypeError:  # not the shape response() gives (a str that is not one): the generic encoder
        out = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": resp}
        return json.dumps(out).encode()


def _compose(resp: dict[str, Any]) -> bytes:
    allowed, status, warnings, audit = (
        resp["allowed"],
        resp.get("status"),
        resp.get("warnings"),
        resp.get("auditAnnotations"),
    )
    if type(allowed) is not bool or not resp.keys() <= _RESPONSE_KEYS:
        raise TypeError
    parts = [_HEAD, _ESC(resp["uid"]), ', "allowed": true' if allowed else ', "allowed": false']
    if status is not None:
        if type(status) is not dict or status.keys() != _STATUS_KEYS or type(status["code"]) is not int:
            raise TypeError
        parts += [
            f', "status": {{"code": {status["code"]}, "reason": ',
            _ESC(status["reason"]),  # _ESC raises TypeError for anything but a str
            ', "message": ',
            _ESC(status["message"]),
            "}",
        ]
    if warnings is not None:
        if type(warnings) is not list:
            raise TypeError
        parts += [', "warnings": [', ", ".join(map(_ESC, warnings)), "]"]
    if audit is not None:
        if type(audit) is not dict:
            raise TypeError
        parts += [
            ', "auditAnnotations": {',
            ", ".join([f"{_ESC(k)}: {_ESC(v)}" for k, v in audit.items()]),
            "}",
        ]
    parts.append("}}")
    return "".join(parts).encode()


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
            req = read_review(body)
        except ReviewError as exc:
            return problem(400, "Bad Request", str(exc), "malformed_request")
        decision = await decider.decide(req)
        if log.isEnabledFor(logging.INFO):
            log.info(
                "admission %s %s/%s %s by %s: %s",
                req.operation,
                req.kind.group or "core",
                req.kind.kind,
                req.name,
                req.user_info.username,
                "allowed" if decision.allowed else "denied",
                extra={
                    "uid": req.uid,
                    "dry_run": req.dry_run,
                    "rules": [v.rule for v in decision.violations],
                },
            )
        return web.Response(
            body=encode_review_response(decision, req.uid), content_type="application/json", charset="utf-8"
        )

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
