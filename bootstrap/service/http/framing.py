"""HTTP/1.1 request framing for the admission listener (RFC 9112), strict and small.

The admission listener has one client, the Kubernetes API server (Go's ``net/http``): an
origin-form ``POST`` with ``Content-Length``, CRLF line ends, a handful of header fields. This
module reads exactly that grammar and refuses the rest with a status, a machine code and a
one-line detail (:class:`FramingError`); the connection is closed after such an answer, since
its framing can no longer be trusted. Pure functions over bytes: no I/O, no clock.

What is refused, and why (docs/admission.md, "The admission listener's HTTP"):

- a request head over ``MAX_HEAD_BYTES`` or with more than ``MAX_FIELDS`` fields (431);
- a request line that is not ``token SP origin-form SP HTTP/1.x`` (400; a line without a version,
  HTTP/0.9's simple request, is one), but a request line ``token SP target SP HTTP/d.d`` of
  another major version (HTTP/0.9, HTTP/2.0, the h2 preface ``PRI * HTTP/2.0``) is 505;
- a field whose name is not a token, with whitespace before the colon, a folded line (obs-fold),
  a bare CR or LF, or a control character in its value (400, RFC 9112 sections 5.1 and 5.2);
- no ``Host`` in an HTTP/1.1 request, or two ``Host`` lines in any (400, RFC 9112 section 3.2);
- ``Content-Type``, ``Content-Encoding`` or ``Expect`` twice (400: the listener acts on these,
  and which line counts would be a guess);
- ``Transfer-Encoding`` (411: reviews carry ``Content-Length``; RFC 9112 section 6.3 lets a
  server require it), and ``Content-Length`` values that disagree or are not digits (400);
- ``Expect`` other than ``100-continue`` (417; in an HTTP/1.0 request ``Expect`` is ignored).

What is accepted as Go, curl and aiohttp's client send it: empty lines before the request line
(RFC 9112 section 2.2), any field order, repeated identical ``Content-Length`` values, a query
string (the API server appends ``?timeout=10s`` to the webhook URL), HTTP/1.0 (closed after its
answer unless it asks for keep-alive; ``Host`` optional).

A head still incomplete is refused as soon as it cannot become a valid one (``head_end``): a bare
CR or LF in it (an LF-only client would otherwise wait for the deadline; RFC 9112 section 2.2 lets
a server take a bare LF as a line end, this one refuses it at once, as llhttp does), its request
line once that line has ended, or a first byte that cannot begin a method.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

MAX_HEAD_BYTES: Final = 16 * 1024  # Go's client sends ~200 bytes; aiohttp's own limit is 8 KiB a line
MAX_FIELDS: Final = 100
HEAD_END: Final = b"\r\n\r\n"

_BLANK_LINES = re.compile(rb"(?:\r\n)*")
_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_REQUEST_LINE = re.compile(rb"(" + _TOKEN + rb") (/[\x21-\x7e]*) HTTP/1\.([0-9])")
# Another major version, any target: 505, not 400 (RFC 9110 section 15.6.6).
_VERSIONED_LINE = re.compile(_TOKEN + rb" [\x21-\x7e]+ HTTP/[02-9]\.[0-9]")
# What a head may begin with: a method's first byte (a token's), or the CR of an empty line whose
# LF has not arrived yet.
_HEAD_START = frozenset(b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz\r")
# Every field line at once: name ":" value CRLF, the value without control characters (HTAB
# aside; obs-text 0x80-0xff allowed, RFC 9110 section 5.5). No quantifier can take what the next
# one needs, so the match is linear in the head's length.
_FIELD_LINES = re.compile(rb"(?:" + _TOKEN + rb":[^\x00-\x08\x0a-\x1f\x7f]*\r\n)*")
# The fields the listener acts on, out of lines already found well formed.
_WANTED = re.compile(
    rb"^(content-length|content-type|transfer-encoding|content-encoding|connection|expect|host):([^\r]*)\r\n",
    re.IGNORECASE | re.MULTILINE,
)


class FramingError(Exception):
    """A request the listener does not frame: answered with ``status`` and ``code``, then the
    connection is closed."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail


def _malformed(detail: str) -> FramingError:
    return FramingError(400, "malformed_request", detail)


@dataclass(slots=True)
class RequestHead:
    method: str
    path: str  # the request target without its query
    content_length: int
    content_type: str  # the media type, lowercase, without parameters; "" when absent
    content_encoding: str  # as sent (stripped); "" when absent
    expect_continue: bool
    keep_alive: bool  # False: the client asked to close (or HTTP/1.0 without keep-alive)


