"""EK trust from the config: ``ek_roots`` (PEM or DER files, folders, the vendor root store, the
imported roots) and the allow- and denylists (docs/ek-roots.md).

A file that cannot be used (unreadable, not a certificate, not a CA, a store file whose
fingerprint differs from its manifest) is skipped and reported by name, never fatal: skipping a
root can only make fewer EKs trusted. The reports are kept on ``EkTrust.skipped`` for the log,
``/readyz`` and the metrics. Each certificate keeps where it came from (``Roots.provenance``:
package, imported, config; the service adds fetched intermediates at join time).
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

from attest import certparse, cloudek
from attest.certparse import Cert
from attest.errors import MalformedInput
from bootstrap.config import Settings
from bootstrap.service.join import vendorroots

log = logging.getLogger("nodegate.ekroots")

VENDORS = "vendors"  # the literal ek_roots entry that means "the vendor root store"
IMPORTED = "imported"  # the literal entry for the roots `nodegate ek roots import` added
STORE_ENV = vendorroots.STORE_ENV
MANIFEST = "manifest.json"
MANIFEST_FORMAT = "nodegate-ek-roots/1"
MAX_FILE_BYTES = 4 * 1024 * 1024  # a PEM bundle of every vendor CA is under 1 MiB
CERT_SUFFIXES = frozenset({".pem", ".crt", ".cer", ".der", ".cert"})
# Where provenance labels come from (``nodegate ek roots``' SOURCE column).
PACKAGE, IMPORTED_FROM, CONFIG, FETCHED = "package", "imported", "config", "fetched"


def imported_store(state_dir: Path) -> Path:
    """``ek_roots: [imported]``: the folder `nodegate ek roots import` writes (a store with a
    manifest.json recording each root's source)."""
    return state_dir / "ek-roots" / "imported"


def fetched_cache(state_dir: Path) -> Path:
    """Intermediates fetched from AIA URLs (bootstrap/service/join/aia.py); they add no trust."""
    return state_dir / "ek-roots" / "fetched"


@dataclass(frozen=True, slots=True)
class EkTrust:
    roots: tuple[Cert, ...]  # trust anchors: the self-issued CA certificates
    intermediates: tuple[Cert, ...]  # only help to build paths
    allowlist: frozenset[str]
    denylist: frozenset[str]
    skipped: tuple[tuple[Path, str], ...] = ()  # (file, why) for each certificate file not used
    origins: Mapping[str, Path] = field(default_factory=dict, compare=False)  # sha256 -> file
    provenance: Mapping[str, str] = field(default_factory=dict, compare=False)  # sha256 -> source
    cloud: cloudek.CloudBindings = cloudek.NO_BINDINGS  # bindings for cloud vTPM chains (ek_cloud)

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
    cloud: str = ""  # a cloud vTPM CA (e.g. "gce"): its EKs need a binding (docs/ek-roots.md)

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
            **({"cloud": self.cloud} if self.cloud else {}),
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
                cloud=str(doc.get("cloud") or ""),
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


def vendor_store() -> Path | None:
    """Where ``ek_roots: [vendors]`` reads (docs/ek-roots.md), or None when no copy is installed."""
    return vendorroots.find_store()


def load_ek_trust(settings: Settings) -> EkTrust:
    """The configured EK trust; every skipped file is logged by name (a warning each)."""
    roots = load_roots(settings.ek_roots, state_dir=settings.state_dir)
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
        roots.provenance,
        cloud_bindings(settings, roots),
    )


def cloud_bindings(settings: Settings, roots: Roots) -> cloudek.CloudBindings:
    """``ek_cloud`` as attest takes it, with the CAs an import marked as cloud vTPM CAs."""
    marked = {sha: e.cloud for sha, e in roots.listed.items() if e.cloud}
    gce = settings.ek_cloud.gce
    return cloudek.CloudBindings(frozenset(gce.projects), frozenset(gce.instances), marked)


def unbound_cloud_cas(settings: Settings, roots: Roots) -> list[tuple[Cert, str]]:
    """Configured cloud vTPM CAs whose provider has no binding: (certificate, provider)."""
    bindings = cloud_bindings(settings, roots)
    out = []
    for cert in (*roots.anchors, *roots.intermediates):
        provider = bindings.provider_of(cert.sha256)
        if provider is not None and not bindings.binds(provider):
            out.append((cert, provider))
    return out


@dataclass(frozen=True, slots=True)
class Roots:
    anchors: tuple[Cert, ...]
    intermediates: tuple[Cert, ...]
    skipped: tuple[tuple[Path, str], ...]
    origins: dict[str, Path]  # sha256 -> the first file it was read from
    listed: dict[str, ManifestEntry] = field(default_factory=dict)  # sha256 -> its store manifest entry
    provenance: dict[str, str] = field(default_factory=dict)  # sha256 -> package | imported | config
    left_out: tuple[tuple[Path, str], ...] = ()  # package files `vendors` does not use, and why


@dataclass
class _Found:
    certs: list[tuple[Path, Cert, str]] = field(default_factory=list)  # (file, cert, provenance)
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    listed: dict[str, ManifestEntry] = field(default_factory=dict)
    left_out: list[tuple[Path, str]] = field(default_factory=list)


