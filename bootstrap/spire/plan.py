"""Which SPIRE agents nodegate bans, un-bans and forgets: a pure decision over SPIRE's agent list
and what nodegate accepts of each node now (docs/spire.md, "Which agents may run").

An x509pop agent's ID is ``.../<node>/<attestation>`` (``agent_path_template``), where
``attestation`` is a digest of every fact its certificate carries, so each accepted attestation
(a boot, its classes, its pool, its TPM) has its own agent ID, shared by the renewals that keep
those facts. The rule: an agent may run when its node is accepted now and it carries the node's
current attestation; every other agent of a node nodegate issued certificates to is banned. A
banned agent of the current attestation of an accepted node is un-banned (the node attested
again), and a banned one that is not current is forgotten once every certificate that could
bring it back has expired, so SPIRE's list does not grow with every reboot.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal

from bootstrap.spire.wire import ListedAgent

__all__ = ["UNKNOWN", "Action", "Standing", "plan"]

NODE: Final = "node"  # the x509pop SAN keys (attest.x509pop) as SPIRE's selectors carry them
ATTESTATION: Final = "attestation"


@dataclass(frozen=True, slots=True)
class Standing:
    """What nodegate accepts of one node's SPIRE agents now."""

    accepted: bool
    attestation: str | None = None  # the attestation fact its agent must carry (when accepted)
    reason: str = ""  # why not: unknown, revoked, refused, expired, stale


UNKNOWN: Final = Standing(accepted=False, reason="unknown")


@dataclass(frozen=True, slots=True)
class Action:
    kind: Literal["ban", "lift", "forget"]
    agent: ListedAgent
    node: str
    reason: str


def plan(
    agents: Iterable[ListedAgent],
    standings: Mapping[str, Standing],
    *,
    now: int,
    forget_after: int,
) -> list[Action]:
    """The actions that bring ``agents`` in line with ``standings`` (node name -> standing; a node
    missing from it is unknown: forgotten, or never attested). ``now`` and each agent's expiry are
    seconds since the epoch; ``forget_after``: how long after its own SVID expired a banned agent
    that is not current is forgotten. Agents without a ``node`` selector are not nodegate's."""
    out: list[Action] = []
    for agent in agents:
        node = agent.san(NODE)
        if node is None:
            continue
        want = standings.get(node, UNKNOWN)
        current = want.accepted and agent.san(ATTESTATION) == want.attestation
        if not agent.banned:
            if not current:
                out.append(Action("ban", agent, node, want.reason or "superseded"))
        elif current:
            out.append(Action("lift", agent, node, "attested again"))
        elif agent.expires_at and agent.expires_at + forget_after < now:
            out.append(Action("forget", agent, node, "banned, and its certificates have expired"))
    return out
