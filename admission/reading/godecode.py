"""A package CR's spec as NodeWright's Go types hold it: what makes two specs the same to it.

The operator decodes a CR into Go structs and writes it back re-encoded (its finalizer UPDATE,
and its mutating webhook): package ``name`` filled from the key, ``interruptionBudget: {}``,
``podNonInterruptLabels: {}``, ``nodeSelectors: {}`` added, empty maps, lists and strings left
out, quantities and durations in canonical form, and for ``skyhook.nvidia.com`` the image cut at
its first ``:``. None of that changes what the operator does, so none of it is a change.

:func:`canonical_spec` maps a spec to a value in which exactly those differences vanish: each
field the Go types know is read by its Go type (absent, null and the zero value are one value
where Go cannot tell them apart; a pointer keeps nil apart from a pointer to a zero value), and
every field they do not know is kept as given, so that a difference there always counts. This is
security-relevant: the webhook lets anyone through whose UPDATE leaves the canonical spec as it
was, so it equates only what Go's decoding equates.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from admission.syntax.quantity import parse_quantity

# -- Go's time.ParseDuration ---------------------------------------------------------------

_UNITS_NS = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # micro sign
    "\u03bcs": 1_000,  # Greek mu
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_TERM = re.compile(r"([0-9]*)(?:\.([0-9]*))?([^0-9.]+)")
_MAX_NS = 2**63 - 1


class DurationError(ValueError):
    """Not a duration Go's time.ParseDuration accepts."""


def parse_duration(text: str) -> int:
    """Nanoseconds of a Go duration such as ``1h30m``, ``46s``, ``-1.5ms``, ``0``."""
    rest = text
    negative = rest[:1] == "-"
    if rest[:1] in ("-", "+"):
        rest = rest[1:]
    if rest == "0":
        return 0
    if not rest:
        raise DurationError(f"invalid duration {text!r}")
    total = Decimal(0)
    pos = 0
    while pos < len(rest):
        m = _TERM.match(rest, pos)
        if m is None or (not m.group(1) and not m.group(2)):
            raise DurationError(f"invalid duration {text!r}")
        unit = _UNITS_NS.get(m.group(3))
        if unit is None:
            raise DurationError(f"unknown unit {m.group(3)!r} in duration {text!r}")
        total += Decimal(f"{m.group(1) or 0}.{m.group(2) or 0}") * unit
        pos = m.end()
    nanos = int(total)  # Go drops what is below a nanosecond
    if nanos > _MAX_NS:
        raise DurationError(f"invalid duration {text!r}")
    return -nanos if negative else nanos


# -- The Go types, as far as a difference matters ------------------------------------------
# A type is "str", "bool", "int", "qty" (resource.Quantity), "dur" (metav1.Duration), or a tuple:
# ("ptr", T), ("map", T), ("list", T), ("struct", {json name: T}).

_RAW = "raw"  # tags a value kept as given


def _struct(**fields: Any) -> tuple[str, dict[str, Any]]:
    return ("struct", fields)


_SELECTOR = _struct(
    matchLabels=("map", "str"),
    matchExpressions=("list", _struct(key="str", operator="str", values=("list", "str"))),
)
_KEY_REF = ("ptr", _struct(name="str", key="str", optional=("ptr", "bool")))
_ENV = _struct(
    name="str",
    value="str",
    valueFrom=(
        "ptr",
        _struct(
            fieldRef=("ptr", _struct(apiVersion="str", fieldPath="str")),
            resourceFieldRef=("ptr", _struct(containerName="str", resource="str", divisor="qty")),
            configMapKeyRef=_KEY_REF,
            secretKeyRef=_KEY_REF,
            fileKeyRef=("ptr", _struct(volumeName="str", path="str", key="str", optional=("ptr", "bool"))),
        ),
    ),
)
_INTERRUPT = _struct(type="str", services=("list", "str"))
# name and image are read by _package (they depend on the key and the API group).
_PACKAGE = _struct(
    version="str",
    containerSHA="str",
    agentImageOverride="str",
    interrupt=("ptr", _INTERRUPT),
    dependsOn=("map", "str"),
    configInterrupts=("map", _INTERRUPT),
    configMap=("map", "str"),
    env=("list", _ENV),
    resources=("ptr", _struct(cpuRequest="qty", cpuLimit="qty", memoryRequest="qty", memoryLimit="qty")),
    gracefulShutdown=("ptr", "dur"),
    stageTimeout=("ptr", "dur"),
    uninstall=("ptr", _struct(enabled="bool", apply="bool")),
)
_SPEC = _struct(
    serial="bool",
    pause="bool",  # skyhook.nvidia.com before v0.14
    podNonInterruptLabels=_SELECTOR,
    nodeSelectors=_SELECTOR,
    deploymentPolicy="str",
    deploymentPolicyOptions=("ptr", _struct(resetBatchStateOnCompletion=("ptr", "bool"))),
    interruptionBudget=_struct(percent=("ptr", "int"), count=("ptr", "int")),
    drainConfig=(
        "ptr",
        _struct(
            disableEviction=("ptr", "bool"),
            deleteEmptyDirData=("ptr", "bool"),
            force=("ptr", "bool"),
            ignoreDaemonSets=("ptr", "bool"),
            timeout=("ptr", "dur"),
            gracePeriod=("ptr", "dur"),
        ),
    ),
    additionalTolerations=(
        "list",
        _struct(key="str", operator="str", value="str", effect="str", tolerationSeconds=("ptr", "int")),
    ),
    runtimeRequired="bool",
    runtimeRequiredCordonAfter="bool",
    autoTaintNewNodes="bool",
    priority="int",
    sequencing="str",
)
_ZERO: dict[str, Any] = {"str": "", "bool": False, "int": 0, "qty": Decimal(0)}


