"""SPIFFE IDs: parse, validate and render ``spiffe://<trust domain>/<path>`` (the SPIFFE-ID rules).

IDs are parsed by our own code because py-spiffe accepts a trailing newline and has no length limits.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass

SCHEME = "spiffe://"
MAX_ID_BYTES = 2048
MAX_TRUST_DOMAIN_BYTES = 255

_TD_CHARS = re.compile(r"[a-z0-9._-]+")
_SEGMENT = re.compile(r"[A-Za-z0-9._-]+")
_PLACEHOLDERS = frozenset({"trust_domain", "node_name", "ek_sha256"})


class SpiffeIdError(ValueError):
    """A SPIFFE ID, trust domain or ID template that breaks the SPIFFE-ID rules."""


def _check_trust_domain(td: str) -> None:
    if not td:
        raise SpiffeIdError("trust domain is empty")
    if len(td) > MAX_TRUST_DOMAIN_BYTES:
        raise SpiffeIdError(f"trust domain is longer than {MAX_TRUST_DOMAIN_BYTES} bytes")
    if "%" in td:
        raise SpiffeIdError("trust domain must not be percent-encoded")
    if "@" in td:
        raise SpiffeIdError("trust domain must not carry userinfo")
    if ":" in td:
        raise SpiffeIdError("trust domain must not carry a port")
    if _TD_CHARS.fullmatch(td) is None:
        raise SpiffeIdError(f"trust domain {td!r} may only contain lowercase a-z, 0-9, '.', '-' and '_'")


def _check_path(path: str) -> None:
    if path == "":
        return
    if not path.startswith("/"):
        raise SpiffeIdError("path must start with '/'")
    if "%" in path:
        raise SpiffeIdError("path must not be percent-encoded")
    if path.endswith("/"):
        raise SpiffeIdError("path must not end with '/'")
    for segment in path[1:].split("/"):
        if segment == "":
            raise SpiffeIdError("path must not contain empty segments")
        if segment in (".", ".."):
            raise SpiffeIdError("path must not contain '.' or '..' segments")
        if _SEGMENT.fullmatch(segment) is None:
            raise SpiffeIdError(f"path segment {segment!r} may only contain A-Z, a-z, 0-9, '.', '-' and '_'")


@dataclass(frozen=True, slots=True)
class SpiffeId:
    """A valid SPIFFE ID in canonical form (construction validates, so no invalid instance exists)."""

    trust_domain: str
    path: str  # "" for the trust-domain ID, else starts with "/"

    def __post_init__(self) -> None:
        if not isinstance(self.trust_domain, str) or not isinstance(self.path, str):
            raise SpiffeIdError("trust domain and path must be strings")
        _check_trust_domain(self.trust_domain)
        _check_path(self.path)
        if len(SCHEME) + len(self.trust_domain) + len(self.path) > MAX_ID_BYTES:
            raise SpiffeIdError(f"SPIFFE ID is longer than {MAX_ID_BYTES} bytes")

    @property
    def is_trust_domain_id(self) -> bool:
        return self.path == ""

    def __str__(self) -> str:
        return f"{SCHEME}{self.trust_domain}{self.path}"


def parse_spiffe_id(text: str) -> SpiffeId:
    """Parse ``spiffe://<td>[/<path>]``. Scheme and trust domain are case-insensitive (SPIFFE-ID
    §2.4) and come back lowercase; the path is kept as is."""
    if not isinstance(text, str):
        raise SpiffeIdError("SPIFFE ID must be a string")
    if len(text) > MAX_ID_BYTES:  # every accepted character is one byte, so this bounds bytes too
        raise SpiffeIdError(f"SPIFFE ID is longer than {MAX_ID_BYTES} bytes")
    if text[: len(SCHEME)].lower() != SCHEME:
        raise SpiffeIdError("SPIFFE ID must start with 'spiffe://'")
    rest = text[len(SCHEME) :]
    if "?" in rest:
        raise SpiffeIdError("SPIFFE ID must not contain a query")
    if "#" in rest:
        raise SpiffeIdError("SPIFFE ID must not contain a fragment")
    slash = rest.find("/")
    td, path = (rest, "") if slash < 0 else (rest[:slash], rest[slash:])
    # Lowercase only ASCII: str.lower() would map e.g. the Kelvin sign to "k" and sneak it in.
    td = "".join(c.lower() if "A" <= c <= "Z" else c for c in td)
    return SpiffeId(td, path)


def validate_trust_domain(td: str) -> str:
    """A configured trust-domain name (not a URI): must already be canonical (lowercase)."""
    if not isinstance(td, str):
        raise SpiffeIdError("trust domain must be a string")
    if td[: len(SCHEME)].lower() == SCHEME:
        raise SpiffeIdError(f"a trust domain is a name, not a SPIFFE ID: write {td[len(SCHEME) :]!r}")
    if td != td.lower() and td.lower() == "".join(c.lower() if "A" <= c <= "Z" else c for c in td):
        raise SpiffeIdError(f"trust domain {td!r} must be lowercase: {td.lower()!r}")
    _check_trust_domain(td)
    return td


def render_spiffe_id(template: str, *, trust_domain: str, node_name: str, ek_sha256: str) -> SpiffeId:
    """Fill ``{trust_domain}``, ``{node_name}``, ``{ek_sha256}`` into an ID template.

    Values are substituted by hand, not with ``str.format``, so a template cannot reach attributes
    or indexes; node name and EK hash must each be one path segment, so they cannot add path levels.
    """
    if not isinstance(template, str):
        raise SpiffeIdError("SPIFFE ID template must be a string")
    validate_trust_domain(trust_domain)
    values = {"trust_domain": trust_domain, "node_name": node_name, "ek_sha256": ek_sha256}
    for key in ("node_name", "ek_sha256"):
        value = values[key]
        if not isinstance(value, str) or _SEGMENT.fullmatch(value) is None or value in (".", ".."):
            raise SpiffeIdError(f"{key} {value!r} is not usable as a SPIFFE ID path segment")
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise SpiffeIdError(f"SPIFFE ID template {template!r}: {exc}") from None
    out: list[str] = []
    for literal, field, format_spec, conversion in parts:
        out.append(literal)
        if field is None:
            continue
        if field not in _PLACEHOLDERS:
            raise SpiffeIdError(f"SPIFFE ID template has unknown placeholder {{{field}}}")
        if format_spec or conversion:
            raise SpiffeIdError(
                f"SPIFFE ID template placeholder {{{field}}} must not have a format or conversion"
            )
        out.append(values[field])
    sid = parse_spiffe_id("".join(out))
    if sid.trust_domain != trust_domain:
        raise SpiffeIdError(f"SPIFFE ID {sid} is not in trust domain {trust_domain}")
    if sid.is_trust_domain_id:
        raise SpiffeIdError(f"SPIFFE ID {sid} has no path (a node ID must not be the trust-domain ID)")
    return sid
