"""``nodegate disk revoke|rotate|recover`` (docs/disk-keys.md, "Operations"): exit 0; 1 refused or
failed (the message says why); 2 usage or config."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import socket
import sys
from pathlib import Path

from bootstrap.cli import common
from bootstrap.cli.backup import read_passphrase
from bootstrap.config import Settings
from bootstrap.files import create_exclusive
from bootstrap.kube import KubeUnavailable
from bootstrap.node.disk import jwe, luks
from bootstrap.node.disk.rekey import bindings
from bootstrap.service.disk import admin
from bootstrap.service.pki.startup import StartupError
from bootstrap.store import StoreUnavailable
from bootstrap.store.backup import BackupError, open_archive
from bootstrap.store.backup.contents import DISK_KEYS
from bootstrap.store.diskkeys import VaultDamaged, VaultUnavailable, parse_document

_FAILURES = (VaultDamaged, VaultUnavailable, StoreUnavailable, KubeUnavailable, StartupError)


def actor() -> str:
    return f"cli:{getpass.getuser()}@{socket.gethostname()}"[:256]


def run(args: argparse.Namespace) -> int:
    prog = f"nodegate disk {args.disk_command}"
    settings = common.settings(args.config, prog)
    if settings is None:
        return 2
    try:
        return asyncio.run(_run(args, prog, settings))
    except BackupError as exc:
        print(f"{prog}: {exc.detail} [{exc.code}]", file=sys.stderr)
        return 1
    except _FAILURES as exc:
        print(f"{prog}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1


async def _run(args: argparse.Namespace, prog: str, settings: Settings) -> int:
    if args.disk_command == "recover":
        return await _recover(args, prog, settings)
    async with admin.tools(settings) as t:
        if args.disk_command == "revoke":
            try:
                done = await admin.revoke(t, args.node, ek_sha256=args.ek, actor=actor(), reason=args.reason)
            except KeyError:
                print(f"{prog}: the store knows no node {args.node}; name its EK with --ek", file=sys.stderr)
                return 1
            print(
                f"{prog}: {done.node}'s TPM (EK {done.ek_sha256}) is at epoch {done.epoch}: every disk key "
                "it had is refused from now on"
            )
            if not done.audited:
                warning = f"the store keeps no trail for {done.node}; the change stands"
                print(f"{prog}: warning: {warning}", file=sys.stderr)
            return 0
        doc = await admin.rotate(t, retire=args.retire)
        if args.retire is not None:
            print(f"{prog}: key version {args.retire} retired; versions kept: {list(doc.versions)}")
        else:
            print(
                f"{prog}: key version {doc.current} is current; bindings re-key at their node's next "
                f"nodegate disk rekey; versions kept: {list(doc.versions)}"
            )
        return 0


def _binding_jwe(args: argparse.Namespace) -> str:
    if args.jwe is not None:
        return Path(args.jwe).read_text(encoding="ascii").strip()
    found = bindings(luks.header(args.device))
    if args.token is not None:
        found = [b for b in found if b.token == args.token]
    if len(found) != 1:
        raise ValueError(f"{args.device} has {len(found)} matching nodegate bindings; name one with --token")
    return found[0].text


async def _recover(args: argparse.Namespace, prog: str, settings: Settings) -> int:
    passphrase = read_passphrase(args.passphrase_file)
    content, _size = open_archive(args.archive, passphrase)
    if DISK_KEYS not in content.files:
        print(f"{prog}: {args.archive} holds no disk-key secret", file=sys.stderr)
        return 1
    doc = parse_document(content.files[DISK_KEYS], f"{args.archive} ({DISK_KEYS})")
    try:
        text = _binding_jwe(args)
    except (OSError, luks.LuksError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    binding = jwe.binding_of(text)
    found = admin.derive_for(
        doc, ek_sha256=binding.ek_sha256, volume=binding.volume, epoch=binding.epoch, version=binding.version
    )
    secret = jwe.unseal(text, found.key)
    note = " (its epoch was revoked since)" if found.revoked else ""
    detail = (
        f"volume={binding.volume} epoch={binding.epoch} version={binding.version}{note} "
        f"from {args.archive}: {args.reason}"
    )
    # The audit first: no passphrase leaves without its line in the node's trail.
    async with admin.tools(settings) as t:
        if not await t.store.record_disk(binding.node, action="disk-recover", actor=actor(), detail=detail):
            print(f"{prog}: the store keeps no trail for {binding.node}; nothing recovered", file=sys.stderr)
            return 1
    if args.out == "-":
        sys.stdout.buffer.write(secret)
        sys.stdout.flush()
    elif not create_exclusive(Path(args.out), secret):
        print(f"{prog}: {args.out} exists; name a new file", file=sys.stderr)
        return 1
    print(f"{prog}: recovered the passphrase of {binding.volume} ({binding.node}){note}", file=sys.stderr)
    return 0
