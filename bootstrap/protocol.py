"""Wire models of the join protocol (docs/protocol.md); pydantic, strict, size-capped.

Requests refuse unknown fields and non-canonical base64, so one request has one meaning. Responses
are built by the server from checked values and parsed by the node (bootstrap.node) with the same
models: unknown fields are ignored there (a newer server may add some), and what the node is about
to hand its TPM (the nonce, the PCR selection) is checked before it does. Sizes are the largest a
real TPM structure can be, well under the 64 KiB body limit, so a parse never allocates much for a
hostile body; the one large field is the measured-boot event log of the finish bodies (at most
1 MiB raw, 1.5 MiB for the whole body).

What the quote signs (``qualifying_data``) is defined here once, for the service and the node.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import uuid
from collections.abc import Callable
from typing import Annotated, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    field_validator,
)

from attest import validation, wire
from attest.errors import AttestationError, MalformedInput
from attest.svid import MAX_ID_BYTES
from bootstrap.times import MAX_TIME_TEXT

_PCR_INDEX = re.compile(r"(?:[0-9]|1[0-9]|2[0-3])")
_HEX = re.compile(r"(?:[0-9a-fA-F]{2})+")
_MAX_PCR_HEX = 128  # sha512
_MACHINE_CODE = re.compile(r"[a-z][a-z0-9_]{0,63}")
NONCE_BYTES = 32
EVENT_LOG_BYTES = 1024 * 1024  # the raw measured-boot log of a finish body
FINISH_BODY_BYTES = 1536 * 1024  # a finish body with that log in base64 and the rest
# The kernel's boot id (/proc/sys/kernel/random/boot_id): a UUID in lowercase hex.
_BOOT_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
BOOT_ID_DOMAIN = b"nodegate boot_id v1\x00"
# Disk-key releases (docs/disk-keys.md): their own start/finish pair beside join and renewal.
DISK_START_PATH = "/v1/disk/start"
DISK_FINISH_PATH = "/v1/disk/finish"
DISK_DOMAIN = b"nodegate disk release v1\x00"
_VOLUME = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
MAX_DISK_VERSION = 2**31 - 1  # attest.diskkey.MAX_VERSION and MAX_EPOCH


def base_qualifying_data(nonce: bytes, csr_der: bytes) -> bytes:
    """SHA256(nonce || SHA256(csr_der)): binds the quote to this session and to the key the SVID
    will certify."""
    return hashlib.sha256(nonce + hashlib.sha256(csr_der).digest()).digest()


def qualifying_data(nonce: bytes, csr_der: bytes, boot_id: str | None) -> bytes:
    """What the quote's extraData must be. Without a boot id, the base value (unchanged from the
    first protocol version); with one, SHA256(base || "nodegate boot_id v1\\0" || boot_id), so a
    quote can only carry the boot id the node's software put under it (docs/protocol.md)."""
    return bind_boot_id(base_qualifying_data(nonce, csr_der), boot_id)


def bind_boot_id(base: bytes, boot_id: str | None) -> bytes:
    if boot_id is None:
        return base
    return hashlib.sha256(base + BOOT_ID_DOMAIN + boot_id.encode("ascii")).digest()


def disk_qualifying_data(
    nonce: bytes, node_name: str, volume: str, epoch: int, key_version: int, boot_id: str | None
) -> bytes:
    """What a release's quote signs: SHA256("nodegate disk release v1\\0" || nonce || node name
    || 0 || volume (16 bytes) || epoch (u32) || version (u32)), with the boot id bound as in a
    join. The domain keeps a release's quote from ever counting as a join's or a renewal's."""
    digest = hashlib.sha256(
        DISK_DOMAIN
        + nonce
        + node_name.encode("ascii")
        + b"\x00"
        + uuid.UUID(volume).bytes
        + epoch.to_bytes(4, "big")
        + key_version.to_bytes(4, "big")
    ).digest()
    return bind_boot_id(digest, boot_id)


def disk_release_aad(session: str, node_name: str, volume: str, epoch: int) -> bytes:
    """The sealed keys' associated data: the exchange they answer (``session`` is the token the
    start step handed out; attest.diskkey.open_keys)."""
    return b"\x00".join(
        (
            DISK_DOMAIN,
            session.encode("ascii"),
            node_name.encode("ascii"),
            volume.encode("ascii"),
            str(epoch).encode(),
        )
    )


def is_volume_uuid(value: object) -> bool:
    """A LUKS UUID as ``cryptsetup luksUUID`` prints it: canonical lowercase text."""
    return isinstance(value, str) and _VOLUME.fullmatch(value) is not None


