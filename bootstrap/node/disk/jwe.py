"""The nodegate pin's JWE (docs/disk-keys.md, "The Clevis pin"): compact serialization, ``alg: dir``,
``enc: A256GCM``, the key being the disk key nodegate releases. The protected header's
``clevis.nodegate`` is everything an unlock needs, with no file from the (still locked) root
file system: the server URL, its CA bundle (PEM), the node name, the volume's LUKS UUID, the EK
kind and digest, and the epoch and key version the key was released at.

    jwe = seal(binding, key, passphrase)       # clevis-encrypt-nodegate
    binding = binding_of(jwe)                   # what to ask the server for
    passphrase = unseal(jwe, key)               # clevis-decrypt-nodegate
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from typing import Annotated, Any, Literal

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from attest import validation
from attest.diskkey import KEY_BYTES, MAX_EPOCH, MAX_VERSION
from bootstrap.names import is_node_name
from bootstrap.protocol import is_volume_uuid

__all__ = ["MAX_JWE", "Binding", "JweError", "binding_of", "compact_of", "flattened_of", "seal", "unseal"]

PIN = "nodegate"
MAX_JWE = 64 * 1024  # a LUKS2 header's JSON area is smaller still
MAX_CA = 32 * 1024
_IV = 12
_TAG = 16


class JweError(ValueError):
    """Not a nodegate JWE, or one that does not open with the key: the message says which."""


class Binding(BaseModel):
    """``clevis.nodegate`` in the protected header."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: Annotated[str, Field(min_length=8, max_length=2048)]
    ca: Annotated[str, Field(min_length=1, max_length=MAX_CA)]  # PEM roots for the server's TLS
    node: str
    volume: str
    ek: Literal["rsa", "ecc"] = "rsa"
    # The EK's digest, a key's input: with the backup's secret, all that recovery needs (public).
    ek_sha256: Annotated[str, Field(pattern=r"\A[0-9a-f]{64}\z")]
    epoch: int = Field(ge=0, le=MAX_EPOCH, strict=True)
    version: int = Field(ge=1, le=MAX_VERSION, strict=True)
    tcti: Annotated[str, Field(max_length=256)] | None = None

    @field_validator("node")
    @classmethod
    def _node(cls, v: str) -> str:
        if not is_node_name(v):
            raise ValueError("not a Kubernetes node name")
        return v

    @field_validator("volume")
    @classmethod
    def _volume(cls, v: str) -> str:
        if not is_volume_uuid(v):
            raise ValueError("not a LUKS UUID in canonical lowercase form")
        return v


def _b64u(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64u(text: str, what: str) -> bytes:
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise JweError(f"the JWE's {what} is not base64url") from None
    if _b64u(raw) != text:
        raise JweError(f"the JWE's {what} is not canonical base64url")
    return raw


def seal(binding: Binding, key: bytes, plaintext: bytes) -> str:
    """The compact JWE of ``plaintext`` under ``key`` with ``binding`` in its protected header."""
    if len(key) != KEY_BYTES:
        raise ValueError(f"a disk key is {KEY_BYTES} bytes")
    header = {
        "alg": "dir",
        "enc": "A256GCM",
        "kid": f"nodegate:e{binding.epoch}:v{binding.version}",
        "clevis": {"pin": PIN, PIN: binding.model_dump(exclude_none=True)},
    }
    protected = _b64u(json.dumps(header, separators=(",", ":"), sort_keys=True).encode())
    iv = os.urandom(_IV)
    sealed = AESGCM(key).encrypt(iv, plaintext, protected.encode("ascii"))
    return ".".join((protected, "", _b64u(iv), _b64u(sealed[:-_TAG]), _b64u(sealed[-_TAG:])))


def _parts(jwe: str) -> tuple[str, dict[str, Any], bytes, bytes, bytes]:
    text = jwe.strip()
    if len(text) > MAX_JWE or not text.isascii():
        raise JweError("not a compact JWE (too large, or not ASCII)")
    parts = text.split(".")
    if len(parts) != 5:
        raise JweError(f"a compact JWE has 5 parts, this has {len(parts)}")
    protected, encrypted_key, iv, ciphertext, tag = parts
    try:
        header = json.loads(_unb64u(protected, "protected header"))
    except ValueError:
        raise JweError("the JWE's protected header is not JSON") from None
    if not isinstance(header, dict):
        raise JweError("the JWE's protected header is not an object")
    if encrypted_key:
        raise JweError("a nodegate JWE has no encrypted key (alg dir)")
    return protected, header, _unb64u(iv, "IV"), _unb64u(ciphertext, "ciphertext"), _unb64u(tag, "tag")


def compact_of(flattened: object) -> str:
    """The compact form of the flattened JSON a LUKS2 ``clevis`` token holds (``jwe``), as
    ``jose jwe fmt -c`` makes it."""
    if not isinstance(flattened, dict):
        raise JweError("the token's jwe is not a JSON object")
    parts = [flattened.get(k, "") for k in ("protected", "encrypted_key", "iv", "ciphertext", "tag")]
    if not all(isinstance(p, str) for p in parts) or "header" in flattened or "aad" in flattened:
        raise JweError("the token's jwe is not a flattened JWE this pin wrote")
    return ".".join(parts)


def flattened_of(compact: str) -> dict[str, str]:
    """The flattened JSON form of a compact JWE (what ``clevis luks bind`` stores in the token)."""
    parts = compact.strip().split(".")
    if len(parts) != 5:
        raise JweError(f"a compact JWE has 5 parts, this has {len(parts)}")
    return dict(zip(("protected", "encrypted_key", "iv", "ciphertext", "tag"), parts, strict=True))


def binding_of(jwe: str) -> Binding:
    """The binding in ``jwe``'s header; JweError when it is not a nodegate JWE."""
    _, header, *_ = _parts(jwe)
    clevis = header.get("clevis")
    if header.get("alg") != "dir" or header.get("enc") != "A256GCM":
        raise JweError("not a nodegate JWE (alg must be dir, enc A256GCM)")
    if not isinstance(clevis, dict) or clevis.get("pin") != PIN:
        raise JweError("the JWE's clevis.pin is not nodegate")
    try:
        return Binding.model_validate(clevis.get(PIN))
    except ValidationError as exc:
        raise JweError(
            f"the JWE's clevis.nodegate is not understood: {validation.summary(exc, Binding)}"
        ) from None


def unseal(jwe: str, key: bytes) -> bytes:
    """The plaintext; JweError when ``key`` does not open ``jwe`` (another volume, TPM, epoch or
    version, or an altered header)."""
    protected, _header, iv, ciphertext, tag = _parts(jwe)
    if len(iv) != _IV or len(tag) != _TAG:
        raise JweError("the JWE's IV or tag has the wrong size for A256GCM")
    try:
        return AESGCM(key).decrypt(iv, ciphertext + tag, protected.encode("ascii"))
    except InvalidTag:
        raise JweError("the released key does not open this JWE") from None
