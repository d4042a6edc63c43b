"""Signing authorities of one trust domain: creation, rotation with overlap, and their file form.

Rotation adds a new authority that signs from then on; the older ones stay in the bundle until
their ``retire_at`` so that SVIDs they issued keep verifying. ``dump``/``load`` only turn the set
into bytes and back; writing the files (atomically, mode 0600) is the caller's job.
"""

from __future__ import annotations

import hmac
import itertools
import json
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from attest.spiffeid import SCHEME, SpiffeIdError, parse_spiffe_id, validate_trust_domain
from attest.x509svid import CLOCK_SKEW

DEFAULT_CA_TTL = timedelta(days=3650)
MAX_KEY_FILE = 16 * 1024
MAX_CERT_FILE = 16 * 1024
MAX_INDEX_FILE = 64 * 1024
MAX_AUTHORITIES = 64
INDEX_FILE = "index.json"
INDEX_VERSION = 1
_CN_LIMIT = 64  # ub-common-name (RFC 5280)
_STEM = re.compile(r"ca-[0-9a-f]{16}")


class CaStoreError(ValueError):
    """CA files that are missing, oversized, malformed or inconsistent with each other."""


@dataclass(frozen=True, slots=True)
class Authority:
    key: ec.EllipticCurvePrivateKey
    certificate: x509.Certificate
    created_at: datetime
    retire_at: datetime | None = None  # set when superseded by rotation; dropped from the bundle after it

    @property
    def stem(self) -> str:
        """File name stem, stable for the authority's life (derived from its key identifier), so a
        writer only ever adds files and then replaces the index."""
        ski = self.certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        return f"ca-{ski.digest[:8].hex()}"

    def in_bundle(self, now: datetime) -> bool:
        """Published as a root at ``now``: not past ``retire_at`` and not expired."""
        if self.retire_at is not None and now >= self.retire_at:
            return False
        return now <= self.certificate.not_valid_after_utc


def _require_aware(now: datetime, what: str = "now") -> None:
    if not isinstance(now, datetime) or now.tzinfo is None or now.utcoffset() is None:
        raise ValueError(f"{what} must be a timezone-aware datetime")


def new_authority(trust_domain: str, *, now: datetime, ttl: timedelta = DEFAULT_CA_TTL) -> Authority:
    """A fresh self-signed P-256 root for ``trust_domain``."""
    validate_trust_domain(trust_domain)
    _require_aware(now)
    if ttl <= CLOCK_SKEW:
        raise ValueError("CA ttl must be longer than the clock-skew allowance")
    key = ec.generate_private_key(ec.SECP256R1())
    suffix = secrets.token_hex(4)  # distinct subjects, so old and new roots never look alike
    room = _CN_LIMIT - len("nodegate CA ") - len(suffix) - 1
    cn = f"nodegate CA {trust_domain[:room]} {suffix}"
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "nodegate"),
            x509.NameAttribute(NameOID.COMMON_NAME, cn),
        ]
    )
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + ttl)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        # The trust-domain ID; no URI name constraints (cryptography's verifier rejects them).
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(SCHEME + trust_domain)]), False
        )
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Authority(key=key, certificate=cert, created_at=now.astimezone(UTC))


