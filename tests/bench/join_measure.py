"""One variant of the join benchmark (``tests.bench.join``): at each concurrency a warm-up, then
rounds of joins against the server each followed by a floor batch on the server's CPU; and the
server's RSS with many join sessions started and never finished."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from bootstrap.service.join.flow import load_ek_trust
from tests.bench import common
from tests.bench.join_floor import FloorInput, floor_batch
from tests.bench.join_load import HEADERS, Batch, Prepared, client_session, run_batch
from tests.bench.join_servers import Server, client_tls, service_ca

CONCURRENCY = (1, 8, 32)
SESSION_CONCURRENCY = 32


@dataclass
class Level:
    concurrency: int
    joins: int
    warmup: int
    batches: list[Batch] = field(default_factory=list)
    floors: list[list[float]] = field(default_factory=list)  # per round: ns per join per op
    warmup_errors: list[str] = field(default_factory=list)


@dataclass
class VariantResult:
    variant: str
    levels: list[Level]
    floor_nodes: int
    allowlist: dict[str, float] | None = None
    memory: dict[str, Any] | None = None
    swtpm: dict[str, Any] | None = None
    rss_start_kib: int | None = None
    rss_end_kib: int | None = None


async def measure_variant(
    server: Server,
    nodes: dict[int, list[Prepared]],
    floor: list[FloorInput],
    joins: dict[int, int],
    rounds: int,
    floor_joins: int,
    server_cpus: set[int],
) -> VariantResult:
    cas = service_ca(server)
    tls = client_tls(cas)
    trust = load_ek_trust(server.settings)
    result = VariantResult(server.variant, [], len(floor))
    for concurrency in CONCURRENCY:
        pool = nodes[concurrency]
        level = Level(concurrency, joins[concurrency], warmup=len(pool) - rounds * joins[concurrency])
        async with client_session(concurrency, tls) as http:
            warm = await run_batch(http, server, pool[: level.warmup], concurrency)
            level.warmup_errors = warm.errors
            if result.rss_start_kib is None:
                result.rss_start_kib = server.rss_kib()
            for r in range(rounds):
                lo = level.warmup + r * level.joins
                level.batches.append(await run_batch(http, server, pool[lo : lo + level.joins], concurrency))
                with common.pinned(server_cpus):  # on the server's core, while the server idles
                    level.floors.append(floor_batch(floor, floor_joins, trust, cas.signer))
        result.levels.append(level)
    result.rss_end_kib = server.rss_kib()
    return result


async def measure_sessions(server: Server, nodes: list[Prepared]) -> dict[str, Any]:
    """RSS of the server before and after join starts for ``nodes`` (but the first
    SESSION_CONCURRENCY, which open the connections) that are never finished."""
    tls = client_tls(service_ca(server))
    tokens: list[int] = []  # token sizes of the held sessions
    answers: list[int] = []  # sizes of the start answers
    errors: list[str] = []

    async def start(http: aiohttp.ClientSession, p: Prepared) -> None:
        try:
            async with http.post(f"{server.base}/v1/join/start", data=p.start, headers=HEADERS) as resp:
                raw, status = await resp.read(), resp.status
            if status != 200:
                errors.append(f"start HTTP {status}: {raw[:200]!r}")
                return
            tokens.append(len(json.loads(raw)["session"]))
            answers.append(len(raw))
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as exc:
            errors.append(f"{type(exc).__name__}: {exc}"[:300])

    warm, held = nodes[:SESSION_CONCURRENCY], nodes[SESSION_CONCURRENCY:]
    async with client_session(SESSION_CONCURRENCY, tls) as http:
        await asyncio.gather(*(start(http, p) for p in warm))  # every connection up first
        tokens.clear()
        answers.clear()
        todo = iter(held)

        async def worker() -> None:
            for p in todo:
                await start(http, p)

        before = server.rss_kib()
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(SESSION_CONCURRENCY)))
        wall = time.perf_counter() - started
        after = server.rss_kib()
    return {
        "sessions": len(held),
        "ok": len(tokens),
        "errors": errors,
        "rss_before_kib": before,
        "rss_after_kib": after,
        "rss_growth_kib": None if before is None or after is None else after - before,
        "token_bytes_median": statistics.median(tokens) if tokens else None,
        "token_bytes_max": max(tokens) if tokens else None,
        "start_response_bytes_median": statistics.median(answers) if answers else None,
        "starts_per_s": len(tokens) / wall if wall > 0 else None,
    }
