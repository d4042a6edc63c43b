"""The gate's writes: the hold taint, the NodegateReady Node condition, the NodeAttestation status
and Events.

Node writes are read-modify-write guarded by the resourceVersion read (merge patches replace whole
lists, so a write from a stale read must fail with 409 and be redone on a fresh read); taints and
conditions of others are sent back exactly as read. Every write asks the Lease first, and none is
made when a pass would change nothing.

Write discipline (docs/gate.md, "How it writes"): the taint follows the decision at once. The
NodegateReady condition is rewritten only when the decision itself changes (holds.decision_key:
the hold, the reason, the attestation problem, the set of packages waited for), never for words
alone: every Node write bumps the Node's resourceVersion and fails the operator's guarded patches
in flight. The NodeAttestation follows a decision change at once; a change of its words or of a
package's stage alone is written at most once per ``pace`` (10 s) per node, the newest one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from bootstrap.config import GateSettings
from bootstrap.gate import holds
from bootstrap.gate.backoff import CONFLICT_ATTEMPTS, jitter
from bootstrap.gate.cache import ATTESTATIONS, Cache
from bootstrap.gate.fields import dict_at, list_at, name_of
from bootstrap.gate.lease import Lease
from bootstrap.kube import Conflict, Kube, KubeUnavailable, NotFound
from bootstrap.times import rfc3339

log = logging.getLogger("nodegate.gate")

CONDITION_TYPE = "NodegateReady"
HELD_CONDITION = "Held"
_GATE_STATUS_KEYS = ("phase", "reason", "message", "packages", "completeSince", "conditions")
# At most one NodeAttestation write per node per PACE when only its words or a package's stage
# changed (docs/gate.md states the bound).
PACE = timedelta(seconds=10)


def camel(reason: str | None) -> str:
    """``packages-pending`` -> ``PackagesPending``; None (released) -> ``Released``."""
    if reason is None:
        return "Released"
    return "".join(part.capitalize() for part in reason.split("-"))


class Writer:
    """Writes one decision's outcome; ``count`` is the writes made (leases not counted)."""

    def __init__(
        self,
        kube: Kube,
        settings: GateSettings,
        cache: Cache,
        lease: Lease,
        *,
        events_namespace: str,
        now: Callable[[], datetime],
        pace: timedelta = PACE,
    ) -> None:
        self._kube = kube
        self._settings = settings
        self._cache = cache
        self._lease = lease
        self._events_namespace = events_namespace
        self._now = now
        self._pace = pace
        self._conditioned: dict[str, holds.DecisionKey] = {}  # the decision each condition says
        self._reported: dict[str, tuple[holds.DecisionKey, datetime]] = {}  # NodeAttestation: when
        self.count = 0

    def forget(self, name: str) -> None:
        """The node is gone: what was written for it no longer paces anything."""
        self._conditioned.pop(name, None)
        self._reported.pop(name, None)

    def hold(self, node: Mapping[str, Any]) -> str | None:
        """The value of the node's hold taint (None: not held)."""
        key = self._settings.taint_key
        taints = list_at(node, "spec", "taints")
        return next((t.get("value") for t in taints if isinstance(t, dict) and t.get("key") == key), None)

    async def taint(self, node: dict[str, Any], decision: holds.Decision) -> dict[str, Any]:
        """One attempt; the node as stored afterwards. Conflict when the node changed since read."""
        key = self._settings.taint_key
        taints = [t for t in list_at(node, "spec", "taints") if isinstance(t, dict)]
        reason = decision.reason
        effect = holds.effect_for(reason, self._settings.quarantine_effect) if reason else "NoSchedule"
        new = holds.apply_decision(taints, key=key, reason=reason, effect=effect)
        if new is None:
            return node
        name = name_of(node)
        patch: dict[str, Any] = {"spec": {"taints": new}}
        rv = dict_at(node, "metadata").get("resourceVersion")
        if rv:
            patch["metadata"] = {"resourceVersion": rv}
        self._lease.check()
        out = await self._kube.patch_node(name, patch)
        self.count += 1
        log.info("hold %s -> %s", self.hold(node) or "none", reason or "released", extra={"node": name})
        self._cache.wrote_node(name, node, out)
        return out

    async def event(self, node: Mapping[str, Any], decision: holds.Decision) -> None:
        """The Event of a hold change (after the change, off its critical path; a lost one is
        logged, never retried)."""
        if decision.reason is None:
            reason, type_ = "NodegateReleased", "Normal"
        elif decision.reason == "quarantined":
            reason, type_ = "NodegateQuarantined", "Warning"
        else:
            reason = "NodegateHeld"
            type_ = "Warning" if decision.reason == "validation-failed" else "Normal"
        meta = dict_at(node, "metadata")
        involved = {
            "kind": "Node",
            "apiVersion": "v1",
            "name": name_of(node),
            "uid": str(meta.get("uid", "")),
        }
        self._lease.check()
        try:
            await self._kube.create_event(
                involved=involved,
                reason=reason,
                message=decision.message,
                type_=type_,
                namespace=self._events_namespace,
            )
        except (KubeUnavailable, Conflict) as exc:  # an Event is a courtesy: the taint is what counts
            log.warning("event %s for node %s not recorded: %s", reason, name_of(node), exc)
            return
        self.count += 1

    async def condition(self, node: dict[str, Any], decision: holds.Decision) -> None:
        """The NodegateReady condition, read-modify-write of status.conditions (a merge patch
        replaces the list, so other conditions are sent back exactly as read)."""
        name = name_of(node)
        for attempt in range(1, CONFLICT_ATTEMPTS + 1):
            conditions = list_at(node, "status", "conditions")
            index = next(
                (
                    i
                    for i, c in enumerate(conditions)
                    if isinstance(c, dict) and c.get("type") == CONDITION_TYPE
                ),
                None,
            )
            old = conditions[index] if index is not None else None
            status = "True" if decision.reason is None else "False"
            want = {
                "type": CONDITION_TYPE,
                "status": status,
                "reason": camel(decision.reason),
                "message": decision.message,
            }
            key = holds.decision_key(decision)
            if old is not None and all(old.get(k) == v for k, v in want.items()):
                self._conditioned[name] = key
                return
            if (
                old is not None
                and self._conditioned.get(name) == key
                and all(old.get(k) == want[k] for k in ("status", "reason"))
            ):
                return  # the words alone changed: the NodeAttestation carries them, not a Node write
            now = rfc3339(self._now())
            kept = old.get("lastTransitionTime") if old is not None and old.get("status") == status else None
            want["lastTransitionTime"] = kept or now
            want["lastHeartbeatTime"] = now
            new = list(conditions)
            if index is None:
                new.append(want)
            else:
                new[index] = want
            patch: dict[str, Any] = {"status": {"conditions": new}}
            rv = dict_at(node, "metadata").get("resourceVersion")
            if rv:
                patch["metadata"] = {"resourceVersion": rv}
            self._lease.check()
            try:
                await self._kube.patch_node_status(name, patch)
            except NotFound:
                return
            except Conflict:
                if attempt >= CONFLICT_ATTEMPTS:
                    raise
                await jitter(attempt)
                fresh = await self._kube.get_node(name)
                if fresh is None:
                    return
                node = fresh
                continue
            self.count += 1
            self._conditioned[name] = key
            return

    def attestation_status(self, decision: holds.Decision, current: Mapping[str, Any]) -> dict[str, Any]:
        """The gate's keys of NodeAttestation status for ``decision`` (``current`` = the status
        now: the Held condition keeps its lastTransitionTime while its status stays)."""
        held = "False" if decision.reason is None else "True"
        conditions = [c for c in list_at(current, "conditions") if isinstance(c, dict)]
        old = next((c for c in conditions if c.get("type") == HELD_CONDITION), None)
        now = rfc3339(self._now())
        condition = {
            "type": HELD_CONDITION,
            "status": held,
            "reason": camel(decision.reason),
            "message": decision.message,
            "lastTransitionTime": str(old.get("lastTransitionTime", now))
            if old is not None and old.get("status") == held
            else now,
        }
        return {
            "phase": decision.phase,
            "reason": decision.reason or "",
            "message": decision.message,
            "packages": [p.to_json() for p in decision.packages[: holds.MAX_STATUS_PACKAGES]],
            "completeSince": rfc3339(decision.complete_since) if decision.complete_since else None,
            "conditions": [c if c.get("type") != HELD_CONDITION else condition for c in conditions]
            if old is not None
            else [*conditions, condition],
            "observedAt": now,
        }

    async def attestation(self, name: str, decision: holds.Decision) -> datetime | None:
        """The NodeAttestation's status, when the gate's keys of it would change: at once when the
        decision changed (holds.decision_key), else at most once per ``pace``. Returns when a
        change held back by the pace is due (decide the node again then), else None."""
        obj = self._cache.attestation(name)
        if obj is None:
            return None  # the join service creates NodeAttestations; the gate only reports on them
        current = dict_at(obj, "status")
        want = self.attestation_status(decision, current)
        if all(current.get(k) == want[k] for k in _GATE_STATUS_KEYS):
            return None
        key, now = holds.decision_key(decision), self._now()
        last = self._reported.get(name)
        if last is not None and last[0] == key and now < last[1] + self._pace:
            return last[1] + self._pace
        self._lease.check()
        group, version, plural = ATTESTATIONS
        try:
            out = await self._kube.patch_cluster_object(
                group, version, plural, name, {"status": want}, status=True
            )
        except NotFound:
            self._cache.drop_attestation(name)
            return None
        self.count += 1
        self._reported[name] = (key, now)
        self._cache.wrote_attestation(name, obj, out)
        return None
