"""One package of spec.packages: read, then its rules (identity, interrupts, images, resources,
uninstall, durations; dependsOn needs every package and is checked by the CR's reader
afterwards)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from admission.reading.checks.durations import duration_rule
from admission.reading.checks.identity import identity_rules
from admission.reading.checks.images import image_rules
from admission.reading.checks.interrupts import interrupt_rules, read_config_interrupts, read_interrupt_type
from admission.reading.checks.ranks import Found
from admission.reading.checks.resources import Quantities, read_resources, resource_rules
from admission.reading.checks.uninstall import read_uninstall, uninstall_rules
from admission.reading.checks.values import ABSENT, NO_MAP, Names, NotCanonical, str_map
from admission.reading.crs import PackageView
from admission.violations import Violation

# Bound of the memo of package rules (each entry holds the strings of one package).
_MAX_MEMO = 1024
Findings = tuple[tuple[int, Violation], ...]


def read_package(
    key: Any, raw: Any, names: Names, kinds: set[str], found: Found, nodewright: bool
) -> PackageView:
    """The package under ``key``; adds the types of its interrupts to ``kinds``. ``nodewright``:
    the CR is of nodewright.nvidia.com, whose webhook checks images and stage timeouts."""
    if type(key) is not str or type(raw) is not dict or not names.package.isdisjoint(raw):
        raise NotCanonical
    get = raw.get
    name, version, image = get("name"), get("version"), get("image")
    sha, agent = get("containerSHA"), get("agentImageOverride")
    graceful, stage = get("gracefulShutdown"), get("stageTimeout")
    for value in (name, version, image, sha, agent, graceful, stage):
        if value is not None and type(value) is not str:
            raise NotCanonical
    intr = get("interrupt")
    interrupt = None if intr is None else read_interrupt_type(intr)
    ci = get("configInterrupts", ABSENT)
    config_interrupts = () if ci is ABSENT else read_config_interrupts(ci)
    cm = get("configMap", ABSENT)
    config_map = NO_MAP if cm is ABSENT else str_map(cm)
    deps = get("dependsOn", ABSENT)
    depends_on = NO_MAP if deps is ABSENT else str_map(deps)
    env = get("env", ABSENT)
    value_from = () if env is ABSENT else _env_value_from(env, names.env)
    res = get("resources")
    resources = None if res is None else read_resources(res, names.resources)
    uni = get("uninstall")
    uninstall = None if uni is None else read_uninstall(uni)

    reboot = False
    if interrupt is not None:
        kinds.add(interrupt)
        reboot = interrupt == "reboot"
    for _glob, kind in config_interrupts:
        kinds.add(kind)
        if kind == "reboot":
            reboot = True
    # The rules are a pure function of these values (of the configMap only its keys, which the
    # configInterrupts name); CRs repeat the same packages, so the answer is memoised. Quantities
    # other than strings are not keys to trust (1 == 1.0): those packages are judged afresh.
    rule_args = (
        key,
        name,
        version,
        image if nodewright else None,
        sha if nodewright else None,
        stage if nodewright else None,
        graceful,
        interrupt,
        config_interrupts,
        tuple(config_map) if config_interrupts else (),
        resources,
        uninstall,
        nodewright,
    )
    memo = True
    if resources is not None:
        for q in resources:
            if q is not None and type(q) is not str:
                memo = False
    rules = _memo_rules(*rule_args) if memo else _rules(*rule_args)
    if rules:
        found += rules
    return PackageView(
        key,
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


def _rules(
    key: str,
    name: str | None,
    version: str | None,
    image: str | None,
    sha: str | None,
    stage: str | None,
    graceful: str | None,
    interrupt: str | None,
    config_interrupts: tuple[tuple[str, str], ...],
    config_keys: tuple[str, ...],
    resources: Quantities | None,
    uninstall: tuple[bool, bool] | None,
    nodewright: bool,
) -> Findings:
    """What the rules of one package find (``image``, ``sha`` and ``stage`` only of a NodeWright
    CR, whose webhook checks them; ``config_keys`` only when there are configInterrupts)."""
    found: Found = []
    path = f"spec.packages.{key}"
    identity_rules(path, key, name, version, found)
    if interrupt is not None or config_interrupts:
        interrupt_rules(path, interrupt, config_interrupts, config_keys, found)
    if nodewright:
        image_rules(path, image, sha, found)
    # Both durations were type-checked by the reader; their paths are only built when there is
    # one to judge.
    if stage is not None and nodewright:
        duration_rule(f"{path}.stageTimeout", stage, found, non_negative=True)
    if resources is not None:
        resource_rules(path, resources, found)
    if uninstall is not None:
        uninstall_rules(path, uninstall, found)
    if graceful is not None:
        duration_rule(f"{path}.gracefulShutdown", graceful, found, non_negative=False)
    return tuple(found)


_memo_rules = lru_cache(maxsize=_MAX_MEMO)(_rules)


def _env_value_from(env: Any, names: frozenset[str]) -> tuple[int, ...]:
    """Indices of the env entries with valueFrom (a policy rule decides whether they may)."""
    if env is ABSENT:
        return ()
    if type(env) is not list:
        raise NotCanonical
    found = []
    for i, var in enumerate(env):
        if type(var) is not dict or not names.isdisjoint(var) or type(var.get("name")) is not str:
            raise NotCanonical
        value = var.get("value")
        if value is not None and type(value) is not str:
            raise NotCanonical
        source = var.get("valueFrom")
        if source is not None:
            if type(source) is not dict or not all(type(k) is str for k in source):
                raise NotCanonical
            found.append(i)
    return tuple(found)
