"""The admission listener's framing against h11 (issue 41): the same bytes, cut at the same points,
through nodegate's connection protocol (``ReviewProtocol`` and its ``framing``) and through h11's
server side must give the same requests (method, path, Content-Length, every body byte for byte:
the body boundaries) and the same end (refused, closed after an answer, or waiting for more).

The inputs: pipelines of one to four requests from a grammar of plausible heads (each a valid
request with up to two defects: methods, targets and versions good and bad; Host, Content-Length,
Transfer-Encoding, Content-Type, Content-Encoding, Expect and Connection missing, repeated or
odd; CR/LF variants, NUL and other control characters, obs-fold; bodies shorter or longer than
declared, so that one request's extra bytes are the next one's start), requests whose length is
in doubt followed by more, the API server's own head again and again with other lengths (the head
memo), all of them mutated byte by byte, and raw bytes. They are fed in chunks cut at arbitrary
points. The smuggling shapes of issue 41's red team are run every time as well.

Where the two differ, the difference must be one RFC 9112 leaves to the server (or one this
listener chose and documents, marked so below), recognised in the head of the first request they
do not read alike. Never tolerated: a request both read with another method, path, length or body
(a boundary elsewhere is request smuggling); nodegate left waiting where h11 read a request, or
refusing it without a reason below; nodegate reading what h11 refuses outside the two classes
at the end.

nodegate refuses (or refuses sooner) what h11 reads:

- ``bare_lf``: a line ending in LF alone. RFC 9112 section 2.2 lets a recipient take it as a line
  end (h11 does); nodegate answers 400 at once, as llhttp does (LF-only clients waited for the
  deadline before, issue 41 finding 7).
- ``bare_cr``: a CR not before LF (RFC 9112 section 2.2: invalid, or replaced by SP); h11 refuses
  it too, but only once the head has ended.
- ``obs_fold``: a folded field line. RFC 9112 section 5.2: reject with 400, or replace by SP (h11).
- ``transfer_encoding`` (the listener's choice): 411, send Content-Length (RFC 9110 section
  15.5.12); h11 reads chunked bodies, as RFC 9112 section 7.1 expects of a recipient. The API
  server always sends Content-Length; docs/admission.md.
- ``target_form`` (the listener's choice): a target other than origin-form is 400. RFC 9112
  section 3.2.2 asks a server to accept absolute-form too; the API server sends only origin-form.
  h11 leaves the target to its user.
- ``other_version``: another major version, 505 (RFC 9110 section 15.6.6); h11 leaves the version
  to its user. ``http1x_host``: h11 requires Host of exactly HTTP/1.1, nodegate of every HTTP/1.x
  but 1.0 (RFC 9112 section 3.2; RFC 9110 section 2.5: 1.2 is processed as 1.1).
- ``control_char``: a control character in a field value (invalid, RFC 9110 section 5.5); h11
  admits most of them (its issue 57: a cookie with 0x01 in it).
- ``repeated_field``: Content-Type, Content-Encoding or Expect twice (issue 41 finding 6: the
  listener acts on each and will not guess which counts). ``expect_other``: an Expect other than
  ``100-continue``, 417 (RFC 9110 section 10.1.1); h11 ignores Expect.
- ``limits``: a head within 64 bytes of 16 KiB or over it (each parser counts it its own way),
  over 100 field lines (nodegate's 431), a Content-Length of 19 or 20 digits (h11 takes 20).
- an unfinished head that cannot become valid (a request line without a version, a first byte no
  method begins with): nodegate refuses it at once, h11 once it ends. Checked, not assumed: h11
  must refuse the same bytes with an empty line added.

h11 refuses what nodegate reads:

- ``leading_empty_line``: empty lines before a request line. RFC 9112 section 2.2: a server
  SHOULD ignore at least one (nodegate skips CRLFs, up to 16 KiB); h11 refuses them.
- ``limits`` as above.

h11 closes where nodegate goes on: an HTTP/1.0 request with ``Connection: keep-alive``. h11 never
keeps an HTTP/1.0 connection (a server may close after any answer, RFC 9112 section 9.6);
nodegate keeps it as asked (section 9.3) and reads the next request.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import h11
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from bootstrap.service.http.framing import (
    MAX_FIELDS,
    MAX_HEAD_BYTES,
    RequestHead,
    head_end,
    parse_head,
    skip_blank_lines,
)
from bootstrap.service.webhook.app import Answer, ReadBody
from tests.service.test_review_protocol import connect

# method, path (without the query), Content-Length (-1: chunked), the body (None: not all here)
Read = tuple[str, str, int, bytes | None]


@dataclass
class Outcome:
    requests: list[Read] = field(default_factory=list)
    end: str = "waiting"  # "refused", "closed" (after an answer) or "waiting" (for more bytes)


# -- nodegate ---------------------------------------------------------------------------------


class Record:
    """Reads every body and answers 200; what it was given is the framing's reading."""

    def __init__(self) -> None:
        self.reads: list[list[Any]] = []
        self.done = 0

    async def answer(self, head: RequestHead, read: ReadBody) -> Answer:
        entry: list[Any] = [head.method, head.path, head.content_length, None]
        self.reads.append(entry)
        # No time passes in these runs: a deadline that never fires (the framing is under test).
        entry[3] = await read(3600.0) if head.content_length else b""
        self.done += 1
        return Answer(200, b"{}")


