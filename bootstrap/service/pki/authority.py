"""The service's CA on disk (``state_dir/ca``) and the TLS certificate it issues for the service.

Replicas share ``state_dir``: the first to start creates the CA (exclusively; the loser loads the
winner's), every writer adds key and certificate files before it replaces ``index.json``, and
readers notice a rotation by the index's modification time. Key files are 0600, never logged.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from attest import ca, svid
from bootstrap.files import create_exclusive, ensure_dir, exposure, read_limited, write_atomic

_STEM = re.compile(r"ca-[0-9a-f]{16}")
SERVER_TTL = timedelta(days=30)
_RENEW_BEFORE = timedelta(days=10)
# A retiring CA stops signing the TLS certificate this long before it leaves the bundle.
RETIRE_MARGIN = timedelta(minutes=30)


class CaUnavailable(Exception):
    """The CA files cannot be read or do not belong to the configured trust domain."""


class CaStore:
    """Load, create and rotate the CA in one folder."""

    def __init__(self, folder: Path, trust_domain: str) -> None:
        self.folder = folder
        self.trust_domain = svid.validate_trust_domain(trust_domain)

    @property
    def index(self) -> Path:
        return self.folder / ca.INDEX_FILE

    def stamp(self) -> int:
        """Changes whenever the index is replaced (cheap enough to call per request)."""
        try:
            st = os.stat(self.index)
        except FileNotFoundError:
            return 0
        return st.st_mtime_ns ^ st.st_ino

    def load(self) -> ca.CaSet:
        # Only the files the index names: other files may be a racing replica's leftovers that it
        # is deleting right now, or authorities pruned since.
        files: dict[str, bytes] = {}
        try:
            files[ca.INDEX_FILE] = read_limited(self.index, ca.MAX_INDEX_FILE)
            for stem in _stems(files[ca.INDEX_FILE]):
                for name in (f"{stem}.key", f"{stem}.pem"):
                    files[name] = read_limited(self.folder / name, ca.MAX_INDEX_FILE)
        except (OSError, ValueError) as exc:
            raise CaUnavailable(f"cannot read the CA in {self.folder}: {exc}") from None
        try:
            cas = ca.CaSet.load(files)
        except ca.CaStoreError as exc:
            raise CaUnavailable(f"CA in {self.folder}: {exc}") from None
        if cas.trust_domain != self.trust_domain:
            raise CaUnavailable(
                f"CA in {self.folder} is for trust domain {cas.trust_domain}, config says {self.trust_domain}"
            )
        return cas

    def check_key_modes(self, cas: ca.CaSet) -> None:
        """A key others can read is a key others may have: refused rather than trusted (at the
        service's start; ``bootstrap.files.exposure`` says what is allowed)."""
        for authority in cas.authorities:
            path = self.folder / f"{authority.stem}.key"
            try:
                exposed = exposure(path)
            except OSError as exc:
                raise CaUnavailable(f"cannot read the CA in {self.folder}: {exc}") from None
            if exposed is not None:
                raise CaUnavailable(f"CA key {exposed}")

    def load_or_create(self, now: datetime) -> ca.CaSet:
        ensure_dir(self.folder)
        if self.index.exists():
            return self.load()
        fresh = ca.initial(self.trust_domain, now=now)
        files = fresh.dump()
        index = files.pop(ca.INDEX_FILE)
        for name, data in files.items():
            write_atomic(self.folder / name, data)
        if not create_exclusive(self.index, index):
            # Another replica created the CA first; its index wins, our files are unreferenced.
            for name in files:
                (self.folder / name).unlink(missing_ok=True)
        return self.load()

    def save(self, cas: ca.CaSet) -> None:
        files = cas.dump()
        index = files.pop(ca.INDEX_FILE)
        for name, data in files.items():
            path = self.folder / name
            if not path.exists() or path.read_bytes() != data:
                write_atomic(path, data)
        write_atomic(self.index, index)  # last: it names only files that now exist
        keep = set(files) | {ca.INDEX_FILE}
        for name in os.listdir(self.folder):
            if not name.startswith(".") and name not in keep:
                (self.folder / name).unlink(missing_ok=True)

    def rotate(self, now: datetime, grace: timedelta) -> ca.CaSet:
        rotated = self.load().prune(now).rotate(now=now, grace=grace)
        self.save(rotated)
        return rotated


def _stems(index: bytes) -> list[str]:
    """The authority stems an index names (CaSet.load validates the index fully)."""
    try:
        doc = json.loads(index)
    except ValueError:
        return []
    entries = doc.get("authorities") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or len(entries) > ca.MAX_AUTHORITIES:
        return []
    return [e["stem"] for e in entries if isinstance(e, dict) and _STEM.fullmatch(str(e.get("stem", "")))]


@dataclass(frozen=True, slots=True)
class ServerCert:
    cert_file: Path
    key_file: Path
    certificate: x509.Certificate
    refresh_at: datetime  # call server_certificate again from then on (it reissues)


def tls_issuer(cas: ca.CaSet, now: datetime) -> tuple[ca.Authority, datetime | None]:
    """The authority that signs the service's own TLS certificate, and when it leaves the bundle.

    The oldest one still published, not the newest signer: after ``nodegate ca rotate`` nodes
    with an older bundle (baked into the image, or from the last join) must still reach the
    service to fetch the new one, so TLS stays on the old root until shortly before it retires
    (``ca_grace``); by then renewals have handed out bundles with both roots."""
    for authority in cas.authorities:  # oldest first
        if not authority.in_bundle(now):
            continue
        if authority.retire_at is None:
            return authority, None
        if authority.retire_at - now > RETIRE_MARGIN:
            return authority, authority.retire_at
    return cas.signer, None


def server_certificate(folder: Path, cas: ca.CaSet, names: tuple[str, ...], now: datetime) -> ServerCert:
    """The service's own TLS certificate, an SVID for ``spiffe://<td>/nodegate/server`` with the
    configured names as DNS/IP SANs, from ``tls_issuer``; reissued when missing, mismatched, near
    expiry, or when the issuer changes (its old one nears retirement)."""
    ensure_dir(folder)
    cert_file, key_file = folder / "server.pem", folder / "server.key"
    current = _load_pair(cert_file, key_file)
    issuer, retires = tls_issuer(cas, now)
    signer = issuer.certificate
    renew_before = _RENEW_BEFORE if retires is None else RETIRE_MARGIN
    if (
        current is not None
        and current.issuer == signer.subject
        and current.not_valid_after_utc - now > renew_before
        and _aki(current) == _ski(signer)
        and (retires is None or current.not_valid_after_utc <= retires)
        and _sans(current) == _split_names(names)  # a changed server_names takes effect at once
    ):
        return ServerCert(cert_file, key_file, current, _refresh_at(current, renew_before, retires))
    key = ec.generate_private_key(ec.SECP256R1())
    dns, ips = _split_names(names)
    ttl = SERVER_TTL if retires is None else min(SERVER_TTL, retires - now)
    leaf = svid.issue_svid(
        issuer,
        spiffe_id=svid.parse_spiffe_id(f"spiffe://{cas.trust_domain}/nodegate/server"),
        public_key=key.public_key(),
        now=now,
        ttl=ttl,
        dns_names=dns,
        ip_addresses=ips,
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    # Key first: a crash in between leaves a pair that does not match, which is reissued next time.
    write_atomic(key_file, key_pem)
    write_atomic(cert_file, leaf.public_bytes(serialization.Encoding.PEM))
    return ServerCert(cert_file, key_file, leaf, _refresh_at(leaf, renew_before, retires))


def _refresh_at(leaf: x509.Certificate, renew_before: timedelta, retires: datetime | None) -> datetime:
    at = leaf.not_valid_after_utc - renew_before
    return at if retires is None else min(at, retires - RETIRE_MARGIN)


def _split_names(
    names: tuple[str, ...],
) -> tuple[list[str], list[ipaddress.IPv4Address | ipaddress.IPv6Address]]:
    dns: list[str] = []
    ips: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = []
    for name in names:
        try:
            ips.append(ipaddress.ip_address(name))
        except ValueError:
            dns.append(name.lower())  # as issued: DNS names are case-insensitive
    return dns, ips


def _sans(cert: x509.Certificate) -> tuple[list[str], list[ipaddress.IPv4Address | ipaddress.IPv6Address]]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return [], []
    ips = [
        ip
        for ip in san.get_values_for_type(x509.IPAddress)
        if isinstance(ip, ipaddress.IPv4Address | ipaddress.IPv6Address)
    ]
    return san.get_values_for_type(x509.DNSName), ips


def _load_pair(cert_file: Path, key_file: Path) -> x509.Certificate | None:
    try:
        certs = x509.load_pem_x509_certificates(read_limited(cert_file, 64 * 1024))
        key = serialization.load_pem_private_key(read_limited(key_file, 16 * 1024), None)
    except (OSError, ValueError, TypeError):
        return None
    leaf = certs[0]
    if leaf.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) != key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ):
        return None
    return leaf


def _ski(cert: x509.Certificate) -> bytes:
    return cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest


def _aki(cert: x509.Certificate) -> bytes | None:
    try:
        return cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value.key_identifier
    except x509.ExtensionNotFound:
        return None
