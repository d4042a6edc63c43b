"""A flood of junk bearer tokens on the admin API (issue 33, finding 3).

Each ``Authorization: Bearer <junk>`` cost a TokenReview, unlimited, on the Kubernetes client that
the joins' Node and CSR writes, the gate and the webhook's SubjectAccessReviews share (100
connections): under a flood a genuine join failed with 503 and an allowed review neared the
webhook's timeout. Now the admin routes are rate-limited per address (``limits.admin_rate``),
refusals are remembered briefly by a keyed hash of the token, and bearer checks have their own
small budget of API calls (``limits.admin_reviews``); beyond them the flood gets 429
``rate_limited``.

The flood runs in its own tasks from several loopback addresses against the real listener; the
emulated API counts the TokenReviews that reach it. Assertions are counts and answers, never
times; a wait is for an event, bounded only so that a failing test ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from bootstrap.service.serve import Serving, start
from tests.admission.test_webhook import gpu_policies, no_reboot, review
from tests.service.test_abuse import GENUINE, base, client_tls, http
from tests.support.kshim import TOKEN_REVIEW_PATH, ShimEmulator, cluster_signer, kubeconfig
from tests.support.package_crs import SAMPLE
from tests.support.service import EkCa, settings_for
from tests.support.softnode import join, post

WAIT = 30.0  # bound for events that take well under a second; only a failing test waits this long
FLOODERS = [f"127.0.0.{i}" for i in range(11, 17)]  # six addresses, as in the report
OPS_TOKEN = "ops-token"  # the one token the emulated API accepts


class CountedReviews(ShimEmulator):
    """The emulated API, counting the TokenReviews that reach it; ``hold`` keeps them unanswered
    (a slow API, or one drowned by the flood) until it is set."""

    def counted(self) -> Counter[str]:
        if "_tokens" not in self.__dict__:
            self.__dict__["_tokens"] = Counter()
            self.__dict__["hold"] = asyncio.Event()
            self.__dict__["hold"].set()
            self.__dict__["progress"] = asyncio.Event()
        tokens: Counter[str] = self.__dict__["_tokens"]
        return tokens

    async def _handle(self, request: Any) -> Any:
        if request.url.path == TOKEN_REVIEW_PATH and request.method.value == "POST":
            self.counted()[request.data["spec"]["token"]] += 1
            self.__dict__["progress"].set()
            await self.__dict__["hold"].wait()
        return await super()._handle(request)


pytestmark = pytest.mark.kmock(cls=CountedReviews)


@pytest.fixture(scope="module")
def ek_ca() -> EkCa:
    return EkCa.create()


@contextlib.asynccontextmanager
async def served(
    kmock: Any, tmp: Path, ek_ca: EkCa, limits: dict[str, Any], timeout: str = "3s"
) -> AsyncIterator[Serving]:
    kmock.counted()
    kmock.resources["nodegate.io/v1alpha1/nodeattestations"] = {
        "kind": "NodeAttestation",
        "namespaced": False,
    }
    kmock.signer = cluster_signer()
    kmock.token_review = lambda body: (
        {"authenticated": True, "user": {"username": "ops", "uid": "1", "groups": ["sre"]}}
        if body["spec"]["token"] == OPS_TOKEN
        else {"authenticated": False}
    )
    kmock.sar = lambda _body: {"allowed": True}
    (tmp / "kubeconfig").write_text(yaml.safe_dump(kubeconfig(str(kmock.url))))
    (tmp / "policies.yaml").write_text(
        yaml.safe_dump_all([p.model_dump(by_alias=True, exclude_none=True) for p in gpu_policies()])
    )
    settings = settings_for(
        tmp,
        ek_ca,
        store="kubernetes",
        kubernetes={"kubeconfig": str(tmp / "kubeconfig"), "timeout": timeout},
        admission={"policy_files": [str(tmp / "policies.yaml")]},  # deploy rights: SubjectAccessReview
        limits=limits,
    )
    running = await start(settings, kube=True)
    try:
        yield running
    finally:
        kmock.hold.set()
        await running.close()


async def junk(
    s: Serving,
    source: str,
    count: int,
    token: Callable[[], str],
    answered: Callable[[], None] = lambda: None,
) -> list[tuple[int, str, str]]:
    """``count`` admin requests at once from ``source``: (status, code, Retry-After) each."""

    async def one(h: aiohttp.ClientSession) -> tuple[int, str, str]:
        headers = {"Authorization": f"Bearer {token()}"}
        try:
            async with h.get(f"{base(s)}/v1/admin/nodes", headers=headers) as resp:
                body = await resp.json(content_type=None)
                return resp.status, body.get("code", ""), resp.headers.get("Retry-After", "")
        finally:
            answered()

    async with http(s, source=source) as h:
        return await asyncio.gather(*(one(h) for _ in range(count)))


def fresh_junk() -> str:
    return "junk-" + secrets.token_urlsafe(24)


async def genuine_join(s: Serving, ek_ca: EkCa, name: str) -> tuple[int, dict[str, Any]]:
    async with http(s, source=GENUINE) as h:
        return await join(h, base(s), ek_ca.node(name))


async def allowed_review(s: Serving) -> tuple[int, dict[str, Any]]:
    connector = aiohttp.TCPConnector(ssl=client_tls(s), local_addr=(GENUINE, 0))
    async with aiohttp.ClientSession(connector=connector) as h:
        return await post(
            h, f"https://127.0.0.1:{s.admission_port}/admission/validate", review(no_reboot(SAMPLE))
        )


async def until(kmock: Any, done: Callable[[], bool]) -> None:
    """Wait for the emulated API or the flood to make progress until ``done``."""
    while not done():
        kmock.progress.clear()
        await asyncio.wait_for(kmock.progress.wait(), WAIT)


async def test_a_junk_token_flood_is_bounded_per_address_and_refusals_are_remembered(
    kmock: Any, tmp_path: Path, ek_ca: EkCa
) -> None:
    burst, per_address = 5, 30
    # admin_rate: no token comes back within the test, so each address gets exactly its burst
    async with served(kmock, tmp_path, ek_ca, {"admin_rate": 0.0001, "admin_burst": burst}) as s:
        flood = [asyncio.ensure_future(junk(s, a, per_address, fresh_junk)) for a in FLOODERS]
        status, out = await genuine_join(s, ek_ca, "gpu-f1")  # while the flood is on
        assert status == 200, out
        assert out["kubeconfig"]
        status, verdict = await allowed_review(s)
        assert status == 200, verdict
        assert verdict["response"]["allowed"] is True, verdict
        answers = [a for f in await asyncio.gather(*flood) for a in f]
        reviews = sum(kmock.counted().values())

        # The same junk token again and again (from an address with its burst left): one review.
        repeated = "junk-repeated-" + secrets.token_urlsafe(8)
        again = [(await junk(s, "127.0.0.20", 1, lambda: repeated))[0] for _ in range(burst)]
        async with (
            http(s, source="127.0.0.21") as h,
            h.get(f"{base(s)}/v1/admin/nodes", headers={"Authorization": f"Bearer {OPS_TOKEN}"}) as resp,
        ):
            ops_status = resp.status

    total = len(FLOODERS) * per_address
    assert reviews <= len(FLOODERS) * burst, f"{reviews} TokenReviews for {total} junk tokens"
    statuses = Counter((st, code) for st, code, _ in answers)
    assert set(statuses) <= {(401, "unauthenticated"), (429, "rate_limited")}, statuses
    assert statuses[429, "rate_limited"] >= total - len(FLOODERS) * burst, statuses
    assert all(float(retry) > 0 for st, _, retry in answers if st == 429)
    assert [st for st, _, _ in again] == [401] * burst
    assert kmock.counted()[repeated] == 1, "a refused token is remembered, not reviewed again"
    assert ops_status == 200  # a genuine admin token from its own address still works


async def test_held_token_reviews_take_only_their_budget_and_joins_and_reviews_go_on(
    kmock: Any, tmp_path: Path, ek_ca: EkCa
) -> None:
    """The API answers no TokenReview (held): the flood may occupy ``admin_reviews`` calls, no
    more, and a join (Node, CSR) and an allowed review (SubjectAccessReview) on the same client
    complete. Before, each junk token held a connection of the shared pool (on the old code this
    test fails with every TokenReview the pool let through in flight: 99 in our run)."""
    budget, per_address = 4, 20
    total = len(FLOODERS) * per_address  # 120: more than the client's 100 connections
    async with served(
        kmock,
        tmp_path,
        ek_ca,
        {"admin_rate": 1000, "admin_burst": 1000, "admin_reviews": budget},
        timeout="5s",  # a held review ends after this (503) once the join and the review are done
    ) as s:
        kmock.hold.clear()
        answers = 0

        def answered() -> None:
            nonlocal answers
            answers += 1
            kmock.progress.set()

        flood = [asyncio.ensure_future(junk(s, a, per_address, fresh_junk, answered)) for a in FLOODERS]

        def settled() -> bool:  # the old code: more reviews than the budget reach the API
            reviews = sum(kmock.counted().values())
            return reviews > budget or (reviews == budget and answers == total - budget)

        await until(kmock, settled)
        held = sum(kmock.counted().values())
        join_status, join_out = await genuine_join(s, ek_ca, "gpu-f2")
        review_status, verdict = await allowed_review(s)
        kmock.hold.set()
        finished = [a for f in await asyncio.gather(*flood) for a in f]

    assert join_status == 200, join_out
    assert review_status == 200, verdict
    assert verdict["response"]["allowed"] is True, verdict
    assert held == budget, f"{held} TokenReviews in flight; the budget is {budget}"
    statuses = Counter((st, code) for st, code, _ in finished)
    assert statuses[429, "rate_limited"] == total - budget, statuses
    # The held ones: refused once answered (503 if the API call's own timeout came first).
    assert statuses[401, "unauthenticated"] + statuses[503, "unavailable"] == budget, statuses
