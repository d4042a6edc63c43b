"""The admission decision: a review's request, the PackagePolicies and an authorizer in, a
:class:`~admission.decision.response.Decision` out. Decisions fail closed: no policies loaded, or an
authorizer that cannot answer, is a denial that says so.

The decision for a NodeWright / Skyhook CREATE or UPDATE:
1. an UPDATE whose spec is the same to the operator (:mod:`admission.reading.godecode`) and whose
   pause/disable annotations did not change is allowed, whoever sends it, before anything is
   read or checked: the operator's own finalizer UPDATE and status churn need no rights; adding
   or changing a NodeWright's ``mirrored-from`` claim is not such an UPDATE (it is judged as if
   the CR were new, :func:`admission.reading.changes.claims_mirror`);
2. the CR parses and passes every structural rule (what NodeWright's own webhook refuses without
   looking at the cluster), and on UPDATE NodeWright's uninstall rules; then nodegate's
   toleration rules (:mod:`admission.policies.guards`);
3. a change of pause/disable alone needs ``deploy`` on a policy whose pool contains the CR;
4. otherwise, among the PackagePolicies whose pool contains the CR's selector (name order), the
   first for which the requester holds ``deploy`` on ``packagepolicies/<name>`` (group
   nodegate.io), plus ``reboot`` when the change fires a reboot interrupt (every reboot package
   once ``nodeSelectors`` changed: the CR then reboots nodes it did not select), and whose limits
   all hold, admits it;
5. otherwise the denial lists, per candidate policy, the missing verb or the violated limits.
Removing a CR (a DELETE, or an UPDATE that takes NodeWright's finalizer off) needs ``deploy`` on a
policy whose pool contains the stored CR, except for the operator's own account
(:mod:`admission.hold.removals`); CONNECT is allowed. A Node UPDATE by the node's own credentials may
not take it out of a package CR's selection (:mod:`admission.hold.selection`).

Per-review work that does not change the answer is avoided: the unchanged UPDATE is answered from
the objects as given, the CR is read and checked in one pass (:mod:`admission.reading.structural`),
policies are compiled when the source hands out new ones, and texts of candidates that do not
admit are only built for a denial.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from admission.decision.advice import hold_warnings, soft_warnings
from admission.decision.response import Decision
from admission.hold import nodes, removals, selection
from admission.hold.selection import PackageSelector
from admission.policies import deploymentpolicy, rules
from admission.policies.guards import guard_violations
from admission.policies.rules import CompiledPolicy
from admission.rbac.evaluator import RbacEvaluator, ResourceAttributes, UserInfo
from admission.reading import changes
from admission.reading.crs import PACKAGE_GROUPS, CrView
from admission.reading.policy import PackagePolicy
from admission.reading.review import Request, RequestUser
from admission.reading.structural import read_package_cr
from admission.violations import Violation

POLICY_GROUP = "nodegate.io"
POLICY_RESOURCE = "packagepolicies"


class AuthorizerUnavailable(Exception):
    """The authorizer could not answer (API down, timeout): the webhook denies and says so."""


class Authorizer(Protocol):
    async def allowed(self, user: UserInfo, attrs: ResourceAttributes) -> bool: ...


class PolicySource(Protocol):
    def policies(self) -> list[PackagePolicy] | None:
        """The current PackagePolicies, or None while they are not loaded (not ready)."""


class SelectorSource(Protocol):
    def package_selectors(self) -> Sequence[PackageSelector] | None:
        """Every NodeWright/Skyhook CR's selector, or None while they are not listed yet."""


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


def rbac_authorizer(objects: list[Mapping[str, Any]]) -> LocalRbac:
    return LocalRbac(RbacEvaluator.from_objects(objects))


def _deny(message: str, violations: list[Violation] | None = None, rule: str = "") -> Decision:
    return Decision(
        False, message, violations or [], audit={"decision": "deny", **({"rule": rule} if rule else {})}
    )


def _user(info: RequestUser) -> UserInfo:
    extra = info.extra
    values = {key: tuple(value) for key, value in extra.items()} if extra else {}
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


def _not_loaded(source: PolicySource) -> str:
    """Why there are no policies: a source that can never load any says so (``why_none``)."""
    why = getattr(source, "why_none", None)
    return why if isinstance(why, str) else _NOT_LOADED


