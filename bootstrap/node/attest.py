"""``nodegate attest``: what a joined node runs at every boot, before kubelet starts.

It proves the new boot at once instead of at the next renewal timer tick: a renewal with a fresh
quote (and this boot's id and event log) over the node's current SVID, whatever time the SVID has
left. If that SVID can no longer authenticate (it expired while the machine was off, or the
service no longer accepts it), a full join with the same EK and node name (the binding allows
it). Exit codes as join and renew: 0, 1 refused, 2 local, 75 transient (docs/node-join.md).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from bootstrap.node.defaults import ATTEMPTS, BOOT_ID, DEFAULT_TCTI, NODE_DIR
from bootstrap.node.errors import JoinFailed
from bootstrap.node.join import JoinOptions, join
from bootstrap.node.renew import RenewOptions, read_index, renew

__all__ = ["AttestOptions", "AttestResult", "attest"]

log = logging.getLogger("nodegate.attest")

# Refusals that mean "this SVID cannot authenticate a renewal", not "this node is not trusted".
_REJOIN_CODES = frozenset({"svid_expired", "svid_invalid", "unauthenticated"})


@dataclass(frozen=True)
class AttestOptions:
    server: str
    ca_bundle: Path
    dir: Path = NODE_DIR
    tcti: str = DEFAULT_TCTI
    ek_kind: str = "rsa"  # for the fallback join: the EK the node joined with
    attempts: int = ATTEMPTS
    event_log: Path | None = None  # None: the firmware's log when tcti is the platform TPM
    boot_id_file: Path | None = BOOT_ID


@dataclass(frozen=True)
class AttestResult:
    how: Literal["renewed", "joined"]
    spiffe_id: str
    svid_expires_at: str


async def attest(opts: AttestOptions) -> AttestResult:
    try:
        renewed = await renew(
            RenewOptions(
                server=opts.server,
                ca_bundle=opts.ca_bundle,
                dir=opts.dir,
                tcti=opts.tcti,
                attempts=opts.attempts,
                event_log=opts.event_log,
                boot_id_file=opts.boot_id_file,
                force=True,
            )
        )
        return AttestResult("renewed", renewed.spiffe_id, renewed.svid_expires_at.isoformat())
    except JoinFailed as exc:
        if exc.code not in _REJOIN_CODES:
            raise
        log.warning("%s; joining again with the same TPM", exc.detail)
    joined = await join(
        JoinOptions(
            server=opts.server,
            ca_bundle=opts.ca_bundle,
            node_name=read_index(opts.dir),
            tcti=opts.tcti,
            out=opts.dir,
            ek_kind=opts.ek_kind,
            attempts=opts.attempts,
            event_log=opts.event_log,
            boot_id_file=opts.boot_id_file,
        )
    )
    return AttestResult("joined", joined.spiffe_id, joined.svid_expires_at)