@dataclass(frozen=True, slots=True)
class CaSet:
    trust_domain: str
    authorities: tuple[Authority, ...]  # oldest first
    sequence: int  # spiffe_sequence; +1 on every change of the root set

    @property
    def signer(self) -> Authority:
        """The newest authority: it signs new SVIDs."""
        return self.authorities[-1]

    def roots(self, now: datetime) -> list[x509.Certificate]:
        _require_aware(now)
        return [a.certificate for a in self.authorities if a.in_bundle(now)]

    def bundle_sequence(self, now: datetime) -> int:
        """``spiffe_sequence`` for ``roots(now)``: roots also leave the bundle by time alone (retire_at,
        expiry), so each one that left but is not yet pruned counts once. Pruning moves that count
        into ``sequence``, so the value never goes backwards and changes whenever the roots do."""
        _require_aware(now)
        return self.sequence + sum(1 for a in self.authorities if not a.in_bundle(now))

    def rotate(self, *, now: datetime, grace: timedelta, ttl: timedelta = DEFAULT_CA_TTL) -> CaSet:
        """Add a new signer; every older authority without ``retire_at`` retires at ``now + grace``
        (grace should exceed the SVID lifetime so SVIDs of the old signer stay verifiable)."""
        _require_aware(now)
        if grace < timedelta(0):
            raise ValueError("rotation grace must not be negative")
        retire_at = now.astimezone(UTC) + grace
        old = tuple(
            a if a.retire_at is not None else replace(a, retire_at=retire_at) for a in self.authorities
        )
        fresh = new_authority(self.trust_domain, now=now, ttl=ttl)
        return CaSet(self.trust_domain, (*old, fresh), self.sequence + 1)

    def prune(self, now: datetime) -> CaSet:
        """Drop authorities that left the bundle (past ``retire_at`` or expired), but never the signer."""
        _require_aware(now)
        signer = self.signer
        kept = tuple(a for a in self.authorities if a is signer or a.in_bundle(now))
        dropped = len(self.authorities) - len(kept)
        if dropped == 0:
            return self
        return CaSet(self.trust_domain, kept, self.sequence + dropped)

    def dump(self) -> dict[str, bytes]:
        """File name -> bytes: ``<stem>.key`` (PKCS#8 PEM, unencrypted: protect it with file mode),
        ``<stem>.pem`` and ``index.json``."""
        files: dict[str, bytes] = {}
        entries: list[dict[str, Any]] = []
        for a in self.authorities:
            files[f"{a.stem}.key"] = a.key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
            files[f"{a.stem}.pem"] = a.certificate.public_bytes(serialization.Encoding.PEM)
            entries.append(
                {
                    "stem": a.stem,
                    "created_at": _timestamp(a.created_at),
                    "retire_at": None if a.retire_at is None else _timestamp(a.retire_at),
                }
            )
        index = {
            "version": INDEX_VERSION,
            "trust_domain": self.trust_domain,
            "sequence": self.sequence,
            "authorities": entries,
        }
        files[INDEX_FILE] = (json.dumps(index, indent=2, sort_keys=True) + "\n").encode("utf-8")
        return files

    @classmethod
    def load(cls, files: Mapping[str, bytes]) -> CaSet:
        """Rebuild a set from ``dump`` output. Files the index does not name are ignored (stale
        authorities from before a prune); everything the index names must be present and agree."""
        index = _load_index(_file(files, INDEX_FILE, MAX_INDEX_FILE))
        td = index["trust_domain"]
        authorities: list[Authority] = []
        for n, entry in enumerate(index["authorities"]):
            authorities.append(_load_authority(files, td, n, entry))
        stems = [a.stem for a in authorities]
        if len(set(stems)) != len(stems):
            raise CaStoreError("index.json names the same authority twice")
        for earlier, later in itertools.pairwise(authorities):
            if later.created_at < earlier.created_at:
                raise CaStoreError("index.json authorities are not ordered oldest first")
        if authorities[-1].retire_at is not None:
            raise CaStoreError("the newest authority (the signer) must not have retire_at")
        return cls(td, tuple(authorities), index["sequence"])


def initial(trust_domain: str, *, now: datetime) -> CaSet:
    """A set with one new authority, at sequence 1."""
    return CaSet(validate_trust_domain(trust_domain), (new_authority(trust_domain, now=now),), 1)


# -- loading -----------------------------------------------------------------------------------


def _timestamp(when: datetime) -> str:
    return when.astimezone(UTC).isoformat()


def _parse_timestamp(value: object, what: str) -> datetime:
    if not isinstance(value, str):
        raise CaStoreError(f"index.json {what} must be an RFC 3339 string")
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise CaStoreError(f"index.json {what} {value!r} is not an RFC 3339 timestamp") from None
    if when.tzinfo is None:
        raise CaStoreError(f"index.json {what} {value!r} has no time zone")
    return when.astimezone(UTC)


def _file(files: Mapping[str, bytes], name: str, limit: int) -> bytes:
    data = files.get(name)
    if data is None:
        raise CaStoreError(f"CA file {name} is missing")
    if not isinstance(data, bytes):
        raise CaStoreError(f"CA file {name} must be bytes")
    if len(data) > limit:
        raise CaStoreError(f"CA file {name} is {len(data)} bytes, above the limit of {limit}")
    return data


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise CaStoreError(f"index.json has duplicate key {key!r}")
        out[key] = value
    return out


