"""The admission webhooks on their own listener (``admission.listen``; issue 21, finding 8).

Before, the webhook shared the join port: 32 connections posting 3 MiB reviews pushed join
latency from 91 ms to 17-33 s. Now the reviews have their own listener, their own in-flight
limit per route, and large bodies go one at a time. The tests show the behaviour (joins complete
while the webhook listener is saturated; the limits answer as documented), not timings: the
latency figures are the benchmark's (``python -m tests.bench joinload``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from admission.webhook import MAX_REVIEW_BYTES
from bootstrap.service.serve import Serving
from tests.service.test_abuse import GENUINE, base, client_tls, counter, http, serving
from tests.support.service import EkCa, settings_for
from tests.support.softnode import join

WAIT = 30.0


@pytest.fixture(scope="module")
def ek_ca() -> EkCa:
    return EkCa.create()


def review(uid: str, pad: int = 0) -> bytes:
    """A Skyhook CREATE (no PackagePolicies here: answered, denied) padded to about ``pad`` bytes."""
    doc: dict[str, Any] = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "skyhook.nvidia.com", "version": "v1alpha1", "kind": "Skyhook"},
            "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "name": "big",
            "object": {
                "apiVersion": "skyhook.nvidia.com/v1alpha1",
                "kind": "Skyhook",
                "metadata": {"name": "big", "annotations": {f"k{i}": "v" * 40 for i in range(pad // 50)}},
                "spec": {},
            },
        },
    }
    return json.dumps(doc).encode()


def admission(s: Serving) -> str:
    return f"https://127.0.0.1:{s.admission_port}"


async def stalled_review(s: Serving) -> asyncio.StreamWriter:
    """Headers of a 3 MiB review and a first chunk, then nothing: holds a slot until cut."""
    _reader, writer = await asyncio.open_connection(
        "127.0.0.1", s.admission_port, ssl=client_tls(s), server_hostname="127.0.0.1"
    )
    writer.write(
        b"POST /admission/validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 3145728\r\n\r\n" + b'{"apiVersion": "admission.k8s.io/v1", '
    )
    await writer.drain()
    return writer


async def test_the_webhooks_are_not_on_the_join_listener(tmp_path: Path, ek_ca: EkCa) -> None:
    async with serving(settings_for(tmp_path, ek_ca)) as s, http(s) as h:
        assert s.admission_port not in (0, s.port)
        for path in ("/admission/validate", "/admission/mutate"):
            async with h.post(f"{base(s)}{path}", data=review("u")) as resp:
                out = await resp.json(content_type=None)
            assert (resp.status, out["code"]) == (404, "not_found")
        async with h.post(f"{admission(s)}/admission/validate", data=review("u-1"), headers=_JSON) as resp:
            answer = await resp.json()
        assert resp.status == 200
        assert answer["response"]["uid"] == "u-1"
        assert answer["response"]["allowed"] is False  # no PackagePolicies: fail closed, answered
        async with h.get(f"{admission(s)}/v1/bundle") as resp:  # the join API is not here either
            out = await resp.json(content_type=None)
        assert (resp.status, out["code"], resp.content_type) == (404, "not_found", "application/problem+json")
        async with h.get(f"{admission(s)}/admission/validate") as resp:
            out = await resp.json(content_type=None)
        assert (resp.status, out["code"]) == (405, "method_not_allowed")


_JSON = {"Content-Type": "application/json"}


async def test_joins_complete_while_the_webhook_listener_is_saturated(tmp_path: Path, ek_ca: EkCa) -> None:
    """Stalled 3 MiB reviews and large reviews flooding in (the adversarial run's 32
    connections): joins on the join listener all succeed, and the flood is answered, each review
    with its verdict or, when no slot came within its time in line, 503 ``unavailable`` with
    Retry-After, instead of waiting without end. (The stalled reviews hold no slot: a slot is
    taken once the whole body is in, issue 41.)"""
    settings = settings_for(tmp_path, ek_ca, admission={"max_inflight": 2})
    async with serving(settings) as s:
        stalled = [await stalled_review(s) for _ in range(2)]  # as many as /admission/validate's slots
        big = review("flood", pad=3 * 1024 * 1024)
        assert 3 * 1024 * 1024 <= len(big) < MAX_REVIEW_BYTES
        answers: list[int] = []
        stop = asyncio.Event()

        async def flood() -> None:
            connector = aiohttp.TCPConnector(ssl=client_tls(s), limit=1)
            async with aiohttp.ClientSession(connector=connector) as h:
                while not stop.is_set():
                    with contextlib.suppress(aiohttp.ClientError, OSError):
                        async with h.post(f"{admission(s)}/admission/validate", data=big, headers=_JSON) as r:
                            await r.read()
                            answers.append(r.status)

        flooders = [asyncio.create_task(flood()) for _ in range(30)]
        while not answers:
            await asyncio.sleep(0.05)  # the listener is saturated: the first refusals are out (an event)
        outcomes = []
        for i in range(3):
            async with http(s) as h:
                outcomes.append((await join(h, base(s), ek_ca.node(f"during-flood-{i}")))[0])
        stop.set()
        await asyncio.wait_for(asyncio.gather(*flooders), WAIT)
        for w in stalled:
            w.close()
    assert outcomes == [200, 200, 200]
    assert answers
    assert set(answers) <= {200, 503}  # judged or refused as busy, never queued forever
    assert counter(s, "nodegate_admission_busy_total", route="/admission/validate") >= answers.count(503)


async def test_large_reviews_are_judged_one_at_a_time_and_answered(tmp_path: Path, ek_ca: EkCa) -> None:
    """Large reviews (the heavy lane) are still answered, each with its own uid."""
    async with serving(settings_for(tmp_path, ek_ca)) as s:
        connector = aiohttp.TCPConnector(ssl=client_tls(s), limit=8)
        async with aiohttp.ClientSession(connector=connector) as h:

            async def one(i: int) -> tuple[int, str]:
                body = review(f"large-{i}", pad=600 * 1024)
                async with h.post(f"{admission(s)}/admission/validate", data=body, headers=_JSON) as r:
                    return r.status, (await r.json())["response"]["uid"]

            got = await asyncio.gather(*(one(i) for i in range(6)))
    assert got == [(200, f"large-{i}") for i in range(6)]


@pytest.mark.parametrize(
    ("headers", "body", "status", "code"),
    [
        ({"Content-Type": "application/json", "Content-Encoding": "gzip"}, b"{}", 415, "malformed_request"),
        ({"Content-Type": "text/plain"}, b"{}", 415, "malformed_request"),
        ({"Content-Type": "application/json"}, b"x" * (MAX_REVIEW_BYTES + 1), 413, "payload_too_large"),
        ({"Content-Type": "application/json"}, b"{not json", 400, "malformed_request"),
    ],
)
async def test_bodies_the_webhook_does_not_take(
    tmp_path: Path, ek_ca: EkCa, headers: dict[str, str], body: bytes, status: int, code: str
) -> None:
    url = "/admission/validate"
    async with (
        serving(settings_for(tmp_path, ek_ca)) as s,
        http(s, source=GENUINE) as h,
        h.post(f"{admission(s)}{url}", data=body, headers=headers) as resp,
    ):
        out = await resp.json(content_type=None)
        assert resp.content_type == "application/problem+json"
    assert (resp.status, out["code"]) == (status, code), out


async def test_a_stalled_review_is_cut_at_the_request_deadline(tmp_path: Path, ek_ca: EkCa) -> None:
    from bootstrap.service.http.limits import ConnectionLimits

    limits = ConnectionLimits(
        per_address=8, total=8, header_timeout=0.5, max_age=None, max_requests=None, sweep=0.1
    )
    settings = settings_for(tmp_path, ek_ca)
    from bootstrap.service.serve import start

    s = await start(settings, kube=False, admission_limits=limits)
    try:
        writer = await stalled_review(s)
        assert s.admission_site is not None
        assert s.admission_site.connections is not None
        while s.admission_site.connections.count():
            await asyncio.sleep(0.02)  # cut by the request deadline (an event, polled)
        assert counter(s, "nodegate_client_errors_total", endpoint="connection", reason="header_timeout") == 1
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            writer.close()
    finally:
        await s.close()


async def test_review_slots_are_handed_over_in_order_and_never_lost() -> None:
    from bootstrap.service.webhook.app import _Busy, _Lane

    lane = _Lane(1, 30.0)
    assert lane.take()
    assert not lane.take()
    first = asyncio.create_task(lane.wait())
    second = asyncio.create_task(lane.wait())
    await asyncio.sleep(0)  # both queued
    lane.give()  # to the first in line, not back to the pool
    await asyncio.wait_for(first, WAIT)
    assert not second.done()
    assert not lane.take()
    second.cancel()  # a request that went away: its place is dropped
    with contextlib.suppress(asyncio.CancelledError):
        await second
    lane.give()
    assert lane.take()  # the slot came back to the pool
    short = _Lane(1, 0.05)
    assert short.take()
    with pytest.raises(_Busy):
        await short.wait()
    short.give()
    assert short.take()  # the timed-out waiter left nothing behind


async def test_reviews_are_counted_and_timed_per_endpoint(tmp_path: Path, ek_ca: EkCa) -> None:
    """docs/operations.md's metrics (and the chart's latency alert) for the webhook: every
    review in nodegate_requests_total{endpoint="admission"} and nodegate_request_seconds."""
    async with serving(settings_for(tmp_path, ek_ca)) as s, http(s, source=GENUINE) as h:
        for body in (review("counted-1"), review("counted-2"), b"{not json"):
            async with h.post(f"{admission(s)}/admission/validate", data=body, headers=_JSON) as r:
                await r.read()
    assert counter(s, "nodegate_requests_total", endpoint="admission", code="ok") == 2
    assert counter(s, "nodegate_requests_total", endpoint="admission", code="malformed_request") == 1
    assert counter(s, "nodegate_request_seconds_count", endpoint="admission") == 3
