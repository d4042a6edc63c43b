"""The few protobuf messages of SPIRE's Agent API that nodegate sends and reads, by hand.

Field numbers are those of spire-api-sdk (``spire/api/server/agent/v1/agent.proto``,
``spire/api/types/{agent,selector,spiffeid}.proto``) as SPIRE v1.13 serves them. Encoding is the
protobuf wire format (varints and length-delimited fields); decoding is strict about structure
(a truncated or malformed message is refused, never half-read) and skips fields it does not know,
as protobuf readers must. nodegate thus needs grpcio and no generated code.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from attest.spiffeid import SpiffeId

__all__ = [
    "MATCH_SUPERSET",
    "ListedAgent",
    "WireError",
    "agent_request",
    "list_agents_request",
    "list_agents_response",
]

MATCH_SUPERSET: Final = 2  # spire.api.types.SelectorMatch.MatchBehavior
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_MAX_VARINT_BYTES: Final = 10


class WireError(ValueError):
    """A message that is not protobuf of the expected shape."""


# -- encoding -----------------------------------------------------------------------------------------


def varint(n: int) -> bytes:
    if n < 0:
        raise ValueError("varints here are unsigned")
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _len_field(number: int, value: bytes) -> bytes:
    return varint(number << 3 | _LEN) + varint(len(value)) + value


def _varint_field(number: int, value: int) -> bytes:
    return varint(number << 3 | _VARINT) + varint(value)


def _spiffe_id(agent_id: SpiffeId) -> bytes:
    """spire.api.types.SPIFFEID {trust_domain = 1, path = 2}."""
    return _len_field(1, agent_id.trust_domain.encode()) + _len_field(2, agent_id.path.encode())


def agent_request(agent_id: SpiffeId) -> bytes:
    """BanAgentRequest / DeleteAgentRequest / GetAgentRequest (same first field): {id = 1}."""
    return _len_field(1, _spiffe_id(agent_id))


def list_agents_request(
    *,
    attestation_type: str,
    selector: tuple[str, str] | None = None,
    page_size: int = 0,
    page_token: str = "",
) -> bytes:
    """ListAgentsRequest {filter = 1 {by_attestation_type = 1, by_selector_match = 2
    {selectors = 1 {type = 1, value = 2}, match = 2}}, page_size = 3, page_token = 4}; no output
    mask: every field of each agent, selectors included."""
    flt = _len_field(1, attestation_type.encode())
    if selector is not None:
        sel = _len_field(1, selector[0].encode()) + _len_field(2, selector[1].encode())
        flt += _len_field(2, _len_field(1, sel) + _varint_field(2, MATCH_SUPERSET))
    out = _len_field(1, flt)
    if page_size:
        out += _varint_field(3, page_size)
    if page_token:
        out += _len_field(4, page_token.encode())
    return out


# -- decoding -----------------------------------------------------------------------------------------


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    for i in range(_MAX_VARINT_BYTES):
        if pos + i >= len(data):
            raise WireError("truncated varint")
        byte = data[pos + i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos + i + 1
        shift += 7
    raise WireError("varint longer than 10 bytes")


def fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value): an int for varints, the bytes otherwise."""
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, kind = key >> 3, key & 7
        if number == 0:
            raise WireError("field number 0")
        if kind == _VARINT:
            value, pos = _read_varint(data, pos)
            yield number, kind, value
            continue
        if kind == _LEN:
            size, pos = _read_varint(data, pos)
            end = pos + size
        elif kind in (_I64, _I32):
            end = pos + (8 if kind == _I64 else 4)
        else:
            raise WireError(f"wire type {kind} (groups are not used by this API)")
        if end > len(data):
            raise WireError("truncated field")
        yield number, kind, data[pos:end]
        pos = end


def _text(kind: int, value: int | bytes, what: str) -> str:
    if kind != _LEN or not isinstance(value, bytes):
        raise WireError(f"{what} is not a string")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise WireError(f"{what} is not UTF-8") from None


def _message(kind: int, value: int | bytes, what: str) -> bytes:
    if kind != _LEN or not isinstance(value, bytes):
        raise WireError(f"{what} is not a message")
    return value


def _number(kind: int, value: int | bytes, what: str) -> int:
    if kind != _VARINT or not isinstance(value, int):
        raise WireError(f"{what} is not a varint")
    return value


@dataclass(frozen=True, slots=True)
class ListedAgent:
    """One agent as SPIRE lists it (spire.api.types.Agent)."""

    spiffe_id: str
    attestation_type: str
    selectors: frozenset[tuple[str, str]]  # (type, value), e.g. ("x509pop", "san:node:gpu-1")
    banned: bool
    expires_at: int  # its own X.509-SVID's expiry, seconds since the epoch (0: not reported)

    def san(self, key: str) -> str | None:
        """The value of the x509pop ``san:<key>:<value>`` selector; None when it has none or
        several different ones (which nodegate's certificates never give)."""
        prefix = f"san:{key}:"
        found = {v[len(prefix) :] for t, v in self.selectors if t == "x509pop" and v.startswith(prefix)}
        return next(iter(found)) if len(found) == 1 else None


def _agent_id(data: bytes) -> str:
    td = path = ""
    for number, kind, value in fields(data):
        if number == 1:
            td = _text(kind, value, "SPIFFEID.trust_domain")
        elif number == 2:
            path = _text(kind, value, "SPIFFEID.path")
    return f"spiffe://{td}{path}"


def _selector(data: bytes) -> tuple[str, str]:
    out = ["", ""]
    for number, kind, value in fields(data):
        if number in (1, 2):
            out[number - 1] = _text(kind, value, "Selector")
    return out[0], out[1]


def _agent(data: bytes) -> ListedAgent:
    spiffe_id, attestation, banned, expires = "", "", False, 0
    selectors: set[tuple[str, str]] = set()
    for number, kind, value in fields(data):
        if number == 1:
            spiffe_id = _agent_id(_message(kind, value, "Agent.id"))
        elif number == 2:
            attestation = _text(kind, value, "Agent.attestation_type")
        elif number == 4:
            expires = _number(kind, value, "Agent.x509svid_expires_at")
            if expires >= 1 << 63:
                expires -= 1 << 64  # int64 on the wire: two's complement
        elif number == 5:
            selectors.add(_selector(_message(kind, value, "Agent.selectors")))
        elif number == 6:
            banned = _number(kind, value, "Agent.banned") != 0
    if not spiffe_id.startswith("spiffe://") or spiffe_id == "spiffe://":
        raise WireError("an agent without an id")
    return ListedAgent(spiffe_id, attestation, frozenset(selectors), banned, expires)


def list_agents_response(data: bytes) -> tuple[list[ListedAgent], str]:
    """ListAgentsResponse {agents = 1, next_page_token = 2}: the agents and the next page's token."""
    agents: list[ListedAgent] = []
    token = ""
    for number, kind, value in fields(data):
        if number == 1:
            agents.append(_agent(_message(kind, value, "ListAgentsResponse.agents")))
        elif number == 2:
            token = _text(kind, value, "ListAgentsResponse.next_page_token")
    return agents, token
