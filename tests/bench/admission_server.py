"""One server process for the admission benchmark (``tests.bench.admission``).

    python -m tests.bench.admission_server --mode webhook|bare --cert F --key F --port-file F
                                           [--bare-parser json|pydantic-core]
                                           [--bare-server aiohttp|listener] [--profile F]

Listens on 127.0.0.1 on a free port with TLS (1.2 or later) and serves ``POST /admission/validate``
until SIGTERM (or SIGINT); once listening it writes the port to ``--port-file`` (atomically).

``webhook``  the admission listener as ``nodegate serve`` runs it and the chart deploys it:
             ``bootstrap.service.compose.admission_app`` (both routes, the in-flight limit per
             route, the heavy lane, the decision cache) on ``ReviewSite`` with the admission
             listener's connection limits, with the benchmark's policies and RBAC
             (``tests.bench.admission_data``); no log handler
``bare``     a handler that reads the body, ``json.loads`` it and answers allowed with the uid:
             what any AdmissionReview server over aiohttp must at least spend
             (``--bare-parser pydantic-core``: ``pydantic_core.from_json`` instead, the parser
             the webhook reads reviews with, which is faster than the json module);
             ``--bare-server listener``: the same handler on nodegate's own admission listener
             (``ReviewSite``) instead of aiohttp, the floor of that listener

Access logs are off in all; the ``nodegate`` loggers stay at the default WARNING level, so the
webhook's per-review line is built but not emitted. ``--profile F`` runs the server under
cProfile, timed by process CPU time, and writes the stats (``pstats`` format) to F on shutdown.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import signal
import ssl
import time
from collections.abc import Sequence
from pathlib import Path

from aiohttp import web
from pydantic_core import from_json

from bootstrap.service.http.framing import RequestHead
from bootstrap.service.metrics import Metrics
from bootstrap.service.serve import default_admission_limits
from bootstrap.service.webhook.app import Answer, ReadBody, Reviews, WebhookLimits
from bootstrap.service.webhook.site import ReviewSite
from tests.bench.admission_data import MUTATE_PATH, PATH

BARE_PARSERS = ("json", "pydantic-core")
BARE_SERVERS = ("aiohttp", "listener")


def bare_app(parser: str = "json") -> web.Application:
    """Answers allowed on both webhook paths."""
    loads = from_json if parser == "pydantic-core" else json.loads

    async def validate(request: web.Request) -> web.Response:
        review = loads(await request.read())
        out = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {"uid": review["request"]["uid"], "allowed": True},
        }
        return web.json_response(out)

    app = web.Application()
    app.router.add_post(PATH, validate)
    app.router.add_post(MUTATE_PATH, validate)
    return app


class BareReviews:
    """``bare_app``'s handler on the admission listener: reads the body, parses it, answers allowed."""

    def __init__(self, parser: str = "json") -> None:
        self._loads = from_json if parser == "pydantic-core" else json.loads
        self._body_seconds = WebhookLimits().body_seconds  # the webhook's body deadline

    async def answer(self, head: RequestHead, read: ReadBody) -> Answer:
        review = self._loads(await read(self._body_seconds))
        out = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {"uid": review["request"]["uid"], "allowed": True},
        }
        return Answer(200, json.dumps(out).encode())


def webhook_app() -> Reviews:
    from bootstrap.config import settings_from_obj
    from bootstrap.service.compose import admission_app
    from tests.bench import admission_data

    settings = settings_from_obj({"admission": {"owner": admission_data.OWNER}})
    return admission_app(settings, admission_data.decider(), Metrics())


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    return ctx


async def _until_signalled(port: int, port_file: Path) -> None:
    partial = port_file.with_name(port_file.name + ".partial")
    partial.write_text(f"{port}\n")
    partial.replace(port_file)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def serve(app: web.Application | Reviews, ctx: ssl.SSLContext, port_file: Path) -> None:
    """An aiohttp app on aiohttp's TCPSite; a ReviewApp on the admission listener, as serve runs it."""
    if not isinstance(app, web.Application):
        site = ReviewSite(app, "127.0.0.1", 0, tls=ctx, limits=default_admission_limits(), metrics=Metrics())
        await site.start()
        try:
            await _until_signalled(site.port, port_file)
        finally:
            await site.stop()
        return
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        tcp = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
        await tcp.start()
        await _until_signalled(runner.addresses[0][1], port_file)
    finally:
        await runner.cleanup()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tests.bench.admission_server", description=__doc__.split("\n")[0]
    )
    p.add_argument("--mode", choices=("webhook", "bare"), required=True)
    p.add_argument("--bare-parser", choices=BARE_PARSERS, default=BARE_PARSERS[0], help="JSON parser of bare")
    p.add_argument(
        "--bare-server",
        choices=BARE_SERVERS,
        default=BARE_SERVERS[0],
        help="bare on aiohttp or on the listener",
    )
    p.add_argument("--cert", type=Path, required=True, help="PEM certificate")
    p.add_argument("--key", type=Path, required=True, help="PEM private key")
    p.add_argument("--port-file", type=Path, required=True, help="where to write the port once listening")
    p.add_argument("--profile", type=Path, help="run under cProfile and write the stats here on exit")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    app: web.Application | Reviews
    if args.mode == "webhook":
        app = webhook_app()
    elif args.bare_server == "listener":
        app = BareReviews(args.bare_parser)
    else:
        app = bare_app(args.bare_parser)
    ctx = server_context(args.cert, args.key)
    # CPU time, not wall time: on a busy machine a wall-clock profile mostly shows the process
    # waiting (in epoll, or in a loopback send() that hands the CPU to the client).
    profiler = cProfile.Profile(time.process_time) if args.profile else None
    if profiler is not None:
        profiler.enable()
    try:
        asyncio.run(serve(app, ctx, args.port_file))
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(os.fspath(args.profile))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
