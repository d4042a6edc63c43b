"""The disk-key server secret (docs/disk-keys.md): its versions and the per-TPM epochs, in one small
JSON document kept where the CA's keys are kept.

- ``store: sqlite``: ``state_dir/disk-keys.json``, 0600, replaced atomically, changed under a
  lock file so two writers never lose each other's change.
- ``store: kubernetes``: a Secret (``disk_keys.secret_name`` in ``kubernetes.namespace``), every
  write guarded by the resourceVersion read.

Both are read on every release (the file by its stamp), so a revocation or a rotation made by
``nodegate disk`` counts at the next release on every replica. The document holds key material:
it is never logged, and nothing here puts it in an error message.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import re
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from attest import validation
from attest.diskkey import MAX_EPOCH, MAX_VERSION, SECRET_BYTES
from bootstrap.files import create_exclusive, exposure, read_limited, write_atomic
from bootstrap.kube import Conflict, Kube, KubeUnavailable, NotFound

__all__ = [
    "FILE_NAME",
    "MARKER",
    "MAX_DOCUMENT",
    "DATA_KEY",
    "DiskVault",
    "FileVault",
    "KubeVault",
    "VaultDamaged",
    "VaultDoc",
    "VaultUnavailable",
    "parse_document",
]

FILE_NAME: Final = "disk-keys.json"
MARKER: Final = "disk-keys.id"  # next to it: one was made here (a missing document is then lost)
DATA_KEY: Final = "disk-keys.json"  # the key inside the Kubernetes Secret
MAX_DOCUMENT: Final = 768 * 1024  # under a Secret's 1 MiB, base64 included
MAX_VERSIONS: Final = 16  # retire old versions once every node re-keyed (docs/disk-keys.md)
MAX_EPOCHS: Final = 8000  # TPMs whose keys were revoked, ~80 bytes each
_HEX64 = re.compile(r"[0-9a-f]{64}")
_ATTEMPTS: Final = 8


class VaultUnavailable(Exception):
    """The document cannot be read or written right now (I/O, the API): retry later."""


class VaultDamaged(Exception):
    """The document exists but is not one nodegate wrote, or is open to others: never trusted,
    never overwritten; restore it from a backup (docs/disk-keys.md)."""


class SecretVersion(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = Field(ge=1, le=MAX_VERSION, strict=True)
    key: str = Field(repr=False)  # 64 hex: the version's secret
    created_at: str

    @field_validator("key")
    @classmethod
    def _hex(cls, v: str) -> str:
        if not _HEX64.fullmatch(v):
            raise ValueError(f"a secret is {SECRET_BYTES} bytes as 64 lowercase hex characters")
        return v


class VaultDoc(BaseModel):
    """Versions of the server secret (the newest is ``current``) and, per EK digest, the epoch its
    keys are at (absent: 0). Keys of an epoch below the recorded one are never released again."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal[1] = 1
    current: int = Field(ge=1, le=MAX_VERSION, strict=True)
    secrets: tuple[SecretVersion, ...] = Field(min_length=1, max_length=MAX_VERSIONS)
    epochs: dict[str, int] = Field(default_factory=dict, max_length=MAX_EPOCHS)

    @field_validator("epochs")
    @classmethod
    def _epochs(cls, v: dict[str, int]) -> dict[str, int]:
        for ek, epoch in v.items():
            if not _HEX64.fullmatch(ek) or type(epoch) is not int or not 1 <= epoch <= MAX_EPOCH:
                raise ValueError("epochs map an EK's SHA-256 (hex) to an epoch of at least 1")
        return v

    @model_validator(mode="after")
    def _versions(self) -> VaultDoc:
        numbers = [s.version for s in self.secrets]
        if len(set(numbers)) != len(numbers) or numbers != sorted(numbers):
            raise ValueError("secret versions must be unique and ascending")
        if self.current != numbers[-1]:
            raise ValueError("current must be the newest version")
        return self

    # -- reading -----------------------------------------------------------------------------------

    def secret(self, version: int) -> bytes | None:
        """The secret of ``version``; None once retired (or never made)."""
        for s in self.secrets:
            if s.version == version:
                return bytes.fromhex(s.key)
        return None

    def epoch(self, ek_sha256: str) -> int:
        return self.epochs.get(ek_sha256, 0)

    @property
    def versions(self) -> tuple[int, ...]:
        return tuple(s.version for s in self.secrets)

    # -- changes (each returns a new document) -----------------------------------------------------

    @classmethod
    def new(cls, now: datetime) -> VaultDoc:
        return cls(current=1, secrets=(_fresh(1, now),))

    def rotated(self, now: datetime) -> VaultDoc:
        """A new current version; the older ones stay until retired, so every binding still opens."""
        if len(self.secrets) >= MAX_VERSIONS:
            raise ValueError(f"{MAX_VERSIONS} versions are kept at most: retire old ones first")
        version = self.current + 1
        if version > MAX_VERSION:
            raise ValueError("no version number is left")
        return self.model_copy(update={"current": version, "secrets": (*self.secrets, _fresh(version, now))})

    def retired(self, version: int) -> VaultDoc:
        """Without ``version``: keys derived from it are never released again."""
        if version == self.current:
            raise ValueError(f"version {version} is the current one; rotate first")
        if version not in self.versions:
            raise ValueError(f"there is no version {version} (versions: {list(self.versions)})")
        return self.model_copy(update={"secrets": tuple(s for s in self.secrets if s.version != version)})

    def revoked(self, ek_sha256: str) -> VaultDoc:
        """The TPM's epoch one up: every key of its earlier epochs is refused from now on."""
        if not _HEX64.fullmatch(ek_sha256):
            raise ValueError("an EK digest is 64 lowercase hex characters")
        epoch = self.epoch(ek_sha256) + 1
        if epoch > MAX_EPOCH:
            raise ValueError("no epoch number is left for this TPM")
        if ek_sha256 not in self.epochs and len(self.epochs) >= MAX_EPOCHS:
            raise ValueError(f"the document holds the epochs of {MAX_EPOCHS} TPMs, its limit")
        return self.model_copy(update={"epochs": {**self.epochs, ek_sha256: epoch}})

    def dump(self) -> bytes:
        return (json.dumps(self.model_dump(mode="json"), indent=1, sort_keys=True) + "\n").encode()


