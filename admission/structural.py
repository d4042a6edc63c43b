"""Reading a NodeWright / Skyhook CR and applying its structural rules, in one pass over the dict.

The API server hands the webhook objects that already passed the CRD's schema, so nearly every
field has exactly the type the pydantic models of :mod:`admission.crs` declare. The reader takes
such values as they are and gives up (NotCanonical) at the first one it does not: another type,
null where a model has no None, a snake_case field name that populate_by_name would accept. Then
pydantic validates, with its coercions and its error messages, and the reader reads the validated
model's dump. Either way the rules see what the models hold; unknown fields stay in ``raw``.

While reading, it applies the structural rules that hold for every CR whatever the policy (names,
semver, tags, digests, the dependency graph, resources, uninstall, interrupts, budget shape,
tolerations, selectors), so a CR is walked once. Each violation carries the rank of its rule;
a stable sort by rank gives the order of checking the rules one after the other.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal
from functools import lru_cache
from operator import itemgetter
from types import MappingProxyType
from typing import Any, NamedTuple

from pydantic import BaseModel

from admission.crs import (
    PACKAGE_GROUPS,
    CrView,
    EnvVar,
    Package,
    PackageCR,
    PackageSpec,
    PackageView,
    Resources,
    Selector,
    parse_package_cr,
)
from admission.images import DIGEST_RE, ImageError, parse_image
from admission.policy import INTERRUPT_TYPES
from admission.quantity import parse_quantity
from admission.violations import Violation

# The structural rules in the order a decision lists them (the hold-taint toleration, last,
# depends on the webhook's taint key and is applied by admission.rules).
SELECTOR, PACKAGE_NAME, SEMVER, IMAGE, DEPENDS_ON, RESOURCES, UNINSTALL, INTERRUPTS, BUDGET, TOLERATIONS = (
    range(10)
)

_NAME_RE = re.compile(r"^[a-z][-a-z0-9]{0,41}[a-z]$")
# semver.org's regular expression: no "v" prefix, no shorthand versions.
_SEMVER_RE = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)
INTERRUPT_TYPE_SET = frozenset(INTERRUPT_TYPES)
_KINDS = frozenset(PACKAGE_GROUPS.values())
_OPERATORS = {"In": True, "NotIn": True, "Exists": False, "DoesNotExist": False}  # needs values?
_RESOURCE_FIELDS = ("cpuRequest", "cpuLimit", "memoryRequest", "memoryLimit")


class NotCanonical(Exception):
    """A value the reader does not take as is: pydantic decides instead."""


_ABSENT: Any = object()
_NO_MAP: Mapping[str, str] = MappingProxyType({})  # the shared value of an absent map


def _aliased(model: type[BaseModel]) -> frozenset[str]:
    """The field names that differ from their alias (populate_by_name accepts both)."""
    return frozenset(n for n, f in model.model_fields.items() if f.alias is not None and f.alias != n)


class _Names(NamedTuple):
    """Per model, the field names a dict must not use for the reader to take it as is."""

    cr: frozenset[str]
    spec: frozenset[str]
    package: frozenset[str]
    selector: frozenset[str]
    resources: frozenset[str]
    env: frozenset[str]


# In input, a snake_case name may set a field (populate_by_name); in a model's dump every field
# is under its alias, and such a name can only be an unknown field, kept as is.
_INPUT = _Names(
    _aliased(PackageCR),
    _aliased(PackageSpec),
    _aliased(Package),
    _aliased(Selector),
    _aliased(Resources),
    _aliased(EnvVar),
)
_DUMP = _Names(*(frozenset[str]() for _ in _INPUT))
_QUANTITY_TYPES = (str, int, float)
_rank = itemgetter(0)


def read_package_cr(obj: Mapping[str, Any]) -> CrView | list[Violation]:
    """What :func:`~admission.crs.parse_package_cr` accepts, as a view; its violations where it
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


# ------------------------------------------------------------------------------------------
# Values


def _opt_str(value: Any) -> str | None:
    if value is None or type(value) is str:
        return value
    raise NotCanonical


def _str_map(value: Any) -> Mapping[str, str]:
    if type(value) is not dict:
        raise NotCanonical
    for k, v in value.items():
        if type(k) is not str or type(v) is not str:
            raise NotCanonical
    return value


