"""The admission listener's HTTP/1.1 framing (``bootstrap.service.http.framing``): what the API
server (Go's net/http), curl and aiohttp send is read; everything else is refused with its status
and machine code, never another exception."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bootstrap.service.http.framing import (
    MAX_FIELDS,
    MAX_HEAD_BYTES,
    FramingError,
    HeadReader,
    head_end,
    parse_head,
    skip_blank_lines,
)

# What kube-apiserver's webhook client sends (Go net/http: canonical names, ?timeout= appended).
GO_HEAD = (
    b"POST /admission/validate?timeout=10s HTTP/1.1\r\n"
    b"Host: nodegate-webhook.nodegate.svc:9443\r\n"
    b"User-Agent: kube-apiserver-admission\r\n"
    b"Content-Length: 3355\r\n"
    b"Accept: application/json, */*\r\n"
    b"Content-Type: application/json\r\n"
    b"Accept-Encoding: gzip"
)


def test_the_api_servers_head_is_read() -> None:
    head = parse_head(GO_HEAD)
    assert (head.method, head.path, head.content_length) == ("POST", "/admission/validate", 3355)
    assert (head.content_type, head.content_encoding) == ("application/json", "")
    assert head.keep_alive
    assert not head.expect_continue


def test_names_are_case_insensitive_and_media_type_parameters_dropped() -> None:
    head = parse_head(
        b"POST /x HTTP/1.1\r\nHost: x\r\ncontent-LENGTH:  7 \r\n"
        b"CONTENT-TYPE: Application/JSON; charset=utf-8\r\nContent-Encoding: identity"
    )
    assert (head.content_length, head.content_type, head.content_encoding) == (
        7,
        "application/json",
        "identity",
    )


def test_repeated_identical_lengths_are_one_length() -> None:
    assert (
        parse_head(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 5\r\nContent-Length: 5").content_length
        == 5
    )


def test_no_length_is_no_body() -> None:
    assert parse_head(b"GET /readyz HTTP/1.1\r\nHost: x").content_length == 0


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6", 400),  # disagreeing lengths
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +5", 400),
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0x10", 400),
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5,", 400),
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1234567890123456789", 400),
        (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked", 411),
        (
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked",
            411,
        ),  # smuggling shape
        (b"POST / HTTP/1.1\r\nHost: x\r\n folded", 400),  # obs-fold
        (b"POST / HTTP/1.1\r\nHost : x", 400),  # whitespace before the colon
        (b"POST / HTTP/1.1\r\nHost: x\nContent-Length: 5", 400),  # a bare LF
        (b"POST / HTTP/1.1\r\nHost: x\rContent-Length: 5", 400),  # a bare CR
        (b"POST / HTTP/1.1\r\nHost: a\x00b", 400),  # a control character in a value
        (b"POST / HTTP/1.1\r\nHost: x\r\nNo colon here", 400),
        (b"POST / HTTP/1.1\r\nHost: x\r\n: empty name", 400),
        (b"POST http://example.com/ HTTP/1.1", 400),  # absolute-form
        (b"POST * HTTP/1.1", 400),
        (b"POST /a b HTTP/1.1", 400),
        (b"POST / HTTP/1.1 ", 400),
        (b"POST / http/1.1", 400),
        (b"POST / HTTP/2.0", 505),
        (b"POST / HTTP/0.9", 505),
        (b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 200-ok", 417),
        (b"PRI * HTTP/2.0", 505),  # the h2 preface's request line: another version, not a bad line
        (b"GET /", 400),  # HTTP/0.9's simple request: no version at all
        (b"POST / HTTP/1.1\r\nContent-Length: 0", 400),  # no Host (RFC 9112 section 3.2)
        (b"POST / HTTP/1.1\r\nHost: x\r\nhost: y", 400),  # two Host lines
        (b"POST / HTTP/1.0\r\nHost: x\r\nHost: x", 400),  # two, even in HTTP/1.0
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: a/b\r\nContent-Type: a/b", 400),
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\nContent-Encoding: identity", 400),
        (b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nexpect: 100-continue", 400),
        (b"POST / HTTP/1.1" + b"\r\nX: y" * (MAX_FIELDS + 1), 431),
    ],
)
def test_what_is_refused(head: bytes, status: int) -> None:
    with pytest.raises(FramingError) as refused:
        parse_head(head)
    assert refused.value.status == status
    assert refused.value.code == "malformed_request"


def test_expect_continue_and_connection_options() -> None:
    assert parse_head(b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-Continue").expect_continue
    assert not parse_head(b"POST / HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, Close").keep_alive
    assert not parse_head(b"POST / HTTP/1.0").keep_alive
    assert parse_head(b"POST / HTTP/1.0\r\nConnection: keep-alive").keep_alive
    assert parse_head(b"POST / HTTP/1.1\r\nHost: x\r\nConnection: te\r\nConnection: upgrade").keep_alive


def test_obs_text_in_values_is_accepted() -> None:
    assert parse_head(b"POST / HTTP/1.1\r\nHost: x\r\nX-Note: caf\xe9\tau lait").method == "POST"


def test_a_head_is_bounded_before_it_ends() -> None:
    assert head_end(b"POST / HTTP/1.1\r\nHost: x\r\n\r\nbody") == len(b"POST / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert head_end(b"POST / HTTP/1.1\r\nHost: x\r\n") == -1
    with pytest.raises(FramingError) as refused:
        head_end(b"POST / HTTP/1.1\r\nHost: x\r\nX: " + b"a" * MAX_HEAD_BYTES)
    assert refused.value.status == 431


def test_http10_needs_no_host() -> None:
    assert parse_head(b"POST / HTTP/1.0\r\nContent-Length: 2").content_length == 2


@pytest.mark.parametrize(
    ("partial", "status"),
    [
        (b"POST / HTTP/1.1\nHost: x\n", 400),  # LF-only lines
        (b"POST / HTTP/1.1\r\nHost: x\n", 400),
        (b"POST / HTTP/1.1\r\nHost: x\rY", 400),  # a bare CR
        (b"GET /\r\n", 400),  # HTTP/0.9: its request line has ended
        (b"PRI * HTTP/2.0\r\n", 505),
        (b"POST http://x/ HTTP/1.1\r\nHost", 400),
        (b"\x16\x03\x01\x02\x00", 400),  # a TLS ClientHello on a plain listener
        (b"\nPOST", 400),
    ],
)
def test_a_head_that_cannot_become_valid_is_refused_before_it_ends(partial: bytes, status: int) -> None:
    with pytest.raises(FramingError) as refused:
        head_end(partial, skip_blank_lines(partial, 0))
    assert refused.value.status == status


@pytest.mark.parametrize(
    "partial",
    [b"", b"\r", b"\r\n\r", b"P", b"POST / HTTP/1.1\r", b"POST / HTTP/1.1\r\nHost: x\r\n\r", b"POST / HT"],
)
def test_a_head_that_may_still_become_valid_is_waited_for(partial: bytes) -> None:
    assert head_end(partial, skip_blank_lines(partial, 0)) == -1


def _verdict(buffer: bytes, checked: int) -> Any:
    return _outcome(lambda b: head_end(b, skip_blank_lines(b, 0), checked), buffer)


_HEAD_PARTS = st.sampled_from(
    [
        b"GET / HTTP/1.1",
        b"GET /",
        b"PRI * HTTP/2.0",
        b"Host: x",
        b"X: a",
        b"\r\n",
        b"\r",
        b"\n",
        b" ",
        b"\x00",
        b"(",
    ]
)


@settings(max_examples=300)
@given(
    st.one_of(
        st.lists(_HEAD_PARTS, max_size=12).map(b"".join),
        st.lists(_HEAD_PARTS, max_size=8).map(lambda parts: b"GET / HTTP/1.1\r\n" + b"".join(parts)),
        st.binary(max_size=80),
    ),
    st.one_of(st.lists(st.integers(1, 120)), st.just(list(range(1, 200)))),  # or a byte at a time
)
@example(b"GET /\r\n", [5])  # the request line ends in the next read: checked then
@example(b"GET / HTTP/1.1\r\n", [15])  # a CR, then its LF in the next read: no bare CR, no bare LF
@example(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", [28])  # the blank line's last LF alone
def test_a_head_checked_as_it_arrives_is_judged_as_if_checked_at_once(data: bytes, cuts: list[int]) -> None:
    """``head_end`` told what it checked before (the protocol, between reads) gives, at every
    read, the verdict of checking all of it again: the same refusal at the same read, the same
    end of the head."""
    checked = 0
    for cut in [*sorted(c for c in cuts if c < len(data)), len(data)]:
        buffer = data[:cut]
        verdict = _verdict(buffer, checked)
        assert verdict == _verdict(buffer, 0)
        if verdict != -1:
            break
        checked = len(buffer)


def test_blank_lines_before_a_request_are_skipped() -> None:
    assert skip_blank_lines(b"\r\n\r\nPOST", 0) == 4
    assert skip_blank_lines(b"\nPOST", 0) == 0  # a bare LF is not a blank line here


def test_a_long_adversarial_head_is_judged_in_one_pass() -> None:
    """Values of spaces and tabs just under the limit, ending in a control character: refused
    (the patterns are linear; a backtracking one would take minutes here)."""
    head = b"POST / HTTP/1.1\r\nHost: x\r\nX: " + b" \t" * (MAX_HEAD_BYTES // 2 - 16) + b"\x01"
    with pytest.raises(FramingError):
        parse_head(head)


@given(st.binary(max_size=600))
def test_any_bytes_are_a_head_or_a_framing_error(data: bytes) -> None:
    status = 0
    try:
        head = parse_head(data)
    except FramingError as exc:
        status = exc.status
    if status:
        assert status in (400, 411, 417, 431, 505)
    else:
        assert head.path.startswith("/")
        assert head.content_length >= 0


_TOKEN = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-!#$%&'*+.^_`|~", min_size=1
)
_VALUE = st.binary(max_size=40).map(lambda b: bytes(c for c in b if c >= 0x20 and c != 0x7F).strip(b" \t"))


@given(st.lists(st.tuples(_TOKEN, _VALUE), max_size=20), st.integers(0, 10**9))
def test_any_well_formed_fields_are_read(fields: list[tuple[str, bytes]], length: int) -> None:
    """Fields of any token names and visible values parse; the length is the one sent."""
    fields = [(n, v) for n, v in fields if n.lower() not in _ACTED_ON]
    raw = b"".join(b"\r\n%b: %b" % (n.encode(), v) for n, v in fields)
    head = parse_head(
        b"POST /admission/validate HTTP/1.1\r\nHost: x" + raw + b"\r\nContent-Length: %d" % length
    )
    assert head.content_length == length
    assert head.keep_alive


_ACTED_ON = {
    "content-length",
    "content-type",
    "transfer-encoding",
    "content-encoding",
    "connection",
    "expect",
    "host",
}


def _outcome(parse: Any, head: bytes) -> Any:
    try:
        return parse(head)
    except FramingError as exc:
        return (exc.status, exc.detail)


_LINES = st.sampled_from(
    [
        b"Content-Length: 12",
        b"content-length:7",
        b"Content-Length: 5, 5",
        b"Content-Length: 7",
        b"Content-Length: 0012 ",
        b"Content-Length: 99999999999999999999",
        b"Content-Length: x",
        b"Content-Type: application/json",
        b"Transfer-Encoding: chunked",
        b"Connection: close",
        b"Expect: 100-continue",
        b"Host: x",
        b"Host : x",
        b" folded",
        b"X-Content-Length: 3",
    ]
)


@settings(max_examples=400)
@given(
    st.lists(st.lists(_LINES, max_size=5), min_size=1, max_size=6),
    st.lists(st.integers(0, 10**6), min_size=1),
)
def test_the_head_memo_answers_as_a_full_parse(heads: list[list[bytes]], lengths: list[int]) -> None:
    """Any sequence of heads, each sent again with other Content-Length digits: the memo's
    result (or refusal) is always the full parse's."""
    reader = HeadReader(size=4)
    for lines in heads:
        for length in lengths:
            head = b"\r\n".join([b"POST /admission/validate HTTP/1.1", *lines]).replace(b"12", b"%d" % length)
            assert _outcome(reader.parse, head) == _outcome(parse_head, head)


def test_a_second_length_field_is_never_taken_from_the_memo() -> None:
    reader = HeadReader()
    agreeing = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\nContent-Length: 7"
    assert reader.parse(agreeing).content_length == 7
    with pytest.raises(FramingError):
        reader.parse(agreeing.replace(b"Length: 7\r\n", b"Length: 5\r\n", 1))
