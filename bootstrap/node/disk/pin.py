"""The Clevis pin ``nodegate`` (docs/disk-keys.md, "The Clevis pin"): what ``clevis-encrypt-nodegate``
and ``clevis-decrypt-nodegate`` do.

    clevis luks bind -d /dev/nvme0n1p3 nodegate '{"url": "https://join.example:8443",
                                                  "ca_bundle": "/etc/nodegate/ca.pem"}'

encrypt  reads the config (below), asks the server for the volume's key (a full release: this
         node must be attested and its boot must pass its class's policy), and seals the
         plaintext (the passphrase ``clevis luks bind`` made for its new keyslot) under it.
decrypt  reads what it needs from the JWE's header alone (the root file system may still be
         locked), asks for the key of the same epoch and version, and opens the JWE.

Config keys: ``url`` and ``ca_bundle`` (a PEM file, or the PEM text), required; ``volume`` (the
LUKS UUID; default: the device ``clevis luks bind -d`` was given, found from the parent process),
``node`` (default: ``join.json`` in ``dir``, /var/lib/nodegate-node), ``ek`` (rsa or ecc, the EK
the node joined with; default rsa), ``tcti``. The environment may override, for the machines a
test or a demo plays: NODEGATE_TCTI, NODEGATE_BOOT_ID_FILE, NODEGATE_EVENT_LOG.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from attest import validation
from bootstrap.files import read_limited
from bootstrap.node.defaults import BOOT_ID, DEFAULT_TCTI, NODE_DIR
from bootstrap.node.disk import jwe, luks
from bootstrap.node.disk.release import Released, ReleaseOptions, release
from bootstrap.node.errors import JoinUsageError, one_line
from bootstrap.node.renew import read_index
from bootstrap.protocol import is_volume_uuid

__all__ = ["PinConfig", "decrypt", "encrypt", "parse_config"]

TCTI_ENV = "NODEGATE_TCTI"
BOOT_ID_ENV = "NODEGATE_BOOT_ID_FILE"
EVENT_LOG_ENV = "NODEGATE_EVENT_LOG"
_BINDERS = ("clevis-luks-bind", "clevis-luks-regen", "clevis-luks-edit")
_MAX_CONFIG = 64 * 1024
_MAX_PROC = 64 * 1024


class PinConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    url: Annotated[str, Field(min_length=8, max_length=2048)]
    ca_bundle: Annotated[str, Field(min_length=1, max_length=jwe.MAX_CA)]
    volume: str | None = None
    node: str | None = None
    ek: Literal["rsa", "ecc"] = "rsa"
    tcti: Annotated[str, Field(max_length=256)] | None = None
    dir: Annotated[str, Field(max_length=4096)] | None = None


def parse_config(text: str) -> PinConfig:
    if len(text) > _MAX_CONFIG:
        raise JoinUsageError("the pin's config is larger than 64 KiB")
    try:
        return PinConfig.model_validate_json(text)
    except ValidationError as exc:
        raise JoinUsageError(f"the pin's config: {validation.summary(exc, PinConfig)}") from None


def _ca_pem(value: str) -> str:
    """The CA bundle's PEM: the config names a file, or holds the text itself."""
    if "-----BEGIN CERTIFICATE-----" in value:
        return value
    try:
        text = read_limited(Path(value), jwe.MAX_CA).decode("ascii")
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise JoinUsageError(f"ca_bundle {one_line(value, 200)}: {one_line(exc, 200)}") from None
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise JoinUsageError(f"ca_bundle {one_line(value, 200)} holds no PEM certificate")
    return text


@contextmanager
def _ca_file(pem: str) -> Iterator[Path]:
    """The PEM in a private file for the TLS context (initramfs has no other copy of it)."""
    with tempfile.TemporaryDirectory(prefix="nodegate-pin-") as folder:
        path = Path(folder) / "ca.pem"
        path.write_text(pem, encoding="ascii")
        yield path


