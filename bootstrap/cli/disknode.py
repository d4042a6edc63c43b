"""``nodegate disk unlock|rekey|status DEV`` (docs/disk-keys.md): exit 0; 1 refused (the server's
machine code, or a volume that does not open); 2 usage or local (cryptsetup, the TPM); 75 the
server stayed unreachable."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from bootstrap.cli.common import node_log
from bootstrap.node.defaults import NODE_DIR
from bootstrap.node.disk import jwe, luks, pin, rekey
from bootstrap.node.errors import EXIT_OK, EXIT_REFUSED, JoinFailed, JoinUsageError, report_failure
from bootstrap.node.eventlogfile import require_event_log
from bootstrap.node.renew import read_index


def run(args: argparse.Namespace) -> int:
    node_log("disk")
    prog = f"nodegate disk {args.disk_command}"
    # The pin's code reads the machine from the environment (bootstrap/node/disk/pin.py): the
    # options set it for this process.
    try:
        if getattr(args, "tcti", None):
            os.environ[pin.TCTI_ENV] = args.tcti
        if getattr(args, "event_log", None) is not None:
            require_event_log(args.event_log)
            os.environ[pin.EVENT_LOG_ENV] = str(args.event_log)
        if args.disk_command == "status":
            return _status(args)
        if args.disk_command == "unlock":
            slot = asyncio.run(rekey.unlock(args.device, args.name, test=args.test))
            verb = "opens" if args.test else f"opened as /dev/mapper/{args.name} with"
            print(f"{prog}: the released key {verb} keyslot {slot} of {args.device}")
            return EXIT_OK
        return _rekey(args, prog)
    except jwe.JweError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except (JoinUsageError, JoinFailed) as exc:
        return report_failure(prog, exc)


def _rekey(args: argparse.Namespace, prog: str) -> int:
    config = None
    if args.server is not None or args.ca_bundle is not None:
        if args.server is None or args.ca_bundle is None:
            raise JoinUsageError("a new binding needs both --server and --ca-bundle")
        try:
            volume = luks.volume_uuid(args.device)
        except luks.LuksError as exc:
            raise JoinFailed("luks_error", str(exc)) from None
        config = rekey.config_json(
            url=args.server,
            ca_bundle=str(args.ca_bundle.resolve()),
            volume=volume,
            node=args.node_name if args.node_name is not None else read_index(NODE_DIR),
            ek=args.ek,
            tcti=args.tcti,
        )
    opts = rekey.RekeyOptions(args.device, args.bootstrap_key_file, config, offline=args.offline)
    result = asyncio.run(rekey.rekey(opts))
    for step in result.steps or ["nothing to do: the volume is re-keyed and its bindings are current"]:
        print(f"{prog}: {step}")
    return EXIT_OK


def _status(args: argparse.Namespace) -> int:
    doc = rekey.status(args.device)
    if args.output == "json":
        print(json.dumps(doc, sort_keys=True))
        return EXIT_OK
    print(f"{doc['device']}: LUKS UUID {doc['uuid']}, keyslots {', '.join(doc['keyslots']) or 'none'}")
    print(f"  volume key: {'its own (re-keyed)' if doc['rekeyed'] else 'NOT re-keyed: may be the image key'}")
    if doc["reencrypting"]:
        print("  a reencryption was interrupted: run nodegate disk rekey to finish it")
    for b in doc["bindings"]:
        slots = ", ".join(b["keyslots"])
        print(
            f"  token {b['token']} (keyslot {slots}): node {b['node']}, epoch {b['epoch']}, "
            f"key version {b['key_version']}, {b['url']}"
        )
    if not doc["bindings"]:
        print("  no nodegate binding")
    return EXIT_OK