def _fresh(version: int, now: datetime) -> SecretVersion:
    return SecretVersion(
        version=version, key=secrets.token_hex(SECRET_BYTES), created_at=now.astimezone(UTC).isoformat()
    )


def parse_document(data: bytes, where: str) -> VaultDoc:
    """The document in ``data``; VaultDamaged naming ``where`` (never a value) otherwise."""
    if len(data) > MAX_DOCUMENT:
        raise VaultDamaged(f"{where} is larger than {MAX_DOCUMENT} bytes")
    try:
        return VaultDoc.model_validate_json(data)
    except ValidationError as exc:
        raise VaultDamaged(
            f"{where} is not a disk-key document: {validation.summary(exc, VaultDoc)}"
        ) from None


class DiskVault(Protocol):
    where: str

    async def read(self) -> VaultDoc | None:
        """The document; None when there is none yet. VaultDamaged, VaultUnavailable."""
        ...

    async def create(self, doc: VaultDoc) -> VaultDoc:
        """Write ``doc`` unless a document exists; returns the one that is stored (ours or the
        one another replica created first)."""
        ...

    async def update(self, change: Callable[[VaultDoc], VaultDoc]) -> VaultDoc:
        """Read, ``change``, write, without losing a concurrent writer's change; returns what was
        written. VaultDamaged when there is no document to change."""
        ...


# -- state_dir/disk-keys.json -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Cached:
    stamp: tuple[int, int, int]
    doc: VaultDoc


