"""Ask TLS clients for a certificate without letting OpenSSL refuse a bad one.

With the ssl module as is, a client certificate that does not verify (expired, not yet valid, from
a look-alike CA, from a CA that left the bundle) cuts the handshake, and the node sees a reset
instead of the documented 403 ``svid_invalid``. The ssl module has no verify callback, so one is
installed on the context's ``SSL_CTX`` through ctypes: it accepts every chain, and the service
judges the certificate itself, as it always did (``svid.verify_svid`` on renewal and on the admin
API, which check the chain to the current roots, the validity window and the SPIFFE rules). The
handshake still proves that the client holds the certificate's key (CertificateVerify is checked
by OpenSSL regardless of the callback).

Fail safe: when the ``SSL_CTX`` cannot be found with certainty (another Python implementation or
layout, no OpenSSL symbols), nothing is changed and OpenSSL keeps refusing bad chains in the
handshake, which is stricter, only less helpful.
"""

from __future__ import annotations

import _ssl  # the stdlib's extension module: its OpenSSL is the one the ssl module uses
import ctypes
import logging
import platform
import ssl
import sys
from typing import Final

log = logging.getLogger("nodegate.server")

_VERIFY_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p)
_MODES: Final = {ssl.CERT_NONE: 0, ssl.CERT_OPTIONAL: 1, ssl.CERT_REQUIRED: 3}  # SSL_VERIFY_* bits


def _accept(_preverify_ok: int, _store_ctx: int | None) -> int:
    return 1  # judged by the application: see the module docstring


_accept_chain = _VERIFY_CALLBACK(_accept)  # kept alive here: OpenSSL holds a pointer to it


def _libssl() -> ctypes.CDLL | None:
    try:
        lib = ctypes.CDLL(_ssl.__file__)
        for name, res, args in (
            ("SSL_CTX_get_options", ctypes.c_uint64, [ctypes.c_void_p]),
            ("SSL_CTX_get_verify_mode", ctypes.c_int, [ctypes.c_void_p]),
            ("SSL_CTX_get_verify_callback", ctypes.c_void_p, [ctypes.c_void_p]),
            ("SSL_CTX_set_verify", None, [ctypes.c_void_p, ctypes.c_int, _VERIFY_CALLBACK]),
        ):
            fn = getattr(lib, name)
            fn.restype = res
            fn.argtypes = args
    except (OSError, AttributeError, TypeError):
        return None
    return lib


def _ssl_ctx(ctx: ssl.SSLContext, lib: ctypes.CDLL) -> int | None:
    """The ``SSL_CTX *`` of ``ctx``: CPython's PySSLContext holds it right after the object
    header. Confirmed by reading the options and verify mode back through OpenSSL."""
    if platform.python_implementation() != "CPython" or not (3, 10) <= sys.version_info[:2] <= (3, 14):
        return None
    ptr = ctypes.c_void_p.from_address(id(ctx) + object.__basicsize__).value
    if not ptr:
        return None
    if int(lib.SSL_CTX_get_options(ptr)) != int(ctx.options):
        return None
    if int(lib.SSL_CTX_get_verify_mode(ptr)) != _MODES[ctx.verify_mode]:
        return None
    return int(ptr)


def request_without_verifying(ctx: ssl.SSLContext) -> bool:
    """Ask for a client certificate (``CERT_OPTIONAL``) and accept any chain in the handshake.
    False when it could not be arranged (the handshake then verifies, as before)."""
    ctx.verify_mode = ssl.CERT_OPTIONAL
    lib = _libssl()
    ptr = _ssl_ctx(ctx, lib) if lib is not None else None
    if lib is None or ptr is None:
        log.warning(
            "client certificates are verified in the TLS handshake: a bad SVID cuts the connection "
            "instead of getting 403 svid_invalid (no OpenSSL verify callback on this Python)"
        )
        return False
    lib.SSL_CTX_set_verify(ptr, _MODES[ssl.CERT_OPTIONAL], _accept_chain)
    installed = lib.SSL_CTX_get_verify_callback(ptr)
    return bool(installed) and installed == ctypes.cast(_accept_chain, ctypes.c_void_p).value
