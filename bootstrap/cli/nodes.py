"""``nodegate nodes list|show|revoke|unrevoke|forget|quarantine``: the admin API from the command line, with
an admin SVID (``nodegate ca issue-admin``) over mTLS; ``-o table|json|yaml``. Works the same
for both stores (the service answers from whichever it runs on). Exit 0; 1 when the service
refuses (the code and detail are printed); 2 for usage and local problems; 75 when it cannot be
reached."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import yaml

from attest.bootrecord import fleet
from attest.bootrecord.model import BootRecord
from bootstrap.cli.opsargs import ADMIN_ENV, BUNDLE_ENV, SERVER_ENV
from bootstrap.node.client import base_url, tls_context
from bootstrap.node.errors import JoinUsageError, one_line

EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE = 1, 2, 75
MAX_ANSWER = 64 * 1024 * 1024  # a listing of a large fleet, with its boot records (~2 KB a node)
TIMEOUT = 30.0


class AdminError(Exception):
    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def run(args: argparse.Namespace) -> int:
    prog = f"nodegate nodes {args.nodes_command}"
    try:
        answer = asyncio.run(_call(args))
    except AdminError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return exc.exit_code
    print(render(args.nodes_command, answer, args.output))
    return 0


def _option(value: Path | str | None, env: str, flag: str) -> str:
    text = str(value) if value is not None else os.environ.get(env, "")
    if not text:
        raise AdminError(f"{flag} is required (or ${env})", EXIT_USAGE)
    return text


def _context(args: argparse.Namespace) -> ssl.SSLContext:
    bundle = Path(_option(args.ca_bundle, BUNDLE_ENV, "--ca-bundle"))
    admin = Path(_option(args.admin, ADMIN_ENV, "--admin"))
    try:
        ctx = tls_context(bundle)
    except JoinUsageError as exc:
        raise AdminError(str(exc), EXIT_USAGE) from None
    cert, key = admin / "admin.pem", admin / "admin.key"
    try:
        ctx.load_cert_chain(cert, key)
    except FileNotFoundError:
        raise AdminError(
            f"{cert} or {key} does not exist (nodegate ca issue-admin --out {admin})", EXIT_USAGE
        ) from None
    except (OSError, ssl.SSLError) as exc:
        raise AdminError(
            f"{cert} and {key} do not load as a certificate and its key ({exc})", EXIT_USAGE
        ) from None
    return ctx


def _request(args: argparse.Namespace) -> tuple[str, str, dict[str, Any] | None]:
    action = args.nodes_command
    if action == "list":
        return "GET", "/v1/admin/nodes", None
    path = f"/v1/admin/nodes/{quote(args.name, safe='')}"
    if action == "show":
        return "GET", path, None
    if action == "forget":
        return "POST", f"{path}/forget", {"reason": args.reason}
    if action == "quarantine":
        raise AssertionError("quarantine makes several requests (_quarantine)")
    return "POST", f"{path}/revoke", {"reason": args.reason, "revoked": action == "revoke"}


async def _call(args: argparse.Namespace) -> Any:
    server = _option(args.server, SERVER_ENV, "--server")
    if not server.lower().startswith("https://"):
        # the admin API authenticates the admin SVID by mTLS: plain http can never work
        raise AdminError(f"--server must be https://host[:port], not {one_line(server, 100)!r}", EXIT_USAGE)
    try:
        base = base_url(server)
    except JoinUsageError as exc:
        raise AdminError(str(exc), EXIT_USAGE) from None
    selectors = _selectors(args)
    ctx = _context(args)
    timeout = aiohttp.ClientTimeout(total=TIMEOUT)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(ssl=ctx)) as session:
        if args.nodes_command == "quarantine":
            return await _quarantine(session, base, args, selectors)
        method, path, body = _request(args)
        if selectors:
            path += "?boot=true"
        doc = await _fetch(session, base, method, path, body)
        return _select(doc, selectors) if selectors else doc


def _selectors(args: argparse.Namespace) -> list[fleet.Selector]:
    try:
        found = [fleet.parse_where(w) for w in getattr(args, "where", None) or ()]
    except fleet.SelectorError as exc:
        raise AdminError(str(exc), EXIT_USAGE) from None
    if args.nodes_command == "quarantine" and not found:
        raise AdminError(
            "--where FIELD=VALUE is required (quarantining every node is not a selector)", EXIT_USAGE
        )
    return found


def _select(doc: Any, selectors: list[fleet.Selector]) -> Any:
    """The listing's nodes whose boot record matches every selector (a node without one: none)."""
    kept = []
    for node in doc.get("nodes", []) if isinstance(doc, dict) else []:
        boot = node.get("boot")
        if boot is None:
            continue
        try:
            rec = BootRecord.model_validate(boot)
        except ValueError:
            continue
        if fleet.matches(rec, selectors, {"node": str(node.get("node_name", ""))}):
            kept.append(node)
    return {**doc, "nodes": kept}