def _str_list(value: Any) -> tuple[str, ...]:
    if type(value) is not list:
        raise NotCanonical
    for v in value:
        if type(v) is not str:
            raise NotCanonical
    return tuple(value)


def _flag(obj: Mapping[str, Any], key: str) -> bool:
    value = obj.get(key, False)
    if type(value) is not bool:
        raise NotCanonical
    return value


def _opt_int(value: Any) -> int | None:
    if value is None or type(value) is int:
        return value
    raise NotCanonical


def _interrupt_type(value: Any) -> str:
    if type(value) is not dict:
        raise NotCanonical
    kind = value.get("type")
    if type(kind) is not str:
        raise NotCanonical
    services = value.get("services", _ABSENT)
    if services is not _ABSENT:
        _str_list(services)
    return kind


def _env_value_from(env: Any, names: frozenset[str]) -> tuple[int, ...]:
    """Indices of the entries with valueFrom."""
    if env is _ABSENT:
        return ()
    if type(env) is not list:
        raise NotCanonical
    found = []
    for i, var in enumerate(env):
        if type(var) is not dict or not names.isdisjoint(var) or type(var.get("name")) is not str:
            raise NotCanonical
        _opt_str(var.get("value"))
        source = var.get("valueFrom")
        if source is not None:
            if type(source) is not dict or not all(type(k) is str for k in source):
                raise NotCanonical
            found.append(i)
    return tuple(found)


def _resources(res: Any, names: frozenset[str]) -> tuple[Any, Any, Any, Any] | None:
    if res is None:
        return None
    if type(res) is not dict or not names.isdisjoint(res):
        raise NotCanonical
    values = (res.get("cpuRequest"), res.get("cpuLimit"), res.get("memoryRequest"), res.get("memoryLimit"))
    for q in values:
        if q is not None and type(q) not in _QUANTITY_TYPES:
            raise NotCanonical
    return values


# ------------------------------------------------------------------------------------------
# The CR


def _read(obj: Any, names: _Names) -> CrView:
    """The view of a package CR whose values all have the models' types; NotCanonical otherwise."""
    if type(obj) is not dict or not names.cr.isdisjoint(obj):
        raise NotCanonical
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if type(api_version) is not str or type(kind) is not str or kind not in _KINDS:
        raise NotCanonical
    name, annotations = "", _NO_MAP
    meta = obj.get("metadata", _ABSENT)
    if meta is not _ABSENT:
        if type(meta) is not dict:
            raise NotCanonical
        name = meta.get("name", "")
        if type(name) is not str:
            raise NotCanonical
        ann = meta.get("annotations", _ABSENT)
        if ann is not _ABSENT:
            annotations = _str_map(ann)
    raw_spec = obj.get("spec")
    if raw_spec is None:
        if "spec" in obj:
            raise NotCanonical  # null is not a spec
        spec: Mapping[str, Any] = _NO_MAP
    elif type(raw_spec) is not dict or not names.spec.isdisjoint(raw_spec):
        raise NotCanonical
    else:
        spec = raw_spec
    found: list[tuple[int, Violation]] = []
    labels, expressions = _selector(spec.get("nodeSelectors"), names.selector, found)
    deployment_policy = _opt_str(spec.get("deploymentPolicy"))
    budget = _budget(spec.get("interruptionBudget"), deployment_policy, found)
    packages_raw = spec.get("packages", _ABSENT)
    packages: list[PackageView] = []
    by_key: dict[str, PackageView] = {}
    kinds: set[str] = set()
    depends = False
    if packages_raw is not _ABSENT:
        if type(packages_raw) is not dict:
            raise NotCanonical
        for key, raw in packages_raw.items():
            view = _package(key, raw, names, kinds, found)
            packages.append(view)
            by_key[key] = view
            depends = depends or bool(view.depends_on)
    if depends:
        _dependencies(packages, by_key, found)
    tolerations = _tolerations(spec.get("additionalTolerations", _ABSENT), found)
    priority = spec.get("priority", 200)
    if type(priority) is not int:
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
        _flag(spec, "runtimeRequired"),
        _flag(spec, "autoTaintNewNodes"),
        priority,
        frozenset(kinds),
        tuple(found) if found else (),
    )


