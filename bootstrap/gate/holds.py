"""Why a node is held: pure decisions over a Node, its NodeAttestation and the package CRs.

No I/O and no clock: the gate controller passes objects and ``now``. The rules are those of
docs/gate.md ("What decides"), with NodeWright's own completion rule for packages:
a package is complete on a node when the node's state for the CR holds its *spec* version in state
``complete`` at stage ``post-interrupt`` (when an interrupt applies) or ``config``. Per-CR
``status.status`` is not trusted (it flips complete <-> in_progress between reboots).
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from bootstrap.times import parse_time

Reason = Literal["unattested", "packages-pending", "validation-failed", "quarantined"]
HOLD_REASONS: tuple[Reason, ...] = ("unattested", "packages-pending", "validation-failed", "quarantined")
Phase = Literal["Attested", "Held", "Ready", "Quarantined"]
GROUPS = {"nodewright.nvidia.com": "NodeWright", "skyhook.nvidia.com": "Skyhook"}
PREFIXES = ("nodewright.nvidia.com", "skyhook.nvidia.com")  # node annotations: the new one first
MAX_WAITING = 20
MAX_MESSAGE = 1024
MAX_FIELD = 256  # one string of a status.packages entry
MAX_STATUS_PACKAGES = 512  # entries of status.packages (the CRD allows 1024)


class CrInvalid(ValueError):
    """A package CR the gate cannot read; nodes it might select stay held."""


@dataclass(frozen=True, slots=True)
class PackageSpec:
    name: str
    version: str
    interrupt: bool
    config_interrupt_keys: tuple[str, ...]
    uninstall_enabled: bool
    uninstall_apply: bool


@dataclass(frozen=True, slots=True)
class PackageCr:
    group: str
    name: str
    selector: Mapping[str, Any]
    packages: Mapping[str, PackageSpec]
    paused: bool
    disabled: bool
    config_updates: Mapping[str, tuple[str, ...]]
    mirrored_from: str | None

    @property
    def ref(self) -> str:
        return f"{self.group}/{self.name}"


def _obj(parent: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """``parent[key]`` when it is an object, else an empty one (unreadable counts as absent)."""
    value = parent.get(key)
    return value if isinstance(value, Mapping) else {}


def _str(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise CrInvalid(f"{what} must be a non-empty string")
    return value


def _flag(annotations: Mapping[str, Any], word: str) -> bool:
    return any(annotations.get(f"{p}/{word}") == "true" for p in PREFIXES)


def parse_cr(obj: Mapping[str, Any]) -> PackageCr:
    """The parts of a NodeWright or Skyhook CR the gate acts on; CrInvalid names what is wrong."""
    group = str(obj.get("apiVersion", "")).split("/", 1)[0]
    if GROUPS.get(group) != obj.get("kind"):
        raise CrInvalid(f"not a package CR: {obj.get('apiVersion')}/{obj.get('kind')}")
    meta = _obj(obj, "metadata")
    name = _str(meta.get("name"), "metadata.name")
    annotations = _obj(meta, "annotations")
    spec = obj.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise CrInvalid(f"{group}/{name}: spec is not an object")
    selector = spec.get("nodeSelectors") or {}
    if not isinstance(selector, Mapping):
        raise CrInvalid(f"{group}/{name}: spec.nodeSelectors is not a label selector")
    raw_packages = spec.get("packages") or {}
    if not isinstance(raw_packages, Mapping):
        raise CrInvalid(f"{group}/{name}: spec.packages is not a map")
    packages: dict[str, PackageSpec] = {}
    for key, pkg in raw_packages.items():
        if not isinstance(pkg, Mapping):
            raise CrInvalid(f"{group}/{name}: spec.packages.{key} is not an object")
        uninstall = _obj(pkg, "uninstall")
        config_interrupts = pkg.get("configInterrupts") or {}
        packages[str(key)] = PackageSpec(
            name=str(key),
            version=_str(pkg.get("version"), f"spec.packages.{key}.version"),
            interrupt=isinstance(pkg.get("interrupt"), Mapping),
            config_interrupt_keys=tuple(str(k) for k in config_interrupts)
            if isinstance(config_interrupts, Mapping)
            else (),
            uninstall_enabled=uninstall.get("enabled") is True,
            uninstall_apply=uninstall.get("apply") is True,
        )
    status = _obj(obj, "status")
    updates_raw = status.get("configUpdates") or {}
    updates = (
        {str(k): tuple(str(x) for x in v) for k, v in updates_raw.items() if isinstance(v, list)}
        if isinstance(updates_raw, Mapping)
        else {}
    )
    mirrored = annotations.get("nodewright.nvidia.com/mirrored-from")
    return PackageCr(
        group=group,
        name=name,
        selector=selector,
        packages=packages,
        paused=_flag(annotations, "pause"),
        disabled=_flag(annotations, "disable"),
        config_updates=updates,
        mirrored_from=mirrored if isinstance(mirrored, str) and group == "nodewright.nvidia.com" else None,
    )


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Kubernetes LabelSelector semantics; a selector the gate cannot read matches (fail closed:
    the node is held rather than released by a CR nobody can interpret)."""
    if not selector:
        return True
    match_labels = selector.get("matchLabels") or {}
    expressions = selector.get("matchExpressions") or []
    if not isinstance(match_labels, Mapping) or not isinstance(expressions, list):
        return True
    for key, value in match_labels.items():
        if labels.get(str(key)) != value:
            return False
    for expr in expressions:
        if not isinstance(expr, Mapping):
            return True
        key, op = expr.get("key"), expr.get("operator")
        values = expr.get("values") or []
        if not isinstance(key, str) or not isinstance(values, list):
            return True
        present = key in labels
        if op == "In":
            ok = present and labels[key] in values
        elif op == "NotIn":
            ok = not present or labels[key] not in values
        elif op == "Exists":
            ok = present
        elif op == "DoesNotExist":
            ok = not present
        else:
            return True
        if not ok:
            return False
    return True


