"""UPDATEs of package CRs: whether a change matters, which packages it would reboot, and
NodeWright's uninstall rules, which read the old object's spec and its ``status.nodeState``.

A DELETE asks nothing of them: NodeWright's finalizer holds a CR until its pending uninstalls ran
(who may delete is :mod:`admission.hold.removals`'s and the decider's).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from admission.reading.crs import PACKAGE_GROUPS, CrView, PackageCR
from admission.reading.godecode import canonical_package, same_spec
from admission.reading.structural import as_view
from admission.syntax.versions import compare
from admission.violations import Violation

# The annotations that pause or disable a CR, in both API groups.
GATES = tuple(f"{g}/{k}" for g in PACKAGE_GROUPS for k in ("pause", "disable"))


def gates(obj: Mapping[str, Any] | None) -> tuple[Any, ...]:
    """The pause/disable annotations of an object, as given."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    ann = meta.get("annotations") if isinstance(meta, Mapping) else None
    if not isinstance(ann, Mapping) or not ann:
        return ()
    found = tuple(map(ann.get, GATES))
    return () if found == (None,) * len(GATES) else found


# NodeWright's mirror controller stamps the NodeWright it copies from a Skyhook with this claim;
# the gate then judges the NodeWright instead of the Skyhook (bootstrap/gate/mirror.py).
MIRRORED_FROM = "nodewright.nvidia.com/mirrored-from"
_NODEWRIGHT = "nodewright.nvidia.com"


def mirror_claim(obj: Mapping[str, Any] | None) -> object:
    """A NodeWright's ``mirrored-from`` annotation, as given (None: none; a Skyhook's is not read)."""
    # Objects from the review's JSON are dicts: tested as such first (no ABC check on this path).
    if (type(obj) is not dict and not isinstance(obj, Mapping)) or group_of(obj) != _NODEWRIGHT:
        return None
    meta = obj.get("metadata")
    ann = meta.get("annotations") if type(meta) is dict or isinstance(meta, Mapping) else None
    return ann.get(MIRRORED_FROM) if type(ann) is dict or isinstance(ann, Mapping) else None


