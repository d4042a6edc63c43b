"""nodegate's hand-written Agent API messages (bootstrap/spire/wire.py) against protobuf itself,
with the API's field numbers (tests/support/spire_api.py)."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bootstrap.spire.wire import ListedAgent, WireError, list_agents_request, list_agents_response
from tests.support.spire_api import messages

text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
selector = st.tuples(st.sampled_from(("x509pop", "unix")), text)
agent_st = st.fixed_dictionaries(
    {
        "td": st.from_regex(r"[a-z0-9.-]{1,20}", fullmatch=True),
        "path": st.from_regex(r"(/[a-z0-9._-]{1,12}){1,4}", fullmatch=True),
        "type": text,
        "serial": text,
        "expires": st.integers(-(1 << 63), (1 << 63) - 1),
        "selectors": st.lists(selector, max_size=6),
        "banned": st.booleans(),
        "reattest": st.booleans(),
    }
)


def encoded(agents: list[dict[str, Any]], token: str) -> bytes:
    out = messages()["ListAgentsResponse"](next_page_token=token)
    for a in agents:
        item = out.agents.add(
            attestation_type=a["type"],
            x509svid_serial_number=a["serial"],
            x509svid_expires_at=a["expires"],
            banned=a["banned"],
            can_reattest=a["reattest"],
        )
        item.id.trust_domain, item.id.path = a["td"], a["path"]
        for t, v in a["selectors"]:
            item.selectors.add(type=t, value=v)
    data: bytes = out.SerializeToString()
    return data


@given(st.lists(agent_st, max_size=5), text)
def test_a_list_answer_reads_as_protobuf_wrote_it(agents: list[dict[str, Any]], token: str) -> None:
    got, next_token = list_agents_response(encoded(agents, token))
    assert next_token == token
    assert got == [
        ListedAgent(
            f"spiffe://{a['td']}{a['path']}", a["type"], frozenset(a["selectors"]), a["banned"], a["expires"]
        )
        for a in agents
    ]


@given(st.binary(max_size=200))
def test_any_bytes_read_as_an_answer_or_a_wire_error(data: bytes) -> None:
    with contextlib.suppress(WireError):
        list_agents_response(data)


def test_a_truncated_answer_is_refused_not_half_read() -> None:
    one = {"td": "t", "path": "/a", "type": "x509pop", "serial": "1", "expires": 5}
    data = encoded([{**one, "selectors": [("x509pop", "san:node:n")], "banned": True, "reattest": True}], "")
    for cut in range(1, len(data)):
        with pytest.raises(WireError):
            list_agents_response(data[:cut])


@given(st.one_of(st.none(), st.tuples(text, text)), st.integers(0, (1 << 31) - 1), text)
def test_a_list_request_is_the_apis_message(selector: tuple[str, str] | None, size: int, token: str) -> None:
    msg = messages()["ListAgentsRequest"].FromString(
        list_agents_request(attestation_type="x509pop", selector=selector, page_size=size, page_token=token)
    )
    assert msg.filter.by_attestation_type == "x509pop"
    assert (msg.page_size, msg.page_token) == (size, token)
    assert not msg.HasField("output_mask")  # every field, selectors included
    assert not msg.filter.HasField("by_banned")  # banned agents too
    if selector is None:
        assert not msg.filter.HasField("by_selector_match")
    else:
        assert [(s.type, s.value) for s in msg.filter.by_selector_match.selectors] == [selector]
        assert msg.filter.by_selector_match.match == 2  # MATCH_SUPERSET


def test_an_agent_without_an_id_is_refused() -> None:
    out = messages()["ListAgentsResponse"]()
    out.agents.add(attestation_type="x509pop")
    with pytest.raises(WireError, match="without an id"):
        list_agents_response(out.SerializeToString())
