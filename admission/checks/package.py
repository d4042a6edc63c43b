"""One package of spec.packages: read, then its rules (identity, interrupts, images, resources,
uninstall, durations; dependsOn needs every package and is checked by the CR's reader
afterwards)."""

from __future__ import annotations

from typing import Any

from admission.checks.durations import duration_rule
from admission.checks.identity import identity_rules
from admission.checks.images import image_rules
from admission.checks.interrupts import interrupt_rules, read_config_interrupts, read_interrupt_type
from admission.checks.ranks import Found
from admission.checks.resources import read_resources, resource_rules
from admission.checks.uninstall import read_uninstall, uninstall_rules
from admission.checks.values import ABSENT, NO_MAP, Names, NotCanonical, opt_str, str_map
from admission.crs import PackageView


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
    config_interrupts = read_config_interrupts(get("configInterrupts", ABSENT))
    cm = get("configMap", ABSENT)
    config_map = NO_MAP if cm is ABSENT else str_map(cm)
    deps = get("dependsOn", ABSENT)
    depends_on = NO_MAP if deps is ABSENT else str_map(deps)
    value_from = _env_value_from(get("env", ABSENT), names.env)
    resources = read_resources(get("resources"), names.resources)
    uninstall = read_uninstall(get("uninstall"))

    path = f"spec.packages.{key}"
    identity_rules(path, key, name, version, found)
    reboot = (
        interrupt_rules(path, interrupt, config_interrupts, config_map, kinds, found)
        if interrupt is not None or config_interrupts
        else False
    )
    if nodewright:
        image_rules(path, image, sha, found)
    # Both durations were type-checked above; their paths are only built when there is one to judge.
    if stage is not None and nodewright:
        duration_rule(f"{path}.stageTimeout", stage, found, non_negative=True)
    if resources is not None:
        resource_rules(path, resources, found)
    if uninstall is not None:
        uninstall_rules(path, uninstall, found)
    if graceful is not None:
        duration_rule(f"{path}.gracefulShutdown", graceful, found, non_negative=False)
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
        opt_str(var.get("value"))
        source = var.get("valueFrom")
        if source is not None:
            if type(source) is not dict or not all(type(k) is str for k in source):
                raise NotCanonical
            found.append(i)
    return tuple(found)
