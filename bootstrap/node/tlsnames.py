"""When the server's certificate chains to ``--ca-bundle`` but does not name the host the node
dialled, say which names it has and which setting to change (instead of a bare "hostname
mismatch"). The names are read over a second handshake that still verifies the chain, so only a
certificate from the trusted CA is described."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from pathlib import Path
from urllib.parse import urlsplit

# OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH and X509_V_ERR_IP_ADDRESS_MISMATCH
_MISMATCH = frozenset({62, 64})
_MAX_SHOWN = 12


def is_name_mismatch(error: BaseException) -> bool:
    return isinstance(error, ssl.SSLCertVerificationError) and error.verify_code in _MISMATCH


async def certificate_names(base: str, ca_bundle: Path, timeout: float) -> list[str] | None:
    """The DNS and IP names of the server's certificate, when it chains to ``ca_bundle``."""
    parts = urlsplit(base)
    host, port = parts.hostname or "", parts.port or 443
    try:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca_bundle))
        ctx.check_hostname = False  # the chain is still verified: only the name is not compared
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=ctx), timeout)
    except (OSError, ssl.SSLError, ValueError, TimeoutError):
        return None
    try:
        cert = writer.get_extra_info("peercert") or {}
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()
    return [str(v) for k, v in cert.get("subjectAltName", ()) if k in ("DNS", "IP Address")]


def mismatch_detail(host: str, names: list[str] | None) -> str:
    has = ", ".join(names[:_MAX_SHOWN]) + (" ..." if len(names) > _MAX_SHOWN else "") if names else "no names"
    return (
        f"the server's certificate does not name {host}; it names {has}: dial one of those with --server, "
        f"or add {host} to server_names in the service's config (a self-issued certificate is "
        "reissued at the next start; with tls.cert_file, to that certificate's SANs)"
    )
