#!/usr/bin/env python3
"""Build or refresh nodegate's vendor EK root store from public sources on disk.

    python scripts/refresh-ek-roots.py [--store DIR] [--dry-run] [--expiring DAYS] [--fetched DATE] SRC...

SRC is a certificate file (PEM, several PEM blocks, or DER) or a folder searched recursively for
*.pem, *.crt, *.cer, *.der and *.cert: for example git checkouts of keylime/keylime
(tpm_cert_store/), loicsikidi/tpm-ca-certificates, google/go-tpm-tools (server/ca-certs/) and the
unpacked Microsoft TrustedTpm.cab (docs/ek-roots.md lists them). Only CA certificates go into the
store; each is written as its own PEM file (the exact DER the vendor signed) under
``<store>/<vendor>/`` and listed in ``<store>/manifest.json`` with its vendor, source (repository,
commit and path, from ``git`` or from a ``manifest.json`` next to the files that records them; the
vendor's download URL where the source lists it), the source's licence, the date fetched, SHA-256
fingerprint, subject and expiry. nodegate checks those fingerprints when it loads the store.
Without --store, the store shipped in the package (bootstrap/data/ek-roots) is rewritten.

The store becomes exactly what the sources hold; the report says what was added, removed, skipped
and what expires within --expiring days. Exit 0 done, 1 nothing usable found, 2 usage.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, too

import yaml
from cryptography import x509

from attest.certparse import Cert
from bootstrap.service import ekroots

# Vendor by words in the certificate's subject or issuer (first match wins).
VENDORS: tuple[tuple[str, str], ...] = (
    ("infineon", r"infineon"),
    ("stmicro", r"stmicroelectronics|\bstm tpm\b|globalsign trusted platform"),
    ("nuvoton", r"nuvoton|\bntc tpm\b|\bnpct"),
    ("intel", r"\bintel\b|\bondie\b|\bodca\b"),
    ("amd", r"advanced micro devices|\bamd\b|\bamdtpm\b"),
    ("nationz", r"nationz|\bnsing\b|nations technologies"),
    ("google", r"google"),
    ("microsoft", r"microsoft|\bazure\b"),
    ("alibaba", r"aliyun|alibaba"),
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sources", nargs="+", type=Path, metavar="SRC")
    p.add_argument(
        "--store", type=Path, default=ekroots.PACKAGED_STORE, help="the store folder (default %(default)s)"
    )
    p.add_argument("--dry-run", action="store_true", help="report what would change, write nothing")
    p.add_argument(
        "--expiring", type=int, default=365, metavar="DAYS", help="report CAs expiring within DAYS"
    )
    p.add_argument(
        "--fetched",
        default=datetime.now(UTC).date().isoformat(),
        metavar="DATE",
        help="the date the sources were fetched, recorded per file (default today)",
    )
    args = p.parse_args(argv)
    missing = [s for s in args.sources if not s.exists()]
    if missing:
        print(f"refresh-ek-roots: no such file or folder: {missing[0]}", file=sys.stderr)
        return 2
    entries, certs, left_out = collect(args.sources, fetched=args.fetched)
    old = _old_manifest(args.store)
    print(report(old, entries, left_out, datetime.now(UTC), timedelta(days=args.expiring)))
    if not entries:
        print("refresh-ek-roots: no CA certificate found; the store is left as it was", file=sys.stderr)
        return 1
    if not args.dry_run:
        write_store(args.store, entries, certs)
        print(f"wrote {len(entries)} certificates and {ekroots.MANIFEST} to {args.store}")
    return 0


def collect(
    sources: list[Path], *, fetched: str = ""
) -> tuple[list[ekroots.ManifestEntry], dict[str, Cert], list[tuple[str, str]]]:
    """Manifest entries and certificates (by sha256) of every CA in ``sources``, and what was left out."""
    entries: dict[str, ekroots.ManifestEntry] = {}
    certs: dict[str, Cert] = {}
    left_out: list[tuple[str, str]] = []
    for src in sources:
        for path in _files(src):
            provenance = Provenance.of(path)
            try:
                found = ekroots.read_cert_file(path)
            except ValueError as exc:
                left_out.append((str(path), str(exc)))
                continue
            for i, cert in enumerate(found):
                where = str(path) + (f"#{i + 1}" if len(found) > 1 else "")
                if not isinstance(cert, Cert):
                    left_out.append((where, cert))
                    continue
                if _is_ca(cert) is False:
                    left_out.append((where, "not a CA certificate"))
                    continue
                if cert.sha256 in entries:
                    continue  # published in several places: the first source is recorded
                vendor = provenance.vendor or vendor_of(cert) or _vendor_from_path(path) or "other"
                source = provenance.source(path, i, len(found))
                url = provenance.urls.get(cert.sha256)
                if url:
                    source["url"] = url
                entries[cert.sha256] = _entry(cert, vendor, source, provenance.licence, fetched)
                certs[cert.sha256] = cert
    return sorted(entries.values(), key=lambda e: e.file), certs, left_out


def _files(src: Path) -> Iterator[Path]:
    if src.is_file():
        yield src
        return
    for root, dirs, files in os.walk(src):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if Path(name).suffix.lower() in ekroots.CERT_SUFFIXES:
                yield Path(root) / name


def _is_ca(cert: Cert) -> bool:
    try:
        return bool(cert.view.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def vendor_of(cert: Cert) -> str | None:
    for name in (cert.subject, cert.issuer):
        text = name.rfc4514_string().lower()
        for vendor, pattern in VENDORS:
            if re.search(pattern, text):
                return vendor
    return None


def _vendor_from_path(path: Path) -> str | None:
    names = {v for v, _ in VENDORS}
    return next((part.lower() for part in reversed(path.parts[:-1]) if part.lower() in names), None)


def _entry(
    cert: Cert, vendor: str, source: dict[str, str], licence: str, fetched: str
) -> ekroots.ManifestEntry:
    cn = cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    label = str(cn[0].value) if cn else cert.name()
    slug = re.sub(r"[^A-Za-z0-9]+", "-", label).strip("-")[:60] or "ca"
    return ekroots.ManifestEntry(
        file=f"{vendor}/{slug}-{cert.sha256[:12]}.pem",
        vendor=vendor,
        sha256=cert.sha256,
        subject=cert.subject.rfc4514_string(),
        not_after=cert.view.not_valid_after_utc.isoformat(),
        role="root" if cert.self_issued else "intermediate",
        source=source,
        quirks=cert.quirks,
        licence=licence,
        fetched=fetched,
    )


class Provenance:
    """Where a file came from: a manifest.json next to it that records each file's source (as the
    fixture collections do), else its git checkout, else the local path."""

    def __init__(
        self,
        vendor: str | None,
        recorded: dict[str, str] | None,
        git: dict[str, str] | None,
        licence: str = "",
        urls: dict[str, str] | None = None,
    ) -> None:
        self.vendor, self.recorded, self.git = vendor, recorded, git
        self.licence, self.urls = licence, urls or {}

    @classmethod
    def of(cls, path: Path) -> Provenance:
        for folder in path.parents:
            manifest = folder / "manifest.json"
            if manifest.is_file():
                entry = _recorded(manifest, path.relative_to(folder).as_posix())
                if entry is not None:
                    vendor, source, licence = entry.get("vendor"), entry.get("source"), entry.get("licence")
                    return cls(
                        vendor if isinstance(vendor, str) else None,
                        {str(k): str(v) for k, v in source.items()} if isinstance(source, dict) else None,
                        None,
                        licence if isinstance(licence, str) else "",
                    )
            if (folder / ".git").exists():
                return cls(None, None, _git(folder, path), _licence(folder), _download_urls(folder))
        return cls(None, None, None)

    def source(self, path: Path, index: int, count: int) -> dict[str, str]:
        suffix = f"#{index + 1}" if count > 1 else ""
        if self.recorded:
            out = {k: str(v) for k, v in self.recorded.items() if k in ("repo", "commit", "path", "url")}
            return {**out, "path": out.get("path", "") + suffix}
        if self.git:
            return {**self.git, "path": self.git["path"] + suffix}
        return {"repo": "local", "path": str(path.resolve()) + suffix}


_MANIFESTS: dict[Path, dict[str, dict[str, object]]] = {}


def _recorded(manifest: Path, relative: str) -> dict[str, object] | None:
    if manifest not in _MANIFESTS:
        try:
            doc = json.loads(manifest.read_text())
            rows = doc.get("entries", []) if isinstance(doc, dict) else []
            _MANIFESTS[manifest] = {r["file"]: r for r in rows if isinstance(r, dict) and "file" in r}
        except (OSError, ValueError):
            _MANIFESTS[manifest] = {}
    row = _MANIFESTS[manifest].get(relative)
    return row if row is not None and isinstance(row.get("source"), dict) else None


def _git(top: Path, path: Path) -> dict[str, str]:
    def git(*args: str) -> str:
        out = subprocess.run(["git", "-C", str(top), *args], capture_output=True, text=True, check=False)
        return out.stdout.strip()

    remote = git("config", "--get", "remote.origin.url")
    match = re.search(r"github\.com[:/]([^/]+/[^/]+?)(?:\.git)?$", remote)
    return {"repo": match.group(1) if match else remote or str(top), "commit": git("rev-parse", "HEAD"),
            "path": path.relative_to(top).as_posix()}  # fmt: skip


_LICENCES = (  # the first words of a LICENSE file -> its SPDX identifier
    (r"apache license\s+version 2\.0", "Apache-2.0"),
    (r"bsd 3-clause", "BSD-3-Clause"),
    (r"bsd 2-clause", "BSD-2-Clause"),
    (r"\bmit license\b", "MIT"),
)


def _licence(top: Path) -> str:
    """The SPDX identifier of a checkout's LICENSE file, or "see <file>" when it is another one."""
    for name in ("LICENSE", "LICENSE.txt", "LICENSE.md", "COPYING"):
        path = top / name
        if path.is_file():
            text = " ".join(path.read_text(errors="replace")[:600].lower().split())
            found = next((spdx for pattern, spdx in _LICENCES if re.search(pattern, text)), None)
            return found or f"see {name}"
    return ""


