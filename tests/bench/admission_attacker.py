"""The attacker of ``tests.bench.admission_attacks``, in a process of its own:

    python -m tests.bench.admission_attacker --attack NAME --port P --conns N --addresses K --ca F

Opens ``--conns`` connections to 127.0.0.1:P, spread over ``--addresses`` source addresses
(127.0.0.2 and up: Linux routes all of 127/8 to loopback), each doing what ``--attack`` names,
and opens it again whenever the listener closes it, until SIGTERM. Writes a line ``ready`` to
stdout once every connection has been tried once. The attacks are issue 41's findings:

``stalled_bodies``  a review head (``Content-Length: 100000``) and 40 body bytes, then nothing
``heavy_lane``      a 400 KiB review head and 40 body bytes, then nothing
``pipelined_byte``  ``GET /readyz`` answered, and the first byte of the next request
``bare_connect``    a TCP connect, and no TLS handshake
``flood``           ``GET /readyz`` pipelined without end, no answer read
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import ssl
from collections.abc import Sequence

ATTACKS = ("stalled_bodies", "heavy_lane", "pipelined_byte", "bare_connect", "flood")
_READYZ = b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n"


def _review_head(length: int) -> bytes:
    return (
        b"POST /admission/validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % length
    )


async def _connect(port: int, source: str) -> socket.socket:
    sock = socket.socket()
    sock.setblocking(False)
    sock.bind((source, 0))
    try:  # a listener whose accept queue is full leaves a SYN unanswered for minutes
        await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port)), 10)
    except BaseException:
        sock.close()
        raise
    return sock


async def _once(attack: str, port: int, source: str, tls: ssl.SSLContext, tried: asyncio.Event) -> None:
    """One connection of the attack, until the listener closes it."""
    sock = await _connect(port, source)
    tried.set()
    if attack == "bare_connect":
        try:
            while await asyncio.get_running_loop().sock_recv(sock, 1):
                pass
        finally:
            sock.close()
        return
    reader, writer = await asyncio.open_connection(sock=sock, ssl=tls, server_hostname="127.0.0.1")
    try:
        if attack == "flood":
            while True:
                writer.write(_READYZ * 64)
                await writer.drain()  # raises once the listener has closed it
        if attack == "stalled_bodies":
            writer.write(_review_head(100_000) + b"{" * 40)
        elif attack == "heavy_lane":
            writer.write(_review_head(400 * 1024 + 100) + b"{" * 40)
        else:  # pipelined_byte
            writer.write(_READYZ + b"G")
        await writer.drain()
        while await reader.read(65536):
            pass
    finally:
        writer.transport.abort()


async def _slot(attack: str, port: int, source: str, tls: ssl.SSLContext, tried: asyncio.Event) -> None:
    while True:
        with contextlib.suppress(OSError, ssl.SSLError, asyncio.IncompleteReadError, TimeoutError):
            await _once(attack, port, source, tls, tried)
        tried.set()
        await asyncio.sleep(0.05)  # closed or refused: opened again, not in a spin


async def run(attack: str, port: int, conns: int, addresses: int, ca: str) -> None:
    tls = ssl.create_default_context(cafile=ca)
    sources = [f"127.0.0.{2 + i}" for i in range(addresses)]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    events = [asyncio.Event() for _ in range(conns)]
    tasks = []
    for i in range(conns):
        tasks.append(asyncio.ensure_future(_slot(attack, port, sources[i % addresses], tls, events[i])))
        await asyncio.sleep(0)
    await asyncio.gather(*(e.wait() for e in events))
    print("ready", flush=True)
    await stop.wait()
    for task in tasks:
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.gather(*tasks, return_exceptions=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.admission_attacker")
    parser.add_argument("--attack", choices=ATTACKS, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--conns", type=int, required=True)
    parser.add_argument("--addresses", type=int, default=1)
    parser.add_argument("--ca", required=True)
    args = parser.parse_args(argv)
    asyncio.run(run(args.attack, args.port, args.conns, args.addresses, args.ca))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
