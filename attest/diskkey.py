"""Disk keys (docs/disk-keys.md): one key per node, volume, epoch and server-secret version,
derived, never stored; and the sealed envelope a release carries them in. Pure: no I/O.

    key = derive_key(secret, ek_sha256=..., volume=uuid, epoch=0, version=1)
    sealed = seal_keys(transport, {1: key}, aad)     # the server, after the quote passed
    keys = open_keys(transport, sealed, aad)          # the node, with the secret its TPM recovered

``transport`` is the 32-byte secret the server hands to TPM2_MakeCredential for the node's EK and
AK, so only that TPM (ActivateCredential) recovers it; the keys travel under it with AES-256-GCM,
bound by ``aad`` to the exchange they answer.
"""

from __future__ import annotations

import os
import re
import struct
import uuid
from collections.abc import Mapping

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from attest.errors import MalformedInput

__all__ = [
    "KEY_BYTES",
    "MAX_EPOCH",
    "MAX_KEYS",
    "MAX_VERSION",
    "SECRET_BYTES",
    "DiskKeyUnsealable",
    "derive_key",
    "open_keys",
    "seal_keys",
]

KEY_BYTES = 32  # a disk key: the JWE's A256GCM key on the node
SECRET_BYTES = 32  # a server secret version
TRANSPORT_BYTES = 32  # what MakeCredential seals (a TPM2B_DIGEST of SHA-256: at most 32 bytes)
MAX_VERSION = 2**31 - 1
MAX_EPOCH = 2**31 - 1
MAX_KEYS = 2  # the version asked for, and the current one when they differ
_SALT = b"nodegate disk key v1"
_HEX64 = re.compile(r"[0-9a-f]{64}")
_ENTRY = struct.Struct(">I")
_IV = 12


class DiskKeyUnsealable(MalformedInput):
    """The sealed keys do not open with this transport secret and context: altered in transit, or
    meant for another TPM or another exchange."""


def derive_key(secret: bytes, *, ek_sha256: str, volume: uuid.UUID, epoch: int, version: int) -> bytes:
    """HKDF-SHA256 of the server secret of ``version`` over the node's EK digest, the volume's
    LUKS UUID and the node's epoch: the same inputs always give the same key, so nothing per
    node or volume is stored, and no two (TPM, volume, epoch, version) share a key."""
    if type(secret) is not bytes or len(secret) != SECRET_BYTES:
        raise ValueError(f"a server secret is {SECRET_BYTES} bytes")
    if not isinstance(ek_sha256, str) or not _HEX64.fullmatch(ek_sha256):
        raise ValueError("ek_sha256 must be 64 lowercase hex characters")
    if not isinstance(volume, uuid.UUID):
        raise TypeError("volume must be a uuid.UUID")
    _check_int(epoch, MAX_EPOCH, "epoch", 0)
    _check_int(version, MAX_VERSION, "version", 1)
    info = (
        b"nodegate disk key v1\x00"
        + bytes.fromhex(ek_sha256)
        + volume.bytes
        + _ENTRY.pack(epoch)
        + _ENTRY.pack(version)
    )
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=_SALT, info=info).derive(secret)


def _check_int(value: object, limit: int, what: str, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= limit:
        raise ValueError(f"{what} must be an integer in {low}..{limit}")


def seal_keys(transport: bytes, keys: Mapping[int, bytes], aad: bytes) -> bytes:
    """IV || AES-256-GCM(transport, version (u32) || key, ...) with ``aad``; versions ascending."""
    if type(transport) is not bytes or len(transport) != TRANSPORT_BYTES:
        raise ValueError(f"the transport secret is {TRANSPORT_BYTES} bytes")
    if not 1 <= len(keys) <= MAX_KEYS:
        raise ValueError(f"a release carries 1..{MAX_KEYS} keys")
    plain = b""
    for version, key in sorted(keys.items()):
        _check_int(version, MAX_VERSION, "version", 1)
        if type(key) is not bytes or len(key) != KEY_BYTES:
            raise ValueError(f"a disk key is {KEY_BYTES} bytes")
        plain += _ENTRY.pack(version) + key
    iv = os.urandom(_IV)
    return iv + AESGCM(transport).encrypt(iv, plain, aad)


def open_keys(transport: bytes, sealed: bytes, aad: bytes) -> dict[int, bytes]:
    """The keys ``seal_keys`` sealed; DiskKeyUnsealable for anything else."""
    if type(transport) is not bytes or len(transport) != TRANSPORT_BYTES:
        raise DiskKeyUnsealable(f"the transport secret is not {TRANSPORT_BYTES} bytes")
    entry = _ENTRY.size + KEY_BYTES
    if type(sealed) is not bytes or not _IV + 16 + entry <= len(sealed) <= _IV + 16 + MAX_KEYS * entry:
        raise DiskKeyUnsealable("the sealed keys have the wrong size")
    try:
        plain = AESGCM(transport).decrypt(sealed[:_IV], sealed[_IV:], aad)
    except InvalidTag:
        raise DiskKeyUnsealable(
            "the sealed keys do not authenticate (altered, or for another TPM or exchange)"
        ) from None
    if len(plain) % entry:
        raise DiskKeyUnsealable("the sealed keys have the wrong size")
    out: dict[int, bytes] = {}
    for at in range(0, len(plain), entry):
        (version,) = _ENTRY.unpack_from(plain, at)
        if not 1 <= version <= MAX_VERSION or version in out:
            raise DiskKeyUnsealable("the sealed keys name an impossible or repeated version")
        out[version] = plain[at + _ENTRY.size : at + entry]
    return out
