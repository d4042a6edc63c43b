"""EK trust from the config: ``ek_roots`` (PEM or DER files, folders, the vendor root store) and
the allow- and denylists (docs/ek-roots.md).

A file that cannot be used (unreadable, not a certificate, not a CA, a store file whose
fingerprint differs from its manifest) is skipped and reported by name, never fatal: skipping a
root can only make fewer EKs trusted. The reports are kept on ``EkTrust.skipped`` for the log,
``/readyz`` and the metrics.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509

from attest import certparse
from attest.certparse import Cert
from attest.errors import MalformedInput
from bootstrap.config import Settings

log = logging.getLogger("nodegate.ekroots")

VENDORS = "vendors"  # the literal ek_roots entry that means "the vendor root store"
STORE_ENV = "NODEGATE_EK_VENDOR_STORE"
# The store ships inside the package (package data, like certifi's bundle), built by
# scripts/refresh-ek-roots.py from public sources; the folder name is not importable on purpose.
PACKAGED_STORE = Path(__file__).resolve().parent.parent / "data" / "ek-roots"
MANIFEST = "manifest.json"
MANIFEST_FORMAT = "nodegate-ek-roots/1"
MAX_FILE_BYTES = 4 * 1024 * 1024  # a PEM bundle of every vendor CA is under 1 MiB
CERT_SUFFIXES = frozenset({".pem", ".crt", ".cer", ".der", ".cert"})


@dataclass(frozen=True, slots=True)
class EkTrust:
    roots: tuple[Cert, ...]  # trust anchors: the self-issued CA certificates
    intermediates: tuple[Cert, ...]  # only help to build paths
    allowlist: frozenset[str]
    denylist: frozenset[str]
    skipped: tuple[tuple[Path, str], ...] = ()  # (file, why) for each certificate file not used
    origins: Mapping[str, Path] = field(default_factory=dict, compare=False)  # sha256 -> file

    def skipped_lines(self) -> list[str]:
        """One line per skipped file, for ``/readyz`` and ``nodegate ek check``."""
        return [f"{path}: {why}" for path, why in self.skipped]


@dataclass(frozen=True, slots=True)
class ManifestEntry:
    """One file of a root store (``manifest.json``, written by scripts/refresh-ek-roots.py)."""

    file: str  # path relative to the store folder
    vendor: str
    sha256: str  # SHA-256 of the certificate DER
    subject: str
    not_after: str  # RFC 3339
    role: str  # "root" (self-issued) or "intermediate"
    source: Mapping[str, str]  # repo, commit, path (or "local" and the path it was read from), url
    quirks: tuple[str, ...] = ()
    licence: str = ""  # of the source the file was taken from (SPDX id where known)
    fetched: str = ""  # the date the source was fetched (YYYY-MM-DD)

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "vendor": self.vendor,
            "role": self.role,
            "sha256": self.sha256,
            "subject": self.subject,
            "not_after": self.not_after,
            "source": dict(self.source),
            "quirks": list(self.quirks),
            "licence": self.licence,
            "fetched": self.fetched,
        }

    @classmethod
    def from_json(cls, doc: object) -> ManifestEntry:
        if not isinstance(doc, dict):
            raise TypeError("an entry is not an object")
        try:
            entry = cls(
                file=_text(doc, "file"),
                vendor=_text(doc, "vendor"),
                sha256=_text(doc, "sha256").lower(),
                subject=_text(doc, "subject", empty=True),
                not_after=_text(doc, "not_after"),
                role=_text(doc, "role"),
                source={str(k): str(v) for k, v in dict(doc.get("source") or {}).items()},
                quirks=tuple(str(q) for q in doc.get("quirks") or ()),
                licence=str(doc.get("licence") or ""),
                fetched=str(doc.get("fetched") or ""),
            )
        except (TypeError, ValueError) as exc:
            raise ValueError(f"entry {doc.get('file')!r}: {exc}") from None
        if len(entry.sha256) != 64 or any(c not in "0123456789abcdef" for c in entry.sha256):
            raise ValueError(f"entry {entry.file!r}: sha256 is not 64 hex digits")
        return entry


def _text(doc: dict[str, Any], key: str, *, empty: bool = False) -> str:
    value = doc.get(key)
    if not isinstance(value, str) or (not value and not empty):
        raise ValueError(f"{key} must be a{'' if empty else ' non-empty'} string")
    return value


def vendor_store() -> Path:
    """Where ``ek_roots: [vendors]`` points: $NODEGATE_EK_VENDOR_STORE, else the packaged store."""
    return Path(os.environ.get(STORE_ENV) or PACKAGED_STORE)


def load_ek_trust(settings: Settings) -> EkTrust:
    """The configured EK trust; every skipped file is logged by name (a warning each)."""
    roots = load_roots(settings.ek_roots)
    for path, why in roots.skipped:
        log.warning("ek_roots: skipped %s", path, extra={"error": why})
    log.info(
        "ek_roots: %d anchors, %d intermediates, %d files skipped",
        len(roots.anchors),
        len(roots.intermediates),
        len(roots.skipped),
    )
    return EkTrust(
        roots.anchors,
        roots.intermediates,
        frozenset(settings.ek_allowlist),
        frozenset(settings.ek_denylist),
        roots.skipped,
        roots.origins,
    )


@dataclass(frozen=True, slots=True)
class Roots:
    anchors: tuple[Cert, ...]
    intermediates: tuple[Cert, ...]
    skipped: tuple[tuple[Path, str], ...]
    origins: dict[str, Path]  # sha256 -> the first file it was read from
    listed: dict[str, ManifestEntry] = field(default_factory=dict)  # sha256 -> its store manifest entry


def load_roots(paths: Iterable[Path]) -> Roots:
    """Certificates from files and folders; ``vendors`` is the vendor root store. A folder with a
    ``manifest.json`` is a store: only its listed files whose fingerprints match are used."""
    found: list[tuple[Path, Cert]] = []
    skipped: list[tuple[Path, str]] = []
    listed: dict[str, ManifestEntry] = {}
    for entry in paths:
        path = vendor_store() if entry == Path(VENDORS) else entry
        if entry == Path(VENDORS) and not (path / MANIFEST).is_file():
            why = f"no vendor root store here (no {MANIFEST}; is ${STORE_ENV} right?); see docs/ek-roots.md"
            skipped.append((path, why))
        elif path.is_dir():
            _folder(path, found, skipped, listed)
        else:
            _file(path, found, skipped)
    anchors: list[Cert] = []
    intermediates: list[Cert] = []
    origins: dict[str, Path] = {}
    for path, cert in found:
        if cert.sha256 in origins:
            continue  # the same certificate from two files
        problem = _unusable(cert)
        if problem is not None:
            skipped.append((path, problem))
            continue
        origins[cert.sha256] = path
        (anchors if cert.self_issued else intermediates).append(cert)
    return Roots(tuple(anchors), tuple(intermediates), tuple(skipped), origins, listed)


def _unusable(cert: Cert) -> str | None:
    try:
        bc = cert.view.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        bc = None
    if bc is None or not bc.ca:
        return f"{cert.name()} is not a CA certificate (basicConstraints): it cannot issue EK certificates"
    return None


def read_cert_file(path: Path) -> list[Cert | str]:
    """Every certificate in a PEM or DER file (a Cert, or why that one cannot be used).
    Raises ValueError when the file as a whole cannot be used."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"cannot read it: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"larger than {MAX_FILE_BYTES} bytes")
    if certparse.is_pem(data):
        blocks = list(certparse.pem_blocks(data))
        if not blocks:
            raise ValueError("PEM without a CERTIFICATE block")
    else:
        blocks = [data]
    out: list[Cert | str] = []
    for der in blocks:
        try:
            out.append(certparse.read_certificate(der, "certificate", trailing=certparse.FILE_WHITESPACE))
        except MalformedInput as exc:
            out.append(exc.detail)
    return out


