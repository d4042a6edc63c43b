#!/usr/bin/env python3
"""Check the vendor EK root table (bootstrap/service/join/vendorroots.py) against Debian's package.

    python scripts/refresh-ek-roots.py [--table] [DEB | FOLDER]

nodegate commits no certificate: ``ek_roots: [vendors]`` reads the root CAs that Debian's
ruby-tpm-key-attestation ships, and the table lists each file's name and SHA-256 (docs/ek-roots.md).
This script compares the table with a package: a ``.deb`` (unpacked with ``dpkg-deb -x``), a folder
(the package's certificate folder, or a root holding ``usr/share/...``), or, without an argument,
the pinned version fetched with ``apt-get download``. One line per file: ``ok``, ``differs``,
``missing`` (in the table, not in the package) or ``new`` (in the package, not in the table), with
vendor, subject and expiry, then a warning for every CA that expires within 365 days.

A new package version: run it on the new .deb with ``--table`` and review the printed table (and
the changed certificates) before it replaces ``FILES`` and ``VERSION``. Exit 0 when the package
matches the table, 1 when it does not, 2 usage.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, too

from attest import certparse
from attest.errors import MalformedInput
from bootstrap.service.join import vendorroots

EXPIRING = timedelta(days=365)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("source", nargs="?", type=Path, help="a .deb or a folder (default: apt-get download)")
    p.add_argument("--table", action="store_true", help="print the package's files as a FILES table")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ek-roots-check-") as tmp:
        try:
            folder = certificate_folder(args.source, Path(tmp))
        except (OSError, ValueError, subprocess.CalledProcessError) as exc:
            print(f"refresh-ek-roots: {exc}", file=sys.stderr)
            return 2
        found = files_of(folder)
        if args.table:
            for name, digest in sorted(found.items()):
                print(f'    VendorFile("{name}", "{name.split("/")[0].lower()}", "{digest}"),')
            return 0
        return report(folder, found)


def certificate_folder(source: Path | None, tmp: Path) -> Path:
    if source is None:
        got = subprocess.run(
            ["apt-get", "download", f"{vendorroots.PACKAGE}={vendorroots.VERSION}"],
            cwd=tmp,
            capture_output=True,
            text=True,
            check=False,
        )
        debs = list(tmp.glob("*.deb"))
        if got.returncode != 0 or len(debs) != 1:
            raise ValueError(f"apt-get download failed: {got.stderr.strip()[-300:]}")
        source = debs[0]
    if source.is_file():
        if shutil.which("dpkg-deb") is None:
            raise ValueError("dpkg-deb is needed to unpack a .deb")
        subprocess.run(["dpkg-deb", "-x", str(source), str(tmp / "x")], check=True)
        source = tmp / "x"
    if not source.is_dir():
        raise ValueError(f"{source}: no such file or folder")
    inside = sorted(
        source.glob("usr/share/rubygems-integration/all/gems/tpm-key_attestation-*/lib/tpm/certificates")
    )
    return inside[-1] if inside else source


def files_of(folder: Path) -> dict[str, str]:
    out = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        out[path.relative_to(folder).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def report(folder: Path, found: dict[str, str]) -> int:
    table = vendorroots.by_name()
    now = datetime.now(UTC)
    bad = 0
    warnings = []
    for name in sorted(set(table) | set(found)):
        entry, digest = table.get(name), found.get(name)
        if entry is None:
            state = "new"
        elif digest is None:
            state = "missing"
        else:
            state = "ok" if digest == entry.sha256 else "differs"
        bad += state != "ok"
        what = ""
        if digest is not None:
            what, expiry = describe(folder / name)
            if expiry is not None and expiry < now + EXPIRING:
                warnings.append(f"{name} expires {expiry.date()}")
        used = "" if entry is None or not entry.left_out else "  (left out of vendors)"
        print(f"{state:<8} {name}  {what}{used}")
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)
    print(f"{len(found)} files in the package, {len(table)} in the table, {bad} differences")
    return 1 if bad else 0


def describe(path: Path) -> tuple[str, datetime | None]:
    raw = path.read_bytes()
    der = next(certparse.pem_blocks(raw), b"") if certparse.is_pem(raw) else raw
    try:
        cert = certparse.read_certificate(der, "certificate", trailing=certparse.FILE_WHITESPACE)
    except MalformedInput as exc:
        return f"unreadable: {exc.detail}", None
    expiry = cert.view.not_valid_after_utc
    return f"{cert.name()}; expires {expiry.date()}", expiry


if __name__ == "__main__":
    sys.exit(main())