def nodegate_reads(chunks: list[bytes]) -> Outcome:
    async def run() -> Outcome:
        app = Record()
        proto, wire = connect(app)
        for chunk in chunks:
            proto.data_received(chunk)
            seen, still = None, 0
            while still < 4:  # until nothing moves: a task, its done callback, the next request
                await asyncio.sleep(0)
                now = (len(wire.out), len(app.reads), app.done)
                still = still + 1 if now == seen else 0
                seen = now
        requests: list[Read] = [(m, p, n, b) for m, p, n, b in app.reads]
        if b"Content-Type: application/problem+json" in wire.out:  # a refusal: always the last answer
            return Outcome(requests, "refused")
        return Outcome(requests, "closed" if wire.closed else "waiting")

    return asyncio.run(run())


# -- h11 --------------------------------------------------------------------------------------


def _h11_length(event: h11.Request) -> int:
    for name, value in event.headers:
        if name == b"transfer-encoding":
            return -1
        if name == b"content-length":
            return int(value)
    return 0


def h11_reads(chunks: list[bytes]) -> Outcome:
    conn = h11.Connection(h11.SERVER)
    out = Outcome()
    body = bytearray()
    for chunk in chunks:
        conn.receive_data(chunk)
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError:
                out.end = "refused"
                return out
            if event is h11.NEED_DATA:
                break
            if isinstance(event, h11.Request):
                path = event.target.split(b"?", 1)[0].decode("ascii")
                out.requests.append((event.method.decode("ascii"), path, _h11_length(event), None))
                body = bytearray()
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                method, path, length, _ = out.requests[-1]
                out.requests[-1] = (method, path, length, bytes(body))
                conn.send(h11.Response(status_code=200, headers=[(b"content-length", b"0")]))
                conn.send(h11.EndOfMessage())
                if conn.our_state is h11.MUST_CLOSE:
                    out.end = "closed"
                    return out
                conn.start_next_cycle()
            else:  # PAUSED or ConnectionClosed: neither is reachable here
                pytest.fail(f"h11 gave {event!r}")
    return out


# -- the differences RFC 9112 leaves open ------------------------------------------------------

_FIELD = r"(?im)^{}[ \t]*:"


def _has(name: str) -> Callable[[bytes], int]:
    pattern = re.compile(_FIELD.format(name).encode())
    return lambda head: len(pattern.findall(head))


_HOSTS, _TE, _EXPECTS = _has("host"), _has("transfer-encoding"), _has("expect")
_REPEATABLE_NOT = (_has("content-type"), _has("content-encoding"), _EXPECTS)
_EXPECT_VALUE = re.compile(rb"(?im)^expect[ \t]*:[ \t]*([^\r\n]*?)[ \t]*\r?$")
_LONG_LENGTH = re.compile(rb"(?im)^content-length[ \t]*:[^\r\n]*[0-9]{19}")
_KEEP_ALIVE = re.compile(rb"(?im)^connection[ \t]*:[^\r\n]*keep-alive")


def _head_of(rest: bytes) -> bytes:
    """The first request's head in ``rest`` as either parser ends it (the later of the two; all
    of ``rest`` when neither ends it)."""
    crlf = rest.find(b"\r\n\r\n")
    lf = re.search(rb"\n\r?\n", rest)
    end = max(crlf + 4 if crlf >= 0 else 0, lf.end() if lf else 0)
    return rest[: end or len(rest)]