class FileVault:
    """``state_dir/disk-keys.json``. Reads are cached by the file's stamp (inode, size, mtime),
    so a release costs one stat unless the document changed."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / FILE_NAME
        self.where = str(self.path)
        self._lock = state_dir / f".{FILE_NAME}.lock"
        self._cache: _Cached | None = None

    def _stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise VaultUnavailable(f"{self.path}: {exc.strerror or exc}") from None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def read_now(self) -> VaultDoc | None:
        stamp = self._stamp()
        if stamp is None:
            return None
        cached = self._cache
        if cached is not None and cached.stamp == stamp:
            return cached.doc
        try:
            exposed = exposure(self.path)
            data = read_limited(self.path, MAX_DOCUMENT)
        except FileNotFoundError:
            return None
        except ValueError as exc:
            raise VaultDamaged(str(exc)) from None
        except OSError as exc:
            raise VaultUnavailable(f"{self.path}: {exc.strerror or exc}") from None
        if exposed is not None:
            raise VaultDamaged(f"disk-key secret {exposed}")
        doc = parse_document(data, str(self.path))
        self._cache = _Cached(stamp, doc)
        return doc

    async def read(self) -> VaultDoc | None:
        return self.read_now()

    def create_now(self, doc: VaultDoc) -> VaultDoc:
        try:
            created = create_exclusive(self.path, doc.dump())
        except OSError as exc:
            raise VaultUnavailable(f"cannot write {self.path}: {exc.strerror or exc}") from None
        stored = self.read_now()
        if stored is None:
            raise VaultUnavailable(f"{self.path} vanished right after it was written")
        return doc if created and stored == doc else stored

    async def create(self, doc: VaultDoc) -> VaultDoc:
        return self.create_now(doc)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self._lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing drops the lock

    def update_now(self, change: Callable[[VaultDoc], VaultDoc]) -> VaultDoc:
        try:
            with self._locked():
                current = self.read_now()
                if current is None:
                    raise VaultDamaged(f"{self.path} does not exist: nothing to change")
                changed = change(current)
                write_atomic(self.path, changed.dump())
        except OSError as exc:
            raise VaultUnavailable(f"cannot write {self.path}: {exc.strerror or exc}") from None
        return changed

    async def update(self, change: Callable[[VaultDoc], VaultDoc]) -> VaultDoc:
        return self.update_now(change)


# -- the Kubernetes Secret ----------------------------------------------------------------------------


class KubeVault:
    """The Secret ``name`` in ``namespace``, key ``disk-keys.json``. The chart makes it empty; the
    first replica that finds it empty fills it (a write guarded by the resourceVersion read, so
    of replicas starting together exactly one wins); every change is guarded the same way."""

    def __init__(self, kube: Kube, namespace: str, name: str) -> None:
        self._kube = kube
        self._namespace = namespace
        self._name = name
        self.where = f"Secret {namespace}/{name}"

    async def _get(self) -> tuple[dict[str, Any] | None, VaultDoc | None]:
        try:
            secret = await self._kube.get_secret(self._namespace, self._name)
        except KubeUnavailable as exc:
            raise VaultUnavailable(f"{self.where}: {exc}") from None
        if secret is None:
            return None, None
        data = secret.get("data") or {}
        if not isinstance(data, dict):
            raise VaultDamaged(f"{self.where} has a malformed data field")
        text = data.get(DATA_KEY)
        if text is None:
            return secret, None
        try:
            raw = base64.b64decode(str(text), validate=True)
        except ValueError:
            raise VaultDamaged(f"{self.where}: {DATA_KEY} is not base64") from None
        return secret, parse_document(raw, f"{self.where} ({DATA_KEY})")

    async def read(self) -> VaultDoc | None:
        return (await self._get())[1]

    async def _write(self, secret: dict[str, Any] | None, doc: VaultDoc) -> None:
        encoded = base64.b64encode(doc.dump()).decode("ascii")
        if secret is None:
            body = {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "Opaque",
                "metadata": {"name": self._name, "namespace": self._namespace},
                "data": {DATA_KEY: encoded},
            }
            await self._kube.create_secret(self._namespace, body)
            return
        meta = dict(secret.get("metadata") or {})
        data = dict(secret.get("data") or {})
        data[DATA_KEY] = encoded
        await self._kube.replace_secret(
            self._namespace, self._name, {**secret, "metadata": meta, "data": data}
        )

    async def create(self, doc: VaultDoc) -> VaultDoc:
        for _ in range(_ATTEMPTS):
            secret, stored = await self._get()
            if stored is not None:
                return stored
            try:
                await self._write(secret, doc)
            except (Conflict, NotFound):
                continue  # another replica wrote first: read what it wrote
            except KubeUnavailable as exc:
                raise VaultUnavailable(f"{self.where}: {exc}") from None
            return doc
        raise VaultUnavailable(f"{self.where}: too many concurrent writers")

    async def update(self, change: Callable[[VaultDoc], VaultDoc]) -> VaultDoc:
        for _ in range(_ATTEMPTS):
            secret, stored = await self._get()
            if stored is None:
                raise VaultDamaged(f"{self.where} holds no {DATA_KEY}: nothing to change")
            changed = change(stored)
            try:
                await self._write(secret, changed)
            except (Conflict, NotFound):
                continue
            except KubeUnavailable as exc:
                raise VaultUnavailable(f"{self.where}: {exc}") from None
            return changed
        raise VaultUnavailable(f"{self.where}: too many concurrent writers")