def _load_index(data: bytes) -> dict[str, Any]:
    try:
        index = json.loads(data.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise CaStoreError(f"index.json is not valid JSON: {exc}") from None
    if not isinstance(index, dict) or set(index) != {"version", "trust_domain", "sequence", "authorities"}:
        raise CaStoreError("index.json must be an object with version, trust_domain, sequence, authorities")
    if index["version"] != INDEX_VERSION or isinstance(index["version"], bool):
        raise CaStoreError(f"index.json version {index['version']!r} is not {INDEX_VERSION}")
    try:
        validate_trust_domain(index["trust_domain"])
    except SpiffeIdError as exc:
        raise CaStoreError(f"index.json trust_domain: {exc}") from None
    seq = index["sequence"]
    if isinstance(seq, bool) or not isinstance(seq, int) or not 1 <= seq < 2**63:
        raise CaStoreError("index.json sequence must be a positive integer")
    entries = index["authorities"]
    if not isinstance(entries, list) or not 1 <= len(entries) <= MAX_AUTHORITIES:
        raise CaStoreError(f"index.json authorities must be a list of 1 to {MAX_AUTHORITIES} entries")
    return index


def _load_authority(files: Mapping[str, bytes], td: str, n: int, entry: object) -> Authority:
    if not isinstance(entry, dict) or set(entry) != {"stem", "created_at", "retire_at"}:
        raise CaStoreError(f"index.json authority {n} must be an object with stem, created_at, retire_at")
    stem = entry["stem"]
    if not isinstance(stem, str) or _STEM.fullmatch(stem) is None:
        raise CaStoreError(f"index.json authority {n} has an invalid stem {stem!r}")
    created_at = _parse_timestamp(entry["created_at"], f"authority {n} created_at")
    retire_at = (
        None
        if entry["retire_at"] is None
        else _parse_timestamp(entry["retire_at"], f"authority {n} retire_at")
    )
    cert = _load_certificate(_file(files, f"{stem}.pem", MAX_CERT_FILE), f"{stem}.pem", td)
    key = _load_key(_file(files, f"{stem}.key", MAX_KEY_FILE), f"{stem}.key")
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(serialization.Encoding.DER, spki) != cert.public_key().public_bytes(
        serialization.Encoding.DER, spki
    ):
        raise CaStoreError(f"{stem}.key does not match the key certified by {stem}.pem")
    authority = Authority(key=key, certificate=cert, created_at=created_at, retire_at=retire_at)
    if authority.stem != stem:
        raise CaStoreError(f"{stem}.pem belongs to stem {authority.stem}, not {stem}")
    return authority


def _load_certificate(data: bytes, name: str, td: str) -> x509.Certificate:
    try:
        cert = x509.load_pem_x509_certificate(data)
        # Decode lazily parsed parts now, so that bad encodings surface here.
        bc = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
        ku = cert.extensions.get_extension_for_class(x509.KeyUsage).value
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
        public = cert.public_key()
    except x509.ExtensionNotFound as exc:
        raise CaStoreError(f"{name} lacks a required CA extension ({exc})") from None
    except (
        ValueError,
        x509.DuplicateExtension,
        x509.UnsupportedGeneralNameType,
        UnsupportedAlgorithm,
    ) as exc:
        raise CaStoreError(f"{name} is not a valid PEM certificate ({exc})") from None
    if cert.public_bytes(serialization.Encoding.PEM) != data:
        raise CaStoreError(f"{name} must hold exactly one certificate in canonical PEM (trailing data?)")
    if not bc.ca or not ku.key_cert_sign:
        raise CaStoreError(f"{name} is not a CA certificate")
    if not isinstance(public, ec.EllipticCurvePublicKey) or not isinstance(public.curve, ec.SECP256R1):
        raise CaStoreError(f"{name} does not certify an EC P-256 key")
    uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    try:
        ids = [parse_spiffe_id(u) for u in uris]
    except SpiffeIdError as exc:
        raise CaStoreError(f"{name} has an invalid SPIFFE ID: {exc}") from None
    if len(ids) != 1 or str(ids[0]) != SCHEME + td:
        raise CaStoreError(f"{name} is not a root of trust domain {td}")
    try:
        cert.verify_directly_issued_by(cert)
    except (InvalidSignature, ValueError, TypeError) as exc:
        raise CaStoreError(f"{name} is not a valid self-signed certificate ({exc})") from None
    return cert


def _load_key(data: bytes, name: str) -> ec.EllipticCurvePrivateKey:
    if not data.startswith(b"-----BEGIN PRIVATE KEY-----"):
        raise CaStoreError(f"{name} must be an unencrypted PKCS#8 PEM key")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        # Never echo key parsing details: they may quote key material.
        raise CaStoreError(f"{name} is not a valid unencrypted PKCS#8 PEM key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        raise CaStoreError(f"{name} is not an EC P-256 key")
    canonical = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    if not hmac.compare_digest(canonical, data):
        raise CaStoreError(f"{name} must hold exactly one key in canonical PKCS#8 PEM (trailing data?)")
    return key