@dataclass(frozen=True, slots=True)
class PackageStatus:
    cr: str
    package: str
    version: str
    stage: str | None
    state: str | None
    complete: bool

    def to_json(self) -> dict[str, Any]:
        # Clipped: stage and state come from node annotations anyone with node write access sets,
        # and an over-long status would be refused by the CRD's schema (the node stays held, but
        # its status would stop updating).
        return {
            "cr": self.cr[:MAX_FIELD],
            "package": self.package[:MAX_FIELD],
            "version": self.version[:MAX_FIELD],
            "stage": self.stage[:MAX_FIELD] if self.stage is not None else None,
            "state": self.state[:MAX_FIELD] if self.state is not None else None,
            "complete": self.complete,
        }


@dataclass(frozen=True, slots=True)
class AttestationView:
    revoked: bool
    attested_at: datetime | None
    expires_at: datetime | None


def attestation_view(obj: Mapping[str, Any] | None) -> AttestationView | None:
    """A NodeAttestation as the gate judges it. Unreadable fields count as missing (not valid)."""
    if obj is None:
        return None
    spec, status = _obj(obj, "spec"), _obj(obj, "status")
    revoked = spec.get("revoked")
    return AttestationView(
        revoked=revoked is not False and revoked is not None,  # anything but an explicit false/absent
        attested_at=parse_time(status.get("attestedAt")),
        expires_at=parse_time(status.get("expiresAt")),
    )


@dataclass(frozen=True, slots=True)
class Decision:
    reason: Reason | None
    message: str
    packages: tuple[PackageStatus, ...]
    waiting_on: tuple[str, ...]
    complete_since: datetime | None
    requeue_at: datetime | None
    phase: Phase


def node_state(annotations: Mapping[str, Any], cr_name: str) -> tuple[dict[str, Any] | None, str | None]:
    """The package states the operator wrote for ``cr_name``: (state, None), (None, None) when
    absent, or (None, why) when malformed. The new prefix wins over the legacy one."""
    for prefix in PREFIXES:
        raw = annotations.get(f"{prefix}/nodeState_{cr_name}")
        if raw is None:
            continue
        try:
            state = json.loads(raw) if isinstance(raw, str) and len(raw) <= 256 * 1024 else None
        except ValueError:
            state = None
        if not isinstance(state, dict):
            return None, f"{prefix}/nodeState_{cr_name} is malformed"
        return state, None
    return None, None


