"""How NodeWright's Go operator writes a Skyhook or DeploymentPolicy back: our model of its
``encoding/json`` over the v1alpha1 Go types (field by field, as read from
``operator/api/v1alpha1/*_types.go`` of both snapshots).

Go's encoder leaves out ``omitempty`` fields holding false, 0, "", nil or an empty map or slice,
but never a struct value: ``interruptionBudget: {}``, ``podNonInterruptLabels: {}`` and
``nodeSelectors: {}`` always appear, and so do the four quantities of a ``resources`` block
(``"0"`` when unset). Quantities come out canonical (``0.5`` -> ``500m``), durations as Go prints
them (``90s`` -> ``1m30s``). Decoding (``decode=True``) first applies ``Packages.UnmarshalJSON``
of skyhook.nvidia.com: the image is cut at its first ``:`` and an empty name becomes the key.
"""

from __future__ import annotations

from decimal import ROUND_CEILING, Decimal
from typing import Any

from admission.reading.godecode import DurationError, parse_duration
from admission.syntax.quantity import parse_quantity

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {-9: "n", -6: "u", -3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}


def _suffix(text: str) -> str:
    return text.lstrip("+-0123456789.")


def canonical_quantity(value: Any) -> Any:
    """resource.Quantity's String() after parsing ``value`` (unparseable: as given)."""
    try:
        number = parse_quantity(value)
    except ValueError:
        return value
    text = str(value)
    suffix = _suffix(text)
    nano = Decimal("1e-9")
    if number != number.quantize(nano):
        number = number.quantize(nano, rounding=ROUND_CEILING)
    if number == 0:
        return "0"
    sign, magnitude = ("-" if number < 0 else ""), abs(number)
    binary = suffix in _BINARY and not (-1024 < number < 1024) and magnitude == magnitude.to_integral_value()
    if binary:
        whole, power = int(magnitude), 0
        while whole % 1024 == 0 and power < 6:
            whole //= 1024
            power += 1
        name = {v: k for k, v in _BINARY.items()}.get(power, "")
        return f"{sign}{whole}{name}"
    digits = magnitude.normalize().as_tuple()
    mantissa = int("".join(map(str, digits.digits)))
    exponent = int(digits.exponent)
    while exponent % 3:
        mantissa, exponent = mantissa * 10, exponent - 1
    while mantissa % 1000 == 0 and exponent < 18:
        mantissa, exponent = mantissa // 1000, exponent + 3
    if exponent > 18:
        mantissa, exponent = mantissa * 10 ** (exponent - 18), 18
    if suffix[:1] in ("e", "E"):
        return f"{sign}{mantissa}" + (f"e{exponent}" if exponent else "")
    return f"{sign}{mantissa}{_DECIMAL[exponent]}"


def format_duration(value: Any) -> Any:
    """metav1.Duration's Go String() of a duration text (unparseable: as given)."""
    if not isinstance(value, str):
        return value
    try:
        nanos = parse_duration(value)
    except DurationError:
        return value
    if nanos == 0:
        return "0s"
    sign, rest = ("-" if nanos < 0 else ""), abs(nanos)
    if rest < 1_000_000_000:
        for unit, size in (("ms", 1_000_000), ("\u00b5s", 1_000), ("ns", 1)):
            if rest >= size:
                return f"{sign}{_trim(Decimal(rest) / size)}{unit}"
    hours, rest = divmod(rest, 3_600_000_000_000)
    minutes, rest = divmod(rest, 60_000_000_000)
    seconds = _trim(Decimal(rest) / 1_000_000_000)
    if hours:
        return f"{sign}{hours}h{minutes}m{seconds}s"
    if minutes:
        return f"{sign}{minutes}m{seconds}s"
    return f"{sign}{seconds}s"


def _trim(value: Decimal) -> str:
    return format(value.normalize(), "f")


def _put(out: dict[str, Any], key: str, value: Any) -> None:
    """An ``omitempty`` field: left out when Go's zero value or empty."""
    if value not in (None, False, 0, "", {}, []):  # (False == 0: both are Go zero values)
        out[key] = value


def _selector(sel: Any) -> dict[str, Any]:
    sel = sel or {}
    out: dict[str, Any] = {}
    _put(out, "matchLabels", dict(sel.get("matchLabels") or {}))
    exprs = []
    for req in sel.get("matchExpressions") or []:
        item = {"key": req.get("key", ""), "operator": req.get("operator", "")}
        _put(item, "values", list(req.get("values") or []))
        exprs.append(item)
    _put(out, "matchExpressions", exprs)
    return out


def _interrupt(value: Any) -> dict[str, Any]:
    out = {"type": value.get("type", "")}
    _put(out, "services", list(value.get("services") or []))
    return out


def _env(var: dict[str, Any]) -> dict[str, Any]:
    out = {"name": var.get("name", "")}
    _put(out, "value", var.get("value"))
    if var.get("valueFrom") is not None:
        out["valueFrom"] = var["valueFrom"]
    return out


