"""The encrypted envelope of an archive: a fixed header, scrypt from the passphrase, AES-256-GCM.

Format version 1 (all integers big-endian)::

    offset size
    0      8    magic b"NGBACKUP"
    8      2    format version (1)
    10     1    KDF (1 = scrypt)
    11     1    scrypt log2(N)
    12     1    scrypt r
    13     1    scrypt p
    14     16   salt
    30     16   passphrase check: HMAC-SHA256(scrypt output[32:], CHECK_LABEL)[:16]
    46     1    AEAD (1 = AES-256-GCM)
    47     12   nonce
    59     8    ciphertext length (tag included)
    67     ...  ciphertext: AES-256-GCM(key = scrypt output[:32], aad = bytes 0..66)

Nothing may follow the ciphertext. The passphrase check only makes "wrong passphrase"
distinguishable from "damaged archive"; it is no easier to guess against than the GCM tag it sits
next to. Every header field is checked against fixed limits before any work it asks for is done.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from pathlib import Path
from typing import BinaryIO, Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from bootstrap.store.backup.contents import FORMAT_VERSION, MAX_PLAINTEXT
from bootstrap.store.backup.errors import (
    ArchiveCorrupt,
    ArchiveTooLarge,
    ArchiveTruncated,
    BackupError,
    BackupIoError,
    NotAnArchive,
    TrailingData,
    UnsupportedVersion,
    WrongPassphrase,
)

__all__ = [
    "AEAD_AES256GCM",
    "CHECK_LABEL",
    "HEADER_SIZE",
    "KDF_SCRYPT",
    "MAGIC",
    "MAX_ARCHIVE",
    "MAX_PASSPHRASE",
    "MIN_PASSPHRASE",
    "SCRYPT_LOG2_N",
    "SCRYPT_P",
    "SCRYPT_R",
    "check_passphrase",
    "open_sealed",
    "seal",
]

MAGIC: Final = b"NGBACKUP"
KDF_SCRYPT: Final = 1
AEAD_AES256GCM: Final = 1
CHECK_LABEL: Final = b"nodegate-backup-v1 passphrase check"
_PREFIX = struct.Struct(">8sH")  # magic, version: read first, so an unknown version is named
_HEADER_V1 = struct.Struct(">8sHBBBB16s16sB12sQ")
HEADER_SIZE: Final = _HEADER_V1.size  # 67

# scrypt cost of new archives: N = 2^17, r = 8 -> 128 MiB and about a second per backup or
# restore, which is what an interactive, rare operation can afford. (A module variable, not a
# constant, so tests can make archives quickly; restore reads the cost from the header.)
SCRYPT_LOG2_N = 17
SCRYPT_R = 8
SCRYPT_P = 1
# What restore accepts: a header could otherwise ask for gigabytes of memory.
_LOG2_N_RANGE = range(10, 21)
_MAX_R, _MAX_P = 16, 4
_MAX_SCRYPT_MEMORY = 512 * 1024 * 1024

MAX_ARCHIVE: Final = HEADER_SIZE + MAX_PLAINTEXT + 16
MIN_PASSPHRASE: Final = 12
MAX_PASSPHRASE: Final = 4096


def check_passphrase(passphrase: object, *, creating: bool) -> bytes:
    if not isinstance(passphrase, bytes):
        raise TypeError("the passphrase is bytes")
    if not passphrase:
        raise BackupError("the passphrase is empty")
    if len(passphrase) > MAX_PASSPHRASE:
        raise BackupError(f"the passphrase is longer than {MAX_PASSPHRASE} bytes")
    if creating and len(passphrase) < MIN_PASSPHRASE:
        raise BackupError(f"use a passphrase of at least {MIN_PASSPHRASE} bytes")
    return passphrase


def _derive(passphrase: bytes, salt: bytes, log2_n: int, r: int, p: int) -> tuple[bytes, bytes]:
    km = Scrypt(salt=salt, length=64, n=1 << log2_n, r=r, p=p).derive(passphrase)
    check = hmac.new(km[32:], CHECK_LABEL, hashlib.sha256).digest()[:16]
    return km[:32], check


def seal(plain: bytes, passphrase: bytes) -> bytes:
    salt, nonce = os.urandom(16), os.urandom(12)
    key, check = _derive(passphrase, salt, SCRYPT_LOG2_N, SCRYPT_R, SCRYPT_P)
    header = _HEADER_V1.pack(
        MAGIC,
        FORMAT_VERSION,
        KDF_SCRYPT,
        SCRYPT_LOG2_N,
        SCRYPT_R,
        SCRYPT_P,
        salt,
        check,
        AEAD_AES256GCM,
        nonce,
        len(plain) + 16,
    )
    return header + AESGCM(key).encrypt(nonce, plain, header)


def _read_exact(f: BinaryIO, n: int, what: str) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise ArchiveTruncated(f"the archive is truncated ({what}: {len(data)} of {n} bytes)")
    return data


def open_sealed(archive: Path, passphrase: bytes) -> bytes:
    """The authenticated plaintext of ``archive``."""
    try:
        with archive.open("rb") as f:
            prefix = f.read(_PREFIX.size)
            if len(prefix) < len(MAGIC) or prefix[: len(MAGIC)] != MAGIC:
                raise NotAnArchive(f"{archive} is not a nodegate backup (no NGBACKUP header)")
            if len(prefix) < _PREFIX.size:
                raise ArchiveTruncated("the archive is truncated (in the header)")
            _, version = _PREFIX.unpack(prefix)
            if version != FORMAT_VERSION:
                raise UnsupportedVersion(
                    f"the archive has format version {version}; this nodegate reads version "
                    f"{FORMAT_VERSION} (restore it with the nodegate that wrote it, or a newer one)"
                )
            header = prefix + _read_exact(f, HEADER_SIZE - _PREFIX.size, "header")
            _, _, kdf, log2_n, r, p, salt, check, aead, nonce, length = _HEADER_V1.unpack(header)
            if kdf != KDF_SCRYPT or aead != AEAD_AES256GCM:
                raise UnsupportedVersion(f"the archive uses an unknown KDF ({kdf}) or cipher ({aead})")
            if log2_n not in _LOG2_N_RANGE or not 1 <= r <= _MAX_R or not 1 <= p <= _MAX_P:
                raise ArchiveCorrupt(
                    f"the archive's scrypt parameters are out of range (2^{log2_n}, {r}, {p})"
                )
            if 128 * r * (1 << log2_n) > _MAX_SCRYPT_MEMORY:
                raise ArchiveCorrupt("the archive's scrypt parameters need more memory than allowed")
            if not 16 < length <= MAX_PLAINTEXT + 16:
                raise ArchiveTooLarge(
                    f"the archive declares {length} bytes of content (at most {MAX_PLAINTEXT})"
                )
            sealed = _read_exact(f, length, "content")
            if f.read(1):
                raise TrailingData("the archive has bytes after its end; it was altered or concatenated")
    except FileNotFoundError:
        raise BackupIoError(f"{archive} does not exist") from None
    except IsADirectoryError:
        raise BackupIoError(f"{archive} is a directory") from None
    except OSError as exc:
        raise BackupIoError(f"cannot read {archive}: {exc.strerror or exc}") from None
    key, expected = _derive(passphrase, salt, log2_n, r, p)
    if not hmac.compare_digest(check, expected):
        raise WrongPassphrase("wrong passphrase (or the archive's header is damaged)")
    try:
        return AESGCM(key).decrypt(nonce, sealed, header)
    except InvalidTag:
        raise ArchiveCorrupt("the archive is damaged: its content does not authenticate") from None
