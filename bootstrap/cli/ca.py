"""``nodegate ca rotate`` and ``nodegate ca issue-admin``: the service's signing authorities."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from attest import svid
from bootstrap.cli import common
from bootstrap.config import parse_duration
from bootstrap.files import ensure_dir, write_atomic
from bootstrap.service.pki.authority import CaStore, CaUnavailable


def run(args: argparse.Namespace) -> int:
    if args.ca_command == "issue-admin":
        return issue_admin(args.config, args.spiffe_id, args.out, args.ttl)
    return rotate(args.config)


def rotate(config: Path | None) -> int:

    settings = common.settings(config)
    if settings is None:
        return 2
    store = CaStore(settings.state_dir / "ca", settings.trust_domain)
    now = datetime.now(UTC)
    try:
        rotated = store.rotate(now, settings.ca_grace)
    except CaUnavailable as exc:
        print(f"nodegate ca rotate: {exc}", file=sys.stderr)
        return 1
    old = [a for a in rotated.authorities if a is not rotated.signer]
    print(f"new signer {rotated.signer.stem}; bundle sequence {rotated.bundle_sequence(now)}")
    for a in old:
        print(f"  {a.stem} stays in the bundle until {a.retire_at.isoformat() if a.retire_at else 'expiry'}")
    return 0


def issue_admin(config: Path | None, spiffe_id: str, out: Path, ttl: str) -> int:

    settings = common.settings(config)
    if settings is None:
        return 2
    try:
        sid = svid.parse_spiffe_id(spiffe_id)
        lifetime = parse_duration(ttl)
        cas = CaStore(settings.state_dir / "ca", settings.trust_domain).load()
    except (ValueError, CaUnavailable) as exc:
        print(f"nodegate ca issue-admin: {exc}", file=sys.stderr)
        return 2
    if spiffe_id not in settings.admin.spiffe_ids:
        print(f"nodegate ca issue-admin: note: {spiffe_id} is not in admin.spiffe_ids; it grants nothing yet")
    key = ec.generate_private_key(ec.SECP256R1())
    try:
        leaf = svid.issue_svid(
            cas.signer, spiffe_id=sid, public_key=key.public_key(), now=datetime.now(UTC), ttl=lifetime
        )
    except ValueError as exc:
        print(f"nodegate ca issue-admin: {exc}", file=sys.stderr)
        return 2
    ensure_dir(out)
    write_atomic(
        out / "admin.key",
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )
    write_atomic(out / "admin.pem", leaf.public_bytes(serialization.Encoding.PEM))
    until = leaf.not_valid_after_utc.isoformat()
    print(f"{sid}: {out / 'admin.pem'} (key {out / 'admin.key'}), valid until {until}")
    return 0
