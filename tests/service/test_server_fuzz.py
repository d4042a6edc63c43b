"""Arbitrary bodies on every JSON endpoint never give a 5xx, a traceback or a non-problem error."""

from __future__ import annotations

import asyncio
import http.client
import json
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.service import EkCa, Running, running, settings_for

ENDPOINTS = ("/v1/join/start", "/v1/join/finish", "/v1/nodes/self/renew", "/v1/admin/nodes/x/revoke")
FIELDS = ("node_name", "ek_public", "ek_certificate", "ak_public", "csr", "session", "proof", "quote")
FIELDS += ("signature", "pcrs", "event_log", "reason", "revoked")
ALLOWED = {400, 401, 403, 404, 409, 410, 413, 415, 429}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
shaped = st.dictionaries(st.sampled_from(FIELDS), json_values | st.binary(max_size=40).map(lambda b: b.hex()))
bodies = (
    shaped.map(lambda d: json.dumps(d).encode())
    | json_values.map(lambda v: json.dumps(v).encode())
    | st.binary(max_size=200)
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, ssl.SSLContext]]:
    tmp: Path = tmp_path_factory.mktemp("fuzz")
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        async with running(settings_for(tmp, EkCa.create())) as r:
            box["r"], box["stop"] = r, asyncio.Event()
            box["loop"] = asyncio.get_running_loop()
            ready.set()
            await box["stop"].wait()

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(30)
    r: Running = box["r"]
    yield r, r.client_tls()
    box["loop"].call_soon_threadsafe(box["stop"].set)
    thread.join(10)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    endpoint=st.sampled_from(ENDPOINTS),
    body=bodies,
    ctype=st.sampled_from(["application/json", "text/plain"]),
)
def test_arbitrary_bodies_get_a_problem_not_a_500(
    server: tuple[Running, ssl.SSLContext], endpoint: str, body: bytes, ctype: str
) -> None:
    r, ctx = server
    conn = http.client.HTTPSConnection("127.0.0.1", r.port, context=ctx, timeout=10)
    try:
        conn.request("POST", endpoint, body=body, headers={"Content-Type": ctype})
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    assert resp.status in ALLOWED, (resp.status, data[:300])
    assert resp.getheader("Content-Type", "").startswith("application/problem+json")
    problem = json.loads(data)
    assert problem["status"] == resp.status
    assert problem["code"]
    assert "Traceback" not in problem["detail"]