def _selector(
    value: Any, names: frozenset[str], found: list[tuple[int, Violation]]
) -> tuple[Mapping[str, str], tuple[tuple[str, str, tuple[str, ...]], ...]]:
    """matchLabels and matchExpressions. The operator parses nodeSelectors as a LabelSelector and
    refuses what does not parse; a selector read differently from the operator would make pool
    containment meaningless (rule "selector")."""
    if value is None:
        return _NO_MAP, ()
    if type(value) is not dict or not names.isdisjoint(value):
        raise NotCanonical
    labels = value.get("matchLabels", _ABSENT)
    exprs = value.get("matchExpressions", _ABSENT)
    requirements: list[tuple[str, str, tuple[str, ...]]] = []
    if exprs is not _ABSENT:
        if type(exprs) is not list:
            raise NotCanonical
        for i, req in enumerate(exprs):
            if type(req) is not dict:
                raise NotCanonical
            key, operator, values = req.get("key"), req.get("operator"), req.get("values", _ABSENT)
            if type(key) is not str or type(operator) is not str:
                raise NotCanonical
            given = () if values is _ABSENT else _str_list(values)
            requirements.append((key, operator, given))
            needs_values = _OPERATORS.get(operator)
            if needs_values is None:
                found.append(
                    (
                        SELECTOR,
                        Violation(
                            "selector",
                            f"spec.nodeSelectors.matchExpressions[{i}].operator",
                            f"unknown operator {operator!r}",
                            "use In, NotIn, Exists or DoesNotExist",
                        ),
                    )
                )
            elif needs_values != bool(given):
                found.append(
                    (
                        SELECTOR,
                        Violation(
                            "selector",
                            f"spec.nodeSelectors.matchExpressions[{i}].values",
                            f"{operator} {'needs' if needs_values else 'takes no'} values",
                            "fix the values",
                        ),
                    )
                )
    return (_NO_MAP if labels is _ABSENT else _str_map(labels)), tuple(requirements)


def _budget(
    value: Any, deployment_policy: str | None, found: list[tuple[int, Violation]]
) -> tuple[int | None, int | None] | None:
    """interruptionBudget: exactly one of percent or count, in range, and not with a
    deploymentPolicy (rule "budget")."""
    if value is None:
        return None
    if type(value) is not dict:
        raise NotCanonical
    percent, count = _opt_int(value.get("percent")), _opt_int(value.get("count"))
    if (percent is None) == (count is None):
        found.append(
            (
                BUDGET,
                Violation(
                    "budget",
                    "spec.interruptionBudget",
                    "set exactly one of percent or count",
                    "keep one of them",
                ),
            )
        )
    if percent is not None and not 0 <= percent <= 100:
        found.append(
            (
                BUDGET,
                Violation(
                    "budget", "spec.interruptionBudget.percent", "percent is outside 0-100", "use 0-100"
                ),
            )
        )
    if count is not None and count < 0:
        found.append(
            (
                BUDGET,
                Violation("budget", "spec.interruptionBudget.count", "count is negative", "use 0 or more"),
            )
        )
    if deployment_policy:
        found.append(
            (
                BUDGET,
                Violation(
                    "budget",
                    "spec.deploymentPolicy",
                    "interruptionBudget and deploymentPolicy exclude each other",
                    "keep one of them",
                ),
            )
        )
    return percent, count


def _tolerations(
    value: Any, found: list[tuple[int, Violation]]
) -> tuple[tuple[str | None, str | None, str | None, str | None], ...]:
    """additionalTolerations; ``operator: Exists`` without a key tolerates every taint (rule
    "toleration-wildcard")."""
    if value is _ABSENT:
        return ()
    if type(value) is not list:
        raise NotCanonical
    out = []
    for i, tol in enumerate(value):
        if type(tol) is not dict:
            raise NotCanonical
        entry = (tol.get("key"), tol.get("operator"), tol.get("value"), tol.get("effect"))
        for v in entry:
            if v is not None and type(v) is not str:
                raise NotCanonical
        out.append(entry)
        key, operator = entry[0], entry[1]
        if operator == "Exists" and not key:
            found.append(
                (
                    TOLERATIONS,
                    Violation(
                        "toleration-wildcard",
                        f"spec.additionalTolerations[{i}]",
                        "operator Exists without a key tolerates every taint (control plane, quarantine)",
                        "name the taint key to tolerate",
                    ),
                )
            )
    return tuple(out)


