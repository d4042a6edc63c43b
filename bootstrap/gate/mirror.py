"""When a NodeWright's ``mirrored-from`` claim lets the gate skip a legacy Skyhook: pure, no I/O.

NodeWright's mirror controller (the skyhook.nvidia.com -> nodewright.nvidia.com migration bridge,
``operator/internal/controller/mirror_controller.go`` at NVIDIA/nodewright (NVIDIA/skyhook)
273d50a017332a45ee1c96c3ecf80dd2a4842c6b, with ``operator/api/v1alpha1/nodewright_conversion.go``
at 342baa233b37cee68ddbe145f62a37c9480e9d27) copies each Skyhook into a NodeWright **of the same
name**, its spec converted field by field (``Convert_Skyhook_To_NodeWright``), and stamps it
``nodewright.nvidia.com/mirrored-from: <that name>`` and ``nodewright.nvidia.com/mirrored-generation:
<the Skyhook's metadata.generation>``. From then on the operator reconciles the NodeWright, and the
frozen Skyhook's status is never written again: judging it would hold its nodes forever, so the
gate judges the NodeWright instead.

Anyone who may write some NodeWright can write the annotation, so the claim counts only when it is
what the mirror writes and the NodeWright does what the Skyhook asks for:

- the claim is on a NodeWright, names the NodeWright's own name, and ``mirrored-generation`` is a
  generation (a decimal integer); upstream's mirror backs off from any other target;
- the NodeWright's spec is the Skyhook's spec to the operator (:func:`admission.reading.godecode.
  canonical_spec` of each in its own group: the legacy group's image tag cut, defaults and
  re-encodings equal), so the packages that must complete on a node are the same ones.

A claim that does not hold leaves both CRs judged; the node then waits for the Skyhook too, and
the message says why and what to do. The generation stamp is not compared with the Skyhook's:
deleting the legacy object bumps its generation and the mirror leaves the target as it is, and the
spec comparison is what makes skipping safe.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from admission.reading.godecode import canonical_spec

MIRRORED_FROM = "nodewright.nvidia.com/mirrored-from"
MIRRORED_GENERATION = "nodewright.nvidia.com/mirrored-generation"
NEW_GROUP, LEGACY_GROUP = "nodewright.nvidia.com", "skyhook.nvidia.com"
_MAX_GENERATION = 20  # digits of an int64


class Cr(Protocol):
    """What is read of a parsed package CR (nodewright.PackageCr)."""

    @property
    def group(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def mirrored_from(self) -> str | None: ...
    @property
    def spec(self) -> Any: ...


def spec_key(spec: object, group: str) -> Any:
    """The spec as the operator holds it (compared whole: equal exactly when it cannot tell the
    two apart)."""
    return canonical_spec(spec, group)


def mirror_claim(group: str, name: str, annotations: Mapping[str, Any]) -> str | None:
    """The Skyhook a NodeWright claims to mirror, when the claim has the shape upstream's mirror
    writes (its own name, a generation stamp); else None (the claim is not honoured)."""
    if group != NEW_GROUP:
        return None
    claimed, generation = annotations.get(MIRRORED_FROM), annotations.get(MIRRORED_GENERATION)
    if claimed != name or not isinstance(generation, str):
        return None
    if not (0 < len(generation) <= _MAX_GENERATION and generation.isascii() and generation.isdigit()):
        return None
    return name


def superseded(crs: Sequence[Cr]) -> tuple[frozenset[str], dict[str, str]]:
    """(names of the Skyhooks whose NodeWright mirror is judged instead, why a claimed Skyhook is
    still judged: name -> a line for the node's message)."""
    claims = {cr.name: cr for cr in crs if cr.group == NEW_GROUP and cr.mirrored_from is not None}
    skip: set[str] = set()
    notes: dict[str, str] = {}
    for cr in crs:
        if cr.group != LEGACY_GROUP:
            continue
        mirror = claims.get(cr.name)
        if mirror is None:
            continue
        if mirror.spec == cr.spec:
            skip.add(cr.name)
        else:
            notes[cr.name] = (
                f"{LEGACY_GROUP}/{cr.name}: NodeWright {cr.name} claims to mirror it ({MIRRORED_FROM}) "
                "but its spec differs, so both are judged; when the migration is done, delete the "
                f"legacy Skyhook (kubectl delete skyhooks.{LEGACY_GROUP} {cr.name})"
            )
    return frozenset(skip), notes