def _download_urls(top: Path) -> dict[str, str]:
    """SHA-256 -> the vendor's download URL, where a source lists them (tpm-ca-certificates keeps
    each certificate's URL and fingerprint in .tpm-roots.yaml and .tpm-intermediates.yaml)."""
    urls: dict[str, str] = {}
    for name in (".tpm-roots.yaml", ".tpm-intermediates.yaml"):
        path = top / name
        if not path.is_file():
            continue
        try:
            doc = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError):
            continue
        for vendor in (doc or {}).get("vendors") or []:
            for cert in (vendor or {}).get("certificates") or []:
                url = cert.get("url")
                fp = ((cert.get("validation") or {}).get("fingerprint") or {}).get("sha256")
                if isinstance(url, str) and isinstance(fp, str):
                    urls[fp.replace(":", "").lower()] = url
    return urls


def _old_manifest(store: Path) -> list[ekroots.ManifestEntry]:
    if not (store / ekroots.MANIFEST).is_file():
        return []
    try:
        return ekroots.read_manifest(store)
    except (TypeError, ValueError) as exc:
        print(
            f"refresh-ek-roots: the existing {ekroots.MANIFEST} is not valid ({exc}); rebuilding",
            file=sys.stderr,
        )
        return []


def report(
    old: list[ekroots.ManifestEntry],
    new: list[ekroots.ManifestEntry],
    left_out: list[tuple[str, str]],
    now: datetime,
    window: timedelta,
) -> str:
    before = {e.sha256: e for e in old}
    after = {e.sha256: e for e in new}
    added = [e for s, e in after.items() if s not in before]
    removed = [e for s, e in before.items() if s not in after]
    kept = len(new) - len(added)
    lines = [f"{len(new)} CA certificates ({len(added)} added, {len(removed)} removed, {kept} kept)"]
    if old:  # a first build lists per vendor only
        lines += [f"  added   {e.vendor:<10} {e.role:<12} {e.subject}" for e in added]
    lines += [f"  removed {e.vendor:<10} {e.role:<12} {e.subject}" for e in removed]
    soon = [(datetime.fromisoformat(e.not_after), e) for e in new]
    expiring = sorted((pair for pair in soon if pair[0] < now + window), key=lambda pair: pair[0])
    for when, e in expiring:
        state = "EXPIRED" if when < now else "expires"
        lines.append(f"  {state} {when.date()} {e.vendor:<10} {e.subject}")
    by_vendor: dict[str, int] = {}
    for e in new:
        by_vendor[e.vendor] = by_vendor.get(e.vendor, 0) + 1
    lines.append("  per vendor: " + ", ".join(f"{v} {n}" for v, n in sorted(by_vendor.items())))
    if left_out:
        lines.append(f"  left out: {len(left_out)} (not a CA or not a certificate)")
        lines += [f"    {where}: {why}" for where, why in left_out[:50]]
    return "\n".join(lines)


