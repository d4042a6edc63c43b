"""The join protocol (docs/protocol.md): start, finish, and the two-step renewal.

Each step is a sequence of separate, named checks from ``attest`` (the SPIRE attestor habit: one
check, one failure code). State lives in three places only: the sealed session token the node
carries between steps, the store (bindings, counters, used sessions) and the CA. Nothing here
speaks HTTP; ``bootstrap.service.http.middleware`` maps the exceptions to statuses.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from attest import ca, credential, svid, tpm, x509pop
from attest.bootrecord import ekfacts
from attest.bootrecord.model import EkFacts
from attest.csr import parse_node_csr
from attest.errors import AttestationError, MalformedInput
from bootstrap.config import POOL_LABEL, Settings
from bootstrap.kube import Conflict as KubeConflict
from bootstrap.kube import CsrDenied, Kube, KubeUnavailable, read_ca_bundle
from bootstrap.kube import NotFound as KubeNotFound
from bootstrap.names import is_node_name
from bootstrap.problems import (
    NodeNameConflict,
    NodeNotEnrolled,
    NodeRevoked,
    SessionReused,
    SessionUnknown,
    Unauthenticated,
    Unavailable,
)
from bootstrap.protocol import (
    FinishRequest,
    FinishResponse,
    QuoteEvidence,
    RenewFinishRequest,
    RenewStartRequest,
    RenewStartResponse,
    StartRequest,
    StartResponse,
)
from bootstrap.service.join import ekroots, ekverify, evidence, kubelet
from bootstrap.service.join.aia import AiaFetcher
from bootstrap.service.join.ekroots import EkTrust
from bootstrap.service.join.ekroots import load_ek_trust as load_ek_trust  # noqa: PLC0414  (moved there; re-exported)
from bootstrap.service.join.evidence import Evidence
from bootstrap.service.join.popcert import x509pop_facts, x509pop_pem
from bootstrap.service.join.sessions import Sealer, Session, sealed_ek_facts
from bootstrap.store import Attestation, NodeRecord, Store, StoreUnavailable
from bootstrap.times import rfc3339

log = logging.getLogger("nodegate.join")
_USED_CACHE = 100_000  # session ids this replica committed, kept until they expire
_INLINE_EVENT_LOG = 64 * 1024  # larger logs are judged on a worker thread

Refusal = Callable[[str, str, str, bool], Awaitable[None]]  # node_name, code, detail, evidence
Accepted = Callable[[NodeRecord | None, NodeRecord, str], Awaitable[None]]  # before, after, action


@dataclass(frozen=True, slots=True)
class Issued:
    record: NodeRecord
    response: FinishResponse


class JoinService:
    def __init__(
        self,
        settings: Settings,
        *,
        store: Store,
        sealer: Sealer,
        authorities: Callable[[], ca.CaSet],
        ek_trust: EkTrust,
        kube: Kube | None = None,
        on_refusal: Refusal | None = None,
        on_accepted: Accepted | None = None,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        aia: AiaFetcher | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.sealer = sealer
        self._authorities = authorities
        self._ek = ek_trust
        if aia is None and settings.ek_aia.enabled:
            aia = AiaFetcher(settings.ek_aia, ekroots.fetched_cache(settings.state_dir))
        self._aia = aia
        self.kube = kube
        self._on_refusal = on_refusal
        self._on_accepted = on_accepted
        self._now = now
        self._selection = settings.pcr_policy.selection
        self._inventory = settings.inventory_index
        self._used: OrderedDict[str, float] = OrderedDict()  # session id -> expiry (unix)
        ca_file = settings.kubernetes.kubelet_api_ca_file  # read once: a bad file stops the start
        self._kubelet_ca = read_ca_bundle(ca_file, "kubernetes.kubelet_api_ca_file") if ca_file else None

    @property
    def ek_trust(self) -> EkTrust:
        return self._ek

    # -- join ----------------------------------------------------------------------------------

    async def start(self, req: StartRequest) -> StartResponse:
        if not is_node_name(req.node_name):
            raise MalformedInput(f"node_name {req.node_name[:64]!r} is not a Kubernetes node name")
        ek = await ekverify.verify_ek(
            self._ek,
            req.ek_public,
            req.ek_certificate,
            sent=req.ek_chain,
            fetcher=self._aia,
            now=self._now(),
        )
        ak = tpm.verify_ak(req.ak_public)
        csr = parse_node_csr(req.csr, req.node_name)
        self._check_enrolled(ek.sha256, req.node_name)
        _check_binding(await self._get(req.node_name), ek.sha256, req.node_name)
        secret = os.urandom(32)
        blob, encrypted = tpm.make_credential(req.ek_public, ak.name, secret)
        session, token = self.sealer.new(
            kind="join",
            node_name=req.node_name,
            ek_sha256=ek.sha256,
            ak_public=req.ak_public,
            csr_der=csr.der,
            selection=self._selection,
            ttl=self.settings.session_ttl.total_seconds(),
            secret=secret,
            ek_facts=ekfacts.ek_facts(ek).model_dump_json(by_alias=True, exclude_none=True),
        )
        return StartResponse(
            session=token,
            credential_blob=blob,
            encrypted_secret=encrypted,
            nonce=session.nonce,
            pcr_selection=session.selection,
            expires_at=rfc3339(session.expires_at),
        )

    async def finish(self, req: FinishRequest) -> FinishResponse:
        session = self.sealer.open(req.session, "join")
        try:
            return await self._finish(session, req)
        except AttestationError as exc:
            await self._refused(session.node_name, exc)
            raise

    async def _finish(self, session: Session, req: FinishRequest) -> FinishResponse:
        if self._recently_used(session):
            raise SessionReused("this session already finished a join; start again")
        credential.verify_credential_proof(session.secret, req.session, req.proof)
        record = await self._get(session.node_name)
        _check_binding(record, session.ek_sha256, session.node_name)
        judged = await self._judge(session, req, record)
        sid = svid.render_spiffe_id(
            self.settings.spiffe_id_template,
            trust_domain=self.settings.trust_domain,
            node_name=session.node_name,
            ek_sha256=session.ek_sha256,
        )
        # The Node first, so the attestation records which Node object carries its labels (the
        # gate holds any other Node of this name). A commit that fails afterwards leaves a Node
        # with the hold taint and nothing that releases it.
        node_uid = await self._node(session, judged.pcr_class) if self.kube is not None else None
        issued = await self._issue(
            session, sid, judged, action="join", node_uid=node_uid, ek=sealed_ek_facts(session)
        )
        if self.kube is None:
            return issued.response
        kubeconfig = await self._kubelet(session, str(sid))
        return issued.response.model_copy(update={"kubeconfig": kubeconfig})

    # -- renewal -------------------------------------------------------------------------------

    async def renew_start(self, peer: x509.Certificate | None, req: RenewStartRequest) -> RenewStartResponse:
        record, sid = await self._peer_record(peer)
        csr = parse_node_csr(req.csr, record.node_name)
        session, token = self.sealer.new(
            kind="renew",
            node_name=record.node_name,
            ek_sha256=record.ek_sha256,
            ak_public=record.ak_public,
            csr_der=csr.der,
            selection=self._selection,
            ttl=self.settings.session_ttl.total_seconds(),
            spiffe_id=str(sid),
        )
        return RenewStartResponse(
            session=token,
            nonce=session.nonce,
            pcr_selection=session.selection,
            expires_at=rfc3339(session.expires_at),
        )

    async def renew_finish(self, peer: x509.Certificate | None, req: RenewFinishRequest) -> FinishResponse:
        record, sid = await self._peer_record(peer)
        session = self.sealer.open(req.session, "renew")
        if session.spiffe_id != str(sid) or session.node_name != record.node_name:
            raise SessionUnknown("this renewal session belongs to another SVID")
        try:
            if self._recently_used(session):
                raise SessionReused("this session already renewed the SVID; start again")
            judged = await self._judge(session, req, record)
            # A new boot (``nodegate attest`` before the kubelet starts) whose Node is gone (the
            # cloud deleted the Node of a stopped machine) gets it pre-created as at join, so the
            # kubelet registers onto nodegate's Node; a renewal on the same boot creates nothing.
            new_boot = judged.boot_id is not None and judged.boot_id != record.boot_id
            node_uid = await self._relabel(session, judged.pcr_class, create=new_boot)
            # The EK is the one the join verified (the binding): its facts carry over.
            ek = record.boot_record.ek if record.boot_record is not None else None
            issued = await self._issue(session, sid, judged, action="renew", node_uid=node_uid, ek=ek)
        except AttestationError as exc:
            await self._refused(session.node_name, exc)
            raise
        return issued.response

    async def _peer_record(self, peer: x509.Certificate | None) -> tuple[NodeRecord, svid.SpiffeId]:
        if peer is None:
            raise Unauthenticated("renewal needs the node's SVID as the TLS client certificate")
        now = self._now()
        sid = svid.verify_svid(
            peer, roots=self._authorities().roots(now), trust_domain=self.settings.trust_domain, now=now
        )
        record = await self._record_for(sid)
        if record is None:
            raise Unauthenticated(f"no node holds the SPIFFE ID {sid}")
        if record.revoked:
            raise NodeRevoked(f"node {record.node_name} is revoked")
        if f"{peer.serial_number:x}" not in record.svid_serials:
            raise Unauthenticated("this SVID was not issued to the node's current attestation")
        return record, sid

    async def _record_for(self, sid: svid.SpiffeId) -> NodeRecord | None:
        # The default template ends with the node name; other templates need a scan.
        candidate = sid.path.rsplit("/", 1)[-1]
        if is_node_name(candidate):
            record = await self._get(candidate)
            if record is not None and record.spiffe_id == str(sid):
                return record
        # A scan: first the store's watched copy (no LIST of every node per renewal), then the
        # record read fresh, which alone decides (revocation, serials); a miss scans the API.
        for recent in (True, False):
            try:
                nodes = await self.store.list_nodes(recent=recent)
            except StoreUnavailable as exc:
                raise Unavailable(f"store: {exc}", retry_after=2) from None
            found = next((r.node_name for r in nodes if r.spiffe_id == str(sid)), None)
            record = await self._get(found) if found is not None else None
            if record is not None and record.spiffe_id == str(sid):
                return record
        return None

    # -- shared steps --------------------------------------------------------------------------

    async def _judge(self, session: Session, req: QuoteEvidence, record: NodeRecord | None) -> Evidence:
        """The evidence checks (quote, PCR policy, event log). A large event log is parsed and
        replayed on a worker thread so one node's log never stalls the event loop."""
        previous = record.counters if record is not None else None
        judged = (
            await asyncio.to_thread(evidence.judge, self.settings, session, req, previous)
            if req.event_log is not None and len(req.event_log) > _INLINE_EVENT_LOG
            else evidence.judge(self.settings, session, req, previous)
        )
        if record is not None:
            evidence.check_boot(record.boot_id, record.counters, judged.boot_id, judged.quote.counters)
        return judged

    async def _issue(
        self,
        session: Session,
        sid: svid.SpiffeId,
        judged: Evidence,
        *,
        action: str,
        node_uid: str | None,
        ek: EkFacts | None,
    ) -> Issued:
        counters = judged.quote.counters
        now = self._now()
        cas = self._authorities()
        public_key = x509.load_der_x509_csr(session.csr_der).public_key()
        facts = None
        if self.settings.spire.x509pop:
            entry = self._inventory.get(session.ek_sha256)
            pool = entry.labels.get(POOL_LABEL) if entry is not None else None
            facts = x509pop_facts(session.node_name, session.ek_sha256, pool, judged)
        leaf = svid.issue_svid(
            cas.signer,
            spiffe_id=sid,
            public_key=public_key,  # type: ignore[arg-type]  # parse_node_csr admitted only EC/RSA
            now=now,
            ttl=self.settings.svid_ttl,
        )
        boot = evidence.boot_record(judged, self.settings.measured_boot, attested_at=now, ek=ek)
        att = Attestation(
            node_name=session.node_name,
            ek_sha256=session.ek_sha256,
            ak_public=session.ak_public,
            spiffe_id=str(sid),
            counters=counters,
            svid_serial=f"{leaf.serial_number:x}",
            attested_at=now,
            expires_at=leaf.not_valid_after_utc,
            boot_id=judged.boot_id,
            measured_boot_class=judged.measured_boot_class,
            node_uid=node_uid,
            x509pop_attestation=facts[x509pop.ATTESTATION] if facts is not None else None,
            boot_record=boot.record,
            dbx=tuple(boot.dbx.items()),
        )
        before: list[NodeRecord | None] = []

        def check(existing: NodeRecord | None) -> None:
            # Re-run against what the store holds at commit time: another replica may have
            # committed a join of this node since we read it.
            before[:] = [existing]
            _check_binding(existing, session.ek_sha256, session.node_name)
            if existing is not None and existing.counters is not None:
                tpm.check_counters(existing.counters, counters)
                evidence.check_boot(existing.boot_id, existing.counters, judged.boot_id, counters)

        try:
            record = await self.store.commit(
                att,
                session_id=session.id,
                session_expires_at=datetime.fromtimestamp(session.expires_at, UTC),
                action=action,
                check=check,
            )
        except StoreUnavailable as exc:
            raise Unavailable(f"store: {exc}", retry_after=2) from None
        self._remember(session)
        if self._on_accepted is not None:  # before the answer: SPIRE follows the new attestation
            await self._on_accepted(before[0] if before else None, record, action)
        # one line per success, every value a field (alerts and searches need no parsing of msg)
        log.info(
            "node %s",
            "joined" if action == "join" else "renewed",
            extra={
                "node": session.node_name,
                "spiffe_id": str(sid),
                "ek_sha256": session.ek_sha256,
                "pcr_class": judged.pcr_class,
                "measured_boot_class": judged.measured_boot_class,
                "action": action,
            },
        )
        chain = leaf.public_bytes(serialization.Encoding.PEM).decode()
        pop = None
        if facts is not None:
            pop = x509pop_pem(
                cas.signer,
                self.settings.spire_trust_domain,
                session.node_name,
                facts,
                public_key,
                now,
                leaf.not_valid_after_utc,
            )
        return Issued(
            record,
            FinishResponse(
                node_name=session.node_name,
                spiffe_id=str(sid),
                svid=chain,
                bundle=svid.bundle_pem(cas.roots(now)).decode(),
                svid_expires_at=rfc3339(leaf.not_valid_after_utc),
                kubeconfig=None,
                x509pop_certificate=pop,
            ),
        )

    def _labels(self, session: Session, pcr_class: str | None) -> dict[str, str]:
        entry = self._inventory.get(session.ek_sha256)
        return kubelet.attested_labels(session.ek_sha256, pcr_class, entry.labels if entry else {})

    async def _relabel(self, session: Session, pcr_class: str | None, *, create: bool) -> str | None:
        """The Node's attested labels follow every accepted re-attestation, written before the
        attestation is committed: pools built on the PCR class label must never keep a node of
        another class (issue 33, finding 9). When the Node cannot be written nothing is
        committed, so a rebooted node stays held by the gate until a renewal gets through.
        Returns the uid of the Node written, recorded with the attestation (None: no Node)."""
        if self.kube is None:
            return None
        labels = self._labels(session, pcr_class)
        held = self.settings.gate.taint_key if create else None
        try:
            return await kubelet.relabel_node(self.kube, session.node_name, labels, create_held=held)
        except (KubeUnavailable, KubeConflict, KubeNotFound) as exc:
            raise Unavailable(f"node labels: {exc}"[:500], retry_after=5) from None

    async def _node(self, session: Session, pcr_class: str | None) -> str | None:
        """The Node pre-created with the hold taint and the attested labels (or, on a re-join,
        labelled); the uid of the Node written."""
        if self.kube is None:
            raise Unavailable("no cluster configured")
        labels = self._labels(session, pcr_class)
        key = self.settings.gate.taint_key
        try:
            return await kubelet.ensure_node(self.kube, session.node_name, labels, key)
        except (KubeUnavailable, KubeConflict, KubeNotFound) as exc:
            raise Unavailable(f"kubelet credentials: {exc}"[:500], retry_after=5) from None

    async def _kubelet(self, session: Session, spiffe_id: str) -> str:
        if self.kube is None:
            raise Unavailable("no cluster configured")
        csr_pem = x509.load_der_x509_csr(session.csr_der).public_bytes(serialization.Encoding.PEM)
        k8s = self.settings.kubernetes
        try:
            cert = await kubelet.issue_kubelet_certificate(
                self.kube,
                node_name=session.node_name,
                session_id=session.id,
                csr_pem=csr_pem,
                spiffe_id=spiffe_id,
                expiration_seconds=int(max(self.settings.svid_ttl, timedelta(hours=24)).total_seconds()),
                timeout=k8s.csr_timeout.total_seconds(),
            )
            server, ca_pem = self.kube.api_server()
            if k8s.kubelet_api_server is not None:
                server, ca_pem = k8s.kubelet_api_server, self._kubelet_ca
        except (KubeUnavailable, KubeConflict, KubeNotFound, CsrDenied) as exc:
            # The SVID is recorded but not handed out; the node starts over and gets both.
            raise Unavailable(f"kubelet credentials: {exc}"[:500], retry_after=5) from None
        return kubelet.kubeconfig(
            node_name=session.node_name, server=server, ca_pem=ca_pem, client_cert_pem=cert
        )

    def _check_enrolled(self, ek_sha256: str, node_name: str) -> None:
        if self.settings.enrollment != "inventory":
            return
        entry = self._inventory.get(ek_sha256)
        if entry is None:
            raise NodeNotEnrolled(f"EK {ek_sha256} is not in the inventory")
        if entry.node_name != node_name:
            raise NodeNotEnrolled(f"EK {ek_sha256} is enrolled as {entry.node_name}, not {node_name}")

    async def _get(self, node_name: str) -> NodeRecord | None:
        try:
            return await self.store.get(node_name)
        except StoreUnavailable as exc:
            raise Unavailable(f"store: {exc}", retry_after=2) from None

    def _remember(self, session: Session) -> None:
        now = self._now().timestamp()
        self._used[session.id] = session.expires_at
        while self._used:
            oldest, expires = next(iter(self._used.items()))
            if expires > now and len(self._used) <= _USED_CACHE:
                break
            del self._used[oldest]

    def _recently_used(self, session: Session) -> bool:
        """A replay this replica has seen, refused before any crypto. Only a fast path: the store's
        commit is what makes a session single-use across replicas (and after a restart)."""
        return session.id in self._used

    async def _refused(self, node_name: str, exc: AttestationError) -> None:
        """Refusals of sessions we issued are audited (start-step refusals are not: anyone can
        send them, and the store must not fill up with an attacker's noise). A refusal of the
        node's own evidence (``evidence.REFUSES_THE_BOOT``: only the TPM or the SVID holder gets
        that far) also takes the node's SPIRE agents away, before the node hears of it."""
        log.info("join refused", extra={"node": node_name, "code": exc.code})
        if self._on_refusal is None:
            return
        try:
            await self._on_refusal(node_name, exc.code, exc.detail, exc.code in evidence.REFUSES_THE_BOOT)
        except (StoreUnavailable, KubeUnavailable) as err:
            log.warning("could not record a refusal", extra={"node": node_name, "error": str(err)[:200]})


def _check_binding(record: NodeRecord | None, ek_sha256: str, node_name: str) -> None:
    if record is None:
        return
    if record.ek_sha256 != ek_sha256:
        raise NodeNameConflict(f"node name {node_name} is bound to another EK")
    if record.revoked:
        raise NodeRevoked(f"node {node_name} is revoked")