def _file(path: Path, found: list[tuple[Path, Cert]], skipped: list[tuple[Path, str]]) -> None:
    try:
        certs = read_cert_file(path)
    except ValueError as exc:
        skipped.append((path, str(exc)))
        return
    for i, cert in enumerate(certs, 1):
        if isinstance(cert, Cert):
            found.append((path, cert))
        else:
            where = f"certificate {i} of {len(certs)}: " if len(certs) > 1 else ""
            skipped.append((path, where + cert))


def _visible(folder: Path) -> list[Path]:
    """Entries of a folder, without hidden ones (Kubernetes ConfigMap mounts keep their real
    files under ``..data``; the visible names are links to them)."""
    return sorted(p for p in folder.iterdir() if not p.name.startswith("."))


def _folder(
    folder: Path,
    found: list[tuple[Path, Cert]],
    skipped: list[tuple[Path, str]],
    listed: dict[str, ManifestEntry],
) -> None:
    if (folder / MANIFEST).is_file():
        _store(folder, found, skipped, listed)
        return
    try:
        entries = _visible(folder)
    except OSError as exc:
        skipped.append((folder, f"cannot list it: {exc.strerror or exc}"))
        return
    for p in entries:
        if p.is_dir():
            skipped.append((p, "a subfolder is not read; list it in ek_roots to use it"))
        else:
            _file(p, found, skipped)


