"""nodegate's side of SPIRE (docs/spire.md): only nodes nodegate accepts now have a working SPIRE
agent, with the facts of their current attestation; and SPIRE's x509pop CA bundle follows CA
rotation.

The store says what nodegate accepts (``standing``: not revoked, no refusal of the node's evidence
since its last join or renewal, attestation not expired nor older than
``gate.attestation_lifetime``), SPIRE's Agent API lists the agents, and
``bootstrap.spire.plan`` decides. ``sync_node`` applies it to one node before a join, renewal,
refusal, revoke or forget is answered; ``reconcile`` to every node each ``spire.ban_interval``,
which also catches agents that attested since (SPIRE can ban only an agent it knows) and bans that
failed while SPIRE was unreachable, and recovers them all after a restart: the state is the
store's, never this process's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from attest import ca, svid
from attest.spiffeid import SpiffeIdError, parse_spiffe_id
from bootstrap.config import ConfigError, Settings
from bootstrap.problems import NodeRecordDamaged
from bootstrap.spire import SpireAdmin, SpireUnavailable, write_plugin_files
from bootstrap.spire.plan import UNKNOWN, Action, Standing, plan
from bootstrap.spire.wire import ListedAgent
from bootstrap.store import NodeRecord, Store

log = logging.getLogger("nodegate.spire")

# A banned agent that is not current is forgotten this long after its own SVID expired, past the
# lifetime of any certificate of its attestation (svid_ttl) plus what the clocks of nodegate and
# the SPIRE server may disagree.
CLOCK_MARGIN = timedelta(minutes=5)
_MESSAGES = {"ban": "SPIRE agent banned", "lift": "SPIRE agent ban lifted", "forget": "SPIRE agent forgotten"}


def standing(record: NodeRecord | None, *, now: datetime, lifetime: timedelta | None) -> Standing:
    """What nodegate accepts of the node's SPIRE agents at ``now`` (pure)."""
    if record is None:
        return UNKNOWN
    if record.revoked:
        return Standing(accepted=False, reason="revoked")
    if record.refused_at is not None:
        return Standing(accepted=False, reason="refused")
    if record.quarantine is not None:  # an admin held it (issue 43) until a new boot attests
        return Standing(accepted=False, reason="quarantined")
    if record.expires_at is None or record.expires_at <= now:
        return Standing(accepted=False, reason="expired")
    if lifetime is not None and (record.attested_at is None or record.attested_at + lifetime <= now):
        return Standing(accepted=False, reason="stale")
    return Standing(accepted=True, attestation=record.x509pop_attestation)


@dataclass(frozen=True, slots=True)
class Outcome:
    banned: int = 0
    lifted: int = 0
    forgotten: int = 0


class SpireLink:
    def __init__(self, settings: Settings, admin: SpireAdmin | None) -> None:
        self.settings = settings
        self.admin = admin

    def standing(self, record: NodeRecord | None, now: datetime) -> Standing:
        return standing(record, now=now, lifetime=self.settings.gate.attestation_lifetime)

    def in_step(self, before: NodeRecord | None, after: NodeRecord, now: datetime) -> bool:
        """True when a commit from ``before`` to ``after`` leaves SPIRE nothing to do: the node was
        accepted with the same attestation (a renewal that changed no fact)."""
        was = self.standing(before, now)
        return was.accepted and was.attestation == after.x509pop_attestation

    async def sync_node(self, store: Store, node_name: str, now: datetime) -> Outcome:
        """SPIRE's agents of one node brought in line with its record now. Raises
        SpireUnavailable (the pass applies it later; the store holds what it needs)."""
        if self.admin is None:
            return Outcome()
        # The agents first, then the record: a record newer than the list cannot make the plan ban
        # an agent of an attestation committed in between (it is not in the list).
        agents = await self.admin.agents(("x509pop", f"san:node:{node_name}"))
        try:
            record = await store.get(node_name)
        except NodeRecordDamaged:
            record = None  # nothing in it can be trusted: no agent
        return await self._apply(plan(agents, {node_name: self.standing(record, now)}, **self._clock(now)))

    async def reconcile(self, store: Store, now: datetime) -> Outcome:
        """Every x509pop agent SPIRE knows, against the store (the periodic pass). A SPIRE that
        cannot be reached is logged; the next pass tries again."""
        if self.admin is None:
            return Outcome()
        try:
            agents = await self.admin.agents()
            records = await store.list_nodes(recent=True)
            standings = {r.node_name: self.standing(r, now) for r in records}
            return await self._apply(plan(agents, standings, **self._clock(now)))
        except SpireUnavailable as exc:
            log.warning("SPIRE server not reached", extra={"error": str(exc)})
            return Outcome()

    def _clock(self, now: datetime) -> dict[str, int]:
        forget_after = self.settings.svid_ttl + CLOCK_MARGIN
        return {"now": int(now.timestamp()), "forget_after": int(forget_after.total_seconds())}

    async def _apply(self, actions: list[Action]) -> Outcome:
        assert self.admin is not None  # noqa: S101  (callers checked)
        counts = dict.fromkeys(_MESSAGES, 0)
        for action in actions:
            try:
                agent_id = parse_spiffe_id(action.agent.spiffe_id)
            except SpiffeIdError:
                log.warning("SPIRE agent ID not usable", extra=_fields(action.node, action.agent))
                continue
            if action.kind == "ban":
                done = await self.admin.ban(agent_id)
            else:
                done = await self.admin.lift(agent_id)
            if done:
                counts[action.kind] += 1
                log.info(
                    _MESSAGES[action.kind],
                    extra={**_fields(action.node, action.agent), "code": action.reason},
                )
        return Outcome(counts["ban"], counts["lift"], counts["forget"])

    def sync_bundle(self, cas: ca.CaSet, now: datetime) -> bool:
        """Write SPIRE's x509pop CA bundle and plugin data when they differ from the CA set now."""
        spire = self.settings.spire
        if spire.bundle_file is None or spire.plugin_data_file is None:
            return False
        changed = write_plugin_files(
            spire.bundle_file,
            spire.plugin_data_file,
            svid.bundle_pem(cas.roots(now)),
            spire.agent_id_template,
            spire.server_pid_file,
        )
        if changed:
            log.info("SPIRE x509pop bundle written", extra={"code": f"sequence {cas.bundle_sequence(now)}"})
        return changed

    async def close(self) -> None:
        if self.admin is not None:
            await self.admin.close()


def _fields(node: str, agent: ListedAgent) -> Mapping[str, str]:
    return {"node": node, "spiffe_id": agent.spiffe_id}


def build(settings: Settings) -> SpireLink | None:
    spire = settings.spire
    if spire.server_socket is None and spire.bundle_file is None:
        return None
    try:
        admin = SpireAdmin(spire.server_socket) if spire.server_socket is not None else None
    except SpireUnavailable as exc:
        raise ConfigError(f"spire.server_socket: {exc}") from None
    return SpireLink(settings, admin)
