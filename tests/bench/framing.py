"""The admission listener's HTTP/1.1 framing against well-kept parsers (issue 41: "parse with a
well-kept parser unless you measure it slower"):

    python -m tests.bench framing [--rounds R] [--json] [--quick]

Each round frames the same 2,000 unique reviews, as the API server sends them (Go's head, a new
uid and Content-Length each, one read each, one after the other on one connection), into what the
listener needs of each (method, path, Content-Length, Content-Type, Content-Encoding, Expect,
keep-alive, and the body's bounds):

``nodegate``   ``head_end`` and ``HeadReader.parse`` (bootstrap/service/http/framing.py), as
               ``ReviewProtocol`` calls them, and the body cut by its length;
``httptools``  llhttp (uvicorn's parser) through httptools' callbacks, the fields the listener
               acts on collected from ``on_header`` and the body from ``on_body``;
``httptools+checks``  the same, with the checks the listener makes that llhttp does not (one
               Host, no repeated Content-Type, Content-Encoding or Expect, origin-form), per
               field in Python, and the ``RequestHead`` the listener works from;
``h11``        h11's server connection, one event per request part and an answer sent between
               requests (h11 reads the next request only after one).

Reported: the median µs per review over the rounds, and each parser's ratio to nodegate's,
measured in the same run, with the machine's load. A review costs the listener about 100 µs in
all (docs/benchmarks.md), so the framing's share shows here."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import h11
import httptools

from bootstrap.service.http.framing import HeadReader, RequestHead, head_end, skip_blank_lines
from tests.bench import admission_data
from tests.bench.admission_client import loadavg

REVIEWS = 2000

# What Go's net/http client sends for a webhook call (field order as it writes them).
_HEAD = (
    b"POST /admission/validate?timeout=5s HTTP/1.1\r\nHost: nodegate.nodegate.svc:443\r\n"
    b"User-Agent: kube-apiserver-admission\r\nContent-Length: %d\r\nAccept: application/json, */*\r\n"
    b"Content-Type: application/json\r\nAccept-Encoding: gzip\r\n\r\n"
)
_WANTED = {b"content-length", b"content-type", b"content-encoding", b"expect", b"connection", b"host"}


def stream(n: int) -> list[bytes]:
    """Each review as its own read (as the API server's arrive: one request at a time)."""
    out = []
    templates = admission_data.REVIEWS
    for seq in range(n):
        head, mid, tail = templates[seq % len(templates)].split()
        body = head + f"uid-{seq:08d}-{'x' * (seq % 37)}".encode() + mid + str(seq).encode() + tail
        out.append(_HEAD % len(body) + body)
    return out


def nodegate(reads: list[bytes]) -> int:
    reader, bodies = HeadReader(), 0
    for data in reads:
        start = skip_blank_lines(data, 0)
        end = head_end(data, start, start)
        head = reader.parse(data[start : end - 4])
        body = data[end : end + head.content_length]
        bodies += len(body) == head.content_length
    return bodies


class _Collect:
    """httptools' callbacks: the fields the listener acts on, and the body. ``strict``: also the
    checks the listener makes beyond llhttp's (one Host, no repeated Content-Type,
    Content-Encoding or Expect, no Transfer-Encoding, an origin-form target), which then run
    per field in Python."""

    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self.url = b""
        self.fields: dict[bytes, bytes] = {}
        self.hosts = 0
        self.body: list[bytes] = []
        self.done = 0
        self.parser: httptools.HttpRequestParser | None = None
        self.head: RequestHead | None = None

    def on_url(self, url: bytes) -> None:
        self.url = url

    def on_header(self, name: bytes, value: bytes) -> None:
        lower = name.lower()
        if lower not in _WANTED:
            return
        if self.strict:
            if lower == b"host":
                self.hosts += 1
            elif lower in self.fields and lower != b"content-length":
                raise ValueError(f"{lower!r} twice")
        self.fields[lower] = value

    def on_headers_complete(self) -> None:
        if not self.strict:
            return
        if self.hosts != 1 or not self.url.startswith(b"/"):
            raise ValueError("not one Host, or not origin-form")
        # what ReviewProtocol needs of a head, as parse_head gives it
        fields, parser = self.fields, self.parser
        assert parser is not None
        media = fields.get(b"content-type", b"").partition(b";")[0].strip().lower().decode()
        self.head = RequestHead(
            parser.get_method().decode(),
            self.url.partition(b"?")[0].decode(),
            int(fields.get(b"content-length", b"0")),
            media,
            fields.get(b"content-encoding", b"").strip().decode(),
            fields.get(b"expect", b"").strip().lower() == b"100-continue",
            parser.should_keep_alive(),
        )

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.done += 1
        self.fields, self.body, self.hosts = {}, [], 0


def _httptools(reads: list[bytes], strict: bool) -> int:
    sink = _Collect(strict)
    parser = httptools.HttpRequestParser(sink)
    sink.parser = parser
    for data in reads:
        parser.feed_data(data)
    return sink.done


def with_httptools(reads: list[bytes]) -> int:
    return _httptools(reads, strict=False)


def with_httptools_checked(reads: list[bytes]) -> int:
    return _httptools(reads, strict=True)


def with_h11(reads: list[bytes]) -> int:
    conn = h11.Connection(h11.SERVER)
    done = 0
    for data in reads:
        conn.receive_data(data)
        done += _h11_events(conn)
    return done


def _h11_events(conn: h11.Connection) -> int:
    done = 0
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            break
        if isinstance(event, h11.EndOfMessage):
            done += 1
            conn.send(h11.Response(status_code=200, headers=[("Content-Length", "0")]))
            conn.send(h11.EndOfMessage())
            conn.start_next_cycle()
    return done


PARSERS: dict[str, Callable[[list[bytes]], int]] = {
    "nodegate": nodegate,
    "httptools": with_httptools,
    "httptools+checks": with_httptools_checked,
    "h11": with_h11,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench framing")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true")
    args, _ = parser.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    rounds = 5 if args.quick else args.rounds
    data = stream(REVIEWS)
    for name, frame in PARSERS.items():  # each frames every review, whole
        assert frame(data) == REVIEWS, name
    load = loadavg()
    times: dict[str, list[float]] = {name: [] for name in PARSERS}
    for _ in range(rounds):
        for name, frame in PARSERS.items():  # interleaved: drift in the machine hits all alike
            t0 = time.perf_counter()
            frame(data)
            times[name].append((time.perf_counter() - t0) / REVIEWS * 1e6)
    medians = {name: statistics.median(t) for name, t in times.items()}
    base = medians["nodegate"]
    if args.json:
        print(json.dumps({"benchmark": "framing", "load": [load, loadavg()], "us_per_review": medians}))
        return 0
    size = sum(map(len, data)) // REVIEWS
    print(
        f"framing {REVIEWS} unique reviews ({size} bytes each on average, one read each), {rounds} rounds; "
        f"load {load} -> {loadavg()}"
    )
    for name, median in medians.items():
        print(f"  {name:<17} {median:7.2f} µs/review   {median / base:5.2f}x nodegate")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