def reasons(rest: bytes) -> set[str]:
    """The differences RFC 9112 leaves open found in the head at the start of ``rest``."""
    found = set()
    if rest[:1] in (b"\r", b"\n"):
        found.add("leading_empty_line")
    head = _head_of(rest[skip_blank_lines(rest, 0) :] if rest.startswith(b"\r\n") else rest)
    line = re.split(rb"\r?\n", head, maxsplit=1)[0]
    if re.search(rb"(?<!\r)\n", head):
        found.add("bare_lf")
    if re.search(rb"\r(?!\n)", head):
        found.add("bare_cr")
    if re.search(rb"\n[ \t]", head):
        found.add("obs_fold")
    if _TE(head):
        found.add("transfer_encoding")
    target = re.fullmatch(rb"[^ ]+ ([^ ]*) HTTP/[0-9]\.[0-9]", line)
    if target is not None and not target[1].startswith(b"/"):
        found.add("target_form")
    if re.search(rb"HTTP/[02-9]\.[0-9]$", line):
        found.add("other_version")
    if re.search(rb"HTTP/1\.[2-9]$", line) and not _HOSTS(head):
        found.add("http1x_host")
    if re.search(rb"[\x01-\x08\x0b\x0c\x0e-\x1f\x7f]", head):
        found.add("control_char")
    if any(count(head) > 1 for count in _REPEATABLE_NOT):
        found.add("repeated_field")
    if any(v.lower() != b"100-continue" for v in _EXPECT_VALUE.findall(head)):
        found.add("expect_other")
    if len(head) >= MAX_HEAD_BYTES - 64 or head.count(b"\n") > MAX_FIELDS or _LONG_LENGTH.search(head):
        found.add("limits")
    return found


NODEGATE_STRICTER = {
    "bare_lf",
    "bare_cr",
    "obs_fold",
    "transfer_encoding",
    "target_form",
    "other_version",
    "http1x_host",
    "control_char",
    "repeated_field",
    "expect_other",
    "limits",
}
H11_STRICTER = {"leading_empty_line", "limits"}


def _offset(stream: bytes, count: int) -> int:
    """Where request ``count`` begins: past the heads and bodies of those before it (which both
    parsers read alike, so nodegate's framing finds them)."""
    at = 0
    for _ in range(count):
        start = skip_blank_lines(stream, at)
        end = head_end(stream, start)
        at = end + parse_head(stream[start : end - 4]).content_length
    return at


def check_agreement(stream: bytes, chunks: list[bytes], label: Callable[[str], object] = str) -> None:
    """Both parsers read the same of ``stream`` fed as ``chunks``, or differ as the docstring
    allows; ``label`` is told which (Hypothesis's statistics)."""
    ours, theirs = nodegate_reads(chunks), h11_reads(chunks)
    same = 0
    while same < min(len(ours.requests), len(theirs.requests)) and (
        ours.requests[same] == theirs.requests[same]
    ):
        same += 1
    if same == len(ours.requests) == len(theirs.requests) and ours.end == theirs.end:
        label(f"agree: {min(same, 3)}+ requests read, then {ours.end}")
        return
    story = f"nodegate {ours}\nh11      {theirs}"
    # A request both parsers began to read, read otherwise: a body boundary elsewhere.
    assert same == min(len(ours.requests), len(theirs.requests)), story
    rest = stream[_offset(stream, same) :]
    why = reasons(rest)
    story += f"\nrequest {same}: {rest[:120]!r}, differences RFC 9112 leaves open: {sorted(why)}"
    label(f"differ: nodegate {ours.end}, h11 {theirs.end}; {' '.join(sorted(why)) or 'none'}")
    if theirs.end == "closed" and len(theirs.requests) == same:
        # h11 closed after the last request both read; nodegate kept the connection.
        last = _head_of(stream[_offset(stream, same - 1) :])
        assert re.search(rb"HTTP/1\.0\r?\n", last), story
        assert _KEEP_ALIVE.search(last), story
    elif len(theirs.requests) > same or (ours.end, theirs.end) == ("refused", "waiting"):
        # h11 read (or waits for) a request nodegate refused: refused, never left waiting.
        assert len(ours.requests) == same, story
        assert ours.end == "refused", story
        if not why & NODEGATE_STRICTER:  # refused sooner: h11 refuses it once the head ends
            finished = h11_reads([*chunks, b"\r\n\r\n"])
            assert (finished.end, len(finished.requests)) == ("refused", same), story
    else:  # nodegate read (or waits for) what h11 refused
        assert theirs.end == "refused", story
        assert why & H11_STRICTER, story


# -- the inputs ---------------------------------------------------------------------------------

