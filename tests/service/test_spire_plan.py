"""Which SPIRE agents nodegate bans, un-bans and forgets (bootstrap/spire/plan.py) and what it
accepts of a node (spirelink.standing): pure decisions, asserted as properties."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from attest.tpm import Counters
from bootstrap.service.join.spirelink import standing
from bootstrap.spire.plan import UNKNOWN, Action, Standing, plan
from bootstrap.spire.wire import ListedAgent
from bootstrap.store import NodeRecord
from bootstrap.store.model import Quarantine

NOW = 1_800_000_000
FORGET_AFTER = 3900
NODES = ("n-1", "n-2", "n-3")
ATTESTATIONS = ("a" * 32, "b" * 32, "c" * 32)


def agent(
    node: str | None, attestation: str | None, *, banned: bool = False, expires_at: int = 0
) -> ListedAgent:
    selectors = {("x509pop", "subject:cn:x")}
    if node is not None:
        selectors.add(("x509pop", f"san:node:{node}"))
    if attestation is not None:
        selectors.add(("x509pop", f"san:attestation:{attestation}"))
    path = f"{node or 'other'}/{attestation or 'none'}"
    return ListedAgent(
        f"spiffe://spire.test/spire/agent/x509pop/{path}", "x509pop", frozenset(selectors), banned, expires_at
    )


agents_st = st.lists(
    st.builds(
        agent,
        st.sampled_from((*NODES, None)),
        st.sampled_from((*ATTESTATIONS, None)),
        banned=st.booleans(),
        expires_at=st.sampled_from((0, NOW - 10_000, NOW - 100, NOW + 3600)),
    ),
    max_size=12,
    unique_by=lambda a: a.spiffe_id,
)
standings_st = st.dictionaries(
    st.sampled_from(NODES),
    st.one_of(
        st.builds(Standing, st.just(True), st.sampled_from((*ATTESTATIONS, None))),
        st.builds(
            Standing, st.just(False), st.none(), st.sampled_from(("revoked", "refused", "expired", "stale"))
        ),
    ),
)


def applied(agents: list[ListedAgent], actions: list[Action]) -> list[ListedAgent]:
    """SPIRE after the actions: a ban marks the agent banned, a lift or forget deletes it."""
    by_id = {a.spiffe_id: a for a in agents}
    for act in actions:
        if act.kind == "ban":
            by_id[act.agent.spiffe_id] = replace(by_id[act.agent.spiffe_id], banned=True)
        else:
            del by_id[act.agent.spiffe_id]
    return list(by_id.values())


def current(a: ListedAgent, standings: dict[str, Standing]) -> bool:
    node = a.san("node")
    want = standings.get(node, UNKNOWN) if node is not None else UNKNOWN
    return want.accepted and a.san("attestation") == want.attestation


@given(agents_st, standings_st)
def test_afterwards_only_current_agents_of_accepted_nodes_run(
    agents: list[ListedAgent], standings: dict[str, Standing]
) -> None:
    actions = plan(agents, standings, now=NOW, forget_after=FORGET_AFTER)
    after = applied(agents, actions)
    for a in after:
        if a.san("node") is not None and not a.banned:
            assert current(a, standings), a
    # nothing else is touched: agents that are not nodegate's, and current agents already running
    touched = {act.agent.spiffe_id for act in actions}
    for a in agents:
        if a.san("node") is None or (current(a, standings) and not a.banned):
            assert a.spiffe_id not in touched
    # a ban is lifted only for the current attestation of an accepted node, and a banned agent is
    # forgotten only once its SVID expired ``forget_after`` ago
    for act in actions:
        assert act.kind == "ban" or act.agent.banned
        assert (act.kind == "lift") == (act.agent.banned and current(act.agent, standings))
        if act.kind == "forget":
            assert 0 < act.agent.expires_at < NOW - FORGET_AFTER
    # and a second pass bans and lifts nothing: bans are idempotent (it may forget what the first
    # banned, when that agent's SVID had long expired)
    again = plan(after, standings, now=NOW, forget_after=FORGET_AFTER)
    assert {a.kind for a in again} <= {"forget"}
    assert {a.agent.spiffe_id for a in again} <= {a.agent.spiffe_id for a in actions if a.kind == "ban"}


def test_the_reasons_name_why() -> None:
    agents = [agent("n-1", "a" * 32), agent("n-2", "a" * 32), agent("n-3", "a" * 32)]
    standings = {"n-1": Standing(True, "b" * 32), "n-2": Standing(False, reason="refused")}
    got = {(a.node, a.kind, a.reason) for a in plan(agents, standings, now=NOW, forget_after=FORGET_AFTER)}
    assert got == {("n-1", "ban", "superseded"), ("n-2", "ban", "refused"), ("n-3", "ban", "unknown")}


def record(**change: object) -> NodeRecord:
    base = NodeRecord(
        node_name="n-1",
        ek_sha256="e" * 64,
        ak_public=b"\x00\x01",
        spiffe_id="spiffe://fleet.test/node/n-1",
        counters=Counters(1, 0, 1),
        attested_at=datetime(2027, 1, 1, tzinfo=UTC),
        expires_at=datetime(2027, 1, 1, 1, tzinfo=UTC),
        revoked=False,
        svid_serials=("01",),
        x509pop_attestation="a" * 32,
    )
    return replace(base, **change)  # type: ignore[arg-type]


@given(
    revoked=st.booleans(),
    refused=st.booleans(),
    quarantined=st.booleans(),
    minutes=st.integers(-10, 130),
    lifetime=st.sampled_from((None, 15, 90)),
)
def test_a_node_is_accepted_only_while_its_attestation_is(
    revoked: bool, refused: bool, quarantined: bool, minutes: int, lifetime: int | None
) -> None:
    attested = datetime(2027, 1, 1, tzinfo=UTC)
    held = Quarantine("a suspect dbx", "admin", attested, 1) if quarantined else None
    rec = record(
        revoked=revoked, refused_at=attested + timedelta(minutes=1) if refused else None, quarantine=held
    )
    now = attested + timedelta(minutes=minutes)
    life = timedelta(minutes=lifetime) if lifetime is not None else None
    got = standing(rec, now=now, lifetime=life)
    fresh = minutes < 60 and (life is None or minutes < lifetime)  # type: ignore[operator]
    assert got.accepted == (not revoked and not refused and not quarantined and fresh)
    assert got.attestation == ("a" * 32 if got.accepted else None)
    assert got.accepted or got.reason in {"revoked", "refused", "quarantined", "expired", "stale"}


def test_no_record_is_unknown() -> None:
    assert standing(None, now=datetime.now(UTC), lifetime=None) == UNKNOWN