def _norm(value: Any, kind: Any) -> Any:
    if type(kind) is str:
        if value is None:
            return _ZERO.get(kind)
        if kind == "str":
            return value if type(value) is str else (_RAW, value)
        if kind == "bool":
            return value if type(value) is bool else (_RAW, value)
        if kind == "int":
            return value if type(value) is int else (_RAW, value)
        if kind == "qty":
            try:
                return parse_quantity(value)
            except ValueError:
                return (_RAW, value)
        if type(value) is str:  # "dur"
            try:
                return ("dur", parse_duration(value))
            except DurationError:
                pass
        return (_RAW, value)
    shape, inner = kind
    if shape == "ptr":
        return None if value is None else _norm(value, inner)
    if value is None:
        value = {} if shape in ("map", "struct") else []
    if shape == "list":
        return tuple(_norm(v, inner) for v in value) if type(value) is list else (_RAW, value)
    if type(value) is not dict:
        return (_RAW, value)
    if shape == "map":
        return {k: _norm(v, inner) for k, v in value.items()}
    out = {name: _norm(value.get(name), t) for name, t in inner.items()}
    for name, v in value.items():
        if name not in inner:
            out[name] = (_RAW, v)  # a field the Go types here do not know: as given
    return out


def _name(key: str, name: Any) -> Any:
    """A package's name as decoded: an empty one is its key."""
    return key if name is None or name == "" else _norm(name, "str")


def _package(key: str, value: Any, cut_tag: bool) -> Any:
    if type(value) is not dict:
        return (_RAW, value)
    out = _norm({k: v for k, v in value.items() if k not in ("name", "image")}, _PACKAGE)
    out["name"] = _name(key, value.get("name"))
    image = value.get("image")
    if cut_tag and type(image) is str:
        image = image.split(":", 1)[0]  # Packages.UnmarshalJSON keeps what is before the first ':'
    out["image"] = _norm(image, "str")
    return out


def canonical_package(key: str, value: Any, group: str) -> Any:
    """One package as the Go types hold it (``group`` decides whether the image tag is cut)."""
    return _package(key, value, group == "skyhook.nvidia.com")


def canonical_spec(spec: Any, group: str) -> Any:
    """The spec as the Go types hold it: equal for two specs exactly when the operator cannot tell
    them apart."""
    if spec is None:
        spec = {}
    if type(spec) is not dict:
        return (_RAW, spec)
    out = _norm({k: v for k, v in spec.items() if k != "packages"}, _SPEC)
    if spec.get("priority") is None:
        out["priority"] = 200  # the CRD's default: the API server fills it in when it is absent
    packages = spec.get("packages")
    if packages is None:
        out["packages"] = {}
    elif type(packages) is dict:
        cut = group == "skyhook.nvidia.com"
        out["packages"] = {k: _package(k, v, cut) for k, v in packages.items()}
    else:
        out["packages"] = (_RAW, packages)
    return out


def same_spec(old: Any, new: Any, group: str) -> bool:
    """Whether two specs are the same to the operator: :func:`canonical_spec` of both compared,
    field by field and package by package, only where the two differ as given (an UPDATE
    usually changes one field of one package, and the operator's own UPDATE few fields)."""
    if old == new:
        return True
    if type(old) is not dict or type(new) is not dict:
        return bool(canonical_spec(old, group) == canonical_spec(new, group))
    fields = _SPEC[1]
    for key in old.keys() | new.keys():
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if key == "packages":
            if not _same_packages(a, b, group):
                return False
        elif key == "priority":
            if _norm(200 if a is None else a, "int") != _norm(200 if b is None else b, "int"):
                return False
        elif key not in fields or _norm(a, fields[key]) != _norm(b, fields[key]):
            return False
    return True


def _same_packages(old: Any, new: Any, group: str) -> bool:
    if type(old) is not dict or type(new) is not dict:
        return bool(canonical_spec({"packages": old}, group) == canonical_spec({"packages": new}, group))
    if old.keys() != new.keys():
        return False
    cut = group == "skyhook.nvidia.com"
    return all(old[k] == new[k] or _same_package(k, old[k], new[k], cut) for k in old)


def _same_package(key: str, old: Any, new: Any, cut: bool) -> bool:
    """As :func:`_package` of both compared, field by field where they differ as given."""
    if type(old) is not dict or type(new) is not dict:
        return bool(_package(key, old, cut) == _package(key, new, cut))
    fields = _PACKAGE[1]
    for field in old.keys() | new.keys():
        a, b = old.get(field), new.get(field)
        if a == b:
            continue
        if field == "name":
            if _name(key, a) != _name(key, b):
                return False
        elif field == "image":
            if cut and type(a) is str and type(b) is str:
                a, b = a.split(":", 1)[0], b.split(":", 1)[0]
            if _norm(a, "str") != _norm(b, "str"):
                return False
        elif field not in fields or _norm(a, fields[field]) != _norm(b, fields[field]):
            return False
    return True
