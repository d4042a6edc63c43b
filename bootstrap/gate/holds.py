"""Why a node is held: pure decisions over a Node, its NodeAttestation and the package CRs.

No I/O and no clock: the gate controller passes objects and ``now``. The rules are those of
docs/gate.md ("What decides"): upstream compatibility (NodeWright's own completion rule, read from
what the operator writes with its own credentials, nodewright.py) plus nodegate's policy (a valid
attestation of the boot the node runs now, a stability window).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from admission.hold.selection import selector_matches  # the webhook reads selectors the same way
from bootstrap.gate.mirror import superseded
from bootstrap.gate.nodewright import (
    GROUPS,
    PREFIXES,
    CrInvalid,
    NodeReport,
    NodeView,
    PackageCr,
    PackageSpec,
    PackageStatus,
    judge,
    node_state,
    parse_cr,
)
from bootstrap.names import ATTESTED_LABEL, EK_LABEL, ek_label_value
from bootstrap.times import parse_time, rfc3339

__all__ = [
    "GROUPS",
    "HOLD_REASONS",
    "PREFIXES",
    "AttestationView",
    "CrInvalid",
    "Decision",
    "NodeIdentity",
    "NodeReport",
    "PackageCr",
    "PackageSpec",
    "PackageStatus",
    "Problem",
    "apply_decision",
    "attestation_problem",
    "attestation_view",
    "DecisionKey",
    "decide",
    "decide_without_node",
    "decision_key",
    "effect_for",
    "hold_taint",
    "node_boot_id",
    "node_identity",
    "node_state",
    "parse_cr",
    "selector_matches",
]

Reason = Literal["unattested", "packages-pending", "validation-failed", "quarantined"]
HOLD_REASONS: tuple[Reason, ...] = ("unattested", "packages-pending", "validation-failed", "quarantined")
Phase = Literal["Attested", "Held", "Ready", "Quarantined"]
DEFAULT_TAINT_KEY = "nodegate.io/hold"
MAX_WAITING = 20
MAX_MESSAGE = 1024
MAX_STATUS_PACKAGES = 512  # entries of status.packages (the CRD allows 1024)
MAX_BOOT_ID = 64  # shown of a boot id (a UUID: 36 characters); the CRD's bound on status.bootID
MAX_QUARANTINE_TEXT = 200  # shown of an admin's quarantine reason (the message has its own bound)


def _obj(parent: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """``parent[key]`` when it is an object, else an empty one (unreadable counts as absent)."""
    value = parent.get(key)
    return value if isinstance(value, Mapping) else {}


def _boot(value: object) -> str | None:
    # Compared whole (two long ids with one prefix are two boots); clipped only where shown.
    return value if isinstance(value, str) and value else None


def node_boot_id(node: Mapping[str, Any]) -> str | None:
    """The boot the kubelet reports (``status.nodeInfo.bootID``), or None when it reports none."""
    return _boot(_obj(_obj(node, "status"), "nodeInfo").get("bootID"))


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    """Which Node object this is, as the gate compares it with the attestation: its
    ``metadata.uid`` and the attested labels nodegate writes (under ``node-restriction``, which no
    kubelet may set)."""

    uid: str | None
    attested: str | None  # the value of ATTESTED_LABEL (None: absent)
    ek: str | None  # the value of EK_LABEL


def node_identity(node: Mapping[str, Any]) -> NodeIdentity:
    meta = _obj(node, "metadata")
    labels = _obj(meta, "labels")

    def text(value: object) -> str | None:
        return value if isinstance(value, str) else None

    return NodeIdentity(text(meta.get("uid")), text(labels.get(ATTESTED_LABEL)), text(labels.get(EK_LABEL)))


@dataclass(frozen=True, slots=True)
class AttestationView:
    revoked: bool
    attested_at: datetime | None
    expires_at: datetime | None
    boot_id: str | None = None  # the boot the last join or renewal proved (None: not recorded)
    reset_count: int | None = None  # the TPM's resetCount in that quote
    # The Node object the last join or renewal labelled (status.nodeUID; None: not recorded) and
    # the EK bound to the name (spec.ekSha256), whose label that Node must carry.
    node_uid: str | None = None
    ek_sha256: str | None = None
    quarantine: str | None = None  # an admin's reason (spec.quarantine): held until a new boot attests


def attestation_view(obj: Mapping[str, Any] | None) -> AttestationView | None:
    """A NodeAttestation as the gate judges it. Unreadable fields count as missing (not valid)."""
    if obj is None:
        return None
    spec, status = _obj(obj, "spec"), _obj(obj, "status")
    revoked = spec.get("revoked")
    resets = status.get("resetCount")
    return AttestationView(
        revoked=revoked is not False and revoked is not None,  # anything but an explicit false/absent
        attested_at=parse_time(status.get("attestedAt")),
        expires_at=parse_time(status.get("expiresAt")),
        boot_id=_boot(status.get("bootID")),
        reset_count=resets if isinstance(resets, int) and not isinstance(resets, bool) else None,
        node_uid=_boot(status.get("nodeUID")),  # compared whole, like a boot id
        ek_sha256=_boot(spec.get("ekSha256")),
        quarantine=_quarantine(spec.get("quarantine")),
    )


def _quarantine(value: object) -> str | None:
    """The reason of spec.quarantine; anything present but unreadable still quarantines."""
    if value is None:
        return None
    reason = value.get("reason") if isinstance(value, dict) else None
    return reason[:MAX_QUARANTINE_TEXT] if isinstance(reason, str) and reason else "(no reason given)"


@dataclass(frozen=True, slots=True)
class Problem:
    """Why an attestation does not let the node run: the hold reason, a machine-readable kind
    (``missing``, ``incomplete``, ``revoked``, ``expired``, ``stale``, ``recreated``,
    ``unlabelled``, ``rebooted``, ``no-boot-id``) and the words."""

    reason: Reason
    kind: str
    text: str


def attestation_problem(
    view: AttestationView | None,
    *,
    node_boot: str | None,
    has_node: bool,
    now: datetime,
    lifetime: timedelta | None,
    node: NodeIdentity | None = None,
) -> Problem | None:
    """None when the attestation is valid for the Node object and the boot it runs now.
    Quarantine (the node must join again) before unattested. The Node's identity is checked only
    on a valid attestation that recorded one (``nodeUID``), a reboot only on one that recorded a
    boot id: attestations recorded before either keep the behaviour without it."""
    if view is None:
        return Problem(
            "unattested", "missing", "no NodeAttestation: the node has not joined through nodegate"
        )
    if view.revoked:
        return Problem("quarantined", "revoked", "attestation revoked: the node must join again")
    if view.quarantine is not None:
        return Problem(
            "quarantined",
            "quarantined",
            f"quarantined by an admin ({view.quarantine}): released when the node attests a new boot "
            "that the policy allows",
        )
    if view.expires_at is not None and view.expires_at <= now:
        return Problem(
            "quarantined",
            "expired",
            f"attestation expired at {rfc3339(view.expires_at)}: the node must join again",
        )
    if lifetime is not None and view.attested_at is not None and view.attested_at + lifetime <= now:
        return Problem(
            "quarantined",
            "stale",
            f"attestation older than its lifetime ({lifetime}): renewals stopped; the node must join again",
        )
    if view.attested_at is None or view.expires_at is None:
        return Problem("unattested", "incomplete", "attestation incomplete: no attestedAt/expiresAt")
    if not has_node:
        return None
    if view.node_uid is not None:
        problem = _identity_problem(view, node or NodeIdentity(None, None, None))
        if problem is not None:
            return problem
    if view.boot_id is None:
        return None
    if node_boot is None:
        return Problem(
            "unattested",
            "no-boot-id",
            "the Node reports no boot id (status.nodeInfo.bootID) to match the attested boot "
            + view.boot_id[:MAX_BOOT_ID],
        )
    if node_boot != view.boot_id:
        return Problem(
            "unattested", "rebooted", f"rebooted since its last attestation (boot {node_boot[:MAX_BOOT_ID]})"
        )
    return None


_REATTEST = "the node must attest again (nodegate attest, or its next renewal), which relabels it"


def _identity_problem(view: AttestationView, node: NodeIdentity) -> Problem | None:
    """The Node is not the object the attestation labelled: deleted and re-created since (its
    kubelet registers it with labels of its own choosing), or without the attested labels
    nodegate wrote (``node-restriction.kubernetes.io/``, which no kubelet may set)."""
    if node.uid != view.node_uid:
        return Problem(
            "unattested",
            "recreated",
            f"the Node is not the object nodegate attested (uid {(node.uid or 'none')[:MAX_BOOT_ID]}, "
            f"attested {(view.node_uid or '')[:MAX_BOOT_ID]}): it was deleted and re-created since; "
            + _REATTEST,
        )
    want = ek_label_value(view.ek_sha256) if view.ek_sha256 is not None else None
    if node.attested != "true" or want is None or node.ek != want:
        return Problem(
            "unattested",
            "unlabelled",
            f"the Node lacks the attested labels nodegate wrote ({ATTESTED_LABEL}=true, {EK_LABEL} of "
            "the bound EK); " + _REATTEST,
        )
    return None


def _taints_after(
    node: Mapping[str, Any], key: str, problem: Problem | None
) -> tuple[Mapping[str, Any], ...]:
    """The node's taints as they will be while the gate holds it (what NodeWright's node picker
    will see; only read when packages are pending, so the node is held): the hold is
    ``problem.reason`` when the attestation holds the node, else a value package pods may
    tolerate (packages-pending; validation-failed reads the same)."""
    raw = _obj(node, "spec").get("taints")
    taints = [t for t in raw if isinstance(t, Mapping)] if isinstance(raw, list) else []
    value = problem.reason if problem is not None else "packages-pending"
    old = next((t for t in taints if t.get("key") == key and t.get("value") == value), None)
    effect = old.get("effect") if old is not None else "NoSchedule"
    return (*(t for t in taints if t.get("key") != key), {"key": key, "value": value, "effect": effect})


@dataclass(frozen=True, slots=True)
class Decision:
    reason: Reason | None
    message: str
    packages: tuple[PackageStatus, ...]
    waiting_on: tuple[str, ...]
    complete_since: datetime | None
    requeue_at: datetime | None
    phase: Phase
    problem: Problem | None = None  # the attestation's, when it holds the node


def decide(
    *,
    node: Mapping[str, Any],
    attestation: AttestationView | None,
    crs: Sequence[PackageCr],
    now: datetime,
    stability_window: timedelta,
    attestation_lifetime: timedelta | None,
    complete_since: datetime | None,
    taint_key: str = DEFAULT_TAINT_KEY,
    has_node: bool = True,
) -> Decision:
    problem = attestation_problem(
        attestation,
        node_boot=node_boot_id(node),
        has_node=has_node,
        now=now,
        lifetime=attestation_lifetime,
        node=node_identity(node),
    )
    meta = _obj(node, "metadata")
    view = NodeView(
        name=str(meta.get("name", "")),
        labels=_obj(meta, "labels"),
        annotations=_obj(meta, "annotations"),
        taints=_taints_after(node, taint_key, problem),
        hold_key=taint_key,
    )

    skipped, claimed = superseded(crs)
    rows: list[PackageStatus] = []
    waiting: list[str] = []
    failed = False
    for cr in crs:
        if cr.group == "skyhook.nvidia.com" and cr.name in skipped:
            continue  # its NodeWright mirror (same name, same spec) is judged instead
        if not selector_matches(cr.selector, view.labels):
            continue
        r, w, f = judge(cr, view)
        rows += r
        waiting += w
        failed = failed or f
        if w and cr.group == "skyhook.nvidia.com" and cr.name in claimed:
            waiting.append(claimed[cr.name])
    all_done = not waiting
    since = (complete_since or now) if all_done else None
    requeue: list[datetime] = []

    if attestation is not None and attestation.expires_at is not None and attestation.expires_at > now:
        requeue.append(attestation.expires_at)  # quarantine comes by time alone: a timer, not polling
    stale_at = (
        attestation.attested_at + attestation_lifetime
        if attestation is not None
        and attestation.attested_at is not None
        and attestation_lifetime is not None
        else None
    )
    if stale_at is not None and stale_at > now:
        requeue.append(stale_at)
    reason: Reason | None
    if problem is not None:
        reason = problem.reason
        waiting.insert(0, problem.text)
    elif failed:
        reason = "validation-failed"
    elif not all_done:
        reason = "packages-pending"
    elif since is not None and now < since + stability_window:
        reason = "packages-pending"
        requeue.append(since + stability_window)
        waiting.append(f"stable since {since.isoformat()}; released after the {stability_window} window")
    else:
        reason = None
    shown = waiting[:MAX_WAITING]
    if len(waiting) > MAX_WAITING:
        shown.append(f"and {len(waiting) - MAX_WAITING} more")
    if reason is None:
        message = (
            f"attested; {len(rows)} package(s) complete" if rows else "attested; no package CR selects it"
        )
    else:
        message = f"{reason}: " + "; ".join(shown)
    phase: Phase = "Ready" if reason is None else ("Quarantined" if reason == "quarantined" else "Held")
    return Decision(
        reason=reason,
        message=message[:MAX_MESSAGE],
        packages=tuple(rows),
        waiting_on=tuple(shown),
        complete_since=since,
        requeue_at=min(requeue) if requeue else None,
        phase=phase,
        problem=problem,
    )


DecisionKey = tuple[Reason | None, str | None, Phase, frozenset[tuple[str, str, str]]]


def decision_key(decision: Decision) -> DecisionKey:
    """What the gate decided, without the words: the hold reason, the attestation problem's kind,
    the phase and the set of packages (CR, package, version) the node still waits for. Writes of
    the condition and the NodeAttestation follow a change of this at once; a change of the words
    or of a package's stage alone (the operator's transient text) is paced (writes.py)."""
    waiting = frozenset((p.cr, p.package, p.version) for p in decision.packages if not p.complete)
    kind = decision.problem.kind if decision.problem is not None else None
    return (decision.reason, kind, decision.phase, waiting)


def decide_without_node(
    *, attestation: AttestationView | None, now: datetime, attestation_lifetime: timedelta | None
) -> Decision:
    """A NodeAttestation with no Node of its name (the kubelet has not registered yet, or the
    Node was deleted): nothing to hold, but its status must not keep saying Ready. Phase
    ``Attested`` when the attestation is valid; else as for a node (Held / Quarantined)."""
    decision = decide(
        node={},
        attestation=attestation,
        crs=(),
        now=now,
        stability_window=timedelta(0),
        attestation_lifetime=attestation_lifetime,
        complete_since=None,
        has_node=False,
    )
    if decision.reason is not None:
        return decision
    return replace(decision, phase="Attested", message="attested; no Node object has this name yet")


def hold_taint(key: str, reason: Reason, effect: str) -> dict[str, str]:
    return {"key": key, "value": reason, "effect": effect}


def effect_for(reason: Reason, quarantine_effect: str) -> str:
    return quarantine_effect if reason == "quarantined" else "NoSchedule"


def apply_decision(
    taints: Sequence[Mapping[str, Any]], *, key: str, reason: Reason | None, effect: str
) -> list[dict[str, Any]] | None:
    """The node's new ``spec.taints``, or None when nothing changes. Only taints with ``key`` are
    the gate's; every other taint is kept as it is, in order."""
    mine = [i for i, t in enumerate(taints) if t.get("key") == key]
    if reason is None:
        if not mine:
            return None
        return [dict(t) for t in taints if t.get("key") != key]
    want = hold_taint(key, reason, effect)
    if (
        len(mine) == 1
        and {k: taints[mine[0]].get(k) for k in ("key", "value", "effect")} == want
        and set(taints[mine[0]]) <= {"key", "value", "effect", "timeAdded"}
    ):
        return None
    out: list[dict[str, Any]] = []
    placed = False
    for t in taints:
        if t.get("key") == key:
            if not placed:
                out.append(dict(want))
                placed = True
            continue
        out.append(dict(t))
    if not placed:
        out.append(dict(want))
    return out
