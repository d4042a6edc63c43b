"""A LUKS2 header through ``cryptsetup`` (Debian's cryptsetup-bin): what the pin, ``nodegate disk
rekey`` and ``unlock`` read and change. Passphrases go through stdin, never the command line or a
file; every call has a timeout; a failure is a LuksError with cryptsetup's own words."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

__all__ = [
    "MARKER_TYPE",
    "Header",
    "LuksError",
    "Token",
    "add_key",
    "add_token",
    "header",
    "opens",
    "open_device",
    "reencrypt",
    "remove_key",
    "replace_token",
    "volume_uuid",
]

MARKER_TYPE: Final = "nodegate-rekey"  # a token without keyslots: this volume's key is its own
_TIMEOUT: Final = 120.0
_REENCRYPT_TIMEOUT: Final = 24 * 3600.0  # the whole volume: hours on a large disk
_MAX_OUTPUT: Final = 4 * 1024 * 1024


class LuksError(Exception):
    """cryptsetup failed or is missing; the message says what it said."""


@dataclass(frozen=True)
class Token:
    id: int
    type: str
    keyslots: tuple[str, ...]
    body: dict[str, Any]  # the token's JSON as cryptsetup holds it


@dataclass(frozen=True)
class Header:
    uuid: str
    keyslots: tuple[str, ...]
    tokens: tuple[Token, ...]
    reencrypting: bool  # an interrupted reencryption waits to be resumed

    def of_type(self, kind: str) -> list[Token]:
        return [t for t in self.tokens if t.type == kind]


def _cryptsetup() -> str:
    found = shutil.which("cryptsetup") or next(
        (p for p in ("/usr/sbin/cryptsetup", "/sbin/cryptsetup") if Path(p).is_file()), None
    )
    if found is None:
        raise LuksError("cryptsetup is not installed (Debian: cryptsetup-bin)")
    return found


def _run(args: list[str], *, stdin: bytes = b"", timeout: float = _TIMEOUT) -> bytes:
    try:
        done = subprocess.run(
            [_cryptsetup(), *args], input=stdin, capture_output=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise LuksError(f"cryptsetup {args[0]} did not finish within {timeout:g} s") from None
    except OSError as exc:
        raise LuksError(f"cannot run cryptsetup: {exc}") from None
    if done.returncode != 0:
        said = " ".join(done.stderr.decode("utf-8", "replace").split())[:300]
        raise LuksError(f"cryptsetup {args[0]} failed (exit {done.returncode}): {said or 'no message'}")
    return done.stdout[:_MAX_OUTPUT]


def volume_uuid(device: Path) -> str:
    return _run(["luksUUID", str(device)]).decode("ascii", "replace").strip()


def header(device: Path) -> Header:
    """The LUKS2 header's JSON metadata (keyslots, tokens, requirements)."""
    raw = _run(["luksDump", "--dump-json-metadata", str(device)])
    try:
        doc = json.loads(raw)
        tokens = tuple(
            Token(int(k), str(v.get("type", "")), tuple(str(s) for s in v.get("keyslots", ())), v)
            for k, v in sorted(doc.get("tokens", {}).items(), key=lambda kv: int(kv[0]))
        )
        required = doc.get("config", {}).get("requirements", {}).get("mandatory", [])
    except (ValueError, AttributeError, TypeError):
        raise LuksError(f"{device}: cryptsetup printed a header this version does not understand") from None
    return Header(
        uuid=volume_uuid(device),
        keyslots=tuple(sorted(doc.get("keyslots", {}), key=int)),
        tokens=tokens,
        reencrypting=any(str(r).startswith("online-reencrypt") for r in required),
    )


def opens(device: Path, passphrase: bytes) -> str | None:
    """The keyslot ``passphrase`` opens, None when it opens none (``--test-passphrase``)."""
    try:
        out = _run(
            ["open", "--test-passphrase", "--verbose", "--key-file", "-", str(device)], stdin=passphrase
        )
    except LuksError:
        return None
    for line in out.decode("utf-8", "replace").splitlines():
        words = line.split()
        if line.startswith("Key slot ") and len(words) > 2 and words[2].isdigit():
            return words[2]
    return ""  # opened, slot not reported


def open_device(device: Path, name: str, passphrase: bytes) -> None:
    _run(["open", "--type", "luks2", "--key-file", "-", str(device), name], stdin=passphrase)


def add_token(device: Path, body: dict[str, Any]) -> None:
    _run(["token", "import", str(device)], stdin=json.dumps(body).encode())


def replace_token(device: Path, token_id: int, body: dict[str, Any]) -> None:
    """The token ``token_id`` replaced in one header write (the old one or the new one, never none)."""
    _run(
        ["token", "import", "--token-id", str(token_id), "--token-replace", str(device)],
        stdin=json.dumps(body).encode(),
    )


def add_key(device: Path, existing_key_file: Path, passphrase: bytes) -> str:
    """A new keyslot for ``passphrase`` (from stdin), authorised by the key in ``existing_key_file``;
    returns its number."""
    _run(
        ["luksAddKey", "--batch-mode", "--key-file", str(existing_key_file), str(device), "-"],
        stdin=passphrase,
    )
    slot = opens(device, passphrase)
    if not slot:
        raise LuksError(f"{device}: the new keyslot does not open with its passphrase")
    return slot


def remove_key(device: Path, passphrase: bytes) -> None:
    """Remove the keyslot ``passphrase`` opens."""
    _run(["luksRemoveKey", "--batch-mode", "--key-file", "-", str(device)], stdin=passphrase)


def reencrypt(device: Path, passphrase: bytes, keyslot: str | None, *, offline: bool, resume: bool) -> None:
    """A new volume key for the whole volume (LUKS2 reencryption, resumable: an interrupted run
    leaves a header that ``resume`` finishes). Only ``keyslot`` is kept: the others would open the
    old key only. ``resume`` (or no keyslot): finish an interrupted one."""
    args = ["reencrypt", "--batch-mode", "--key-file", "-"]
    # Resuming, the passphrase opens the new key's keyslot: cryptsetup finds it (naming the old
    # slot fails then).
    if resume or keyslot is None:
        args.append("--resume-only")
    else:
        args += ["--key-slot", keyslot]
    if offline:
        args.append("--force-offline-reencrypt")
    _run([*args, str(device)], stdin=passphrase, timeout=_REENCRYPT_TIMEOUT)
