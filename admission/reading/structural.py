"""Reading a NodeWright / Skyhook CR and applying its structural rules, in one pass over the dict.

The API server hands the webhook objects that already passed the CRD's schema, so nearly every
field has exactly the type the pydantic models of :mod:`admission.reading.crs` declare. The reader takes
such values as they are and gives up (NotCanonical) at the first one it does not: another type,
null where a model has no None, a snake_case field name that populate_by_name would accept. Then
pydantic validates, with its coercions and its error messages, and the reader reads the validated
model's dump. Either way the rules see what the models hold; unknown fields stay in ``raw``.

While reading, it applies the structural rules: exactly the checks NodeWright's own validating
webhook makes without looking at the cluster (budget shape, selectors, package names, config
interrupts, versions, resources, uninstall, durations, the dependency graph, and for
nodewright.nvidia.com image references; one module of :mod:`admission.reading.checks` per part of the
spec), so a CR is walked once. Each violation carries the rank of its rule
(:mod:`admission.reading.checks.ranks`); a stable sort by rank gives NodeWright's order of checking.
"""

from __future__ import annotations

from collections.abc import Mapping
from operator import itemgetter
from typing import Any

from admission.reading.checks.budget import read_budget
from admission.reading.checks.dependencies import dependency_rules
from admission.reading.checks.durations import drain_rules
from admission.reading.checks.interrupts import INTERRUPT_TYPE_SET
from admission.reading.checks.package import read_package
from admission.reading.checks.ranks import Found
from admission.reading.checks.selector import read_selector
from admission.reading.checks.tolerations import read_tolerations
from admission.reading.checks.values import ABSENT, NO_MAP, Names, NotCanonical, aliased, str_map
from admission.reading.crs import (
    PACKAGE_GROUPS,
    CrView,
    DrainConfig,
    EnvVar,
    Package,
    PackageCR,
    PackageSpec,
    PackageView,
    Resources,
    Selector,
    parse_package_cr,
)
from admission.violations import Violation

__all__ = [  # re-exported
    "INTERRUPT_TYPE_SET",
    "NotCanonical",
    "as_view",
    "read_package_cr",
    "structural_violations",
    "view_of",
]

_KINDS = frozenset(PACKAGE_GROUPS.values())

# In input, a snake_case name may set a field (populate_by_name); in a model's dump every field
# is under its alias, and such a name can only be an unknown field, kept as is.
_INPUT = Names(
    aliased(PackageCR),
    aliased(PackageSpec),
    aliased(Package),
    aliased(Selector),
    aliased(Resources),
    aliased(EnvVar),
    aliased(DrainConfig),
)
_DUMP = Names(*(frozenset[str]() for _ in _INPUT))
_rank = itemgetter(0)


def read_package_cr(obj: Mapping[str, Any]) -> CrView | list[Violation]:
    """What :func:`~admission.reading.crs.parse_package_cr` accepts, as a view; its violations where it
    refuses."""
    group = str(obj.get("apiVersion", "")).split("/", 1)[0]
    if PACKAGE_GROUPS.get(group) == obj.get("kind"):
        try:
            return _read(obj, _INPUT)
        except NotCanonical:
            pass
    parsed = parse_package_cr(obj)
    return parsed if isinstance(parsed, list) else view_of(parsed)


def view_of(cr: PackageCR) -> CrView:
    """The view of a validated model (its dump has the models' types throughout)."""
    return _read(cr.model_dump(by_alias=True), _DUMP)


def as_view(cr: PackageCR | CrView) -> CrView:
    """The view of a model, or the view itself (the public rules take either)."""
    return cr if isinstance(cr, CrView) else view_of(cr)


def structural_violations(cr: PackageCR | CrView) -> list[Violation]:
    """Every structural violation, rule by rule in NodeWright's order, each rule in package order."""
    view = as_view(cr)
    return [v for _, v in view.found] if view.found else []