# A request as the API server (or curl) sends it, in a few valid shapes ...
GOOD_LINES = st.sampled_from(
    [
        (b"POST", b"/admission/validate?timeout=10s", b"HTTP/1.1"),
        (b"POST", b"/admission/mutate", b"HTTP/1.1"),
        (b"GET", b"/readyz", b"HTTP/1.1"),
        (b"HEAD", b"/readyz", b"HTTP/1.0"),
        (b"POST", b"/", b"HTTP/1.0"),
        (b"get", b"/x?a=b", b"HTTP/1.1"),  # a method is any token, case and all
    ]
)
GOOD_FIELDS = st.sampled_from(
    [
        b"Accept: application/json, */*",
        b"Connection: close",
        b"Connection: keep-alive",
        b"Expect: 100-continue",
        b"X-Note: caf\xe9\tau lait",  # obs-text and HTAB in a value
        b"x-empty:",
        b"Content-Encoding: identity",
    ]
)
# ... and what can go wrong with one (each request gets up to two of these).
BAD_METHODS = [b"P(ST", b"", b"PO\x00ST", b"PRI", b"G T"]
BAD_TARGETS = [b"*", b"http://x/y", b"x:443", b"/a b", b"/\x80", b"", b"/\x00"]
BAD_VERSIONS = [
    b"HTTP/1.2",
    b"HTTP/2.0",
    b"HTTP/0.9",
    b"http/1.1",
    b"HTTP/11",
    b"",
    b"HTTP/1.1\x00",
    b"HTTP/1.1 ",
]
BAD_EOLS = [b"\n", b"\r", b"\r\r\n", b"\n\r", b" \r\n", b"\r\n "]
DEFECTS = [
    "method",
    "target",
    "version",
    "space",
    *["eol"] * 2,
    *["field"] * 2,
    "drop",  # no Host, no Content-Type or no Content-Length
    *["host"] * 3,  # no Host, or two
    "repeat",
    *["length"] * 2,
    *["second_length"] * 4,  # disagreeing lengths, the smuggler's tool
    *["chunked"] * 3,  # Transfer-Encoding with (or instead of) Content-Length
    "fold",
    "body",
    "before",
    "big",
    "many",
]

_VALUES: dict[bytes, list[bytes]] = {
    b"host": [b"nodegate-webhook.nodegate.svc:9443", b"", b"x y"],
    b"transfer-encoding": [b"chunked", b"gzip", b"chunked, identity", b"Chunked"],
    b"content-type": [b"application/json", b"text/plain", b"application/json; charset=utf-8"],
    b"content-encoding": [b"identity", b"gzip", b""],
    b"expect": [b"100-continue", b"100-Continue", b"200-ok", b""],
    b"connection": [b"close", b"keep-alive", b"Keep-Alive, Upgrade", b"", b"closed"],
    b"x-pad": [b"a", b"a\x01b", b"a\x7f", b"a\x00b", b"a\x0bb", b"  spaced  ", b"a\x1fb"],
}
_NAMES = [*_VALUES, b"Content-Length", b"HOST", b"Host ", b"", b"X\x00", b"content-length", b"X-Pad:"]


@st.composite
def length_value(draw: st.DrawFn, length: int) -> bytes:
    return draw(
        st.sampled_from(
            [
                b"%d, %d" % (length, length),
                b"%03d" % length,
                b"%d" % (length + 3),
                b"%d" % max(length - 3, 0),
                b"+%d" % length,
                b"%d," % length,
                b"",
                b"1" + b"0" * 18,
                b"1" + b"0" * 19,
                b"0x10",
                b" %d \t" % length,
                b"-1",
            ]
        )
    )


@st.composite
def field_line(draw: st.DrawFn, length: int) -> bytes:
    name = draw(st.sampled_from(_NAMES))
    key = name.strip().lower()
    if key == b"content-length":
        value = draw(st.one_of(st.just(b"%d" % length), length_value(length)))
    else:
        value = draw(st.sampled_from(_VALUES.get(key, [b"v"])))
    return name + draw(st.sampled_from([b": ", b":", b":\t", b" : "])) + value