def claims_mirror(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether the request adds or changes a ``mirrored-from`` claim. The claim stands the named
    Skyhook down in the gate, so it needs the rights of both CRs: the gate honours it only for a
    NodeWright of the Skyhook's name and spec, whose pools and reboots are the NodeWright's own, so
    the NodeWright is judged as if new (every limit, ``deploy``, and ``reboot`` for every reboot
    package). Removing a claim only makes the gate judge more: no rights needed."""
    claim = mirror_claim(new)
    return claim is not None and claim != mirror_claim(old)


def stray_claim(obj: Mapping[str, Any]) -> str | None:
    """A warning for a ``mirrored-from`` claim that names another object than the NodeWright
    itself: upstream's mirror never writes one (it backs off from such a target), and the gate
    ignores it."""
    claim = mirror_claim(obj)
    if claim is None:
        return None
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if claim == name:
        return None
    return (
        f"{MIRRORED_FROM}: {str(claim)[:253]!r} is not this NodeWright's name; NodeWright's mirror "
        "names the Skyhook it copied, which has the same name. nodegate's gate ignores this claim"
    )


def group_of(obj: Mapping[str, Any]) -> str:
    api_version = obj.get("apiVersion", "")
    return (api_version if type(api_version) is str else str(api_version)).partition("/")[0]


def unchanged(old: Mapping[str, Any], new: Mapping[str, Any]) -> tuple[bool, bool]:
    """(spec the same to the operator, pause/disable annotations the same), from the objects as
    given: nothing is read or checked before this answer."""
    return same_spec(old.get("spec"), new.get("spec"), group_of(new)), gates(old) == gates(new)


def uninstalls(obj: Mapping[str, Any]) -> bool:
    """Whether some package of the object (as given) has ``uninstall.enabled``: the uninstall
    rules then need its old state."""
    spec = obj.get("spec")
    packages = spec.get("packages") if isinstance(spec, Mapping) else None
    if not isinstance(packages, Mapping):
        return False
    for pkg in packages.values():
        uninstall = pkg.get("uninstall") if isinstance(pkg, Mapping) else None
        if isinstance(uninstall, Mapping) and uninstall.get("enabled"):
            return True
    return False


def spec_changed(old: PackageCR | CrView, new: PackageCR | CrView) -> bool:
    """Whether anything the operator acts on changed (spec, pause/disable annotations)."""
    a, b = as_view(old), as_view(new)
    if tuple(map(a.annotations.get, GATES)) != tuple(map(b.annotations.get, GATES)):
        return True
    return not same_spec(a.raw_spec, b.raw_spec, b.group)


def same_selector(a: CrView, b: CrView) -> bool:
    """Whether two CRs select the same nodes by the same words (labels as a map, expressions in
    order: a reordering counts as a change, which only asks for more rights)."""
    return dict(a.match_labels) == dict(b.match_labels) and a.match_expressions == b.match_expressions


def new_reboots(old: PackageCR | CrView | None, new: PackageCR | CrView) -> list[str]:
    """Packages whose reboot interrupt this change would fire: packages with a reboot interrupt
    that are new, or differ in anything the operator reads from before (a version bump re-runs
    and reboots); after a change of ``nodeSelectors`` every one of them, since the CR now reboots
    nodes it did not select before (moving a CR to another pool needs ``reboot`` there)."""
    view = as_view(new)
    if not view.reboot:
        return []
    prior_view = None if old is None else as_view(old)
    before = {} if prior_view is None or not same_selector(prior_view, view) else prior_view.by_key
    out = []
    for pkg in view.packages:
        if pkg.reboot:
            prior = before.get(pkg.key)
            if prior is None or (
                prior.raw != pkg.raw
                and canonical_package(pkg.key, prior.raw, view.group)
                != canonical_package(pkg.key, pkg.raw, view.group)
            ):
                out.append(pkg.key)
    return out


def _installed(old: Mapping[str, Any]) -> set[str] | None:
    """The ``name|version`` entries of ``status.nodeState`` on any node (None: unreadable)."""
    status = old.get("status")
    if status is None:
        return set()
    if not isinstance(status, Mapping):
        return None
    node_state = status.get("nodeState")
    if node_state is None:
        return set()
    if not isinstance(node_state, Mapping):
        return None
    found: set[str] = set()
    for states in node_state.values():
        if states is None:
            continue
        if not isinstance(states, Mapping):
            return None
        found.update(states)
    return found


def update_rules(old_obj: Mapping[str, Any], old: CrView, new: CrView) -> tuple[list[Violation], list[str]]:
    """NodeWright's uninstall rules: (violations, warnings).

    A package with ``uninstall.enabled`` is uninstalled on a node when its ``name|version`` is
    gone from that node's ``status.nodeState`` (no nodes at all counts as uninstalled). It may be
    removed from the spec, or moved to an older version, only once it is uninstalled everywhere,
    and the downgrade only after ``uninstall.apply`` was set. Switching ``apply`` off again is a
    warning. A state that cannot be read counts as not uninstalled (fail closed)."""
    violations: list[Violation] = []
    warnings: list[str] = []
    installed: set[str] | None = None
    read = False
    for key, before in old.by_key.items():
        if before.uninstall is None or not before.uninstall[0]:
            continue
        applying = before.uninstall[1]
        after = new.by_key.get(key)
        downgrade = (
            after is not None
            and before.version is not None
            and after.version is not None
            and after.version != before.version
            and compare(after.version, before.version) == -1
        )
        if after is None or downgrade:
            if not read:
                installed, read = _installed(old_obj), True
            pending = installed is None or f"{key}|{before.version}" in installed
            found = _uninstall_violation(key, removed=after is None, applying=applying, pending=pending)
            if found is not None:
                violations.append(found)
        if after is not None and applying and not (after.uninstall is not None and all(after.uninstall)):
            warnings.append(
                f"package {key}: uninstall cancelled; nodes where it completed will install it again"
            )
    return violations, warnings


def _uninstall_violation(key: str, *, removed: bool, applying: bool, pending: bool) -> Violation | None:
    if removed:
        if not pending:
            return None
        return Violation(
            "uninstall-pending",
            f"spec.packages.{key}",
            f"{key} has uninstall.enabled and is not yet uninstalled on every node",
            "set uninstall.apply: true, wait until it is uninstalled, then remove it",
        )
    if not applying:
        return Violation(
            "uninstall-pending",
            f"spec.packages.{key}.version",
            f"downgrade of {key} (uninstall.enabled) before its uninstall",
            "set uninstall.apply: true first, wait until it is uninstalled, then change the version",
        )
    if pending:
        return Violation(
            "uninstall-pending",
            f"spec.packages.{key}.version",
            f"downgrade of {key} before its uninstall completed on every node",
            "wait until the uninstall finished, then change the version",
        )
    return None
