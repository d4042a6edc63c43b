"""``bootstrap.service.admin.bearer.TokenChecks``: the refusal cache and the budget of API calls that the
admin API's bearer tokens may hold (issue 33, finding 3), against a stand-in for the cluster."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admission.rbac.evaluator import ResourceAttributes, UserInfo
from bootstrap.kube import AccessDecision, KubeUnavailable
from bootstrap.problems import RateLimited
from bootstrap.service.admin.bearer import TokenChecks

OPS = UserInfo("ops", "1", ("sre",))
ATTRS = ResourceAttributes(verb="list", group="nodegate.io", resource="nodeattestations")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Cluster:
    """Accepts the tokens in ``valid``; counts every TokenReview; ``hold`` keeps calls open."""

    def __init__(self, valid: set[str] | None = None) -> None:
        self.valid = valid if valid is not None else {"ops-token"}
        self.reviews: list[str] = []
        self.hold: asyncio.Event | None = None
        self.entered = asyncio.Event()  # set whenever a call reaches the cluster
        self.fail = False

    async def token_review(self, token: str, _audiences: Any) -> UserInfo | None:
        self.reviews.append(token)
        self.entered.set()
        if self.hold is not None:
            await self.hold.wait()
        if self.fail:
            raise KubeUnavailable("TokenReview: HTTP 500")
        return OPS if token in self.valid else None

    async def subject_access_review(self, _user: UserInfo, _attrs: ResourceAttributes) -> AccessDecision:
        if self.hold is not None:
            await self.hold.wait()
        return AccessDecision(allowed=True, denied=False, reason="")


def checks(cluster: Cluster, **kw: Any) -> TokenChecks:
    return TokenChecks(cluster, **{"budget": 4, **kw})  # type: ignore[arg-type]


async def test_a_refusal_is_remembered_until_its_time_is_up() -> None:
    cluster, clock = Cluster(), Clock()
    tokens = checks(cluster, ttl=10.0, clock=clock)
    for _ in range(5):
        assert await tokens.user("junk", ()) is None
    assert cluster.reviews == ["junk"]
    clock.now += 10.5
    assert await tokens.user("junk", ()) is None
    assert cluster.reviews == ["junk", "junk"]


async def test_accepted_tokens_and_failures_are_never_remembered() -> None:
    cluster = Cluster()
    tokens = checks(cluster)
    assert await tokens.user("ops-token", ()) == OPS
    assert await tokens.user("ops-token", ()) == OPS
    assert cluster.reviews == ["ops-token", "ops-token"]
    cluster.valid.discard("ops-token")  # the ServiceAccount was deleted: no grace period
    assert await tokens.user("ops-token", ()) is None
    cluster.fail = True
    with pytest.raises(KubeUnavailable):
        await tokens.user("other", ())
    cluster.fail = False
    cluster.valid.add("other")
    assert await tokens.user("other", ()) == OPS  # the failure was not taken for a refusal


async def test_the_cache_is_bounded_oldest_first() -> None:
    cluster = Cluster()
    tokens = checks(cluster, max_refusals=3)
    for t in ("a", "b", "c", "d"):
        await tokens.user(t, ())
    await tokens.user("d", ())
    await tokens.user("a", ())  # dropped for d: asked again
    assert cluster.reviews == ["a", "b", "c", "d", "a"]


async def test_no_token_is_kept() -> None:
    tokens = checks(Cluster())
    await tokens.user("junk-secret-value", ())
    keys = list(tokens._refused)
    assert len(keys) == 1
    assert b"junk-secret-value" not in keys[0]
    import hashlib

    assert keys[0] != hashlib.sha256(b"junk-secret-value").digest()  # keyed: not computable outside


async def test_the_budget_refuses_at_once_and_frees_its_slots() -> None:
    cluster = Cluster()
    cluster.hold = asyncio.Event()
    tokens = checks(cluster, budget=2)
    held = [asyncio.ensure_future(tokens.user(f"junk-{i}", ())) for i in range(2)]
    while len(cluster.reviews) < 2:  # wait for both calls to reach the cluster
        cluster.entered.clear()
        await asyncio.wait_for(cluster.entered.wait(), 30)
    assert tokens.inflight == 2
    with pytest.raises(RateLimited) as refused:
        await tokens.user("junk-3", ())
    assert refused.value.code == "rate_limited"
    assert refused.value.retry_after == 1
    assert "junk-3" not in cluster.reviews
    with pytest.raises(RateLimited):
        await tokens.decision(OPS, ATTRS)  # the SubjectAccessReview shares the budget
    cluster.hold.set()
    assert await asyncio.gather(*held) == [None, None]
    cluster.fail = True
    with pytest.raises(KubeUnavailable):
        await tokens.user("junk-4", ())
    assert tokens.inflight == 0  # released after answers and failures alike
    assert (await tokens.decision(OPS, ATTRS)).allowed


@settings(max_examples=60, deadline=None)
@given(
    calls=st.lists(st.sampled_from(["ops-token", "dev-token", "junk-1", "junk-2", "junk-3"]), max_size=30),
    valid=st.sets(st.sampled_from(["ops-token", "dev-token", "junk-1"])),
)
def test_the_cache_never_changes_an_answer_and_asks_once_per_refused_token(
    calls: list[str], valid: set[str]
) -> None:
    async def run() -> None:
        cluster = Cluster(set(valid))
        tokens = checks(cluster, clock=Clock())  # the clock stands still: nothing expires
        for token in calls:
            user = await tokens.user(token, ())
            assert (user is not None) == (token in valid)
        for token in set(calls) - valid:
            assert cluster.reviews.count(token) == 1
        for token in set(calls) & valid:
            assert cluster.reviews.count(token) == calls.count(token)

    asyncio.run(run())