@dataclass
class Decider:
    policy_source: PolicySource
    authorizer: Authorizer
    owner: str  # nodegate's service account username: the only one that may lift the hold taint
    hold_taint_key: str = rules.HOLD_TAINT_KEY
    # The package CRs' selectors (a Node's own label changes); None: never known, fail closed.
    selector_source: SelectorSource | None = None
    # The NodeWright operator's accounts: they remove package CRs without a check (removals.py).
    operators: frozenset[str] = frozenset()
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
        found += self._selection(req)
        if found:
            return _deny("Node refused by nodegate", found, found[0].rule)
        return Decision(True)

    def _selection(self, req: Request) -> list[Violation]:
        """A node's own label change that takes it out of a package CR's selection."""
        if req.operation != "UPDATE" or not req.user_info.username.startswith(nodes.NODE_USER_PREFIX):
            return []
        source = self.selector_source
        return selection.selection_violations(
            req.operation,
            req.object,
            req.old_object,
            username=req.user_info.username,
            selectors=None if source is None else source.package_selectors(),
        )

    def _deployment_policy(self, req: Request) -> Decision:
        if req.operation not in ("CREATE", "UPDATE") or req.object is None:
            return Decision(True)
        policies = self.policy_source.policies()
        if policies is None:
            return _deny(_not_loaded(self.policy_source))
        found = deploymentpolicy.deployment_policy_violations(req.object, policies)
        return _deny("DeploymentPolicy refused by nodegate", found) if found else Decision(True)

    async def _package(self, req: Request) -> Decision:
        obj, old_obj = req.object, req.old_object
        if req.operation == "DELETE":
            return await self._removal(req, old_obj, "delete")
        if req.operation not in ("CREATE", "UPDATE") or obj is None:
            return Decision(True)  # CONNECT: not judged
        claim = False  # an UPDATE that adds or changes a mirrored-from claim (judged as if new)
        if req.operation != "UPDATE" or old_obj is None:
            same_spec = same_gates = False
        else:
            same_spec, same_gates = changes.unchanged(old_obj, obj)
            claim = changes.claims_mirror(old_obj, obj)
            if removals.drops_finalizer(old_obj, obj):
                removal = await self._removal(req, old_obj, "finalizer removal")
                if not removal.allowed or (same_spec and same_gates and not claim):
                    return removal
            if same_spec and same_gates and not claim:
                return Decision(True, audit={"decision": "allow", "reason": "spec unchanged"})
            same_spec = same_spec and not claim
        cr = read_package_cr(obj)
        if isinstance(cr, list):
            return _deny("package CR refused by nodegate: malformed", cr, "schema")
        found = [v for _, v in cr.found] if cr.found else []  # rules.structural_violations(cr)
        old: CrView | None = None
        update_warnings: list[str] = []
        # The old object is read only when a rule needs it: the uninstall rules, or which packages
        # would reboot again.
        if old_obj is not None and req.operation == "UPDATE" and (cr.reboot or changes.uninstalls(old_obj)):
            parsed_old = read_package_cr(old_obj)
            if isinstance(parsed_old, CrView):
                old = parsed_old
                refused, update_warnings = changes.update_rules(old_obj, old, cr)
                found += refused
        if found:
            return _deny("package CR refused (NodeWright's own rules)", found, found[0].rule)
        # nodegate's rules judge the spec: a pause/disable alone leaves it as it was admitted.
        guarded = [] if same_spec else guard_violations(cr, self.hold_taint_key)
        if guarded:
            return _deny("package CR refused by nodegate", guarded, guarded[0].rule)
        compiled = self.compiled_policies()
        if compiled is None:
            return _deny(_not_loaded(self.policy_source))
        try:
            if same_spec:  # pause/disable alone: the spec, which the limits judge, is as admitted
                return await self._toggle(req, cr, compiled)
            decision = await self._authorize(req, cr, None if claim else old, compiled)
        except AuthorizerUnavailable as exc:
            return _deny(
                f"authorization is unavailable ({exc}); nodegate denies until it answers (fail closed)"
            )
        if decision.allowed:
            # Early: without the hold tolerations NodeWright never reaches a held node.
            decision.warnings[:0] = [*update_warnings, *hold_warnings(obj, self.hold_taint_key)]
        stray = changes.stray_claim(obj) if claim or req.operation == "CREATE" else None
        if decision.allowed and stray is not None:
            decision.warnings.append(stray)
        return decision

    async def _toggle(self, req: Request, cr: CrView, compiled: tuple[_Candidate, ...]) -> Decision:
        """Pausing, disabling or resuming: ``deploy`` on some policy whose pool contains the CR."""
        candidates = self._candidates(cr, compiled)
        if not candidates:
            return _deny("package CR refused by nodegate", [rules.no_pool_violation(cr)], "pool")
        user = _user(req.user_info)
        for candidate in candidates:
            if await self.authorizer.allowed(user, candidate.deploy):
                audit = {"decision": "allow", "policy": candidate.name, "reason": "pause/disable"}
                return Decision(True, audit=audit)
        reasons = [_missing_verbs(user, c.name, ["deploy"], []) for c in candidates]
        message = "pause/disable refused by nodegate: no PackagePolicy admits it for this requester"
        return _deny(message, reasons, "rbac")

    async def _removal(self, req: Request, stored: Mapping[str, Any] | None, what: str) -> Decision:
        """A DELETE, or an UPDATE taking NodeWright's finalizer off: ``deploy`` on some policy
        whose pool contains the CR as stored, unless the operator's own account removes it."""
        if req.user_info.username in self.operators:
            return Decision(True, audit={"decision": "allow", "reason": f"{what} by the operator"})
        if stored is None:
            return _deny(f"package CR {what} refused by nodegate: the review has no oldObject", rule="schema")
        compiled = self.compiled_policies()
        if compiled is None:
            return _deny(_NOT_LOADED)
        cr = read_package_cr(stored)
        if isinstance(cr, CrView):
            candidates = self._candidates(cr, compiled)
            no_pool = rules.no_pool_violation(cr) if not candidates else None
        else:  # a stored CR nodegate cannot read: it may select every node (as the gate holds it)
            candidates = [c for c in compiled if not c.rules.pool]
            no_pool = (
                Violation(
                    "pool",
                    "spec.nodeSelectors",
                    "nodegate cannot read this CR, so it may select every node; no PackagePolicy "
                    "has the pool of every node",
                    "ask for deploy on a PackagePolicy with nodeSelector {}",
                )
                if not candidates
                else None
            )
        if no_pool is not None:
            return _deny(f"package CR {what} refused by nodegate", [no_pool], "pool")
        user = _user(req.user_info)
        try:
            for candidate in candidates:
                if await self.authorizer.allowed(user, candidate.deploy):
                    audit = {"decision": "allow", "policy": candidate.name, "reason": what}
                    return Decision(True, audit=audit)
        except AuthorizerUnavailable as exc:
            return _deny(
                f"authorization is unavailable ({exc}); nodegate denies until it answers (fail closed)"
            )
        reasons = [_missing_verbs(user, c.name, ["deploy"], []) for c in candidates]
        return _deny(
            f"package CR {what} refused by nodegate: removing a CR releases the nodes it holds, so it "
            "needs deploy on a PackagePolicy whose pool contains it",
            reasons,
            "rbac",
        )

    @staticmethod
    def _candidates(cr: CrView, compiled: tuple[_Candidate, ...]) -> list[_Candidate]:
        """The policies whose pool contains the CR: ``c.rules.contains(cr, labels)``, with the
        CR's part of that test taken once for all of them."""
        if not cr.match_expressions:
            if not cr.match_labels:  # the selector of every node: only the pool of every node
                return [c for c in compiled if not c.rules.pool]
            items = cr.match_labels.items()
        else:
            labels = rules.required_labels_of(cr)
            if labels is None:  # selects nothing: inside every pool
                return list(compiled)
            items = labels.items()
        return [c for c in compiled if items >= c.rules.pool]

    async def _authorize(
        self, req: Request, cr: CrView, old: CrView | None, compiled: tuple[_Candidate, ...]
    ) -> Decision:
        candidates = self._candidates(cr, compiled)
        if not candidates:
            return _deny("package CR refused by nodegate", [rules.no_pool_violation(cr)], "pool")
        user = _user(req.user_info)
        reboots = rules.new_reboots(old, cr) if cr.reboot else []
        authorizer = self.authorizer
        allowed = authorizer.allowed
        # Local RBAC answers synchronously: asked directly, without a coroutine per question.
        local = authorizer.evaluator.allowed if type(authorizer) is LocalRbac else None
        # Why each candidate before the admitting one fails; their texts are only built for a denial.
        refused: list[tuple[_Candidate, list[str]]] = []
        for candidate in candidates:
            # Rights first: the limits of a policy the requester may not use are not worth computing.
            if local is not None:
                missing = [] if local(user, candidate.deploy) else ["deploy"]
                if reboots and not local(user, candidate.reboot):
                    missing.append("reboot")
            else:
                missing = [] if await allowed(user, candidate.deploy) else ["deploy"]
                if reboots and not await allowed(user, candidate.reboot):
                    missing.append("reboot")
            if missing:
                refused.append((candidate, missing))
                continue
            if not rules.policy_admits(cr, candidate.rules):  # the list itself only for a denial
                refused.append((candidate, []))
                continue
            audit = {"decision": "allow", "policy": candidate.name}
            if reboots:
                audit["reboot"] = ",".join(reboots)
            return Decision(True, warnings=soft_warnings(cr), audit=audit)
        reasons: list[Violation] = []
        for candidate, missing in refused:
            if missing:
                reasons.append(_missing_verbs(user, candidate.name, missing, reboots))
            else:
                reasons += [
                    Violation(v.rule, v.path, f"[{candidate.name}] {v.message}", v.fix)
                    for v in rules.compiled_violations(cr, candidate.rules)
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