def head_end(buffer: bytes | bytearray, start: int = 0, checked: int = 0) -> int:
    """The index just past the head's blank line, -1 while it is incomplete; FramingError when
    the head is already longer than MAX_HEAD_BYTES, or can no longer become a valid head.

    ``checked``: the buffer's length when this head was last found incomplete (0: never), for a
    caller that only appended to the buffer since. Only what came after it is searched and
    checked (but an unended request line, searched from its start), not the whole head again."""
    at = buffer.find(HEAD_END, max(start, checked - 3), start + MAX_HEAD_BYTES + len(HEAD_END))
    if at >= 0:
        return at + len(HEAD_END)
    if len(buffer) - start > MAX_HEAD_BYTES:
        raise FramingError(431, "malformed_request", f"request heads are limited to {MAX_HEAD_BYTES} bytes")
    if len(buffer) > start:
        _check_partial(buffer, start, max(start, checked))
    return -1


def _check_partial(buffer: bytes | bytearray, start: int, since: int) -> None:
    """A head not yet ended (all of ``buffer[start:]``, at most MAX_HEAD_BYTES; ``since``: the end
    of what an earlier call checked) is refused now when no more bytes can make it valid, as
    ``parse_head`` would refuse it then: a bare CR or LF (an LF-only client waited for the
    deadline, issue 41), its request line once ended, a first byte that begins no method."""
    if buffer[start] not in _HEAD_START:
        raise _malformed("the request line is not METHOD /path HTTP/1.1")
    # Every LF must close a CRLF, every CR open one (but the last byte's, whose LF may follow).
    # A CR that was the last byte checked before is counted again, with what follows it now.
    fresh = since - 1 if since > start and buffer[since - 1] == 0x0D else since
    crlf = buffer.count(b"\r\n", fresh)
    if buffer.count(b"\n", fresh) != crlf or buffer.count(b"\r", fresh, len(buffer) - 1) != crlf:
        raise _malformed("a line does not end in CRLF (a bare LF or CR)")
    eol = buffer.find(b"\r\n", start)
    if eol >= 0 and eol + 2 > since:  # the request line has ended since the last check
        _request_line(bytes(buffer[start:eol]))


def skip_blank_lines(buffer: bytes | bytearray, start: int) -> int:
    """Past the CRLFs a client may send before a request line (RFC 9112 section 2.2);
    FramingError past MAX_HEAD_BYTES of them (without a bound, a stream of CRLFs would be read
    for the whole request deadline, each byte costing more than a body's)."""
    if buffer[start : start + 1] != b"\r":  # the usual case: no empty line (0.3 µs a review)
        return start
    found = _BLANK_LINES.match(buffer, start, start + MAX_HEAD_BYTES + 2)
    end = found.end() if found is not None else start
    if end - start > MAX_HEAD_BYTES:
        raise _malformed(f"more than {MAX_HEAD_BYTES} bytes of empty lines before the request line")
    return end


def parse_head(head: bytes) -> RequestHead:
    """The head of one request: its request line and fields, without the blank line that ends it."""
    eol = head.find(b"\r\n")
    fields = head[eol + 2 :] + b"\r\n" if eol >= 0 else b""
    if fields.count(b"\r\n") > MAX_FIELDS:
        raise FramingError(431, "malformed_request", f"requests are limited to {MAX_FIELDS} header fields")
    line = _request_line(head if eol < 0 else head[:eol])
    if _FIELD_LINES.fullmatch(fields) is None:
        raise _malformed(
            "a header field is malformed (name, colon, value; no folding, no control characters)"
        )
    http10 = line.group(3) == b"0"
    lengths: list[bytes] = []
    connection = b""
    content_type: bytes | None = None
    content_encoding: bytes | None = None
    expect: bytes | None = None
    hosts = 0
    for raw_name, raw_value in _WANTED.findall(fields):
        name = raw_name.lower()
        value = raw_value.strip(b" \t")
        if name == b"content-length":
            lengths += value.split(b",")
        elif name == b"host":
            hosts += 1
        elif name == b"content-type":
            if content_type is not None:
                raise _repeated("Content-Type")
            content_type = value
        elif name == b"transfer-encoding":
            raise FramingError(
                411, "malformed_request", "Transfer-Encoding is not accepted; send Content-Length"
            )
        elif name == b"content-encoding":
            if content_encoding is not None:
                raise _repeated("Content-Encoding")
            content_encoding = value
        elif name == b"connection":
            connection = connection + b"," + value if connection else value
        else:
            if expect is not None:
                raise _repeated("Expect")
            expect = value
    if hosts != 1 and (hosts or not http10):
        raise _malformed("a request has one Host field (HTTP/1.0: at most one)")
    return RequestHead(
        line.group(1).decode("ascii"),
        line.group(2).split(b"?", 1)[0].decode("ascii"),
        _content_length(lengths),
        (content_type or b"").split(b";", 1)[0].strip(b" \t").lower().decode("latin-1"),
        (content_encoding or b"").decode("latin-1"),
        not http10 and _expect_continue(expect or b""),  # HTTP/1.0: ignored (RFC 9110 10.1.1)
        _keep_alive(connection, http10),
    )


