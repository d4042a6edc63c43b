"""Warnings on admitted package CRs (AdmissionReview ``warnings``, which kubectl prints): what
NodeWright accepts but will not do as written. Refusing these is a PackagePolicy's choice
(``tagMustEqualVersion``, ``requireDigest``), never a structural rule."""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from admission.hold.holdtolerations import HOLD_EFFECT, missing_hold_values
from admission.reading.checks.images import valid_digest
from admission.reading.crs import CrView
from admission.syntax.images import ImageError, parse_image


def soft_warnings(cr: CrView) -> list[str]:
    """Most consequential first; the response keeps the first ten."""
    first: list[str] = []
    unpinned: list[str] = []
    if cr.cycle:
        first.append(f"dependsOn cycle {' -> '.join(cr.cycle)}: these packages will never start")
    skyhook = cr.group == "skyhook.nvidia.com"
    for pkg in cr.packages:
        image, version, sha = pkg.image or "", pkg.version, pkg.container_sha
        if skyhook and ":" in image:
            cut, rest = image.split(":", 1)
            if rest != version:
                first.append(
                    f"package {pkg.key}: the operator drops ':{rest}' from image and pulls {cut}:{version}"
                )
        if sha and not valid_digest(sha):
            first.append(
                f"package {pkg.key}: containerSHA {sha!r} is not sha256:<64 hex>; the pull will fail"
            )
        agent = pkg.agent_image_override
        if agent:
            try:
                ref = parse_image(agent)
                pinned = ref.digest is not None or ref.tag not in (None, "latest")
            except ImageError:
                pinned = False  # the registry rule names it; here only that it is not pinned
            if not pinned:
                first.append(f"package {pkg.key}: agentImageOverride {agent!r} is not pinned to a version")
        if not sha:
            unpinned.append(f"package {pkg.key} is not pinned by digest (containerSHA); tags are mutable")
    return first + unpinned


def hold_warnings(obj: Mapping[str, Any], hold_taint_key: str) -> list[str]:
    """When the CR lacks the package-hold tolerations (``nodewright.inject_tolerations`` off, or the
    mutating webhook not installed): NodeWright will skip every node nodegate holds. One line per
    missing toleration, in the form to paste (warnings are cut at 120 characters). On the path of
    every admitted CR: objects from the review's JSON are dicts, checked as such (no ABC check)."""
    spec = obj.get("spec")
    missing = missing_hold_values(
        spec.get("additionalTolerations") if type(spec) is dict else None, hold_taint_key
    )
    return list(_hold_lines(hold_taint_key, missing)) if missing else []


@lru_cache(maxsize=16)  # one hold taint key per deployment, and a few subsets of its reasons
def _hold_lines(hold_taint_key: str, missing: tuple[str, ...]) -> tuple[str, ...]:
    head = f"NodeWright skips nodes held by {hold_taint_key}; add to spec.additionalTolerations:"
    return (
        head,
        *(
            f"- {{key: {hold_taint_key}, operator: Equal, value: {value}, effect: {HOLD_EFFECT}}}"
            for value in missing
        ),
    )