@st.composite
def request(draw: st.DrawFn, defects: st.SearchStrategy[list[str]] | None = None) -> bytes:
    """A request: a valid one, then up to two defects."""
    length = draw(st.integers(0, 24))
    method, target, version = draw(GOOD_LINES)
    spaces = [b" ", b" "]
    lines = [
        b"Host: nodegate-webhook.nodegate.svc:9443",
        b"Content-Type: application/json",
        b"Content-Length: %d" % length,
    ]
    lines += draw(st.lists(GOOD_FIELDS, max_size=2, unique=True))
    lines = draw(st.permutations(lines))
    eols = [b"\r\n"] * (len(lines) + 2)  # the request line's, each field's, the blank line's
    before, body = b"", b"x" * length
    for defect in draw(st.lists(st.sampled_from(DEFECTS), max_size=2) if defects is None else defects):
        if defect == "method":
            method = draw(st.sampled_from(BAD_METHODS))
        elif defect == "target":
            target = draw(st.sampled_from(BAD_TARGETS))
        elif defect == "version":
            version = draw(st.sampled_from(BAD_VERSIONS))
        elif defect == "space":
            spaces[draw(st.integers(0, 1))] = draw(st.sampled_from([b"  ", b"\t", b""]))
        elif defect == "eol":
            eols[draw(st.integers(0, len(eols) - 1))] = draw(st.sampled_from(BAD_EOLS))
        elif defect in ("field", "repeat", "fold", "drop", "second_length", "chunked", "host") and (
            len(lines) < len(eols) - 2
        ):
            continue  # a line is gone already: keep one line end per line
        elif defect == "second_length":
            value = draw(length_value(length))
            lines.insert(draw(st.integers(0, len(lines))), b"Content-Length: " + value)
            eols.append(b"\r\n")
        elif defect == "chunked":
            te = draw(st.sampled_from(_VALUES[b"transfer-encoding"]))
            lines.insert(draw(st.integers(0, len(lines))), b"Transfer-Encoding: " + te)
            eols.append(b"\r\n")
            body = draw(st.sampled_from([body, b"5\r\nhello\r\n0\r\n\r\n"]))
        elif defect == "field":
            lines.insert(draw(st.integers(0, len(lines))), draw(field_line(length)))
            eols.append(b"\r\n")
        elif defect == "repeat" and lines:
            lines.insert(draw(st.integers(0, len(lines))), draw(st.sampled_from(lines)))
            eols.append(b"\r\n")
        elif defect == "fold":
            lines.insert(draw(st.integers(0, len(lines))), draw(st.sampled_from([b" folded", b"\tx"])))
            eols.append(b"\r\n")
        elif defect == "drop" and lines:
            del lines[draw(st.integers(0, len(lines) - 1))]
            eols.pop()
        elif defect == "host":
            hosts = [i for i, line in enumerate(lines) if line.lower().startswith(b"host:")]
            if hosts and draw(st.booleans()):
                del lines[hosts[0]]
                eols.pop()
            else:
                host = b"Host: " + draw(st.sampled_from(_VALUES[b"host"]))
                lines.insert(draw(st.integers(0, len(lines))), host)
                eols.append(b"\r\n")
        elif defect == "length":
            at = next((i for i, line in enumerate(lines) if line.startswith(b"Content-Length")), None)
            if at is not None:
                lines[at] = b"Content-Length: " + draw(length_value(length))
        elif defect == "body":
            body = draw(st.sampled_from([body[:-2], body + b"POST", b"5\r\nhello\r\n0\r\n\r\n"]))
        elif defect == "before":
            before = draw(st.sampled_from([b"\r\n", b"\r\n\r\n", b"\n", b"\r"]))
        elif defect == "big":
            size = draw(st.sampled_from([MAX_HEAD_BYTES - 200, MAX_HEAD_BYTES - 80, MAX_HEAD_BYTES + 10]))
            lines[0:0] = [b"X-Big: " + b"a" * size]
            eols.append(b"\r\n")
        elif defect == "many":
            lines[0:0] = [b"X: y"] * (MAX_FIELDS + 1)
            eols += [b"\r\n"] * (MAX_FIELDS + 1)
    parts = [method + spaces[0] + target + spaces[1] + version, *lines, b""]
    head = b"".join(part + eol for part, eol in zip(parts, eols, strict=True))
    return before + head + body


_MUTANTS = b"\r\n \t:,;0123456789/\x00\x01\x7f\x80Hh"


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[bytes]) -> bytes:
    data = bytearray(draw(base))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        byte = draw(st.sampled_from(_MUTANTS))
        kind = draw(st.sampled_from(["insert", "delete", "replace"]))
        if kind == "insert" or at == len(data):
            data[at:at] = bytes([byte])
        elif kind == "delete":
            del data[at]
        else:
            data[at] = byte
    return bytes(data)