# ------------------------------------------------------------------------------------------
# One package


def _package(
    key: Any, raw: Any, names: _Names, kinds: set[str], found: list[tuple[int, Violation]]
) -> PackageView:
    if type(key) is not str or type(raw) is not dict or not names.package.isdisjoint(raw):
        raise NotCanonical
    get = raw.get
    name, version, image = get("name"), get("version"), get("image")
    sha, agent = get("containerSHA"), get("agentImageOverride")
    for value in (name, version, image, sha, agent):
        if value is not None and type(value) is not str:
            raise NotCanonical
    intr = get("interrupt")
    interrupt = None if intr is None else _interrupt_type(intr)
    config_interrupts: tuple[tuple[str, str], ...] = ()
    ci = get("configInterrupts", _ABSENT)
    if ci is not _ABSENT:
        if type(ci) is not dict:
            raise NotCanonical
        config_interrupts = tuple([(glob, _interrupt_type(v)) for glob, v in ci.items()])
        for glob, _kind in config_interrupts:
            if type(glob) is not str:
                raise NotCanonical
    cm = get("configMap", _ABSENT)
    config_map = _NO_MAP if cm is _ABSENT else _str_map(cm)
    deps = get("dependsOn", _ABSENT)
    depends_on = _NO_MAP if deps is _ABSENT else _str_map(deps)
    value_from = _env_value_from(get("env", _ABSENT), names.env)
    resources = _resources(get("resources"), names.resources)
    un = get("uninstall")
    if un is not None and type(un) is not dict:
        raise NotCanonical
    uninstall = None if un is None else (_flag(un, "enabled"), _flag(un, "apply"))

    # The package is read; its rules, each in the order the rule-by-rule check gives.
    path = f"spec.packages.{key}"
    if not _valid_name(key):
        found.append(
            (
                PACKAGE_NAME,
                Violation(
                    "package-name",
                    path,
                    f"package name {key!r} is not a DNS-style name of 2-43 characters",
                    "use lower-case letters, digits and '-', starting with a letter",
                ),
            )
        )
    if name is not None and name != key:
        found.append(
            (
                PACKAGE_NAME,
                Violation(
                    "package-name",
                    f"{path}.name",
                    f"name {name!r} differs from its key {key!r}",
                    "remove name; the key is the name",
                ),
            )
        )
    if not version:
        found.append(
            (
                SEMVER,
                Violation(
                    "semver", f"{path}.version", "version is missing", "set a semver version such as 1.2.3"
                ),
            )
        )
    elif version == "latest" or not _valid_semver(version):
        found.append(
            (
                SEMVER,
                Violation(
                    "semver",
                    f"{path}.version",
                    f"version {version!r} is not strict semver",
                    "use MAJOR.MINOR.PATCH, e.g. 1.2.3 (no 'v', no 'latest')",
                ),
            )
        )
    _image_rules(path, image, version, sha, agent, found)
    if resources is not None:
        # A pure function of the four values; CRs give them as strings and repeat the same few,
        # so that case is memoised (other types are keyed badly: 2**240 == 2.0**240).
        a, b, c, d = resources
        strings = type(a) is str and type(b) is str and type(c) is str and type(d) is str
        for where, message, fix in _resource_problems(resources) if strings else _resource_check(resources):
            found.append((RESOURCES, Violation("resources", f"{path}.{where}", message, fix)))
    if uninstall is not None and uninstall[1] and not uninstall[0]:
        found.append(
            (
                UNINSTALL,
                Violation(
                    "uninstall",
                    f"{path}.uninstall.apply",
                    "apply needs enabled",
                    "set uninstall.enabled: true",
                ),
            )
        )
    reboot = (
        _interrupt_rules(path, interrupt, config_interrupts, config_map, kinds, found)
        if interrupt is not None or config_interrupts
        else False
    )
    return PackageView(
        key,
        path,
        raw,
        version,
        image,
        sha,
        agent,
        interrupt,
        config_interrupts,
        depends_on,
        value_from,
        uninstall,
        reboot,
    )


