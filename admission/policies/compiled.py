"""A PackagePolicy compiled for the rules: its allowlist parsed and its texts built once, when it
loads (:func:`admission.policies.policyrules.compile_policy` builds it)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from admission.reading.crs import CrView
from admission.reading.policy import Budget, PackagePolicy, PriorityBounds
from admission.syntax.images import ImageError, ImageRef, allowed_by, parse_image
from admission.violations import Violation

# Bound of a compiled policy's memo of image references.
_MAX_IMAGES = 4096


@dataclass(frozen=True, slots=True)
class CompiledPolicy:
    """A PackagePolicy as the rules use it, computed once when the policy loads."""

    policy: PackagePolicy
    name: str
    pool: frozenset[tuple[str, str]]  # its labels
    prefixes: tuple[ImageRef, ...]
    any_registry: bool  # the allowlist holds "*"
    bad_prefix: Violation | None  # an allowlist entry that does not parse: the policy admits nothing
    registry_fix: str
    require_digest: bool
    tag_must_equal_version: bool
    strict_versions: bool  # versions: semver
    allowed_interrupts: frozenset[str]
    interrupts_fix: str
    cap: Budget | None
    allow_runtime_required: bool
    allow_secret_env: bool
    allow_agent_image_override: bool
    priority: PriorityBounds | None
    checks: tuple[PolicyRule, ...]  # the policy rules that can find something with this policy
    # image reference -> under an allowed registry; a memo of a pure function, bounded, like the
    # parsers' caches
    images: dict[str, bool] = field(default_factory=dict, compare=False, repr=False)

    def contains(self, cr: CrView, labels: Mapping[str, str] | None) -> bool:
        """Whether the pool contains the CR's selector (``labels``:
        :func:`~admission.policies.pools.required_labels_of`)."""
        if cr.selector_empty:
            return not self.pool
        return labels is None or labels.items() >= self.pool  # None: selects nothing


# A policy rule: appends what it finds in the CR under the policy.
PolicyRule = Callable[[CrView, CompiledPolicy, list[Violation]], None]


def registry_ok(policy: CompiledPolicy, image: str) -> bool:
    """Whether ``image`` is under one of the policy's registries. A reference that does not parse
    is under none (unless the policy admits any registry): fail closed."""
    if policy.any_registry:
        return True
    memo = policy.images
    if image in memo:
        return memo[image]
    try:
        ref = parse_image(image)
        ok = any(allowed_by(ref, p) for p in policy.prefixes)
    except ImageError:
        ok = False
    if len(memo) >= _MAX_IMAGES:
        memo.clear()
    memo[image] = ok
    return ok