def _request_line(line: bytes) -> re.Match[bytes]:
    found = _REQUEST_LINE.fullmatch(line)
    if found is not None:
        return found
    if _VERSIONED_LINE.fullmatch(line) is not None:  # HTTP/0.9, HTTP/2.0, the h2 preface's PRI *
        raise FramingError(505, "malformed_request", "only HTTP/1.1 (and 1.0) is served here")
    raise _malformed("the request line is not METHOD /path HTTP/1.1")


def _repeated(name: str) -> FramingError:
    return _malformed(f"{name} is sent once (a second {name} line is refused, not guessed between)")


# A head's one Content-Length field, its value plain digits (what the API server sends).
_ONE_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*([0-9]{1,18})[ \t]*(?:\r\n|\Z)", re.IGNORECASE)
_ANY_LENGTH = re.compile(rb"content-length", re.IGNORECASE)


class HeadReader:
    """``parse_head`` for one listener, remembering heads that differ only in their length.

    The API server sends the same head for every review but for the digits of Content-Length.
    A head with exactly one ``content-length`` in it whose value is plain digits is looked up
    with those digits cut out: the rest of the head is then byte for byte one that
    ``parse_head`` read before, and the digits (1 to 18 of them, nothing else) can neither make
    it fail nor change any other field, so its result is that head's with this length. Every
    other head is parsed in full. At most ``size`` heads are kept (the first ones seen)."""

    def __init__(self, size: int = 64) -> None:
        self._size = size
        self._known: dict[bytes, RequestHead] = {}

    def parse(self, head: bytes) -> RequestHead:
        span = _length_digits(head)
        if span is None:
            return parse_head(head)
        start, end = span
        key = head[:start] + head[end:]
        known = self._known.get(key)
        # Only the key of a head with one ``content-length`` is kept (below). Cutting digits
        # neither makes nor unmakes the name, so a head with two keeps both in its key, which
        # then matches no kept one: the lookup needs no count of its own (0.9 µs a review).
        if known is not None:
            k = known
            length = int(head[start:end])
            return RequestHead(
                k.method, k.path, length, k.content_type, k.content_encoding, k.expect_continue, k.keep_alive
            )
        parsed = parse_head(head)
        if len(self._known) < self._size and len(_ANY_LENGTH.findall(head)) == 1:
            self._known[key] = parsed
        return parsed


def _length_digits(head: bytes) -> tuple[int, int] | None:
    """Where the digits of the head's first ``content-length`` field are, when they are all its
    value. Go writes it ``Content-Length: N``, found without a regex (0.15 µs a review); any other
    spelling by ``_ONE_LENGTH``, which finds the same digits in that one."""
    at = head.find(b"\r\nContent-Length: ")
    if at >= 0:
        begin = at + 18
        stop = head.find(b"\r\n", begin)
        stop = len(head) if stop < 0 else stop
        if 0 < stop - begin <= 18 and head[begin:stop].isdigit():
            return begin, stop
    found = _ONE_LENGTH.search(head)
    return None if found is None else found.span(1)


def _content_length(values: list[bytes]) -> int:
    if not values:
        return 0
    first = values[0].strip(b" \t")
    for raw in values:
        value = raw.strip(b" \t")
        if not value.isdigit() or len(value) > 18 or value != first:
            raise _malformed("Content-Length is not one decimal number")
    return int(first)


def _expect_continue(expect: bytes) -> bool:
    if not expect:
        return False
    if expect.lower() != b"100-continue":
        raise FramingError(417, "malformed_request", "only Expect: 100-continue is understood")
    return True


def _keep_alive(connection: bytes, http10: bool) -> bool:
    options = {option.strip(b" \t").lower() for option in connection.split(b",")} if connection else set()
    if b"close" in options:
        return False
    return b"keep-alive" in options if http10 else True
