"""``nodegate ek roots import``: add EK root CAs the operator chose, pinned by SHA-256.

    nodegate ek roots import FILE|DIR|URL... --sha256 HEX... [--state-dir DIR] [--cloud gce|alibaba]
                                              [--vendor NAME] [--allow-private-addresses]

Every certificate read (PEM, DER, a folder of them, or an http(s) URL fetched within the AIA
limits of bootstrap/service/join/aia.py) must be a CA certificate whose SHA-256 (of the DER) is one
of ``--sha256``, and every ``--sha256`` must be found: anything else imports nothing. The roots
go to ``<state_dir>/ek-roots/imported`` (one PEM file each, and a manifest.json recording the
source, the date and ``--cloud``; atomic writes), which ``ek_roots: [imported]`` trusts.
``--cloud`` marks a cloud vTPM CA: EKs through it need their ``ek_cloud`` binding (a known cloud
CA is marked whatever you pass). Restart the service after an import (``ek_roots`` is read at
start). Exit 0 imported, 1 refused, 2 usage.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

from attest import cloudek
from attest.certparse import Cert
from bootstrap import files
from bootstrap.cli.common import SHA256_HEX
from bootstrap.service.join import aia, ekroots

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2
MAX_SOURCE_BYTES = 1024 * 1024


class Refused(Exception):
    pass


def run(args: argparse.Namespace) -> int:
    pins = [h.lower().replace(":", "") for h in args.sha256]
    bad = [h for h in pins if not SHA256_HEX.fullmatch(h)]
    if bad:
        print(
            f"nodegate ek roots import: --sha256 {bad[0]!r} is not a 64-character hex SHA-256",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        found = _read_all(args.sources, args.allow_private_addresses)
        chosen = _pinned(found, set(pins))
        written = write(args.state_dir, chosen, cloud=args.cloud or "", vendor=args.vendor or "")
    except Refused as exc:
        print(f"nodegate ek roots import: refused, nothing imported: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except OSError as exc:
        print(f"nodegate ek roots import: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    for entry in written:
        mark = f" (cloud vTPM CA: {entry.cloud}; needs ek_cloud)" if entry.cloud else ""
        print(f"imported {entry.role:<12} {entry.sha256[:16]} {entry.subject}{mark}")
    print(
        f"{len(written)} certificates in {ekroots.imported_store(args.state_dir)}; "
        "ek_roots must list `imported`; restart the service to use them"
    )
    return EXIT_OK


def _read_all(sources: list[str], allow_private: bool) -> list[tuple[str, Cert]]:
    out: list[tuple[str, Cert]] = []
    for source in sources:
        if source.startswith(("http://", "https://")):
            try:
                body = asyncio.run(aia.download(source, allow_private=allow_private, limit=MAX_SOURCE_BYTES))
            except aia.FETCH_ERRORS as exc:
                raise Refused(f"{source}: {exc or type(exc).__name__}") from None
            out += [(source, c) for c in _certs(body, source)]
            continue
        path = Path(source)
        paths = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
        for p in paths:
            try:
                data = files.read_limited(p, MAX_SOURCE_BYTES)
            except (OSError, ValueError) as exc:
                raise Refused(f"{p}: {exc}") from None
            out += [(str(p.resolve()), c) for c in _certs(data, str(p))]
    return out


def _certs(data: bytes, where: str) -> list[Cert]:
    try:
        found = ekroots.read_certs(data, where)
    except ValueError:
        raise Refused(f"{where}: no certificate") from None
    for cert in found:
        if isinstance(cert, str):
            raise Refused(cert)
    return [c for c in found if not isinstance(c, str)]


def _pinned(found: list[tuple[str, Cert]], pins: set[str]) -> list[tuple[str, Cert]]:
    seen = {c.sha256 for _, c in found}
    unpinned = [c for _, c in found if c.sha256 not in pins]
    if unpinned:
        c = unpinned[0]
        raise Refused(f"{c.name()} has SHA-256 {c.sha256}, which no --sha256 names")
    missing = sorted(pins - seen)
    if missing:
        raise Refused(f"no certificate with SHA-256 {missing[0]} was found")
    for _, c in found:
        if ekroots.unusable(c) is not None:
            raise Refused(f"{c.name()} is not a CA certificate")
    return list({c.sha256: (src, c) for src, c in found}.values())


def write(
    state_dir: Path, chosen: list[tuple[str, Cert]], *, cloud: str, vendor: str
) -> list[ekroots.ManifestEntry]:
    """Add to the imported store (kept: what was imported before); the manifest last."""
    store = ekroots.imported_store(state_dir)
    store.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        entries = (
            {e.sha256: e for e in ekroots.read_manifest(store)} if (store / ekroots.MANIFEST).exists() else {}
        )
    except (TypeError, ValueError) as exc:
        raise Refused(f"{store / ekroots.MANIFEST} is damaged ({exc}); repair or remove it first") from None
    today = datetime.now(UTC).date().isoformat()
    written = []
    for source, cert in chosen:
        name = f"{cert.sha256[:16]}.pem"
        files.write_atomic(store / name, _pem(cert.der), 0o644)
        known = cloudek.KNOWN_CLOUD_CAS.get(cert.sha256, "")
        entry = ekroots.ManifestEntry(
            file=name,
            vendor=vendor or known or "imported",
            sha256=cert.sha256,
            subject=cert.name(),
            not_after=cert.view.not_valid_after_utc.isoformat(),
            role="root" if cert.self_issued else "intermediate",
            source={"url": source} if source.startswith(("http://", "https://")) else {"path": source},
            fetched=today,
            cloud=known or cloud,
        )
        entries[cert.sha256] = entry
        written.append(entry)
    doc = {
        "format": ekroots.MANIFEST_FORMAT,
        "generator": "nodegate ek roots import",
        "files": [e.to_json() for e in entries.values()],
    }
    files.write_atomic(store / ekroots.MANIFEST, (json.dumps(doc, indent=1) + "\n").encode(), 0o644)
    return written


def _pem(der: bytes) -> bytes:
    import base64  # noqa: PLC0415

    body = base64.encodebytes(der)
    return b"-----BEGIN CERTIFICATE-----\n" + body + b"-----END CERTIFICATE-----\n"