def write_store(store: Path, entries: list[ekroots.ManifestEntry], certs: dict[str, Cert]) -> None:
    """Certificate files first, stale ones removed, the manifest last (atomically)."""
    store.mkdir(parents=True, exist_ok=True)
    wanted = set()
    for e in entries:
        path = store / e.file
        wanted.add(path.resolve())
        data = _pem(certs[e.sha256].der)
        if not path.is_file() or path.read_bytes() != data:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    for root, _dirs, files in os.walk(store):
        for name in files:
            path = Path(root) / name
            if Path(name).suffix.lower() in ekroots.CERT_SUFFIXES and path.resolve() not in wanted:
                path.unlink()
    doc = {
        "format": ekroots.MANIFEST_FORMAT,
        "generated": datetime.now(UTC).isoformat(timespec="seconds"),
        "generator": "scripts/refresh-ek-roots.py",
        "files": [e.to_json() for e in entries],
    }
    fd, tmp = tempfile.mkstemp(dir=store, prefix=".manifest-")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, store / ekroots.MANIFEST)


def _pem(der: bytes) -> bytes:
    """PEM armour around the exact DER (never re-encoded by cryptography: quirky CAs stay signed)."""
    body = base64.encodebytes(der).replace(b"\n", b"")
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    return b"-----BEGIN CERTIFICATE-----\n" + b"\n".join(lines) + b"\n-----END CERTIFICATE-----\n"


if __name__ == "__main__":
    raise SystemExit(main())
