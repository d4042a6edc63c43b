"""``nodegate disk rekey|unlock|status DEV`` (docs/disk-keys.md, "First boot" and "Rotation").

rekey   brings a volume to where it should be, each step only when it is still needed, so an
        interrupted run is finished by running it again:
        1. a new volume key (LUKS2 reencryption: every copy of an image shares the image's key,
           and changing a passphrase does not change it). Resumed when cryptsetup left one
           half done; marked done by a ``nodegate-rekey`` token.
        2. a keyslot bound to nodegate, as ``clevis luks bind`` binds one (a clevis token whose
           JWE is the nodegate pin's).
        3. the image's bootstrap passphrase removed.
        4. every nodegate binding sealed under an older server-secret version re-sealed under
           the current one (the passphrase and its keyslot do not change: no moment without a
           way in).
        Steps 1-3 need ``--bootstrap-key-file`` and ``--server``/``--ca-bundle``; step 4 reads
        the server from each binding.
unlock  opens the volume with its nodegate binding (``--test``: only checks the passphrase).
status  what the header says, offline.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bootstrap.files import read_limited
from bootstrap.node.disk import jwe, luks, pin
from bootstrap.node.errors import JoinFailed, JoinUsageError

__all__ = ["Binding", "RekeyOptions", "bindings", "rekey", "status", "unlock"]

_MAX_KEY_FILE = 8 * 1024


@dataclass(frozen=True)
class Binding:
    token: int
    keyslots: tuple[str, ...]
    text: str  # the compact JWE
    binding: jwe.Binding


def bindings(head: luks.Header) -> list[Binding]:
    """The header's clevis tokens whose JWE is the nodegate pin's (not those inside sss)."""
    out = []
    for token in head.of_type("clevis"):
        try:
            text = jwe.compact_of(token.body.get("jwe"))
            out.append(Binding(token.id, token.keyslots, text, jwe.binding_of(text)))
        except jwe.JweError:
            continue  # another pin's token
    return out


@dataclass(frozen=True)
class RekeyOptions:
    device: Path
    bootstrap_key_file: Path | None = None
    pin_config: str | None = None  # the clevis config for a new binding (JSON)
    offline: bool = False  # the volume is not open (cryptsetup --force-offline-reencrypt)


@dataclass
class RekeyResult:
    steps: list[str] = field(default_factory=list)


def _bootstrap_key(path: Path) -> bytes:
    try:
        return read_limited(path, _MAX_KEY_FILE)
    except (OSError, ValueError) as exc:
        raise JoinUsageError(f"--bootstrap-key-file {path}: {exc}") from None


def _luks(step: str, exc: luks.LuksError) -> JoinFailed:
    return JoinFailed("luks_error", f"{step}: {exc}")


async def rekey(opts: RekeyOptions) -> RekeyResult:
    result = RekeyResult()
    device = opts.device
    try:
        head = await asyncio.to_thread(luks.header, device)
    except luks.LuksError as exc:
        raise _luks("reading the header", exc) from None
    if opts.bootstrap_key_file is not None:
        await _first_boot(opts, head, _bootstrap_key(opts.bootstrap_key_file), result)
    await _rotate(device, result)
    return result


async def _first_boot(opts: RekeyOptions, head: luks.Header, key: bytes, result: RekeyResult) -> None:
    device = opts.device
    slot = await asyncio.to_thread(luks.opens, device, key)
    if head.reencrypting:
        if slot is None:
            raise JoinFailed(
                "luks_error", "a reencryption waits to be resumed, and the bootstrap key opens no keyslot"
            )
        await _step(
            luks.reencrypt, "resuming the reencryption", device, key, slot, offline=opts.offline, resume=True
        )
        await _step(luks.add_token, "marking the new volume key", device, _marker())
        result.steps.append("reencryption resumed and finished")
    elif not head.of_type(luks.MARKER_TYPE):
        if slot is None:
            raise JoinFailed(
                "luks_error", "the volume still has the image's key, and the bootstrap key opens no keyslot"
            )
        await _step(luks.reencrypt, "reencrypting", device, key, slot, offline=opts.offline, resume=False)
        await _step(luks.add_token, "marking the new volume key", device, _marker())
        result.steps.append("new volume key (reencrypted)")
    head = await _step(luks.header, "reading the header", device)
    if not bindings(head):
        if opts.pin_config is None:
            raise JoinUsageError("no nodegate binding yet: give --server and --ca-bundle to make one")
        await _bind(device, opts.bootstrap_key_file, opts.pin_config)
        result.steps.append("bound a keyslot to nodegate")
    if slot is not None and await asyncio.to_thread(luks.opens, device, key) is not None:
        await _step(luks.remove_key, "removing the bootstrap passphrase", device, key)
        result.steps.append("removed the bootstrap passphrase's keyslot")


def _marker() -> dict[str, Any]:
    return {"type": luks.MARKER_TYPE, "keyslots": [], "rekeyed_at": datetime.now(UTC).isoformat()}


async def _step(fn: Any, what: str, *args: Any, **kw: Any) -> Any:
    try:
        return await asyncio.to_thread(fn, *args, **kw)
    except luks.LuksError as exc:
        raise _luks(what, exc) from None


async def _bind(device: Path, key_file: Path | None, config: str) -> None:
    """What ``clevis luks bind -d DEV nodegate CONFIG`` does, in this process (so a refusal keeps
    its machine code): a random passphrase in a new keyslot, sealed by the pin into a clevis token."""
    if key_file is None:
        raise JoinUsageError("binding needs --bootstrap-key-file (an existing passphrase)")
    passphrase = secrets.token_urlsafe(32).encode()
    sealed = await pin.encrypt(config, passphrase)  # first: a refused release changes nothing
    slot = await _step(luks.add_key, "adding the keyslot", device, key_file, passphrase)
    body = {"type": "clevis", "keyslots": [slot], "jwe": jwe.flattened_of(sealed)}
    await _step(luks.add_token, "saving the binding", device, body)


async def _rotate(device: Path, result: RekeyResult) -> None:
    """Step 4: each binding at an older version re-sealed under the current one."""
    head = await _step(luks.header, "reading the header", device)
    for found in bindings(head):
        released = await pin.released_for(found.binding)
        if released.current_version == found.binding.version:
            continue
        passphrase = jwe.unseal(found.text, released.key)
        if await asyncio.to_thread(luks.opens, device, passphrase) is None:
            result.steps.append(f"token {found.token}: its passphrase opens no keyslot; left as it is")
            continue
        newer = found.binding.model_copy(update={"version": released.current_version})
        sealed = jwe.seal(newer, released.current_key, passphrase)
        body = {"type": "clevis", "keyslots": list(found.keyslots), "jwe": jwe.flattened_of(sealed)}
        await _step(luks.replace_token, f"re-sealing token {found.token}", device, found.token, body)
        versions = f"{found.binding.version} to {released.current_version}"
        result.steps.append(f"token {found.token}: re-sealed from key version {versions}")


async def unlock(device: Path, name: str | None, *, test: bool) -> str:
    """Open ``device`` as ``name`` with the first nodegate binding that opens (``test``: only
    check). Returns the keyslot it opened."""
    head = await _step(luks.header, "reading the header", device)
    found = bindings(head)
    if not found:
        raise JoinFailed(
            "not_bound", f"{device} has no nodegate binding (nodegate disk rekey, clevis luks bind)"
        )
    last: JoinFailed | None = None
    for one in found:
        released = await pin.released_for(one.binding)
        passphrase = jwe.unseal(one.text, released.key)
        slot = await asyncio.to_thread(luks.opens, device, passphrase)
        if slot is None:
            last = JoinFailed("luks_error", f"token {one.token}: its passphrase opens no keyslot")
            continue
        if not test:
            if name is None:
                raise JoinUsageError("unlock needs a mapping name (or --test)")
            await _step(luks.open_device, f"opening {device}", device, name, passphrase)
        return slot
    assert last is not None  # noqa: S101  (found is not empty)
    raise last


def status(device: Path) -> dict[str, Any]:
    try:
        head = luks.header(device)
    except luks.LuksError as exc:
        raise _luks("reading the header", exc) from None
    return {
        "device": str(device),
        "uuid": head.uuid,
        "keyslots": list(head.keyslots),
        "rekeyed": bool(head.of_type(luks.MARKER_TYPE)),
        "reencrypting": head.reencrypting,
        "bindings": [
            {
                "token": b.token,
                "keyslots": list(b.keyslots),
                "node": b.binding.node,
                "volume": b.binding.volume,
                "url": b.binding.url,
                "epoch": b.binding.epoch,
                "key_version": b.binding.version,
            }
            for b in bindings(head)
        ],
    }


def config_json(**values: Any) -> str:
    return json.dumps({k: v for k, v in values.items() if v is not None}, separators=(",", ":"))
