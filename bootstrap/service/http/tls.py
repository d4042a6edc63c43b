"""TLS for the listeners' connections, on memory BIOs, with a bounded footprint.

Why not ``loop.start_tls``: asyncio's TLS protocol gives every connection a 256 KiB read buffer
(``SSLProtocol.max_size``, zero-filled, so resident) and lets 256 KiB of ciphertext queue in and
512 KiB of plaintext queue out before it pushes back. An idle TLS connection cost about 270 KiB,
so the 2,048 join and 512 admission connections the listeners allow would take about 690 MiB, over
the chart's 512Mi memory limit, before any request (issue 41, finding 4). Here a connection holds
its ``ssl.SSLObject`` (OpenSSL frees its record buffers between records), what arrived and is not
yet decrypted (at most one read, 64 KiB, plus a partial record: the socket is not read while the
handler does not take what was decrypted), and the ciphertext the kernel has not taken (the raw
transport's own buffer, whose limits the handler sees).

:class:`TlsSession` is the state of one connection's TLS (handshake, decrypt, encrypt), without
I/O; :class:`TlsTransport` is what the connection's handler (aiohttp's request handler, or the
admission listener's ``ReviewProtocol``) writes to, in front of the raw TCP transport.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable
from typing import Any, Final, Protocol

READ_BYTES: Final = 64 * 1024  # plaintext handed to the handler at once, at most
# Ciphertext that waits while the handler does not read: past it, the socket is not read either.
PENDING_BYTES: Final = 64 * 1024

_SSL_ERRORS = (ssl.SSLError, ssl.CertificateError)


class TlsFailed(Exception):
    """The peer broke the TLS protocol (a bad record, a failed handshake): close the connection."""


class TlsSession:
    """One server-side TLS connection over memory BIOs: bytes in from the socket, plaintext out
    to the handler, plaintext in from the handler, bytes out to the socket."""

    __slots__ = ("_incoming", "_outgoing", "context", "handshaken", "obj", "peer_closed")

    def __init__(self, context: ssl.SSLContext) -> None:
        self.context = context
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self.obj = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self.handshaken = False
        self.peer_closed = False  # its close_notify came: nothing more to decrypt

    def feed(self, data: bytes) -> None:
        self._incoming.write(data)

    def pending(self) -> int:
        """Ciphertext received and not yet decrypted."""
        return self._incoming.pending

    def handshake(self) -> bool:
        """Advance the handshake with what was fed; True once it is done. TlsFailed when the
        peer's bytes or certificate are refused."""
        try:
            self.obj.do_handshake()
        except ssl.SSLWantReadError:
            return False
        except (*_SSL_ERRORS, ValueError) as exc:
            raise TlsFailed(str(exc)) from exc
        self.handshaken = True
        return True

    def read(self) -> bytes | None:
        """Plaintext decrypted from what was fed (at most READ_BYTES), b"" when none is complete
        yet, None at the peer's close_notify. TlsFailed on a bad record."""
        if self.peer_closed:
            return None
        try:
            data = self.obj.read(READ_BYTES)
        except ssl.SSLWantReadError:
            return b""  # no whole record yet
        except ssl.SSLZeroReturnError:
            data = b""
        except _SSL_ERRORS as exc:
            raise TlsFailed(str(exc)) from exc
        if not data:  # Python reads the peer's close_notify as b"" (asyncio's TLS does the same)
            self.peer_closed = True
            return None
        return data

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Encrypt ``data`` (all of it: a memory BIO takes any amount)."""
        view = memoryview(data)
        try:
            while view:
                view = view[self.obj.write(view) :]
        except _SSL_ERRORS as exc:
            raise TlsFailed(str(exc)) from exc

    def close_notify(self) -> None:
        """Queue our close_notify (the peer's answer is not waited for)."""
        try:
            self.obj.unwrap()
        except (ssl.SSLWantReadError, *_SSL_ERRORS, ValueError):
            pass  # ours is queued; the peer's is not needed to close

    def take(self) -> bytes:
        """Ciphertext to send."""
        return self._outgoing.read() if self._outgoing.pending else b""


class Owner(Protocol):
    """What the transport needs of the connection that owns it (``listener.Connection``)."""

    def tls_pause_reading(self) -> None: ...

    def tls_resume_reading(self) -> None: ...

    def tls_send(self) -> None: ...

    def tls_close(self) -> None: ...


class TlsTransport(asyncio.Transport):
    """The handler's transport: writes are encrypted and sent on the raw transport; the rest
    (buffer sizes and limits, the peer's address, closing) is the raw transport's."""

    def __init__(
        self, owner: Owner, session: TlsSession, raw: asyncio.Transport, protocol: asyncio.BaseProtocol
    ) -> None:
        super().__init__()
        self._owner = owner
        self._session = session
        self._raw = raw
        self._protocol = protocol
        self._closing = False
        self._reading = True

    # -- asyncio.BaseTransport -----------------------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        obj = self._session.obj
        if name == "ssl_object":
            return obj
        if name == "sslcontext":
            return self._session.context
        if name == "peercert":
            return obj.getpeercert()
        if name == "cipher":
            return obj.cipher()
        if name == "compression":
            return obj.compression()
        return self._raw.get_extra_info(name, default)

    def is_closing(self) -> bool:
        return self._closing or self._raw.is_closing()

    def close(self) -> None:
        """Our close_notify after what was written, then the raw transport closes once it has
        sent everything."""
        if self._closing:
            return
        self._closing = True
        self._session.close_notify()
        self._owner.tls_send()
        self._owner.tls_close()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        raise NotImplementedError("a listener's TLS transport keeps its protocol")

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    # -- reading ---------------------------------------------------------------------------

    def is_reading(self) -> bool:
        return self._reading and not self.is_closing()

    def pause_reading(self) -> None:
        if self._reading:
            self._reading = False
            self._owner.tls_pause_reading()

    def resume_reading(self) -> None:
        if not self._reading:
            self._reading = True
            self._owner.tls_resume_reading()

    def socket_reading(self) -> bool:
        """The raw socket is read (False while the handler does not take what was decrypted)."""
        return self._raw.is_reading()

    def ciphertext_pending(self) -> int:
        """Received and not yet decrypted (bounded: the module's docstring)."""
        return self._session.pending()

    # -- writing ---------------------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or not data:
            return
        try:
            self._session.write(data)
        except TlsFailed:
            self.abort()
            return
        self._owner.tls_send()

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        self.write(b"".join(list_of_data))

    def can_write_eof(self) -> bool:
        return False  # TLS has close_notify (close), not a half-close

    def write_eof(self) -> None:
        raise NotImplementedError("TLS cannot half-close; use close()")

    def abort(self) -> None:
        self._closing = True
        self._raw.abort()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._raw.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._raw.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._raw.get_write_buffer_limits()
