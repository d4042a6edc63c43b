"""A package's image fields, as NodeWright checks them.

``skyhook.nvidia.com``: nothing. The operator cuts ``image`` at its first ``:`` while decoding
(a tag is dropped, and so is everything after a registry port) and pulls ``image:version``, or
``image@containerSHA``; a tag is never refused. What it will pull is judged by the PackagePolicy
(:mod:`admission.policies.policyrules`), and a tag that is dropped gets a warning.

``nodewright.nvidia.com``: ``image`` is a repository without a tag or a digest (a registry port is
fine), no whitespace; ``containerSHA`` is ``sha256:<64 hex>`` (rules "image", "digest-format").
"""

from __future__ import annotations

from functools import lru_cache

from admission.reading.checks.ranks import IMAGE, Found
from admission.syntax.images import DIGEST_RE
from admission.violations import Violation


def split_reference(image: str) -> tuple[str, str | None, str | None]:
    """(repository, tag, digest) as NodeWright splits them: the digest after the last ``@``, the
    tag after a ``:`` that follows the last ``/`` (an earlier one is a registry port)."""
    digest = None
    at = image.rfind("@")
    if at >= 0:
        image, digest = image[:at], image[at + 1 :]
    colon = image.rfind(":")
    if colon > image.rfind("/"):
        return image[:colon], image[colon + 1 :], digest
    return image, None, digest


def has_whitespace(text: str) -> bool:
    """``any(c.isspace() for c in text)`` without a generator step per character: ``str.split()``
    splits at exactly the characters ``str.isspace`` names (CPython's one predicate,
    ``Py_UNICODE_ISSPACE``), and gives ``[text]`` back only when there is none to cut at or strip."""
    return text.split() != [text] if text else False


def image_problem(image: str | None) -> tuple[str, str] | None:
    """(message, fix) of rule "image" for a NodeWright package's ``image``, or None."""
    if not image or has_whitespace(image):
        return (
            "image is missing" if not image else "image contains whitespace",
            "set image to a repository such as registry.example.com/team/pkg",
        )
    _repository, tag, digest = split_reference(image)
    if digest is not None:
        return "image contains an inline digest", "put the digest in containerSHA"
    if tag is not None:
        return f"image contains an inline tag {tag!r}", "drop the tag; version supplies it"
    return None


def image_rules(path: str, image: str | None, sha: str | None, found: Found) -> None:
    """The image fields of the package at ``path`` of a NodeWright (nodewright.nvidia.com) CR."""
    problem = image_problem(image)
    if problem is not None:
        found.append((IMAGE, Violation("image", f"{path}.image", *problem)))
    if sha and not valid_digest(sha):
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


@lru_cache(maxsize=4096)  # CRs repeat the same few digests
def valid_digest(digest: str) -> bool:
    return DIGEST_RE.fullmatch(digest) is not None