def read_manifest(folder: Path) -> list[ManifestEntry]:
    """The entries of ``folder/manifest.json``; TypeError or ValueError when it is not valid."""
    try:
        doc = json.loads((folder / MANIFEST).read_bytes())
    except (OSError, ValueError) as exc:
        raise ValueError(f"unreadable: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"not a {MANIFEST_FORMAT} manifest")
    files = doc.get("files")
    if not isinstance(files, list):
        raise TypeError("files must be a list")
    return [ManifestEntry.from_json(e) for e in files]


def _store(
    folder: Path,
    found: list[tuple[Path, Cert]],
    skipped: list[tuple[Path, str]],
    by_sha: dict[str, ManifestEntry],
) -> None:
    """A root store: every listed file must hold the one certificate its fingerprint names."""
    try:
        entries = read_manifest(folder)
    except (TypeError, ValueError) as exc:
        skipped.append((folder / MANIFEST, f"the whole store is skipped: {exc}"))
        return
    listed: set[Path] = set()
    base = folder.resolve()
    for entry in entries:
        path = folder / entry.file
        if Path(entry.file).is_absolute() or ".." in Path(entry.file).parts:
            skipped.append((path, "manifest entry points outside the store"))
            continue
        listed.add(path.resolve())
        try:
            certs = read_cert_file(path)
        except ValueError as exc:
            skipped.append((path, str(exc)))
            continue
        good = [c for c in certs if isinstance(c, Cert)]
        if len(certs) != 1 or len(good) != 1:
            why = f"a store file holds exactly one certificate ({len(good)} of {len(certs)} readable)"
            skipped.append((path, why))
        elif good[0].sha256 != entry.sha256:
            skipped.append((path, f"fingerprint {good[0].sha256} does not match {MANIFEST} ({entry.sha256})"))
        else:
            found.append((path, good[0]))
            by_sha.setdefault(entry.sha256, entry)
    for path in sorted(_store_files(base)):
        if path.resolve() not in listed:
            skipped.append((path, f"not listed in {MANIFEST}"))


def _store_files(base: Path) -> Iterable[Path]:
    for root, dirs, files in os.walk(base):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if not name.startswith(".") and Path(name).suffix.lower() in CERT_SUFFIXES:
                yield Path(root) / name
