"""A package's interrupts: known types (rule "interrupt-type", the CRD's enum), and each
configInterrupts key naming a configMap key, exactly or as a ``*`` pattern (rule
"config-interrupt", :mod:`admission.syntax.globs`)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from admission.reading.checks.ranks import INTERRUPTS, Found
from admission.reading.checks.values import ABSENT, NotCanonical, str_list
from admission.reading.policy import INTERRUPT_TYPES
from admission.syntax.globs import matches_some
from admission.violations import Violation

INTERRUPT_TYPE_SET = frozenset(INTERRUPT_TYPES)


def read_interrupt_type(value: Any) -> str:
    """The type of an interrupt (its services are only checked for their shape)."""
    if type(value) is not dict:
        raise NotCanonical
    kind = value.get("type")
    if type(kind) is not str:
        raise NotCanonical
    services = value.get("services", ABSENT)
    if services is not ABSENT:
        str_list(services)
    return kind


def read_config_interrupts(value: Any) -> tuple[tuple[str, str], ...]:
    """configInterrupts as (configMap glob, interrupt type); what :func:`read_interrupt_type`
    takes, inlined (a plain loop: this is read for every package that has them)."""
    if type(value) is not dict:
        raise NotCanonical
    out = []
    for glob, interrupt in value.items():
        if type(glob) is not str or type(interrupt) is not dict:
            raise NotCanonical
        kind = interrupt.get("type")
        if type(kind) is not str:
            raise NotCanonical
        services = interrupt.get("services", ABSENT)
        if services is not ABSENT:
            str_list(services)
        out.append((glob, kind))
    return tuple(out)


def interrupt_rules(
    path: str,
    interrupt: str | None,
    config_interrupts: tuple[tuple[str, str], ...],
    config_keys: Collection[str],
    found: Found,
) -> None:
    """The rules of the interrupts of the package at ``path`` (``config_keys``: its configMap's
    keys); which types it has and whether one reboots are the reader's (``checks.package``)."""
    if interrupt is not None and interrupt not in INTERRUPT_TYPE_SET:
        found.append((INTERRUPTS, _unknown_interrupt(f"{path}.interrupt", interrupt)))
    for glob, kind in config_interrupts:
        if kind not in INTERRUPT_TYPE_SET:
            found.append((INTERRUPTS, _unknown_interrupt(f"{path}.configInterrupts.{glob}", kind)))
    for glob, _kind in config_interrupts:
        if matches_some(glob, config_keys):
            continue
        found.append(
            (
                INTERRUPTS,
                Violation(
                    "config-interrupt",
                    f"{path}.configInterrupts.{glob}",
                    "matches no configMap key",
                    "name an existing configMap key (or a * pattern matching one)",
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