def _has_interrupt(cr: PackageCr, pkg: PackageSpec) -> bool:
    changed = cr.config_updates.get(pkg.name, ())
    if changed:
        return any(fnmatch.fnmatchcase(key, glob) for key in changed for glob in pkg.config_interrupt_keys)
    return pkg.interrupt


def _judge(cr: PackageCr, annotations: Mapping[str, Any]) -> tuple[list[PackageStatus], list[str], bool]:
    """Rows for the CR's spec packages, what is missing, and whether any package failed."""
    state, bad = node_state(annotations, cr.name)
    rows: list[PackageStatus] = []
    waiting: list[str] = []
    failed = False
    if bad is not None:
        waiting.append(bad)
    for pkg in cr.packages.values():
        entry = (state or {}).get(f"{pkg.name}|{pkg.version}")
        entry = entry if isinstance(entry, dict) else None
        stage = entry.get("stage") if entry else None
        st = entry.get("state") if entry else None
        stage = stage if isinstance(stage, str) else None
        st = st if isinstance(st, str) else None
        if entry is None and pkg.uninstall_enabled and pkg.uninstall_apply:
            rows.append(PackageStatus(cr.ref, pkg.name, pkg.version, None, None, True))  # uninstalled
            continue
        want = "post-interrupt" if _has_interrupt(cr, pkg) else "config"
        done = st == "complete" and stage == want
        if stage in ("uninstall", "uninstall-interrupt"):
            done = False
        rows.append(PackageStatus(cr.ref, pkg.name, pkg.version, stage, st, done))
        if st == "erroring":
            failed = True
        if not done:
            waiting.append(
                f"{cr.ref}: {pkg.name} {pkg.version} stage {stage or '-'} state {st or 'absent'}"
                + (f" (needs {want} complete)" if st == "complete" else "")
            )
    if waiting and (cr.paused or cr.disabled):
        waiting.append(
            f"{cr.ref} is {'paused' if cr.paused else 'disabled'}: it will not progress until resumed"
        )
    return rows, waiting, failed


def decide(
    *,
    node: Mapping[str, Any],
    attestation: AttestationView | None,
    crs: Sequence[PackageCr],
    now: datetime,
    stability_window: timedelta,
    attestation_lifetime: timedelta | None,
    complete_since: datetime | None,
) -> Decision:
    meta = _obj(node, "metadata")
    labels, annotations = _obj(meta, "labels"), _obj(meta, "annotations")

    mirrored = {cr.mirrored_from for cr in crs if cr.mirrored_from}
    rows: list[PackageStatus] = []
    waiting: list[str] = []
    failed = False
    for cr in crs:
        if cr.group == "skyhook.nvidia.com" and cr.name in mirrored:
            continue  # its NodeWright mirror is judged instead
        if not selector_matches(cr.selector, labels):
            continue
        r, w, f = _judge(cr, annotations)
        rows += r
        waiting += w
        failed = failed or f
    all_done = not waiting
    since = (complete_since or now) if all_done else None
    requeue: list[datetime] = []

    reason: Reason | None
    if attestation is not None and (
        attestation.revoked
        or (attestation.expires_at is not None and attestation.expires_at <= now)
        or (
            attestation_lifetime is not None
            and attestation.attested_at is not None
            and attestation.attested_at + attestation_lifetime <= now
        )
    ):
        reason = "quarantined"
        why = "revoked" if attestation.revoked else "expired or older than its lifetime"
        waiting.insert(0, f"attestation {why}: the node must join again")
    elif attestation is None or attestation.attested_at is None or attestation.expires_at is None:
        reason = "unattested"
        waiting.insert(0, "no valid attestation: the node has not joined through nodegate")
    else:
        ends = [attestation.expires_at]
        if attestation_lifetime is not None:
            ends.append(attestation.attested_at + attestation_lifetime)
        requeue.append(min(ends))
        if failed:
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
    )


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
