"""Container image references, parsed into parts so that allowlists compare parts, not strings.

``registry.example.com/nodewright`` must not admit ``registry.example.com.evil.io/x`` or
``registry.example.com/nodewright-evil/x``: a string prefix would (gatekeeper-library's
allowedrepos lesson). Here the registry host, the port and each path component are compared.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import NamedTuple

MAX_REFERENCE = 512
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")  # used with fullmatch, as every pattern here
_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_HOST = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
)
DEFAULT_REGISTRY = "docker.io"


class ImageError(ValueError):
    """Not a valid image reference."""


class ImageRef(NamedTuple):
    registry: str  # lower-cased host
    port: int | None
    path: tuple[str, ...]  # repository components
    tag: str | None
    digest: str | None

    @property
    def repository(self) -> str:
        host = self.registry if self.port is None else f"{self.registry}:{self.port}"
        return host + "/" + "/".join(self.path)


@lru_cache(maxsize=4096)  # pure; reviews repeat the same few images, and errors are not cached
def parse_image(ref: str) -> ImageRef:
    """Parse ``[host[:port]/]path[:tag][@digest]`` the way container runtimes do: the first
    component is a registry when it has a dot or a port, or is ``localhost``."""
    if not isinstance(ref, str) or not ref or len(ref) > MAX_REFERENCE or ref != ref.strip():
        raise ImageError("image reference must be a non-empty string without spaces")
    rest, _, digest = ref.partition("@")
    if digest and not DIGEST_RE.fullmatch(digest):
        raise ImageError(f"digest {digest!r} is not sha256:<64 hex>")
    parts = rest.split("/")
    first = parts[0]
    if len(parts) > 1 and ("." in first or ":" in first or first == "localhost"):
        host_port, path_parts = first, parts[1:]
    else:
        host_port, path_parts = DEFAULT_REGISTRY, parts
        if len(path_parts) == 1:
            path_parts = ["library", *path_parts]
    tag = None
    last = path_parts[-1]
    if ":" in last:
        last, tag = last.split(":", 1)
        if not _TAG.fullmatch(tag):
            raise ImageError(f"tag {tag!r} is not a valid tag")
        path_parts = [*path_parts[:-1], last]
    host, _, port_text = host_port.partition(":")
    port = None
    if port_text:
        if not port_text.isascii() or not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ImageError(f"registry port {port_text!r} is not a port")
        port = int(port_text)
    if not _HOST.fullmatch(host):
        raise ImageError(f"registry host {host!r} is not a host name")
    for component in path_parts:
        if not _COMPONENT.fullmatch(component):
            raise ImageError(f"repository component {component!r} is not valid")
    return ImageRef(host.lower(), port, tuple(path_parts), tag, digest or None)


@lru_cache(maxsize=1024)
def parse_prefix(prefix: str) -> ImageRef:
    """An allowlist entry: ``host[:port][/path...]``, no tag or digest. A bare host admits
    everything that registry serves."""
    if not isinstance(prefix, str) or "@" in prefix or not prefix or len(prefix) > MAX_REFERENCE:
        raise ImageError(f"registry allowlist entry {prefix!r} must be host[:port][/path]")
    host_port, _, path = prefix.strip("/").partition("/")
    if not ("." in host_port or ":" in host_port or host_port == "localhost"):
        raise ImageError(f"allowlist entry {prefix!r} must start with a registry host")
    components = tuple(path.split("/")) if path else ()
    probe = parse_image(f"{host_port}/{'/'.join(components) or 'x'}")
    if probe.tag is not None:
        raise ImageError(f"allowlist entry {prefix!r} takes no tag")
    return probe._replace(path=components)


def allowed_by(ref: ImageRef, prefix: ImageRef) -> bool:
    """Same host, same port, and the prefix's path components lead (or are) the image's."""
    return (
        ref.registry == prefix.registry
        and ref.port == prefix.port
        and ref.path[: len(prefix.path)] == prefix.path
    )


def pulled_repository(image: str, group: str) -> str:
    """The repository the operator pulls for a package's ``image``: ``skyhook.nvidia.com`` cuts
    the image at its first ``:`` while decoding (so ``reg:5000/team/pkg`` becomes ``reg``, a
    Docker Hub name); ``nodewright.nvidia.com`` refuses a tag or digest and keeps the image."""
    return image.split(":", 1)[0] if group == "skyhook.nvidia.com" else image
