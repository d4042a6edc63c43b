"""The listener's TLS: the context, the trust bundle it checks client certificates against, and
the certificate it presents (``tls.cert_file``/``tls.key_file``, or one issued by the service's
own CA), reloaded while it runs."""

from __future__ import annotations

import logging
import ssl
from datetime import datetime
from pathlib import Path

from attest import ca, svid
from bootstrap.config import Settings
from bootstrap.service.http import clientcert
from bootstrap.service.pki import authority, hostnames

log = logging.getLogger("nodegate.server")


# TLS 1.2 suites: forward secrecy and AEAD only (no CBC, no RSA key exchange); TLS 1.3's are all
# AEAD and are not affected by this string.
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"


def listener_context(cas: ca.CaSet, now: datetime) -> ssl.SSLContext:
    """TLS 1.2+ with AEAD suites, and optional client certificates (node SVIDs for renewal, admin
    SVIDs) that the handshake asks for and the application judges (``clientcert``); no server
    certificate loaded yet."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(TLS12_CIPHERS)
    ctx.options |= ssl.OP_NO_RENEGOTIATION
    trust(ctx, cas, now)
    clientcert.request_without_verifying(ctx)
    return ctx


def trust(ctx: ssl.SSLContext, cas: ca.CaSet, now: datetime) -> None:
    """Adds the current roots for client certificates (what the handshake falls back to when it
    verifies them itself, see ``clientcert``); retired ones are refused by verify_svid."""
    ctx.load_verify_locations(cadata=svid.bundle_pem(cas.roots(now)).decode())


def load_self_issued(ctx: ssl.SSLContext, settings: Settings, cas: ca.CaSet, now: datetime) -> datetime:
    """Loads the service's own server certificate (issued when missing or due); returns when it is
    due again."""
    cert = authority.server_certificate(
        settings.state_dir / "tls", cas, hostnames.server_names(settings), now
    )
    ctx.load_cert_chain(cert.cert_file, cert.key_file)
    return cert.refresh_at


def pair_stamp(cert: Path, key: Path) -> tuple[int, ...]:
    return file_stamp(cert) + file_stamp(key)


def file_stamp(path: Path) -> tuple[int, int, int]:
    """What changes when a file is replaced or rewritten (a Secret update swaps a symlink)."""
    try:
        st = path.stat()
    except OSError:
        return (0, 0, 0)
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def reload_pair(ctx: ssl.SSLContext, cert: Path, key: Path, stamp: tuple[int, ...]) -> tuple[int, ...] | None:
    """The pair's new stamp once a changed pair is loaded; None when it did not change or does not
    load (caught mid-update: the old one stays, and the next tick tries again)."""
    fresh = pair_stamp(cert, key)
    if fresh == stamp:
        return None
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        log.warning("TLS certificate not reloaded", extra={"error": str(exc)[:300]})
        return None
    return fresh