def _volume(value: str) -> str:
    if not is_volume_uuid(value):
        raise ValueError("must be a LUKS UUID in canonical lowercase form (cryptsetup luksUUID)")
    return value


def is_boot_id(value: object) -> bool:
    return isinstance(value, str) and _BOOT_ID.fullmatch(value) is not None


def _boot_id(value: str) -> str:
    if not is_boot_id(value):
        raise ValueError("must be a kernel boot id (lowercase UUID)")
    return value


def _b64(limit: int) -> Callable[[object], bytes]:
    def decode(value: object) -> bytes:
        if isinstance(value, bytes):
            return value  # built by our own code
        if not isinstance(value, str) or len(value) > (limit + 2) // 3 * 4:
            raise ValueError(f"must be standard base64 of at most {limit} bytes")
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("is not standard base64") from None
        if base64.b64encode(raw).decode() != value:
            raise ValueError("is not canonical base64")
        return raw

    return decode


_B64 = PlainSerializer(lambda b: base64.b64encode(b).decode(), return_type=str)


def _nonce(value: bytes) -> bytes:
    if len(value) != NONCE_BYTES:
        raise ValueError(f"must be {NONCE_BYTES} bytes, not {len(value)}")
    return value


def _selection(value: str) -> str:
    try:
        wire.parse_selection_string(value)
    except AttestationError as exc:
        raise ValueError(exc.detail) from None
    return value


def _pcrs(value: object) -> dict[str, dict[int, bytes]]:
    if isinstance(value, dict) and all(isinstance(v, dict) for v in value.values()):
        out: dict[str, dict[int, bytes]] = {}
        if len(value) > 4:
            raise ValueError("at most 4 PCR banks")
        for bank, entries in value.items():
            if not isinstance(bank, str) or len(bank) > 16 or len(entries) > 24:
                raise ValueError("a PCR bank is a short name with at most 24 entries")
            out[bank] = {}
            for key, v in entries.items():
                k = str(key) if isinstance(key, int) and not isinstance(key, bool) else key
                if not isinstance(k, str) or not _PCR_INDEX.fullmatch(k):
                    raise ValueError(f"PCR index {k!r} is not 0-23")
                if isinstance(v, bytes):
                    out[bank][int(k)] = v
                    continue
                if not isinstance(v, str) or len(v) > _MAX_PCR_HEX or not _HEX.fullmatch(v):
                    raise ValueError(f"PCR {bank}:{k} is not a hex digest")
                out[bank][int(k)] = bytes.fromhex(v)
        return out
    raise ValueError('pcrs is {"bank": {"index": hex}}')


B64Public = Annotated[
    bytes, BeforeValidator(_b64(1024)), _B64
]  # TPM2B_PUBLIC: RSA-4096 templates stay below 700 bytes
B64Cert = Annotated[bytes, BeforeValidator(_b64(8192)), _B64]
B64Attest = Annotated[bytes, BeforeValidator(_b64(2048)), _B64]
B64Signature = Annotated[bytes, BeforeValidator(_b64(1024)), _B64]
B64Proof = Annotated[bytes, BeforeValidator(_b64(64)), _B64]
B64EventLog = Annotated[bytes, BeforeValidator(_b64(EVENT_LOG_BYTES)), _B64]
BootId = Annotated[str, AfterValidator(_boot_id)]
Pcrs = Annotated[
    dict[str, dict[int, bytes]],
    BeforeValidator(_pcrs),
    PlainSerializer(
        lambda d: {b: {str(i): v.hex() for i, v in sorted(e.items())} for b, e in d.items()},
        return_type=dict,
    ),
]
Token = Annotated[str, Field(min_length=1, max_length=8192)]
NodeName = Annotated[str, Field(min_length=1, max_length=253)]
Pem = Annotated[str, Field(min_length=1, max_length=16 * 1024)]
B64Nonce = Annotated[bytes, BeforeValidator(_b64(NONCE_BYTES)), AfterValidator(_nonce), _B64]
PcrSelection = Annotated[str, AfterValidator(_selection)]  # what wire.parse_selection_string reads
SpiffeIdText = Annotated[str, Field(max_length=MAX_ID_BYTES)]
TimeText = Annotated[str, Field(max_length=MAX_TIME_TEXT)]  # RFC 3339: bootstrap.times.parse_time
VolumeUuid = Annotated[str, AfterValidator(_volume)]
DiskVersion = Annotated[int, Field(ge=1, le=MAX_DISK_VERSION, strict=True)]
DiskEpoch = Annotated[int, Field(ge=0, le=MAX_DISK_VERSION, strict=True)]
B64Sealed = Annotated[bytes, BeforeValidator(_b64(256)), _B64]  # attest.diskkey: IV, 2 keys, tag


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, hide_input_in_errors=True)


