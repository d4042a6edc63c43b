"""``nodegate join``, ``renew`` and ``attest``: exit 0, 1 (refused), 2 (usage or local), 75 (transient)."""

from __future__ import annotations

import argparse
import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from bootstrap.cli.common import node_log
from bootstrap.node import tcti
from bootstrap.node.attest import AttestOptions, attest
from bootstrap.node.client import base_url
from bootstrap.node.errors import EXIT_OK, JoinFailed, JoinUsageError, one_line, report_failure
from bootstrap.node.eventlogfile import require_event_log
from bootstrap.node.join import JoinOptions, join
from bootstrap.node.renew import RenewOptions, renew


def run(args: argparse.Namespace) -> int:
    node_log(args.command)
    if args.command == "attest":
        node_log("join")  # the fallback join and the renewal log under their own names
        node_log("renew")
        return attest_main(args)
    return join_main(args) if args.command == "join" else renew_main(args)


def _shared(args: argparse.Namespace) -> dict[str, Any]:
    """The options join, renew and attest take from the same flags (cli/arguments.py _node_common);
    a named event log that cannot be sent stops the command here, before the TPM or the server."""
    if urlsplit(args.server).scheme.lower() != "https":
        # before the TPM and the network: plain http cannot check the server against --ca-bundle
        raise JoinUsageError(f"--server must be https://host[:port], not {one_line(args.server, 100)!r}")
    base_url(args.server)
    tcti.check(args.tcti)
    if args.event_log is not None:
        require_event_log(args.event_log)
    return {
        "server": args.server,
        "ca_bundle": args.ca_bundle,
        "tcti": args.tcti,
        "attempts": args.attempts,
        "event_log": args.event_log,
        "boot_id_file": args.boot_id_file,
    }


def attest_main(args: argparse.Namespace) -> int:
    try:
        opts = AttestOptions(**_shared(args), dir=args.dir, ek_kind=args.ek)
        result = asyncio.run(attest(opts))
    except (JoinUsageError, JoinFailed) as exc:
        return report_failure("nodegate attest", exc)
    until = utc_text(result.svid_expires_at)
    if args.output == "json":
        return _json({"how": result.how, "spiffe_id": result.spiffe_id, "svid_expires_at": until})
    print(f"attested this boot ({result.how}) as {result.spiffe_id} (SVID valid until {until})")
    return EXIT_OK


def join_main(args: argparse.Namespace) -> int:
    try:
        opts = JoinOptions(
            **_shared(args),
            node_name=args.node_name,
            out=args.out,
            ek_kind=args.ek,
            ek_cert_file=args.ek_cert_file,
            ek_cert_fetch=args.ek_cert_fetch,
            ek_cert_service=args.ek_cert_service,
        )
        result = asyncio.run(join(opts))
    except (JoinUsageError, JoinFailed) as exc:
        return report_failure("nodegate join", exc)
    until = utc_text(result.svid_expires_at)
    if args.output == "json":
        return _json(
            {
                "node_name": result.node_name,
                "spiffe_id": result.spiffe_id,
                "svid_expires_at": until,
                "files": {name: str(path) for name, path in result.files.items()},
            }
        )
    print(f"joined as {result.spiffe_id} (SVID valid until {until})")
    for name, path in result.files.items():
        print(f"  {name}: {path}")
    return EXIT_OK


def utc_text(when: datetime | str) -> str:
    """One form for every node command's expiry: ``2026-12-05T11:00:00Z`` (text and JSON)."""
    try:
        moment = when if isinstance(when, datetime) else datetime.fromisoformat(when)
    except ValueError:
        return str(when)  # checked as RFC 3339 when received; shown as sent otherwise
    if moment.tzinfo is None:
        return moment.isoformat()
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _left(d: timedelta) -> str:
    minutes = max(0, int(d.total_seconds())) // 60
    return f"{minutes // 60}h{minutes % 60:02d}m"


def renew_main(args: argparse.Namespace) -> int:
    try:
        opts = RenewOptions(**_shared(args), dir=args.dir, before=args.before)
        result = asyncio.run(renew(opts))
    except (JoinUsageError, JoinFailed) as exc:
        return report_failure("nodegate renew", exc)
    until = utc_text(result.svid_expires_at)
    if args.output == "json":
        return _json(
            {
                "renewed": result.renewed,
                "spiffe_id": result.spiffe_id,
                "svid_expires_at": until,
                "renew_below_seconds": int(result.before.total_seconds()),
                "files": {name: str(path) for name, path in result.files.items()},
            }
        )
    if result.renewed:
        print(f"renewed {result.spiffe_id} (SVID valid until {until})")
    else:
        left = _left(result.svid_expires_at - datetime.now(UTC))
        print(
            f"nodegate renew: SVID for {result.spiffe_id} valid until {until} ({left} left, "
            f"renewing below {_left(result.before)}); nothing to do"
        )
    return EXIT_OK


def _json(doc: dict[str, Any]) -> int:
    """``-o json``: one object on stdout, field names stable (docs/node-join.md)."""
    print(json.dumps(doc, sort_keys=True))
    return EXIT_OK
