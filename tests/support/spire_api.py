"""A stand-in of SPIRE's Agent API (ListAgents, BanAgent, DeleteAgent) on a unix socket, and the
API's messages built by the installed protobuf from their field numbers in spire-api-sdk
(``spire/api/server/agent/v1/agent.proto``, ``spire/api/types/*.proto``), so nodegate's hand
encoding (bootstrap/spire/wire.py) is read and answered by a real protobuf implementation."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from attest import x509pop

_STRING, _MESSAGE, _INT32, _INT64, _BOOL = 9, 11, 5, 3, 8
_OPTIONAL, _REPEATED = 1, 3


@functools.cache
def messages() -> dict[str, Any]:
    """Message classes by name: SPIFFEID, Selector, SelectorMatch, BoolValue, Filter, AgentMask,
    ListAgentsRequest, Agent, ListAgentsResponse, BanAgentRequest (DeleteAgentRequest's shape)."""
    fd = descriptor_pb2.FileDescriptorProto(name="spire_api.proto", package="t", syntax="proto3")

    def message(name: str, *fields: tuple[str, int, int, int, str]) -> None:
        m = fd.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = type_name

    message("SPIFFEID", ("trust_domain", 1, _STRING, _OPTIONAL, ""), ("path", 2, _STRING, _OPTIONAL, ""))
    message("Selector", ("type", 1, _STRING, _OPTIONAL, ""), ("value", 2, _STRING, _OPTIONAL, ""))
    # the MatchBehavior enum travels as a varint, as an int32 does
    message(
        "SelectorMatch",
        ("selectors", 1, _MESSAGE, _REPEATED, ".t.Selector"),
        ("match", 2, _INT32, _OPTIONAL, ""),
    )
    message("BoolValue", ("value", 1, _BOOL, _OPTIONAL, ""))
    message(
        "Filter",
        ("by_attestation_type", 1, _STRING, _OPTIONAL, ""),
        ("by_selector_match", 2, _MESSAGE, _OPTIONAL, ".t.SelectorMatch"),
        ("by_banned", 3, _MESSAGE, _OPTIONAL, ".t.BoolValue"),
        ("by_can_reattest", 4, _MESSAGE, _OPTIONAL, ".t.BoolValue"),
        ("by_expires_before", 5, _STRING, _OPTIONAL, ""),
    )
    message(
        "AgentMask", *((n, i, _BOOL, _OPTIONAL, "") for i, n in enumerate(("a", "b", "c", "d", "e", "f"), 2))
    )
    message(
        "ListAgentsRequest",
        ("filter", 1, _MESSAGE, _OPTIONAL, ".t.Filter"),
        ("output_mask", 2, _MESSAGE, _OPTIONAL, ".t.AgentMask"),
        ("page_size", 3, _INT32, _OPTIONAL, ""),
        ("page_token", 4, _STRING, _OPTIONAL, ""),
    )
    message(
        "Agent",
        ("id", 1, _MESSAGE, _OPTIONAL, ".t.SPIFFEID"),
        ("attestation_type", 2, _STRING, _OPTIONAL, ""),
        ("x509svid_serial_number", 3, _STRING, _OPTIONAL, ""),
        ("x509svid_expires_at", 4, _INT64, _OPTIONAL, ""),
        ("selectors", 5, _MESSAGE, _REPEATED, ".t.Selector"),
        ("banned", 6, _BOOL, _OPTIONAL, ""),
        ("can_reattest", 7, _BOOL, _OPTIONAL, ""),
    )
    message(
        "ListAgentsResponse",
        ("agents", 1, _MESSAGE, _REPEATED, ".t.Agent"),
        ("next_page_token", 2, _STRING, _OPTIONAL, ""),
    )
    message("BanAgentRequest", ("id", 1, _MESSAGE, _OPTIONAL, ".t.SPIFFEID"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return {
        m.name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"t.{m.name}"))
        for m in fd.message_type
    }


@dataclass
class FakeAgent:
    selectors: set[tuple[str, str]]
    banned: bool = False
    expires_at: int = 0


def agent_of(trust_domain: str, cert: x509.Certificate, expires_at: int = 0) -> tuple[str, FakeAgent]:
    """The agent SPIRE's x509pop makes of ``cert`` with nodegate's agent_path_template (the
    default ``agent_id_template``): its ID and its selectors."""
    sans = x509pop.selectors(cert, trust_domain)
    agent_id = f"spiffe://{trust_domain}/spire/agent/x509pop/{sans['node']}/{sans['attestation']}"
    selectors = {("x509pop", f"san:{k}:{v}") for k, v in sans.items()}
    selectors.add(("x509pop", f"subject:cn:{sans['node']}"))
    return agent_id, FakeAgent(selectors, expires_at=expires_at)


@dataclass
class FakeSpire:
    """SPIRE's Agent API on a unix socket: lists ``agents`` (a page at a time, as asked), bans and
    deletes them, and records every call as (method, agent ID or "")."""

    socket: Path
    agents: dict[str, FakeAgent] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    server: Any = None

    def attest(self, trust_domain: str, cert_pem: str | bytes, expires_at: int = 0) -> str:
        """An agent attests with this x509pop certificate, as SPIRE would let it (refused: an
        AssertionError, as the real server refuses a banned ID)."""
        pem = cert_pem.encode() if isinstance(cert_pem, str) else cert_pem
        agent_id, agent = agent_of(trust_domain, x509.load_pem_x509_certificate(pem), expires_at)
        old = self.agents.get(agent_id)
        assert old is None or not old.banned, f"{agent_id} is banned"
        self.agents[agent_id] = agent
        return agent_id

    def _id(self, request: bytes) -> str:
        msg = messages()["BanAgentRequest"].FromString(request)
        return f"spiffe://{msg.id.trust_domain}{msg.id.path}"

    async def _ban(self, request: bytes, context: Any) -> bytes:
        agent = self._id(request)
        self.calls.append(("BanAgent", agent))
        if agent not in self.agents:
            await context.abort(grpc.StatusCode.NOT_FOUND, "agent not found")
        self.agents[agent].banned = True
        return b""  # google.protobuf.Empty

    async def _delete(self, request: bytes, context: Any) -> bytes:
        agent = self._id(request)
        self.calls.append(("DeleteAgent", agent))
        if agent not in self.agents:
            await context.abort(grpc.StatusCode.NOT_FOUND, "agent not found")
        del self.agents[agent]
        return b""

    async def _list(self, request: bytes, context: Any) -> bytes:
        m = messages()
        req = m["ListAgentsRequest"].FromString(request)
        self.calls.append(("ListAgents", ""))
        wanted = {(s.type, s.value) for s in req.filter.by_selector_match.selectors}
        assert req.filter.by_attestation_type == "x509pop"
        assert not wanted or req.filter.by_selector_match.match == 2  # MATCH_SUPERSET
        assert not req.filter.HasField("by_banned")
        found = sorted(i for i, a in self.agents.items() if wanted <= a.selectors)
        start = int(req.page_token or 0)
        size = req.page_size or len(found) or 1
        page = found[start : start + size]
        out = m["ListAgentsResponse"]()
        for agent_id in page:
            a = self.agents[agent_id]
            td, path = agent_id.removeprefix("spiffe://").split("/", 1)
            item = out.agents.add(
                attestation_type="x509pop", banned=a.banned, x509svid_expires_at=a.expires_at
            )
            item.id.trust_domain, item.id.path = td, "/" + path
            for t, v in sorted(a.selectors):
                item.selectors.add(type=t, value=v)
        if start + size < len(found):
            out.next_page_token = str(start + size)
        data: bytes = out.SerializeToString()
        return data

    async def start(self) -> None:
        self.server = grpc.aio.server()
        handlers = {
            "BanAgent": grpc.unary_unary_rpc_method_handler(self._ban),
            "DeleteAgent": grpc.unary_unary_rpc_method_handler(self._delete),
            "ListAgents": grpc.unary_unary_rpc_method_handler(self._list),
        }
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("spire.api.server.agent.v1.Agent", handlers),)
        )
        self.server.add_insecure_port(f"unix:{self.socket}")
        await self.server.start()

    async def stop(self) -> None:
        await self.server.stop(None)

    def banned(self) -> set[str]:
        return {i for i, a in self.agents.items() if a.banned}

    def mutations(self) -> list[tuple[str, str]]:
        return [c for c in self.calls if c[0] != "ListAgents"]
