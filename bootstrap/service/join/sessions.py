"""Join sessions as sealed tokens: the server keeps nothing per session until it finishes.

A token is AES-256-GCM over a small JSON document (who is joining, the CSR, the credential secret,
the nonce, the expiry). Any replica holding the session key opens it; nobody else can read the
secret inside or forge one. The key id in front picks the key, so a new key can be added for
rotation while tokens sealed with the old one still open. Single use is the store's job: it
remembers finished session ids until they expire.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import json
import logging
import os
import re
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from attest.bootrecord.model import EkFacts
from bootstrap.files import create_exclusive, read_limited
from bootstrap.problems import SessionExpired, SessionUnknown
from bootstrap.protocol import disk_qualifying_data, qualifying_data

log = logging.getLogger("nodegate.join")

PREFIX = "ngs1."
MAX_TOKEN_CHARS = 8192
_AAD = b"nodegate-session-v1"
_TOKEN = re.compile(r"ngs1\.[A-Za-z0-9_-]{40,8192}")
_KEY_LINE = re.compile(r"[0-9a-f]{64}")

Kind = Literal["join", "renew", "disk"]


@dataclass(frozen=True, slots=True)
class Session:
    id: str
    kind: Kind
    node_name: str
    ek_sha256: str
    ak_public: bytes
    csr_der: bytes
    secret: bytes  # the credential challenge (join only; empty for renewals)
    nonce: bytes
    selection: str
    expires_at: float  # unix seconds
    spiffe_id: str = ""  # renewals: the SVID that asked
    # Disk-key releases (docs/disk-keys.md): the volume, the epoch and key version the quote binds,
    # and the EK to seal the keys to (its digest checked against the node's binding at start).
    volume: str = ""
    epoch: int = 0
    key_version: int = 0
    ek_public: bytes = b""
    # joins: what the EK certificate verified at the start says (issuer, TPM model...), as the
    # compact JSON of attest.bootrecord.model.EkFacts, for the boot record; "" for renewals and disk releases
    ek_facts: str = ""

    @property
    def qualifying_data(self) -> bytes:
        """What the quote must sign when the node sends no boot id: SHA256(nonce || SHA256(csr_der))."""
        return self.qualifying_data_for(None)

    def qualifying_data_for(self, boot_id: str | None) -> bytes:
        """What the quote must sign for ``boot_id`` (bootstrap.protocol.qualifying_data, and
        disk_qualifying_data for a release)."""
        if self.kind == "disk":
            return disk_qualifying_data(
                self.nonce, self.node_name, self.volume, self.epoch, self.key_version, boot_id
            )
        return qualifying_data(self.nonce, self.csr_der, boot_id)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: object) -> bytes:
    if not isinstance(text, str):
        raise TypeError("not text")
    return base64.b64decode(text, validate=True)


class Sealer:
    """Seal and open session tokens with a list of keys (the first one seals)."""

    def __init__(self, keys: Sequence[bytes], clock: Callable[[], float] = time.time) -> None:
        if not keys or any(len(k) != 32 for k in keys):
            raise ValueError("session keys are 32 bytes and there is at least one")
        self._keys = {hashlib.sha256(k).digest()[:4]: AESGCM(k) for k in keys}
        self._current = hashlib.sha256(keys[0]).digest()[:4]
        self._clock = clock

    def new(
        self,
        *,
        kind: Kind,
        node_name: str,
        ek_sha256: str,
        ak_public: bytes,
        csr_der: bytes,
        selection: str,
        ttl: float,
        secret: bytes = b"",
        spiffe_id: str = "",
        volume: str = "",
        epoch: int = 0,
        key_version: int = 0,
        ek_public: bytes = b"",
        ek_facts: str = "",
    ) -> tuple[Session, str]:
        session = Session(
            id=secrets.token_hex(16),
            kind=kind,
            node_name=node_name,
            ek_sha256=ek_sha256,
            ak_public=ak_public,
            csr_der=csr_der,
            secret=secret,
            nonce=os.urandom(32),
            selection=selection,
            expires_at=self._clock() + ttl,
            spiffe_id=spiffe_id,
            volume=volume,
            epoch=epoch,
            key_version=key_version,
            ek_public=ek_public,
            ek_facts=ek_facts,
        )
        try:
            return session, self.seal(session)
        except ValueError:
            if not ek_facts:
                raise
        # An RSA-8192 CSR and an EK certificate with long names: no room for the EK's facts. The
        # join goes on without them; its boot record then has no ``ek``.
        log.warning("EK facts left out of a join session (token size)", extra={"node": node_name})
        session = dataclasses.replace(session, ek_facts="")
        return session, self.seal(session)

    def seal(self, s: Session) -> str:
        doc = {
            "id": s.id,
            "k": s.kind,
            "n": s.node_name,
            "ek": s.ek_sha256,
            "ak": _b64(s.ak_public),
            "csr": _b64(s.csr_der),
            "s": _b64(s.secret),
            "no": _b64(s.nonce),
            "sel": s.selection,
            "exp": s.expires_at,
            "sp": s.spiffe_id,
        }
        if s.kind == "disk":
            doc.update({"vol": s.volume, "ep": s.epoch, "kv": s.key_version, "ekp": _b64(s.ek_public)})
        if s.ek_facts:
            doc["ekf"] = s.ek_facts
        iv = os.urandom(12)
        plain = json.dumps(doc, separators=(",", ":")).encode()
        sealed = self._keys[self._current].encrypt(iv, plain, _AAD)
        raw = self._current + iv + sealed
        token = PREFIX + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
        if len(token) > MAX_TOKEN_CHARS:
            raise ValueError("session token too large (CSR or AK unexpectedly big)")
        return token

    def open(self, token: object, kind: Kind) -> Session:
        """The session inside ``token``; SessionUnknown for anything not sealed by us for this
        kind of step, SessionExpired once its lifetime is over."""
        if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS or not _TOKEN.fullmatch(token):
            raise SessionUnknown("not a session token")
        body = token[len(PREFIX) :]
        try:
            raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        except (binascii.Error, ValueError):
            raise SessionUnknown("not a session token") from None
        if base64.urlsafe_b64encode(raw).rstrip(b"=").decode() != body:
            # unused bits in the last character: refuse, so one token has exactly one spelling
            raise SessionUnknown("not a session token")
        aead = self._keys.get(raw[:4])
        if aead is None or len(raw) < 4 + 12 + 16:
            raise SessionUnknown("the session was not issued by this service (unknown key)")
        try:
            plain = aead.decrypt(raw[4:16], raw[16:], _AAD)
        except InvalidTag:
            raise SessionUnknown("the session token does not authenticate") from None
        session = _decode(plain)
        if session.kind != kind:
            raise SessionUnknown(f"this is a {session.kind} session, not a {kind} session")
        if self._clock() >= session.expires_at:
            raise SessionExpired("the session expired; start again")
        return session


def _decode(plain: bytes) -> Session:
    # Only we seal tokens, so a decode failure means a key was shared with something else.
    try:
        d: dict[str, Any] = json.loads(plain)
        kind: Kind = "disk" if d["k"] == "disk" else ("renew" if d["k"] == "renew" else "join")
        disk = kind == "disk"
        return Session(
            id=str(d["id"]),
            kind=kind,
            node_name=str(d["n"]),
            ek_sha256=str(d["ek"]),
            ak_public=_unb64(d["ak"]),
            csr_der=_unb64(d["csr"]),
            secret=_unb64(d["s"]),
            nonce=_unb64(d["no"]),
            selection=str(d["sel"]),
            expires_at=float(d["exp"]),
            spiffe_id=str(d.get("sp", "")),
            volume=str(d["vol"]) if disk else "",
            epoch=int(d["ep"]) if disk else 0,
            key_version=int(d["kv"]) if disk else 0,
            ek_public=_unb64(d["ekp"]) if disk else b"",
            ek_facts=str(d.get("ekf", "")),
        )
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise SessionUnknown("the session token's content is not understood") from None


def sealed_ek_facts(session: Session) -> EkFacts | None:
    """What the join start sealed about the EK; None when it sealed nothing (no room, or a token
    from a replica that did not know boot records): the record then lacks them, nothing else."""
    if not session.ek_facts:
        return None
    try:
        return EkFacts.model_validate_json(session.ek_facts)
    except ValueError:
        log.warning("a join session's EK facts do not read back", extra={"node": session.node_name})
        return None


def load_keys(state_dir: Path) -> list[bytes]:
    """The session keys in ``state_dir/session.key`` (hex, one per line, the first seals),
    created on first start. Replicas share the file (a mounted Secret in Kubernetes)."""
    path = state_dir / "session.key"
    if not path.exists():
        create_exclusive(path, secrets.token_hex(32).encode() + b"\n")
    lines = [ln.strip() for ln in read_limited(path, 64 * 1024).decode("ascii", "replace").splitlines()]
    keys = [ln for ln in lines if ln and not ln.startswith("#")]
    if not keys or not all(_KEY_LINE.fullmatch(k) for k in keys):
        raise ValueError(f"{path}: expected lines of 64 lowercase hex characters")
    return [bytes.fromhex(k) for k in keys]