def _interrupt_rules(
    path: str,
    interrupt: str | None,
    config_interrupts: tuple[tuple[str, str], ...],
    config_map: Mapping[str, str],
    kinds: set[str],
    found: list[tuple[int, Violation]],
) -> bool:
    """Known interrupt types; each configInterrupts glob matches a configMap key (rules
    "interrupt-type", "config-interrupt"). Adds the types to ``kinds``; whether one reboots."""
    reboot = False
    if interrupt is not None:
        kinds.add(interrupt)
        reboot = interrupt == "reboot"
        if interrupt not in INTERRUPT_TYPE_SET:
            found.append((INTERRUPTS, _unknown_interrupt(f"{path}.interrupt", interrupt)))
    for glob, kind in config_interrupts:
        kinds.add(kind)
        reboot = reboot or kind == "reboot"
        if kind not in INTERRUPT_TYPE_SET:
            found.append((INTERRUPTS, _unknown_interrupt(f"{path}.configInterrupts.{glob}", kind)))
    for glob, _kind in config_interrupts:
        # A glob equal to a key matches it; only the others need the pattern.
        if glob in config_map or any(_glob(glob).match(k) for k in config_map):
            continue
        found.append(
            (
                INTERRUPTS,
                Violation(
                    "config-interrupt",
                    f"{path}.configInterrupts.{glob}",
                    "matches no configMap key",
                    "name an existing configMap key (or a * glob matching one)",
                ),
            )
        )
    return reboot


def _image_rules(
    path: str,
    image: str | None,
    version: str | None,
    sha: str | None,
    agent: str | None,
    found: list[tuple[int, Violation]],
) -> None:
    """image: present and a reference, no 'latest', its tag (if any) the version, no inline
    digest; containerSHA a sha256 digest; agentImageOverride a reference without 'latest'."""
    if not image:
        found.append(
            (IMAGE, Violation("image", f"{path}.image", "image is missing", "set image (without a tag)"))
        )
        return
    try:
        ref = parse_image(image)
    except ImageError as exc:
        found.append((IMAGE, _bad_image(path, "image", exc)))
        return
    if ref.tag == "latest":
        found.append(
            (
                IMAGE,
                Violation(
                    "no-latest",
                    f"{path}.image",
                    "the 'latest' tag is mutable",
                    "drop the tag; version sets it",
                ),
            )
        )
    elif ref.tag is not None and ref.tag != version:
        found.append(
            (
                IMAGE,
                Violation(
                    "tag-version",
                    f"{path}.image",
                    f"image tag {ref.tag!r} differs from version {version!r}",
                    "drop the tag from image; version is the tag",
                ),
            )
        )
    if ref.digest is not None:
        found.append(
            (
                IMAGE,
                Violation(
                    "digest-field",
                    f"{path}.image",
                    "an inline @digest is not used by the operator",
                    "put the digest in containerSHA",
                ),
            )
        )
    if sha is not None and not _valid_digest(sha):
        found.append(
            (
                IMAGE,
                Violation(
                    "digest-format",
                    f"{path}.containerSHA",
                    f"{sha!r} is not sha256:<64 hex>",
                    "use the image's sha256 digest",
                ),
            )
        )
    if agent:
        try:
            agent_ref = parse_image(agent)
        except ImageError as exc:
            found.append((IMAGE, _bad_image(path, "agentImageOverride", exc)))
            return
        if agent_ref.tag == "latest":
            found.append(
                (
                    IMAGE,
                    Violation(
                        "no-latest",
                        f"{path}.agentImageOverride",
                        "the 'latest' tag is mutable",
                        "pin the agent by version or digest",
                    ),
                )
            )


def _unknown_interrupt(where: str, kind: str) -> Violation:
    return Violation(
        "interrupt-type",
        f"{where}.type",
        f"unknown interrupt type {kind!r}",
        f"use one of {', '.join(INTERRUPT_TYPES)}",
    )


def _bad_image(path: str, field: str, exc: ImageError) -> Violation:
    return Violation(
        "image", f"{path}.{field}", str(exc), "give a reference like registry.example.com/team/pkg"
    )


