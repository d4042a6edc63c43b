"""What NodeWright (formerly Skyhook) writes, read the way the gate needs it: pure, no I/O, no clock.

- The package CRs of both API groups (``nodewright.nvidia.com/NodeWright``, ``skyhook.nvidia.com/
  Skyhook``): their spec (selector, packages, tolerations) and, indexed per node once per CR update,
  what the operator reports in the CR's status with its own credentials: ``status.nodeState[node]``
  (package ``name|version`` -> stage and state) and ``status.nodeStatus[node]`` (``blocked`` ...).
- The Node's ``<prefix>/nodeState_<cr>`` annotation (both prefixes, the new one first), which the
  node's kubelet may rewrite: only checked against the operator's report, never trusted alone.
- NodeWright's completion rule (docs/gate.md, "What decides") and why a CR cannot progress on a node
  (blocked: an untolerated taint, the ignore label), as NodeWright's node picker decides it.
"""

from __future__ import annotations

import fnmatch
import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from admission.hold.holdtolerations import PACKAGE_HOLD_VALUES, missing_hold_tolerations
from bootstrap.gate.mirror import mirror_claim, spec_key

GROUPS = {"nodewright.nvidia.com": "NodeWright", "skyhook.nvidia.com": "Skyhook"}
PREFIXES = ("nodewright.nvidia.com", "skyhook.nvidia.com")  # node annotations: the new one first
MAX_FIELD = 256  # one string of a status.packages entry
MAX_ANNOTATION = 256 * 1024  # the API server's limit for all of an object's annotations
MAX_LINE = 512  # one line of what a node waits for
HOLD_VALUES_FOR_PACKAGES = PACKAGE_HOLD_VALUES  # package pods may run there
_CONDITIONS = ("TaintNotTolerable", "NodesIgnored")  # the CR conditions that explain "blocked"
# Tolerations upstream's node picker always adds (cluster_state_v2.go SelectNodes): the cordon, and
# for runtimeRequired CRs the runtime-required taint (default key of v0.15 and of v0.18; a custom
# RUNTIME_REQUIRED_TAINT is not known here, so it may be named as untolerated: wording only).
_CORDON = ("node.kubernetes.io/unschedulable", "Exists", "", "NoSchedule")
_RUNTIME_REQUIRED = tuple((p, "Equal", "runtime-required", "NoSchedule") for p in PREFIXES)

Toleration = tuple[str, str, str, str]  # key, operator, value, effect
Entry = tuple[str | None, str | None]  # (stage, state) of one package on one node
MALFORMED: Entry = (None, "malformed")  # an entry that is not an object: never complete
_ABSENT = object()


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
class NodeReport:
    """What the operator's status says about one node, for the CR's *spec* packages only (in the
    order of ``PackageCr.packages``): a few tuples of shared strings, however big the status."""

    status: str | None  # status.nodeStatus[node]
    entries: tuple[Entry | None, ...] | None  # None: no status.nodeState entry for the node


@dataclass(frozen=True, slots=True)
class PackageCr:
    group: str
    name: str
    selector: Mapping[str, Any]
    packages: Mapping[str, PackageSpec]
    paused: bool
    disabled: bool
    config_updates: Mapping[str, tuple[str, ...]]
    # A NodeWright's claim to mirror the Skyhook of its own name, when it has the shape upstream's
    # mirror writes (mirror.py decides whether it is honoured: same spec).
    mirrored_from: str | None
    tolerations: tuple[Toleration, ...] = ()
    runtime_required: bool = False
    conditions: tuple[tuple[str, str], ...] = ()  # (type, message) of those True in _CONDITIONS
    spec: Any = None  # the spec as the operator holds it (mirror.spec_key); compared
    # Per node, indexed once per CR update. Not part of equality: two parses that differ only here
    # change only the nodes whose report changed (the cache compares reports node by node).
    reports: Mapping[str, NodeReport] = field(default_factory=dict, compare=False)

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


def _word(value: object) -> str | None:
    # Stages and states come from a small vocabulary: interned, ten thousand nodes share them.
    return sys.intern(value[:MAX_FIELD]) if isinstance(value, str) else None


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _tolerations(raw: object) -> tuple[Toleration, ...]:
    if not isinstance(raw, list):
        return ()
    return tuple(
        (_text(t.get("key")), _text(t.get("operator")), _text(t.get("value")), _text(t.get("effect")))
        for t in raw
        if isinstance(t, Mapping)
    )