def load_roots(paths: Iterable[Path], *, state_dir: Path | None = None) -> Roots:
    """Certificates from files and folders; ``vendors`` is the vendor root store, ``imported`` the
    roots imported into ``state_dir``. A folder with a ``manifest.json`` is a store: only its listed
    files whose fingerprints match are used."""
    got = _Found()
    for entry in paths:
        if entry == Path(VENDORS):
            _vendors(got)
        elif entry == Path(IMPORTED):
            if state_dir is None:
                got.skipped.append((entry, "imported roots need the state_dir (--state-dir)"))
            elif (imported_store(state_dir) / MANIFEST).is_file():
                _store(imported_store(state_dir), got, IMPORTED_FROM)
            else:
                why = "no roots imported yet (nodegate ek roots import); see docs/ek-roots.md"
                got.skipped.append((imported_store(state_dir), why))
        elif entry.is_dir():
            _folder(entry, got)
        else:
            _file(entry, got, CONFIG)
    anchors: list[Cert] = []
    intermediates: list[Cert] = []
    origins: dict[str, Path] = {}
    provenance: dict[str, str] = {}
    for path, cert, source in got.certs:
        if cert.sha256 in origins:
            continue  # the same certificate from two files
        problem = unusable(cert)
        if problem is not None:
            got.skipped.append((path, problem))
            continue
        origins[cert.sha256] = path
        provenance[cert.sha256] = source
        (anchors if cert.self_issued else intermediates).append(cert)
    return Roots(
        tuple(anchors),
        tuple(intermediates),
        tuple(got.skipped),
        origins,
        got.listed,
        provenance,
        tuple(got.left_out),
    )


def _vendors(got: _Found) -> None:
    """The package's files, each checked against the committed table (vendorroots.FILES)."""
    folder = vendor_store()
    if folder is None:
        where = ", ".join(str(p) for p in vendorroots.candidates())
        why = (
            f"no vendor root store installed (looked in {where}; `make image` puts it in the image, "
            f"`apt-get install {vendorroots.PACKAGE}` on Debian, or set ${STORE_ENV}); see docs/ek-roots.md"
        )
        got.skipped.append((Path(VENDORS), why))
        return
    for entry in vendorroots.FILES:
        path = folder / entry.file
        if entry.left_out:
            got.left_out.append((path, entry.left_out))
            continue
        try:
            vendorroots.check_file(folder, entry)
        except ValueError as exc:
            got.skipped.append((path, str(exc)))
            continue
        before = len(got.certs)
        _file(path, got, PACKAGE)
        for _, cert, _ in got.certs[before:]:
            got.listed.setdefault(cert.sha256, _package_entry(entry, cert))
    for path in vendorroots.unlisted(folder):
        got.skipped.append((path, f"not a file of {vendorroots.PACKAGE} {vendorroots.VERSION}: refused"))


def _package_entry(entry: vendorroots.VendorFile, cert: Cert) -> ManifestEntry:
    return ManifestEntry(
        file=entry.file,
        vendor=entry.vendor,
        sha256=cert.sha256,
        subject=cert.name(),
        not_after=cert.view.not_valid_after_utc.isoformat(),
        role="root" if cert.self_issued else "intermediate",
        source={"package": f"{vendorroots.PACKAGE} {vendorroots.VERSION}", "path": entry.file},
    )


def unusable(cert: Cert) -> str | None:
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
    return read_certs(data)


def read_certs(data: bytes, where: str = "certificate") -> list[Cert | str]:
    """Every certificate in PEM or DER bytes (a Cert, or why that one cannot be used, naming
    ``where``); ValueError for PEM without a CERTIFICATE block."""
    if certparse.is_pem(data):
        blocks = list(certparse.pem_blocks(data))
        if not blocks:
            raise ValueError("PEM without a CERTIFICATE block")
    else:
        blocks = [data]
    out: list[Cert | str] = []
    for der in blocks:
        try:
            out.append(certparse.read_certificate(der, where, trailing=certparse.FILE_WHITESPACE))
        except MalformedInput as exc:
            out.append(exc.detail)
    return out


def _file(path: Path, got: _Found, source: str) -> None:
    try:
        certs = read_cert_file(path)
    except ValueError as exc:
        got.skipped.append((path, str(exc)))
        return
    for i, cert in enumerate(certs, 1):
        if isinstance(cert, Cert):
            got.certs.append((path, cert, source))
        else:
            where = f"certificate {i} of {len(certs)}: " if len(certs) > 1 else ""
            got.skipped.append((path, where + cert))


def _visible(folder: Path) -> list[Path]:
    """Entries of a folder, without hidden ones (Kubernetes ConfigMap mounts keep their real
    files under ``..data``; the visible names are links to them)."""
    return sorted(p for p in folder.iterdir() if not p.name.startswith("."))


def _folder(folder: Path, got: _Found) -> None:
    if (folder / MANIFEST).is_file():
        _store(folder, got, CONFIG)
        return
    try:
        entries = _visible(folder)
    except OSError as exc:
        got.skipped.append((folder, f"cannot list it: {exc.strerror or exc}"))
        return
    for p in entries:
        if p.is_dir():
            got.skipped.append((p, "a subfolder is not read; list it in ek_roots to use it"))
        else:
            _file(p, got, CONFIG)


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


def _store(folder: Path, got: _Found, source: str) -> None:
    """A root store: every listed file must hold the one certificate its fingerprint names."""
    skipped = got.skipped
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
            got.certs.append((path, good[0], source))
            got.listed.setdefault(entry.sha256, entry)
    for path in sorted(_store_files(base)):
        if path.resolve() not in listed:
            skipped.append((path, f"not listed in {MANIFEST}"))


def _store_files(base: Path) -> Iterable[Path]:
    for root, dirs, files in os.walk(base):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if not name.startswith(".") and Path(name).suffix.lower() in CERT_SUFFIXES:
                yield Path(root) / name
