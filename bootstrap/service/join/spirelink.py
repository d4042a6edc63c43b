"""nodegate's side of SPIRE (docs/spire.md): ban the agents of revoked nodes, lift the ban on
unrevoke, and keep SPIRE's x509pop CA bundle current across CA rotation.

A ban is by agent SPIFFE ID, which SPIRE derives from the x509pop certificate's ``node`` SAN
(``agent_path_template``), so one ID per node whatever its certificate. SPIRE can only ban an
agent it knows: a node revoked before its agent attested is banned by the periodic pass, which
repeats the bans of revoked nodes while their last x509pop certificate may still be valid.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from attest import ca, svid
from attest.spiffeid import SpiffeId
from bootstrap.config import ConfigError, Settings
from bootstrap.spire import SpireAdmin, SpireUnavailable, write_plugin_files
from bootstrap.store import NodeRecord, Store

log = logging.getLogger("nodegate.spire")

# How long after its SVID (and x509pop certificate) expired a revoked node is still banned again:
# the clocks of nodegate and the SPIRE server may disagree this much.
CLOCK_MARGIN = timedelta(minutes=5)


class SpireLink:
    def __init__(self, settings: Settings, admin: SpireAdmin | None) -> None:
        self.settings = settings
        self.admin = admin

    def agent_id(self, record: NodeRecord) -> SpiffeId:
        return svid.render_spiffe_id(
            self.settings.spire.agent_id_template,
            trust_domain=self.settings.spire_trust_domain,
            node_name=record.node_name,
            ek_sha256=record.ek_sha256,
        )

    async def revoked(self, record: NodeRecord) -> None:
        """After a revoke (or unrevoke) was stored: ban (or lift the ban on) the node's agent.
        A failure is logged; a ban is retried by the periodic pass, a lift is not (docs/spire.md)."""
        if self.admin is None:
            return
        agent = self.agent_id(record)
        try:
            if record.revoked:
                done = await self.admin.ban(agent)
                msg = "SPIRE agent banned" if done else "no SPIRE agent to ban yet"
            else:
                done = await self.admin.lift(agent)
                msg = "SPIRE agent ban lifted" if done else "no SPIRE agent ban to lift"
            log.info(msg, extra=_fields(record, agent))
        except SpireUnavailable as exc:
            log.warning("SPIRE server not reached", extra={**_fields(record, agent), "error": str(exc)})

    async def ban_revoked(self, store: Store, now: datetime) -> int:
        """Ban the agents of revoked nodes whose x509pop certificate may still be valid; the number
        of bans SPIRE applied."""
        if self.admin is None:
            return 0
        banned = 0
        for record in await store.list_nodes():
            if not record.revoked:
                continue
            if record.expires_at is not None and record.expires_at + CLOCK_MARGIN < now:
                continue  # its certificate has expired: SPIRE's x509pop refuses it anyway
            agent = self.agent_id(record)
            try:
                if await self.admin.ban(agent):
                    banned += 1
            except SpireUnavailable as exc:
                log.warning("SPIRE server not reached", extra={**_fields(record, agent), "error": str(exc)})
                break
        return banned

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


def _fields(record: NodeRecord, agent: SpiffeId) -> dict[str, str]:
    return {"node": record.node_name, "spiffe_id": str(agent)}


def build(settings: Settings) -> SpireLink | None:
    spire = settings.spire
    if spire.server_socket is None and spire.bundle_file is None:
        return None
    try:
        admin = SpireAdmin(spire.server_socket) if spire.server_socket is not None else None
    except SpireUnavailable as exc:
        raise ConfigError(f"spire.server_socket: {exc}") from None
    return SpireLink(settings, admin)