def _conditions(status: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    raw = status.get("conditions")
    out: list[tuple[str, str]] = []
    for c in raw if isinstance(raw, list) else ():
        if not isinstance(c, Mapping) or c.get("status") != "True":
            continue
        kind = str(c.get("type", "")).rsplit("/", 1)[-1]  # also the legacy mirror <prefix>/<Type>
        if kind in _CONDITIONS and kind not in (k for k, _ in out):
            out.append((kind, str(c.get("message", ""))[:MAX_LINE]))
    return tuple(out)


def index_reports(status: Mapping[str, Any], packages: Sequence[PackageSpec]) -> dict[str, NodeReport]:
    """``status.nodeState`` and ``status.nodeStatus`` per node, reduced to the spec packages'
    (stage, state). Equal entries and equal reports are one object each: most nodes of a big CR
    report the same, and a CR update re-indexes thousands of nodes (kept to a few dict lookups per
    node and package)."""
    states, statuses = _obj(status, "nodeState"), _obj(status, "nodeStatus")
    keys = [f"{p.name}|{p.version}" for p in packages]
    entries_seen: dict[tuple[object, object], Entry] = {}
    reports_seen: dict[tuple[object, tuple[Entry | None, ...] | None], NodeReport] = {}

    def entry(value: object) -> Entry | None:
        if value is _ABSENT:
            return None
        if not isinstance(value, Mapping):
            return MALFORMED
        raw = (value.get("stage"), value.get("state"))
        if not all(isinstance(x, str | None) for x in raw):  # a list is unhashable: not shared
            return (_word(raw[0]), _word(raw[1]))
        found = entries_seen.get(raw)
        if found is None:
            found = entries_seen.setdefault(raw, (_word(raw[0]), _word(raw[1])))
        return found

    out: dict[str, NodeReport] = {}
    for node in states.keys() | statuses.keys():
        raw_state = states.get(node)
        entries: tuple[Entry | None, ...] | None = None
        if isinstance(raw_state, Mapping):
            entries = tuple(entry(raw_state.get(k, _ABSENT)) for k in keys)
        elif raw_state is not None:
            entries = tuple(MALFORMED for _ in keys)
        node_status = statuses.get(node)
        seen = (node_status if isinstance(node_status, str) else None, entries)
        report = reports_seen.get(seen)
        if report is None:
            report = reports_seen[seen] = NodeReport(_word(node_status), entries)
        out[str(node)] = report
    return out


def _entry(value: object) -> Entry:
    if not isinstance(value, Mapping):
        return MALFORMED
    return (_word(value.get("stage")), _word(value.get("state")))


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
    return PackageCr(
        group=group,
        name=name,
        selector=selector,
        packages=packages,
        paused=_flag(annotations, "pause"),
        disabled=_flag(annotations, "disable"),
        config_updates=updates,
        mirrored_from=mirror_claim(group, name, annotations),
        tolerations=_tolerations(spec.get("additionalTolerations")),
        runtime_required=spec.get("runtimeRequired") is True,
        conditions=_conditions(status),
        reports=index_reports(status, list(packages.values())),
        spec=spec_key(spec, group),
    )


def node_state(annotations: Mapping[str, Any], cr_name: str) -> tuple[dict[str, Any] | None, str | None]:
    """The node's ``nodeState_<cr>`` annotation: (state, None), (None, None) when absent, or
    (None, why) when malformed. The new prefix wins over the legacy one."""
    for prefix in PREFIXES:
        raw = annotations.get(f"{prefix}/nodeState_{cr_name}")
        if raw is None:
            continue
        try:
            state = json.loads(raw) if isinstance(raw, str) and len(raw) <= MAX_ANNOTATION else None
        except ValueError:
            state = None
        if not isinstance(state, dict):
            return None, f"{prefix}/nodeState_{cr_name} is malformed"
        return state, None
    return None, None


def tolerates(toleration: Toleration, taint: Mapping[str, Any]) -> bool:
    """core/v1 Toleration.ToleratesTaint."""
    key, op, value, effect = toleration
    if effect and effect != taint.get("effect"):
        return False
    if key and key != taint.get("key"):
        return False
    if op == "Exists":
        return True
    return op in ("", "Equal") and value == (taint.get("value") or "")


def untolerated(cr: PackageCr, taints: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The node's taints that the CR's package pods do not tolerate, by upstream's node picker
    (every taint counts, PreferNoSchedule too): such a node is ``blocked`` (TaintNotTolerable)."""
    tolerations = (_CORDON, *cr.tolerations, *(_RUNTIME_REQUIRED if cr.runtime_required else ()))
    return [t for t in taints if not any(tolerates(tol, t) for tol in tolerations)]


def show_taint(taint: Mapping[str, Any]) -> str:
    value = taint.get("value")
    return f"{taint.get('key')}{'=' + str(value) if value else ''}:{taint.get('effect')}"


@dataclass(frozen=True, slots=True)
class PackageStatus:
    cr: str
    package: str
    version: str
    stage: str | None
    state: str | None
    complete: bool

    def to_json(self) -> dict[str, Any]:
        # Clipped: an over-long status would be refused by the CRD's schema (the node stays held,
        # but its status would stop updating).
        return {
            "cr": self.cr[:MAX_FIELD],
            "package": self.package[:MAX_FIELD],
            "version": self.version[:MAX_FIELD],
            "stage": self.stage[:MAX_FIELD] if self.stage is not None else None,
            "state": self.state[:MAX_FIELD] if self.state is not None else None,
            "complete": self.complete,
        }


@dataclass(frozen=True, slots=True)
class NodeView:
    """The parts of a Node the package rule reads."""

    name: str
    labels: Mapping[str, Any]
    annotations: Mapping[str, Any]
    taints: tuple[Mapping[str, Any], ...]
    hold_key: str  # the gate's own taint key


def _has_interrupt(cr: PackageCr, pkg: PackageSpec) -> bool:
    changed = cr.config_updates.get(pkg.name, ())
    if changed:
        return any(fnmatch.fnmatchcase(key, glob) for key in changed for glob in pkg.config_interrupt_keys)
    return pkg.interrupt


def _annotated(state: Mapping[str, Any] | None, pkg: PackageSpec) -> Entry | None:
    key = f"{pkg.name}|{pkg.version}"
    if state is None or key not in state:
        return None
    return _entry(state[key])


def _show(entry: Entry | None) -> str:
    if entry is None:
        return "absent"
    return "/".join(x for x in entry if x) or "empty"


def judge(cr: PackageCr, node: NodeView) -> tuple[list[PackageStatus], list[str], bool]:
    """Rows for the CR's spec packages by the operator's report, what the node still waits for,
    and whether a package failed. The node's annotation must agree with the report."""
    report = cr.reports.get(node.name)
    entries = report.entries if report is not None else None
    annotation, bad = node_state(node.annotations, cr.name)
    rows: list[PackageStatus] = []
    pending: list[str] = []
    disagree: list[str] = []
    failed = False
    for i, pkg in enumerate(cr.packages.values()):
        entry = entries[i] if entries is not None and i < len(entries) else None
        seen = _annotated(annotation, pkg)
        if bad is None and seen != entry:
            disagree.append(f"{pkg.name} {pkg.version}: node {_show(seen)}, operator {_show(entry)}")
        stage, state = entry if entry is not None else (None, None)
        if entry is None and pkg.uninstall_enabled and pkg.uninstall_apply:
            rows.append(PackageStatus(cr.ref, pkg.name, pkg.version, None, None, True))  # uninstalled
            continue
        want = "post-interrupt" if _has_interrupt(cr, pkg) else "config"
        done = state == "complete" and stage == want
        rows.append(PackageStatus(cr.ref, pkg.name, pkg.version, stage, state, done))
        failed = failed or state == "erroring"
        if not done:
            pending.append(
                f"{cr.ref}: {pkg.name} {pkg.version} stage {stage or '-'} state {state or 'absent'}"
                + (f" (needs {want} complete)" if state == "complete" else "")
            )
    waiting: list[str] = []
    if pending:
        why = blocked(cr, node, report)
        if why is not None:
            waiting.append(why)
        if entries is None:
            waiting.append(
                f"{cr.ref}: NodeWright has not reported this node in the CR's status.nodeState yet"
            )
    if bad is not None:
        waiting.append(f"{cr.ref}: {bad}; held until it agrees with the CR's status.nodeState")
    elif disagree:
        more = f" and {len(disagree) - 3} more" if len(disagree) > 3 else ""
        waiting.append(
            f"{cr.ref}: the node's nodeState annotation disagrees with the operator's status.nodeState "
            f"({'; '.join(disagree[:3])}{more}); held until they agree"
        )
    waiting += pending
    if pending and (cr.paused or cr.disabled):
        waiting.append(
            f"{cr.ref} is {'paused' if cr.paused else 'disabled'}: it will not progress until resumed"
        )
    return rows, [w[:MAX_LINE] for w in waiting], failed


def blocked(cr: PackageCr, node: NodeView, report: NodeReport | None) -> str | None:
    """Why NodeWright cannot progress the CR on the node (the CR, the cause, the fix), or None.
    Upstream marks such a node ``blocked`` only when it comes up in a rollout batch; the cause is
    computed here the way its node picker does, so the gate says so before that too."""
    reported = report is not None and report.status == "blocked"
    # One wording whether or not the operator reports the node blocked right now: the real operator
    # flips status_<cr> between waiting and blocked on every reconcile while a held node waits for
    # another CR (docs/gate.md, "The real operator's hot loop"), and a message that followed it
    # would be rewritten as often. The cause computed here does not flip.
    verb = "cannot schedule its package pods here"
    ignore = next((f"{p}/ignore" for p in PREFIXES if node.labels.get(f"{p}/ignore") == "true"), None)
    if ignore is not None:
        return (
            f"{cr.ref}: NodeWright {verb} (NodesIgnored): the node has label {ignore}=true; "
            f"fix: remove it (kubectl label node {node.name} {ignore}-)"
        )
    taints = untolerated(cr, node.taints)
    hold = [t for t in taints if t.get("key") == node.hold_key]
    others = [t for t in taints if t.get("key") != node.hold_key]
    # Held for packages: both package hold values, since a failed package turns one into the other.
    held_for_packages = any(
        t.get("key") == node.hold_key and t.get("value") in HOLD_VALUES_FOR_PACKAGES for t in node.taints
    )
    have = [dict(zip(("key", "operator", "value", "effect"), t, strict=True)) for t in cr.tolerations]
    missing = missing_hold_tolerations(have, node.hold_key) if held_for_packages else []
    fixes: list[str] = []
    if others:
        fixes.append(
            f"tolerate {', '.join(show_taint(t) for t in others)} in the CR's spec.additionalTolerations "
            "or remove it from the node"
        )
    if missing:
        fixes.append(
            f"add to spec.additionalTolerations (operator Equal): {', '.join(map(show_taint, missing))}; "
            "nodewright.inject_tolerations adds them on a spec change"
        )
    elif hold:
        fixes.append("none needed: package pods wait until the node is attested (then the hold changes)")
    if taints or missing:
        shown = ", ".join(show_taint(t) for t in taints or missing)
        return (
            f"{cr.ref}: NodeWright {verb} (TaintNotTolerable): its package pods do not tolerate "
            f"{shown}; fix: {'; '.join(fixes)}"
        )
    if not reported:
        return None
    said = "; ".join(f"{kind}: {message}" for kind, message in cr.conditions)
    return (
        f"{cr.ref}: NodeWright reports the node blocked{f' ({said})' if said else ''}; "
        f"fix: see the CR's status.conditions (kubectl describe {GROUPS[cr.group].lower()} {cr.name})"
    )


# What blocked() wrote, read back from a gate message (for `kubectl nodegate status`): "<group>/<cr>:
# NodeWright <verb> (<cause>): <detail>; fix: ...", shown cause first, before the packages it keeps
# from starting ("not started").
_BLOCKED = re.compile(
    r"([a-z0-9.-]+/[^ ;:]+): NodeWright (?:reports the node blocked|cannot schedule its package pods here)"
    r"(?: \(([^);]*)\))?(?:: ([^;]*))?"
)


def blocked_causes(message: str) -> list[str]:
    out: list[str] = []
    for ref, cause, said in _BLOCKED.findall(message):
        detail = said.replace("its package pods do not tolerate ", "does not tolerate ")
        out.append(f"blocked ({cause or 'NodeWright'}): {ref}" + (f": {detail}" if detail else ""))
    return out