def _pods_and_drain(pods: Any, drain: Any, names: Names, found: Found, nodewright: bool) -> None:
    """podNonInterruptLabels and drainConfig, which only NodeWright's webhook checks (Skyhook's
    never did): read for their types either way."""
    read_selector(pods, names.selector, found, "spec.podNonInterruptLabels", nodewright)
    if drain is not None and (type(drain) is not dict or not names.drain.isdisjoint(drain)):
        raise NotCanonical
    drain_rules(drain, found, nodewright)


def _metadata(meta: Any) -> tuple[str, Mapping[str, str]]:
    """The name and annotations."""
    if meta is ABSENT:
        return "", NO_MAP
    if type(meta) is not dict:
        raise NotCanonical
    name = meta.get("name", "")
    if type(name) is not str:
        raise NotCanonical
    ann = meta.get("annotations", ABSENT)
    return name, (NO_MAP if ann is ABSENT else str_map(ann))


def _read(obj: Any, names: Names) -> CrView:
    """The view of a package CR whose values all have the models' types; NotCanonical otherwise.
    Fields that are absent (or null where that means absent) are not handed to their readers: on
    every review, a call saved per field counts."""
    if type(obj) is not dict or not names.cr.isdisjoint(obj):
        raise NotCanonical
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if type(api_version) is not str or type(kind) is not str or kind not in _KINDS:
        raise NotCanonical
    name, annotations = _metadata(obj.get("metadata", ABSENT))
    raw_spec = obj.get("spec")
    if raw_spec is None:
        if "spec" in obj:
            raise NotCanonical  # null is not a spec
        get = NO_MAP.get
    elif type(raw_spec) is not dict or not names.spec.isdisjoint(raw_spec):
        raise NotCanonical
    else:
        get = raw_spec.get
    found: Found = []
    nodewright = kind == "NodeWright"
    deployment_policy = get("deploymentPolicy")
    if deployment_policy is not None and type(deployment_policy) is not str:
        raise NotCanonical
    raw_budget = get("interruptionBudget")
    budget = None if raw_budget is None else read_budget(raw_budget, deployment_policy, found)
    raw_selector = get("nodeSelectors")
    labels, expressions = (
        (NO_MAP, ()) if raw_selector is None else read_selector(raw_selector, names.selector, found)
    )
    pods, drain = get("podNonInterruptLabels"), get("drainConfig")
    if pods is not None or drain is not None:
        _pods_and_drain(pods, drain, names, found, nodewright)
    packages_raw = get("packages", ABSENT)
    packages: list[PackageView] = []
    by_key: dict[str, PackageView] = {}
    kinds: set[str] = set()
    depends = False
    if packages_raw is not ABSENT:
        if type(packages_raw) is not dict:
            raise NotCanonical
        for key, raw in packages_raw.items():
            view = read_package(key, raw, names, kinds, found, nodewright)
            packages.append(view)
            by_key[key] = view
            if view.depends_on:
                depends = True
    cycle = dependency_rules(packages, by_key, found) if depends else ()
    raw_tolerations = get("additionalTolerations", ABSENT)
    tolerations = () if raw_tolerations is ABSENT else read_tolerations(raw_tolerations)
    priority, runtime_required, auto_taint = (
        get("priority", 200),
        get("runtimeRequired", False),
        get("autoTaintNewNodes", False),
    )
    if type(priority) is not int or type(runtime_required) is not bool or type(auto_taint) is not bool:
        raise NotCanonical
    if len(found) > 1:
        found.sort(key=_rank)
    return CrView(
        api_version,
        kind,
        name,
        annotations,
        raw_spec,
        labels,
        expressions,
        budget,
        deployment_policy,
        tuple(packages),
        by_key,
        tolerations,
        runtime_required,
        auto_taint,
        priority,
        frozenset(kinds),
        tuple(found) if found else (),
        cycle,
        api_version.partition("/")[0],
    )
