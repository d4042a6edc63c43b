"""``nodegate ek roots``: what ``ek_roots`` trusts, certificate by certificate.

    nodegate ek roots [--roots vendors imported /etc/nodegate/ek-roots ...] [--state-dir DIR]
                      [--expiring DAYS] [--at TIME] [-o json]
    nodegate ek roots import ...   (bootstrap/cli/ekimport.py)

One line per CA certificate (vendor, role, expiry, SHA-256 fingerprint, subject, and where it came
from: ORIGIN package (Debian's ruby-tpm-key-attestation, the file in it), imported (the URL or
file it was imported from), config (the file ek_roots names) or fetched (an intermediate fetched
from an AIA URL, cached in the state dir: it helps build paths, it is never an anchor)), then
warnings on stderr for CAs that expire within ``--expiring`` days (default 365) or already have,
and for every file skipped. Exit 0 (warnings included), 1 when not a single trust anchor is left,
2 usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from attest import certparse
from attest.certparse import Cert
from attest.errors import MalformedInput
from bootstrap.service.join import aia, ekroots

EXIT_OK, EXIT_NO_ANCHOR, EXIT_USAGE = 0, 1, 2


@dataclass(frozen=True, slots=True)
class Row:
    vendor: str
    role: str  # root (a trust anchor) or intermediate
    not_after: datetime
    sha256: str
    subject: str
    source: str
    file: Path
    origin: str = ekroots.CONFIG  # package | imported | config | fetched


def run(args: argparse.Namespace) -> int:
    if getattr(args, "roots_command", None) == "import":
        from bootstrap.cli import ekimport  # noqa: PLC0415

        return ekimport.run(args)
    try:
        at = _at(args.at)
    except ValueError as exc:
        print(f"nodegate ek roots: {exc}", file=sys.stderr)
        return EXIT_USAGE
    entries = args.roots or [Path(ekroots.VENDORS)]
    roots = ekroots.load_roots(entries, state_dir=args.state_dir)
    rows = rows_of(roots) + fetched_rows(args.state_dir)
    window = timedelta(days=args.expiring)
    if args.output == "json":
        print(json.dumps(_json(rows, roots, at, window), indent=1))
    else:
        print(_table(entries, rows, roots))
    for line in warnings(rows, roots, at, window):
        print(f"warning: {line}", file=sys.stderr)
    return EXIT_OK if roots.anchors else EXIT_NO_ANCHOR


def _at(text: str | None) -> datetime:
    if text is None:
        return datetime.now(UTC)
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--at {text!r} is not an RFC 3339 time") from None
    if at.tzinfo is None:
        raise ValueError("--at needs a time zone (e.g. 2030-01-01T00:00:00Z)")
    return at


def rows_of(roots: ekroots.Roots) -> list[Row]:
    """Every certificate loaded, anchors first, then by vendor and subject."""
    out = [_row(c, "root", roots) for c in roots.anchors] + [
        _row(c, "intermediate", roots) for c in roots.intermediates
    ]
    return sorted(out, key=lambda r: (r.role != "root", r.vendor, r.subject))


def _row(cert: Cert, role: str, roots: ekroots.Roots) -> Row:
    entry = roots.listed.get(cert.sha256)
    path = roots.origins[cert.sha256]
    origin = roots.provenance.get(cert.sha256, ekroots.CONFIG)
    if entry is None:
        vendor, source = "-", str(path)
    else:
        vendor, source = entry.vendor + (f" ({entry.cloud} vTPM)" if entry.cloud else ""), _source(entry)
    return Row(vendor, role, cert.view.not_valid_after_utc, cert.sha256, cert.name(), source, path, origin)


def fetched_rows(state_dir: Path) -> list[Row]:
    """The intermediates the service fetched from AIA URLs (never anchors; listed for the record)."""
    out = []
    for path, meta in aia.cached_files(ekroots.fetched_cache(state_dir)):
        try:
            cert = certparse.read_certificate(path.read_bytes()[: aia.MAX_BYTES + 1], "cached intermediate")
        except (OSError, MalformedInput):
            continue
        url = str(meta.get("url", "?"))
        role = "intermediate"
        out.append(
            Row(
                "-", role, cert.view.not_valid_after_utc, cert.sha256, cert.name(), url, path, ekroots.FETCHED
            )
        )
    return out


def _source(entry: ekroots.ManifestEntry) -> str:
    src = entry.source
    if src.get("package"):
        return f"{src['package']}:{src.get('path', '?')}"
    if src.get("url"):
        return src["url"]
    if src.get("commit"):
        return f"{src.get('repo', '?')}@{src['commit'][:12]}:{src.get('path', '?')}"
    return src.get("path") or src.get("repo") or "?"


def _table(entries: list[Path], rows: list[Row], roots: ekroots.Roots) -> str:
    where = [_where(e) for e in entries]
    lines = [f"ek_roots     {', '.join(where)}"]
    lines.append(
        f"{'VENDOR':<10} {'ROLE':<12} {'EXPIRES':<10} {'SHA256':<16} {'ORIGIN':<9} SUBJECT  <-  SOURCE"
    )
    for r in rows:
        lines.append(
            f"{r.vendor:<10} {r.role:<12} {r.not_after.date()} {r.sha256[:16]} {r.origin:<9} {r.subject}"
            f"  <-  {r.source}"
        )
    lines += [f"left out    {path}: {why}" for path, why in roots.left_out]
    per_vendor: dict[str, int] = {}
    for r in rows:
        per_vendor[r.vendor] = per_vendor.get(r.vendor, 0) + 1
    lines.append(
        f"{len(rows)} certificates: {len(roots.anchors)} anchors, {len(roots.intermediates)} "
        f"intermediates, {len(roots.skipped)} files skipped; per vendor: "
        + ", ".join(f"{v} {n}" for v, n in sorted(per_vendor.items()))
    )
    return "\n".join(lines)


def _where(entry: Path) -> str:
    if entry == Path(ekroots.VENDORS):
        return f"{ekroots.vendor_store() or 'not installed'} (vendors)"
    return str(entry)


def warnings(rows: list[Row], roots: ekroots.Roots, at: datetime, window: timedelta) -> list[str]:
    """Expired and soon-expiring CAs (earliest first), then every skipped file."""
    out = []
    for r in sorted(rows, key=lambda r: r.not_after):
        if r.not_after < at:
            out.append(f"expired {r.not_after.date()}: {r.vendor} {r.role} {r.subject} ({r.file})")
        elif r.not_after < at + window:
            out.append(f"expires {r.not_after.date()}: {r.vendor} {r.role} {r.subject} ({r.file})")
    out += [f"skipped {path}: {why}" for path, why in roots.skipped]
    if not roots.anchors:
        out.append("no trust anchor: no EK certificate can be trusted through these roots")
    return out


def _json(rows: list[Row], roots: ekroots.Roots, at: datetime, window: timedelta) -> dict[str, Any]:
    return {
        "certificates": [
            {
                "vendor": r.vendor,
                "role": r.role,
                "subject": r.subject,
                "sha256": r.sha256,
                "not_after": r.not_after.isoformat(),
                "expired": r.not_after < at,
                "expiring": at <= r.not_after < at + window,
                "source": r.source,
                "origin": r.origin,
                "file": str(r.file),
            }
            for r in rows
        ],
        "skipped": [{"file": str(p), "why": why} for p, why in roots.skipped],
    }
