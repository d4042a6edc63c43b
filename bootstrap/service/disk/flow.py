"""A disk-key release (docs/disk-keys.md, "The exchange"): start and finish.

start   the node names itself, the volume (its LUKS UUID), the epoch and key version its binding
        was made with, and sends its EK public area. The node must be bound to that EK, not
        revoked or quarantined; the epoch must be the TPM's current one and the version one the
        server still has. The answer is a nonce in a sealed session, as for a renewal.
finish  a quote by the AK of the node's attestation over that nonce (and the volume, epoch and
        version), the PCRs, the event log and the boot id: judged exactly like a join's
        (quote, counters, PCR policy, measured boot, boot id); the boot must not be one an admin
        quarantined, and must belong to a class of ``disk_keys.classes``. Only then are the keys
        derived and the session marked used with an audit entry (one step in the store); the
        answer seals them with a fresh secret that only the node's TPM recovers (MakeCredential
        to its EK and that AK).

Every release and every refusal of a session we issued is one audit line (``nodegate.disk``:
node, volume, class, verdict, code) and one count of ``nodegate_disk_releases_total``.
Nothing here speaks HTTP, and no key or secret is ever logged.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from attest import diskkey, tpm
from attest.errors import AttestationError, EkMismatch, MalformedInput
from attest.identity import ek_digest
from bootstrap.config import Settings
from bootstrap.diskconfig import DiskKeysSettings
from bootstrap.names import is_node_name
from bootstrap.problems import (
    DiskKeyRevoked,
    DiskKeysDisabled,
    NodeNameConflict,
    NodeNotEnrolled,
    NodeQuarantined,
    NodeRevoked,
    SessionReused,
    Unavailable,
)
from bootstrap.protocol import (
    DiskFinishRequest,
    DiskFinishResponse,
    DiskStartRequest,
    DiskStartResponse,
    disk_release_aad,
)
from bootstrap.service.disk.eligibility import disk_class
from bootstrap.service.join import evidence
from bootstrap.service.join.sessions import Sealer, Session
from bootstrap.store import NodeRecord, Store, StoreUnavailable
from bootstrap.store.diskkeys import DiskVault, VaultDamaged, VaultDoc, VaultUnavailable
from bootstrap.times import rfc3339

log = logging.getLogger("nodegate.disk")

_INLINE_EVENT_LOG = 64 * 1024  # larger logs are judged on a worker thread, as in a join
_USED_CACHE = 10_000

Count = Callable[[str, str], None]  # disk class ("none" before one is known), code ("ok" or a machine code)
Refusal = Callable[[str, str, str], Awaitable[None]]  # node, code, detail: into the store's trail


@dataclass(frozen=True, slots=True)
class _Keys:
    epoch: int
    version: int
    current: int


class DiskService:
    def __init__(
        self,
        settings: Settings,
        *,
        store: Store,
        sealer: Sealer,
        vault: DiskVault | None,
        count: Count | None = None,
        on_refusal: Refusal | None = None,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.settings = settings
        self.store = store
        self.sealer = sealer
        self.vault = vault
        self._count = count
        self._on_refusal = on_refusal
        self._now = now
        self._used: dict[str, float] = {}  # session id -> expiry: replays this replica saw

    @property
    def keys(self) -> DiskKeysSettings:
        if self.settings.disk_keys is None or self.vault is None:
            raise DiskKeysDisabled("disk keys are not configured on this service (disk_keys)")
        return self.settings.disk_keys

    # -- start ---------------------------------------------------------------------------------

    async def start(self, req: DiskStartRequest) -> DiskStartResponse:
        try:
            return await self._start(req)
        except AttestationError as exc:
            # A line and a count, no store entry: anyone can send a start, and the store must not
            # fill up with an attacker's noise (as for the join).
            self._line(req.node_name, req.volume, "none", "refused", exc.code, req.key_version)
            raise

    async def _start(self, req: DiskStartRequest) -> DiskStartResponse:
        self.keys  # noqa: B018  (refuses at once when the feature is off)
        if not is_node_name(req.node_name):
            raise MalformedInput(f"node_name {req.node_name[:64]!r} is not a Kubernetes node name")
        record = await self._record(req.node_name)
        ek = ek_digest(req.ek_public)
        if ek != record.ek_sha256:
            raise EkMismatch(f"this is not the TPM node {req.node_name} is bound to (EK {ek})")
        self._check_standing(record)
        chosen = self._choose(await self._vault(), ek, req.epoch, req.key_version)
        tpm.verify_ak(record.ak_public)  # the AK the keys will be sealed to must still be one
        session, token = self.sealer.new(
            kind="disk",
            node_name=record.node_name,
            ek_sha256=record.ek_sha256,
            ak_public=record.ak_public,
            csr_der=b"",
            selection=self.settings.pcr_policy.selection,
            ttl=self.settings.session_ttl.total_seconds(),
            volume=req.volume,
            epoch=chosen.epoch,
            key_version=chosen.version,
            ek_public=req.ek_public,
        )
        return DiskStartResponse(
            session=token,
            nonce=session.nonce,
            pcr_selection=session.selection,
            expires_at=rfc3339(datetime.fromtimestamp(session.expires_at, UTC)),
            key_version=chosen.version,
            epoch=chosen.epoch,
        )

    # -- finish --------------------------------------------------------------------------------

    async def finish(self, req: DiskFinishRequest) -> DiskFinishResponse:
        try:
            session = self.sealer.open(req.session, "disk")
        except AttestationError as exc:
            self._line("", "", "none", "refused", exc.code, None)
            raise
        judged_class = "none"
        try:
            if session.id in self._used:
                raise SessionReused("this session already released its keys; start again")
            record = await self._record(session.node_name)
            if record.ek_sha256 != session.ek_sha256 or record.ak_public != session.ak_public:
                raise NodeNameConflict(
                    f"node {session.node_name} attested with another TPM or AK since this release started"
                )
            self._check_standing(record)
            judged = await self._judge(session, req, record)
            _check_admin_quarantine(record, judged.quote.counters.reset_count)
            found = disk_class(
                self.keys,
                self.settings.pcr_policy,
                self.settings.measured_boot,
                judged.quote.pcrs,
                judged.facts,
            )
            if found is None:
                raise DiskKeysDisabled(self._no_class(judged))
            judged_class = found
            # Read again: a revocation or a retirement between start and finish counts.
            doc = await self._vault()
            chosen = self._choose(doc, session.ek_sha256, session.epoch, session.key_version)
            response = await self._release(session, req.session, doc, chosen, judged_class)
        except AttestationError as exc:
            await self._refused(session, judged_class, exc)
            raise
        self._line(session.node_name, session.volume, judged_class, "released", "ok", session.key_version)
        return response

    async def _release(
        self, session: Session, token: str, doc: VaultDoc, chosen: _Keys, cls: str
    ) -> DiskFinishResponse:
        volume = uuid.UUID(session.volume)
        keys = {}
        for version in sorted({chosen.version, chosen.current}):
            secret = doc.secret(version)
            if secret is None:  # _choose checked it; a retired current version cannot be
                raise DiskKeyRevoked(f"key version {version} was retired")
            keys[version] = diskkey.derive_key(
                secret, ek_sha256=session.ek_sha256, volume=volume, epoch=chosen.epoch, version=version
            )
        transport = os.urandom(diskkey.TRANSPORT_BYTES)
        ak = tpm.verify_ak(session.ak_public)
        blob, encrypted = tpm.make_credential(session.ek_public, ak.name, transport)
        sealed = diskkey.seal_keys(
            transport, keys, disk_release_aad(token, session.node_name, session.volume, chosen.epoch)
        )
        del transport, keys
        detail = (
            f"volume={session.volume} class={cls} epoch={chosen.epoch} "
            f"version={chosen.version} current={chosen.current}"
        )
        # Recorded (and the session marked used) before a byte of the answer leaves: a crash after
        # this point loses nothing (keys are derived, never stored), and a replay is refused.
        try:
            await self.store.record_disk(
                session.node_name,
                action="disk-release",
                actor="node",
                detail=detail,
                session_id=session.id,
                session_expires_at=datetime.fromtimestamp(session.expires_at, UTC),
            )
        except StoreUnavailable as exc:
            raise Unavailable(f"store: {exc}", retry_after=2) from None
        self._remember(session)
        return DiskFinishResponse(
            node_name=session.node_name,
            volume=session.volume,
            epoch=chosen.epoch,
            key_version=chosen.version,
            current_version=chosen.current,
            credential_blob=blob,
            encrypted_secret=encrypted,
            sealed_keys=sealed,
        )

    # -- checks --------------------------------------------------------------------------------

    async def _record(self, node_name: str) -> NodeRecord:
        try:
            record = await self.store.get(node_name)
        except StoreUnavailable as exc:
            raise Unavailable(f"store: {exc}", retry_after=2) from None
        if record is None:
            raise NodeNotEnrolled(f"no node {node_name} has joined; disk keys go to attested nodes only")
        return record

    def _check_standing(self, record: NodeRecord) -> None:
        """Revoked, or quarantined by age (``gate.attestation_lifetime``): an expired SVID alone
        is not a reason (a machine that was off boots with one), the fresh quote is what counts."""
        if record.revoked:
            raise NodeRevoked(f"node {record.node_name} is revoked")
        lifetime = self.settings.gate.attestation_lifetime
        if (
            lifetime is not None
            and record.attested_at is not None
            and record.attested_at + lifetime <= self._now()
        ):
            raise NodeQuarantined(
                f"node {record.node_name} last attested at {rfc3339(record.attested_at)}, longer ago than "
                f"gate.attestation_lifetime ({lifetime}): it is quarantined (docs/disk-keys.md)"
            )

    async def _vault(self) -> VaultDoc:
        vault = self.vault
        if vault is None:
            raise DiskKeysDisabled("disk keys are not configured on this service (disk_keys)")
        damaged: str | None = None
        try:
            doc = await vault.read()
        except VaultUnavailable as exc:
            raise Unavailable(f"disk-key secret: {exc}", retry_after=2) from None
        except VaultDamaged as exc:
            doc, damaged = None, str(exc)
        if damaged is not None:
            log.error("the disk-key secret cannot be used", extra={"error": damaged[:300]})
            raise Unavailable("the disk-key secret cannot be used; see the service's log", retry_after=30)
        if doc is None:
            log.error("the disk-key secret is missing", extra={"error": vault.where})
            raise Unavailable("the disk-key secret is missing; see the service's log", retry_after=30)
        return doc

    @staticmethod
    def _choose(doc: VaultDoc, ek_sha256: str, epoch: int | None, version: int | None) -> _Keys:
        current_epoch = doc.epoch(ek_sha256)
        if epoch is None:
            epoch = current_epoch
        elif epoch < current_epoch:
            raise DiskKeyRevoked(
                f"keys of epoch {epoch} were revoked for good (nodegate disk revoke); this TPM is at "
                f"epoch {current_epoch}"
            )
        elif epoch > current_epoch:
            raise MalformedInput(f"there is no epoch {epoch} for this TPM (it is at {current_epoch})")
        if version is None:
            version = doc.current
        elif doc.secret(version) is None:
            if version < doc.current:
                raise DiskKeyRevoked(f"key version {version} was retired (nodegate disk rotate --retire)")
            raise MalformedInput(f"there is no key version {version} (the current one is {doc.current})")
        return _Keys(epoch, version, doc.current)

    async def _judge(self, session: Session, req: DiskFinishRequest, record: NodeRecord) -> evidence.Evidence:
        judged = (
            await asyncio.to_thread(evidence.judge, self.settings, session, req, record.counters)
            if req.event_log is not None and len(req.event_log) > _INLINE_EVENT_LOG
            else evidence.judge(self.settings, session, req, record.counters)
        )
        evidence.check_boot(record.boot_id, record.counters, judged.boot_id, judged.quote.counters)
        return judged

    def _no_class(self, judged: evidence.Evidence) -> str:
        keys = self.keys
        if keys.require_measured_boot and judged.facts is None:
            return "disk keys need a measured boot (disk_keys.require_measured_boot): send the event log"
        seen = judged.measured_boot_class or judged.pcr_class
        what = f"matched class {seen}" if seen else "matched no class"
        return f"this boot {what}; disk keys go only to {', '.join(keys.classes)}"

    # -- bookkeeping ---------------------------------------------------------------------------

    def _remember(self, session: Session) -> None:
        now = self._now().timestamp()
        self._used = (
            {k: v for k, v in self._used.items() if v > now} if len(self._used) >= _USED_CACHE else self._used
        )
        self._used[session.id] = session.expires_at

    def _line(self, node: str, volume: str, cls: str, verdict: str, code: str, version: int | None) -> None:
        """The audit line of a release or a refusal, and its count."""
        log.info(
            "disk key %s",
            verdict,
            extra={
                "node": node[:253],
                "volume": volume[:36],
                "disk_class": cls,
                "verdict": verdict,
                "code": code,
                "key_version": version,
            },
        )
        if self._count is not None:
            self._count(cls, code)

    async def _refused(self, session: Session, cls: str, exc: AttestationError) -> None:
        self._line(session.node_name, session.volume, cls, "refused", exc.code, session.key_version)
        if self._on_refusal is None:
            return
        try:
            await self._on_refusal(session.node_name, exc.code, f"disk release: {exc.detail}")
        except StoreUnavailable as err:
            log.warning(
                "could not record a refusal", extra={"node": session.node_name, "error": str(err)[:200]}
            )


def _check_admin_quarantine(record: NodeRecord, reset_count: int) -> None:
    """An admin's quarantine (``nodegate nodes quarantine``) holds the boot it quarantined: that
    boot gets no key. A new boot (the quote's resetCount above the quarantined one) that the policy
    in force accepts does, as it lifts the gate's hold at its join: refusing it would leave a
    machine with an encrypted root unable ever to attest again (docs/disk-keys.md)."""
    held = record.quarantine
    if held is not None and not held.lifted_by(reset_count):
        raise NodeQuarantined(
            f"node {record.node_name} was quarantined by an admin ({held.reason[:200]}) in this boot: "
            "it gets keys after a reboot into a boot the policy accepts (docs/disk-keys.md)"
        )