async def _quarantine(
    session: aiohttp.ClientSession, base: str, args: argparse.Namespace, selectors: list[fleet.Selector]
) -> dict[str, Any]:
    """Every node whose record matches, held ``quarantined`` with the reason (and the selector,
    kept in each node's audit trail); with --dry-run only listed."""
    listing = _select(await _fetch(session, base, "GET", "/v1/admin/nodes?boot=true", None), selectors)
    names = [str(n["node_name"]) for n in listing["nodes"]]
    where = " ".join(str(s) for s in selectors)
    reason = f"{args.reason} (--where {where})"[:512]
    done = []
    if not args.dry_run:
        for name in names:
            await _fetch(
                session,
                base,
                "POST",
                f"/v1/admin/nodes/{quote(name, safe='')}/quarantine",
                {"reason": reason},
            )
            done.append(name)
    return {"where": where, "dry_run": args.dry_run, "selected": names, "quarantined": done}


async def _fetch(
    session: aiohttp.ClientSession, base: str, method: str, path: str, body: dict[str, Any] | None
) -> Any:
    try:
        async with session.request(method, base + path, json=body, allow_redirects=False) as resp:
            raw = await resp.content.read(MAX_ANSWER + 1)
            status = resp.status
    except aiohttp.ClientConnectorCertificateError as exc:
        raise AdminError(
            f"the server's TLS certificate is not trusted ({exc.certificate_error})", EXIT_USAGE
        ) from None
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise AdminError(f"cannot reach {base}: {type(exc).__name__}: {exc}", EXIT_UNREACHABLE) from None
    if len(raw) > MAX_ANSWER:
        raise AdminError(f"the answer is larger than {MAX_ANSWER} bytes", EXIT_UNREACHABLE)
    try:
        doc = json.loads(raw)
    except ValueError:
        raise AdminError(f"HTTP {status}: the answer is not JSON", EXIT_UNREACHABLE) from None
    if status >= 400:
        detail = doc.get("detail") if isinstance(doc, dict) else None
        code = doc.get("code") if isinstance(doc, dict) else None
        raise AdminError(f"{code or 'error'} (HTTP {status}): {detail or ''}".rstrip(": "), EXIT_REFUSED)
    return doc


# -- output ------------------------------------------------------------------------------------

_COLUMNS = (
    ("NAME", "node_name"),
    ("REVOKED", "revoked"),
    ("ATTESTED", "attested_at"),
    ("EXPIRES", "expires_at"),
    ("EK-SHA256", "ek_sha256"),
    ("SPIFFE-ID", "spiffe_id"),
)


def render(action: str, doc: Any, output: str) -> str:
    if output == "json":
        return json.dumps(doc, indent=2, sort_keys=True)
    if output == "yaml":
        return yaml.safe_dump(doc, sort_keys=True).rstrip("\n")
    if action == "quarantine":
        return _quarantine_text(doc)
    if action == "list":
        return _list_table(doc)
    if action == "show":
        return _show_table(doc)
    if action == "forget":
        return f"{doc['node_name']}: forgotten (the name may join with a new EK)"
    return f"{doc['node_name']}: {'revoked' if doc.get('revoked') else 'not revoked'}"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict) and "reason" in value:  # a quarantine
        return f"{value.get('reason')} (by {value.get('actor')} at {value.get('at')})"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]
    ]
    return "\n".join(lines)


def _list_table(doc: dict[str, Any]) -> str:
    rows = [[_cell(n.get(k)) for _, k in _COLUMNS] for n in doc.get("nodes", [])]
    out = _table([h for h, _ in _COLUMNS], rows) if rows else "no nodes"
    damaged = doc.get("damaged") or []
    if damaged:
        out += "\n\ndamaged records (fix or forget them):\n" + _table(
            ["NAME", "PROBLEM"], [[d["node_name"], d["problem"]] for d in damaged]
        )
    return out


def _quarantine_text(doc: dict[str, Any]) -> str:
    if not doc["selected"]:
        return f"no node matches --where {doc['where']}"
    if doc["dry_run"]:
        return "\n".join(
            [f"would quarantine {len(doc['selected'])} node(s) (--dry-run: nothing written):"]
            + [f"  {n}" for n in doc["selected"]]
        )
    return "\n".join(
        [f"quarantined {len(doc['quarantined'])} node(s):"] + [f"  {n}" for n in doc["quarantined"]]
    )


def _show_table(doc: dict[str, Any]) -> str:
    keys = [k for k in doc if k not in ("audit", "boot")]
    lines = [f"{k + ':':<22}{_cell(doc[k])}" for k in keys]
    audit = doc.get("audit") or []
    if audit:
        lines.append("")
        lines.append(
            _table(
                ["AT", "ACTION", "ACTOR", "CODE", "DETAIL"],
                [[_cell(a.get(c)) for c in ("at", "action", "actor", "code", "detail")] for a in audit],
            )
        )
    return "\n".join(lines)
