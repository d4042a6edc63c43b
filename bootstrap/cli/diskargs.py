"""Arguments of ``nodegate disk`` (docs/disk-keys.md): the node's ``unlock``, ``rekey`` and ``status``,
the operator's ``revoke``, ``rotate`` and ``recover``. argparse only, like ``arguments``."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TypeAlias

from bootstrap.node.defaults import DEFAULT_TCTI, EVENT_LOG, NODE_DIR

Sub: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"  # generic only to mypy


def _machine(p: argparse.ArgumentParser) -> None:
    """What the pin takes from the environment (NODEGATE_TCTI, NODEGATE_EVENT_LOG), as options."""
    p.add_argument("--tcti", default=None, help=f"the TPM (default {DEFAULT_TCTI}, or the binding's)")
    p.add_argument(
        "--event-log",
        type=Path,
        metavar="FILE",
        help=f"the measured-boot event log to send (default: {EVENT_LOG} when the TPM is the platform's)",
    )


def add_disk(sub: Sub, passphrase: Callable[[argparse.ArgumentParser], None]) -> None:
    disk = sub.add_parser("disk", help="disk keys released only to attested boots (LUKS, Clevis)")
    dsub = disk.add_subparsers(dest="disk_command", metavar="ACTION", required=True)

    unlock = dsub.add_parser("unlock", help="open a LUKS volume with its nodegate binding")
    unlock.add_argument("device", type=Path, metavar="DEV")
    unlock.add_argument("name", nargs="?", metavar="NAME", help="the mapping to create (/dev/mapper/NAME)")
    unlock.add_argument("--test", action="store_true", help="only check that the released key opens it")
    _machine(unlock)

    rekey = dsub.add_parser(
        "rekey",
        help="first boot: a new volume key, a nodegate keyslot, the image's passphrase removed; "
        "every boot: bindings re-sealed under the current key version",
    )
    rekey.add_argument("device", type=Path, metavar="DEV")
    rekey.add_argument(
        "--bootstrap-key-file",
        type=Path,
        metavar="FILE",
        help="the image's shared passphrase: reencrypt, bind and remove it (first boot)",
    )
    rekey.add_argument("--server", help="for a new binding: the nodegate service, https://host:port")
    rekey.add_argument(
        "--ca-bundle", type=Path, metavar="FILE", help="for a new binding: PEM roots for its TLS"
    )
    rekey.add_argument("--node-name", help=f"for a new binding (default: join.json in {NODE_DIR})")
    rekey.add_argument("--ek", choices=("ecc", "rsa"), default="rsa", help="the EK the node joined with")
    _machine(rekey)
    rekey.add_argument(
        "--offline",
        action="store_true",
        help="the volume is not open (cryptsetup --force-offline-reencrypt); default: online",
    )

    status = dsub.add_parser("status", help="what a volume's LUKS header says about nodegate (offline)")
    status.add_argument("device", type=Path, metavar="DEV")
    status.add_argument("-o", "--output", choices=("text", "json"), default="text")

    revoke = dsub.add_parser("revoke", help="a node's disk keys never released again (epoch bump)")
    revoke.add_argument("--config", type=Path, metavar="FILE", help="the service's config")
    revoke.add_argument("node", metavar="NODE")
    revoke.add_argument("--reason", required=True, help="why (kept in the audit trail)")
    revoke.add_argument("--ek", metavar="SHA256", help="the node's EK digest, when the store forgot the node")

    rotate = dsub.add_parser(
        "rotate", help="a new server-secret version (nodes re-key at their next boot), or --retire an old one"
    )
    rotate.add_argument("--config", type=Path, metavar="FILE", help="the service's config")
    rotate.add_argument(
        "--retire", type=int, metavar="VERSION", help="drop VERSION: its keys are never released again"
    )

    recover = dsub.add_parser(
        "recover", help="a lost node's volume passphrase from a backup (audited; docs/disk-keys.md)"
    )
    recover.add_argument("--config", type=Path, metavar="FILE", help="the service's config (for the audit)")
    recover.add_argument("--archive", type=Path, required=True, metavar="FILE", help="from nodegate backup")
    passphrase(recover)
    source = recover.add_mutually_exclusive_group(required=True)
    source.add_argument("--device", type=Path, metavar="DEV", help="the volume (its nodegate binding)")
    source.add_argument("--jwe", type=Path, metavar="FILE", help="a binding's JWE (compact form)")
    recover.add_argument(
        "--token", type=int, metavar="ID", help="with --device: which binding (default: the only one)"
    )
    recover.add_argument("--reason", required=True, help="why (kept in the audit trail)")
    recover.add_argument(
        "--out",
        required=True,
        metavar="FILE",
        help="where the volume's passphrase goes (0600, new file; - for stdout)",
    )