_GO = (
    b"POST /admission/validate?timeout=10s HTTP/1.1\r\nHost: nodegate-webhook.nodegate.svc:9443\r\n"
    b"User-Agent: kube-apiserver-admission\r\nContent-Length: 2\r\nAccept: application/json, */*\r\n"
    b"Content-Type: application/json\r\nAccept-Encoding: gzip\r\n\r\n{}"
)


def _review(length: int) -> bytes:
    return _GO.replace(b"Content-Length: 2", b"Content-Length: %d" % length).replace(b"{}", b"x" * length)


PIPELINE = st.lists(request(), min_size=1, max_size=4).map(b"".join)
# The API server's head again and again, only its length changing (the head memo's case).
REVIEWS = st.lists(st.integers(0, 30).map(_review), min_size=2, max_size=4).map(b"".join)
# A request whose length is in doubt, then more: where its body ends decides what comes next.
IN_DOUBT = st.lists(
    st.sampled_from(["second_length", "chunked", "length", "fold", "eol", "field"]), min_size=1, max_size=2
)
SMUGGLED = st.tuples(request(IN_DOUBT), PIPELINE).map(b"".join)
STREAM = st.one_of(
    PIPELINE,
    SMUGGLED,
    SMUGGLED,
    REVIEWS,
    mutated(st.one_of(PIPELINE, REVIEWS)),
    st.tuples(st.one_of(st.just(b""), PIPELINE), st.binary(max_size=120)).map(b"".join),  # junk after
)


@st.composite
def cut(draw: st.DrawFn) -> tuple[bytes, list[bytes]]:
    stream = draw(STREAM)
    cuts = sorted(set(draw(st.lists(st.integers(1, max(len(stream) - 1, 1)), max_size=6))))
    points = [0, *(c for c in cuts if c < len(stream)), len(stream)]
    return stream, [stream[a:b] for a, b in itertools.pairwise(points) if b > a]


def _pipeline(*heads: bytes) -> bytes:
    """Each head (fields after the request line) as a review with a 5-byte body, then one more
    plain review: where the first one's body ends decides what the second request is."""
    return b"".join(b"POST /admission/validate HTTP/1.1\r\n" + h + b"\r\n\r\nhello" for h in heads) + _GO


# The smuggling shapes of issue 41's red team, always run (each as one chunk and byte by byte).
SMUGGLING = [
    _pipeline(b"Host: x\r\nContent-Length: 5\r\nContent-Length: 6"),
    _pipeline(b"Host: x\r\nContent-Length: 5, 6"),
    _pipeline(b"Host: x\r\nContent-Length: 5\r\nContent-Length: 5"),
    _pipeline(b"Host: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked"),
    _pipeline(b"Host: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 5"),
    _pipeline(b"Host: x\r\nTransfer-Encoding: chunked, identity\r\nContent-Length: 5"),
    _pipeline(b"Host: x\r\nContent-Length: 0\r\n Content-Length: 5"),  # obs-fold
    _pipeline(b"Host: x\r\nX: y\nContent-Length: 5"),  # a bare LF before the length
    _pipeline(b"Host: x\r\nX: y\rContent-Length: 5"),  # a bare CR
    _pipeline(b"Host: x\r\nContent-Length : 5"),
    _pipeline(b"Host: x\r\nContent-Length: 5\x00"),
    _pipeline(b"Host: x\r\nContent-Length: 05"),
    _pipeline(b"Host: x\r\nContent-Length: +5"),
    _pipeline(b"Host: x\r\nContent-Length: 5", b"Host: x\r\nContent-Length: 5"),
]


@pytest.mark.parametrize("stream", SMUGGLING)
def test_the_smuggling_shapes_are_read_as_h11_reads_them(stream: bytes) -> None:
    check_agreement(stream, [stream])
    check_agreement(stream, [stream[i : i + 1] for i in range(len(stream))])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cut())
@example((_GO * 3, [_GO, _GO[:17], _GO[17:] + _GO]))  # the API server's pipeline, split mid-head
@example((b"GET / HTTP/1.1\nHost: x\n\n", [b"GET / HTTP/1.1\nHost: x\n\n"]))  # LF only: 400 at once
@example((b"\r\n" + _GO, [b"\r\n" + _GO]))  # an empty line first: h11 refuses, nodegate skips it
@example((b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", [b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"]))
def test_the_framing_reads_what_h11_reads(case: tuple[bytes, list[bytes]]) -> None:
    check_agreement(*case, label=event)