def _toleration(tol: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("key", "operator", "value", "effect", "tolerationSeconds"):
        _put(out, key, tol.get(key))
    return out


def encode_package(key: str, pkg: dict[str, Any], *, decode: bool, uninstall_known: bool) -> dict[str, Any]:
    name, image = pkg.get("name") or "", pkg.get("image") or ""
    if decode:
        name = name or key
        image = image.split(":", 1)[0]
    out: dict[str, Any] = {"name": name, "version": pkg.get("version") or "", "image": image}
    _put(out, "containerSHA", pkg.get("containerSHA"))
    _put(out, "agentImageOverride", pkg.get("agentImageOverride"))
    if pkg.get("interrupt") is not None:
        out["interrupt"] = _interrupt(pkg["interrupt"])
    _put(out, "dependsOn", dict(pkg.get("dependsOn") or {}))
    _put(out, "configInterrupts", {k: _interrupt(v) for k, v in (pkg.get("configInterrupts") or {}).items()})
    _put(out, "configMap", dict(pkg.get("configMap") or {}))
    _put(out, "env", [_env(v) for v in pkg.get("env") or []])
    if pkg.get("resources") is not None:
        res = pkg["resources"]
        out["resources"] = {
            k: canonical_quantity(res.get(k) if res.get(k) is not None else "0")
            for k in ("cpuRequest", "cpuLimit", "memoryRequest", "memoryLimit")
        }
    if pkg.get("gracefulShutdown") is not None:
        out["gracefulShutdown"] = format_duration(pkg["gracefulShutdown"])
    if uninstall_known and pkg.get("uninstall") is not None:
        u = pkg["uninstall"]
        out["uninstall"] = {"enabled": bool(u.get("enabled")), "apply": bool(u.get("apply"))}
    return out


def encode_skyhook_spec(spec: dict[str, Any], *, decode: bool, skyhook_repo: bool) -> dict[str, Any]:
    """The spec as the operator writes it (``skyhook_repo``: the older NVIDIA/skyhook types, with
    ``pause`` and without ``uninstall`` and ``sequencing``)."""
    out: dict[str, Any] = {}
    _put(out, "serial", spec.get("serial"))
    if skyhook_repo:
        _put(out, "pause", spec.get("pause"))
    out["podNonInterruptLabels"] = _selector(spec.get("podNonInterruptLabels"))
    out["nodeSelectors"] = _selector(spec.get("nodeSelectors"))
    _put(out, "deploymentPolicy", spec.get("deploymentPolicy"))
    if spec.get("deploymentPolicyOptions") is not None:
        options: dict[str, Any] = {}
        value = spec["deploymentPolicyOptions"].get("resetBatchStateOnCompletion")
        if value is not None:
            options["resetBatchStateOnCompletion"] = value
        out["deploymentPolicyOptions"] = options
    budget: dict[str, Any] = {}
    for key in ("percent", "count"):
        if (spec.get("interruptionBudget") or {}).get(key) is not None:
            budget[key] = spec["interruptionBudget"][key]
    out["interruptionBudget"] = budget
    packages = {
        key: encode_package(key, pkg or {}, decode=decode, uninstall_known=not skyhook_repo)
        for key, pkg in (spec.get("packages") or {}).items()
    }
    _put(out, "packages", packages)
    _put(out, "additionalTolerations", [_toleration(t) for t in spec.get("additionalTolerations") or []])
    _put(out, "runtimeRequired", spec.get("runtimeRequired"))
    _put(out, "autoTaintNewNodes", spec.get("autoTaintNewNodes"))
    _put(out, "priority", spec.get("priority"))
    if not skyhook_repo:
        _put(out, "sequencing", spec.get("sequencing"))
    return out


def encode_deployment_policy_spec(spec: dict[str, Any], *, defaults: bool = False) -> dict[str, Any]:
    """The DeploymentPolicy spec as Go writes it; ``defaults``: with the operator's mutating
    webhook's defaults in the first strategy set of each (fixed, then linear, then exponential)."""

    def strategy(value: Any) -> Any:
        if value is None:
            return None
        out: dict[str, Any] = {}
        first = True
        for name, extra in (("fixed", {}), ("linear", {"delta": 1}), ("exponential", {"growthFactor": 2})):
            params = value.get(name)
            if params is None:
                continue
            params = {k: v for k, v in params.items() if v is not None}
            if defaults and first:
                for key, default in {
                    "initialBatch": 1,
                    "batchThreshold": 100,
                    "safetyLimit": 50,
                    **extra,
                }.items():
                    params.setdefault(key, default)
            first = False
            out[name] = params
        return out

    def budget(value: Any) -> dict[str, Any]:
        return {k: v for k, v in (value or {}).items() if k in ("percent", "count") and v is not None}

    default = spec.get("default") or {}
    out: dict[str, Any] = {
        "default": {"budget": budget(default.get("budget")), "strategy": strategy(default.get("strategy"))}
    }
    compartments = []
    for comp in spec.get("compartments") or []:
        item: dict[str, Any] = {
            "name": comp.get("name", ""),
            "selector": _selector(comp.get("selector")),
            "budget": budget(comp.get("budget")),
        }
        if comp.get("strategy") is not None:
            item["strategy"] = strategy(comp["strategy"])
        compartments.append(item)
    _put(out, "compartments", compartments)
    if spec.get("resetBatchStateOnCompletion") is not None:
        out["resetBatchStateOnCompletion"] = spec["resetBatchStateOnCompletion"]
    return out