class _Response(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


M = TypeVar("M", bound=_Request)


MAX_EK_CHAIN = 4  # EK intermediates a node may send (TCG EK chain NV indices); real chains have 1-3


class StartRequest(_Request):
    node_name: NodeName
    ek_public: B64Public
    ek_certificate: B64Cert | None = None
    ak_public: B64Public
    csr: Pem
    # A departure documented in docs/protocol.md: intermediates the node read from its TPM's EK chain NV
    # indices. They only help to build a path, exactly like ones fetched from AIA URLs.
    ek_chain: Annotated[tuple[B64Cert, ...], Field(max_length=MAX_EK_CHAIN)] = ()


class StartResponse(_Response):
    session: Token
    credential_blob: B64Public
    encrypted_secret: B64Public
    nonce: B64Nonce
    pcr_selection: PcrSelection
    expires_at: str


class QuoteEvidence(_Request):
    session: Token
    quote: B64Attest
    signature: B64Signature
    pcrs: Pcrs
    event_log: B64EventLog | None = None
    boot_id: BootId | None = None


class FinishRequest(QuoteEvidence):
    proof: B64Proof


class FinishResponse(_Response):
    node_name: str
    spiffe_id: SpiffeIdText
    svid: str
    bundle: str
    svid_expires_at: TimeText
    kubeconfig: str | None = None  # only when the service talks to a cluster
    # An addition to the design contract (docs/spire.md): with spire.x509pop, the certificate for
    # the same key that SPIRE's x509pop node attestor accepts (PEM leaf, chains to ``bundle``).
    x509pop_certificate: str | None = None


class RenewStartRequest(_Request):
    csr: Pem  # a fresh key for the new SVID (the CSR rules of the join apply)


class RenewStartResponse(_Response):
    session: Token
    nonce: B64Nonce
    pcr_selection: PcrSelection
    expires_at: str


class RenewFinishRequest(QuoteEvidence):
    pass


class DiskStartRequest(_Request):
    """A release's first step (docs/disk-keys.md): which node, volume and key. ``key_version`` and
    ``epoch`` are those the volume's binding was made with; None (a new binding): the current ones."""

    node_name: NodeName
    volume: VolumeUuid
    ek_public: B64Public  # for MakeCredential; must be the EK the node is bound to
    key_version: DiskVersion | None = None
    epoch: DiskEpoch | None = None


class DiskStartResponse(_Response):
    session: Token
    nonce: B64Nonce
    pcr_selection: PcrSelection
    expires_at: str
    key_version: DiskVersion  # what the quote binds (disk_qualifying_data)
    epoch: DiskEpoch


class DiskFinishRequest(QuoteEvidence):
    pass


class DiskFinishResponse(_Response):
    """The keys sealed under a secret only the node's TPM recovers (MakeCredential to its EK and
    the AK that quoted): ``key_version``'s key, and ``current_version``'s when they differ (the
    node re-keys its binding)."""

    node_name: NodeName
    volume: VolumeUuid
    epoch: DiskEpoch
    key_version: DiskVersion
    current_version: DiskVersion
    credential_blob: B64Public
    encrypted_secret: B64Public
    sealed_keys: B64Sealed


class Problem(_Response):
    """The parts of an ``application/problem+json`` refusal the node reads (docs/protocol.md,
    "Machine codes and HTTP status")."""

    code: str
    detail: str | None = None
    title: str | None = None

    @field_validator("code")
    @classmethod
    def _machine_code(cls, v: str) -> str:
        if not _MACHINE_CODE.fullmatch(v):
            raise ValueError("not a machine code")
        return v


class RevokeRequest(_Request):
    reason: Annotated[str, Field(min_length=1, max_length=512)]
    revoked: bool = True


class QuarantineRequest(_Request):
    reason: Annotated[str, Field(min_length=1, max_length=512)]


def parse_request(model: type[M], body: object) -> M:
    """Validate a decoded JSON body; MalformedInput names the fields, never echoes their values."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        reasons = validation.summary(exc, model)
        raise MalformedInput(f"invalid request body: {reasons}"[:500]) from None