def _dependencies(
    packages: list[PackageView], by_key: dict[str, PackageView], found: list[tuple[int, Violation]]
) -> None:
    """dependsOn names a package of this CR at its version; no cycles (rule "depends-on")."""
    chained = False
    for pkg in packages:
        for dep, version in pkg.depends_on.items():
            target = by_key.get(dep)
            if target is None or not version or target.version != version:
                found.append(
                    (
                        DEPENDS_ON,
                        Violation(
                            "depends-on",
                            f"{pkg.path}.dependsOn.{dep}",
                            f"no package {dep}|{version} in this CR",
                            "depend on a package of this CR at its current version",
                        ),
                    )
                )
            # A cycle needs a package depending on one that depends on another; without such a
            # chain (the usual case) there is nothing to search.
            chained = chained or (target is not None and bool(target.depends_on))
    cycle = _find_cycle({p.key: list(p.depends_on) for p in packages}) if chained else []
    if cycle:
        found.append(
            (
                DEPENDS_ON,
                Violation(
                    "depends-on",
                    "spec.packages",
                    "dependency cycle " + " -> ".join(cycle),
                    "remove one dependsOn edge of the cycle",
                ),
            )
        )


def _find_cycle(graph: dict[str, list[str]]) -> list[str]:
    """The first cycle of a depth-first search from the nodes in sorted order, edges in order.
    Iterative: a CR may hold more packages than Python's recursion limit."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    for root in sorted(graph):
        if root in state:
            continue
        state[root] = 1
        path = [root]
        pending = [iter(graph[root])]
        while pending:
            for nxt in pending[-1]:
                if nxt not in graph:
                    continue
                seen = state.get(nxt)
                if seen == 1:
                    return [*path[path.index(nxt) :], nxt]
                if seen is None:
                    state[nxt] = 1
                    path.append(nxt)
                    pending.append(iter(graph[nxt]))
                    break
            else:
                state[path.pop()] = 2
                pending.pop()
    return []


# ------------------------------------------------------------------------------------------
# Pure checks, memoised (CRs repeat the same few names, versions, digests and quantities)


@lru_cache(maxsize=4096)
def _valid_name(key: str) -> bool:
    return _NAME_RE.match(key) is not None


@lru_cache(maxsize=4096)
def _valid_semver(version: str) -> bool:
    return _SEMVER_RE.match(version) is not None


@lru_cache(maxsize=4096)
def _valid_digest(digest: str) -> bool:
    return DIGEST_RE.match(digest) is not None


@lru_cache(maxsize=1024)
def _glob(glob: str) -> re.Pattern[str]:
    return re.compile("^" + ".*".join(map(re.escape, glob.split("*"))) + "$")


@lru_cache(maxsize=1024)
def _resource_problems(values: tuple[Any, Any, Any, Any]) -> tuple[tuple[str, str, str], ...]:
    return _resource_check(values)


def _resource_check(values: tuple[Any, Any, Any, Any]) -> tuple[tuple[str, str, str], ...]:
    """(path below the package, message, fix) for its resources: all four or none, quantities,
    positive, limits not below requests (rule "resources")."""
    given = [(k, v) for k, v in zip(_RESOURCE_FIELDS, values, strict=True) if v is not None]
    if not given:
        return ()
    if len(given) != 4:
        named = {k for k, _v in given}
        missing = ", ".join(k for k in _RESOURCE_FIELDS if k not in named)
        return (("resources", "set all four of cpu/memory request/limit or none", f"add {missing}"),)
    out = []
    parsed: dict[str, Decimal] = {}
    for k, v in given:
        try:
            parsed[k] = parse_quantity(v)
        except ValueError as exc:
            out.append((f"resources.{k}", str(exc), "use a quantity such as 500m or 1Gi"))
    if len(parsed) != 4:
        return tuple(out)
    for k, q in parsed.items():
        if q <= 0:
            out.append((f"resources.{k}", "must be positive", "use a value above zero"))
    for kind in ("cpu", "memory"):
        if parsed[f"{kind}Limit"] < parsed[f"{kind}Request"]:
            out.append(
                (
                    f"resources.{kind}Limit",
                    f"{kind} limit is below its request",
                    "raise the limit or lower the request",
                )
            )
    return tuple(out)
