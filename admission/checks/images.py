"""A package's images: image present and a reference, no 'latest', its tag (if any) the version,
no inline digest; containerSHA a sha256 digest; agentImageOverride a reference without 'latest'
(rules "image", "no-latest", "tag-version", "digest-field", "digest-format")."""

from __future__ import annotations

from functools import lru_cache

from admission.checks.ranks import IMAGE, Found
from admission.images import DIGEST_RE, ImageError, parse_image
from admission.violations import Violation


def image_rules(
    path: str,
    image: str | None,
    version: str | None,
    sha: str | None,
    agent: str | None,
    found: Found,
) -> None:
    """The image fields of the package at ``path``."""
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
    if sha is not None and not valid_digest(sha):
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


def _bad_image(path: str, field: str, exc: ImageError) -> Violation:
    return Violation(
        "image", f"{path}.{field}", str(exc), "give a reference like registry.example.com/team/pkg"
    )


@lru_cache(maxsize=4096)  # CRs repeat the same few digests
def valid_digest(digest: str) -> bool:
    return DIGEST_RE.match(digest) is not None