def _parent_args(pid: int) -> tuple[int, list[str], Path] | None:
    """(parent pid, argv, cwd) of ``pid``; None when /proc does not say."""
    try:
        stat = read_limited(Path(f"/proc/{pid}/stat"), _MAX_PROC).decode("ascii", "replace")
        argv = read_limited(Path(f"/proc/{pid}/cmdline"), _MAX_PROC).split(b"\0")
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
    except (OSError, ValueError):
        return None
    parent = int(stat.rsplit(")", 1)[1].split()[1])
    return parent, [a.decode("utf-8", "surrogateescape") for a in argv if a], cwd


def _device_option(args: list[str]) -> str | None:
    for i, arg in enumerate(args):
        if arg == "-d" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("-") and not arg.startswith("--") and arg.endswith("d") and i + 1 < len(args):
            return args[i + 1]  # combined flags: -yd DEV
        if arg.startswith("-d") and len(arg) > 2:
            return arg[2:]
    return None


def binding_device() -> Path | None:
    """The device of the ``clevis luks bind -d DEV`` (or regen, edit) this pin runs under."""
    pid = os.getppid()
    for _ in range(16):
        found = _parent_args(pid)
        if found is None or pid <= 1:
            return None
        parent, argv, cwd = found
        for i, arg in enumerate(argv):
            if Path(arg).name in _BINDERS:
                device = _device_option(argv[i + 1 :])
                return None if device is None else cwd / device
        pid = parent
    return None


def _volume(cfg: PinConfig) -> str:
    if cfg.volume is not None:
        if not is_volume_uuid(cfg.volume):
            raise JoinUsageError(
                f"volume {one_line(cfg.volume, 80)!r} is not a LUKS UUID (cryptsetup luksUUID)"
            )
        return cfg.volume
    device = binding_device()
    if device is None:
        raise JoinUsageError(
            'no "volume" in the config and no clevis luks bind -d DEV above this pin: name the LUKS UUID'
        )
    try:
        return luks.volume_uuid(device)
    except luks.LuksError as exc:
        raise JoinUsageError(f"{device}: {exc}") from None


def _options(
    url: str,
    ca: Path,
    node: str,
    volume: str,
    ek: str,
    tcti: str | None,
    version: int | None,
    epoch: int | None,
) -> ReleaseOptions:
    log_file = os.environ.get(EVENT_LOG_ENV)
    return ReleaseOptions(
        server=url,
        ca_bundle=ca,
        node_name=node,
        volume=volume,
        tcti=os.environ.get(TCTI_ENV) or tcti or DEFAULT_TCTI,
        ek_kind=ek,
        key_version=version,
        epoch=epoch,
        event_log=Path(log_file) if log_file else None,
        boot_id_file=Path(os.environ.get(BOOT_ID_ENV) or BOOT_ID),
    )


async def encrypt(config: str, plaintext: bytes) -> str:
    """``clevis-encrypt-nodegate CONFIG``: the JWE of ``plaintext`` under this volume's current key."""
    cfg = parse_config(config)
    pem = _ca_pem(cfg.ca_bundle)
    node = cfg.node if cfg.node is not None else read_index(Path(cfg.dir) if cfg.dir else NODE_DIR)
    volume = _volume(cfg)
    with _ca_file(pem) as ca:
        out = await release(_options(cfg.url, ca, node, volume, cfg.ek, cfg.tcti, None, None))
    binding = jwe.Binding(
        url=cfg.url,
        ca=pem,
        node=node,
        volume=volume,
        ek=cfg.ek,
        ek_sha256=out.ek_sha256,
        epoch=out.epoch,
        version=out.key_version,
        tcti=cfg.tcti,
    )
    return jwe.seal(binding, out.key, plaintext)


async def released_for(binding: jwe.Binding) -> Released:
    """The key of ``binding`` (and the current one), from its own server."""
    with _ca_file(binding.ca) as ca:
        return await release(
            _options(
                binding.url,
                ca,
                binding.node,
                binding.volume,
                binding.ek,
                binding.tcti,
                binding.version,
                binding.epoch,
            )
        )


async def decrypt(text: str) -> bytes:
    """``clevis-decrypt-nodegate``: the plaintext of the JWE on stdin."""
    binding = jwe.binding_of(text)
    out = await released_for(binding)
    return jwe.unseal(text, out.key)
