"""The decision cache (``admission.decision.decisioncache``): a review that repeats an earlier one but for
its uid gets that one's answer with its own uid; anything else, or any policy or RBAC change in
between, is judged afresh. Every test compares with the answer of a webhook without a cache."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from admission.decision import decisioncache
from admission.decision.decider import Decider, LocalRbac
from admission.decision.response import Decision
from admission.rbac.evaluator import RbacEvaluator
from bootstrap.service.webhook import app as webhookapp
from tests.admission.test_admission_rules import SAMPLE
from tests.admission.test_webhook import GPU, NODEGATE, RBAC, gpu_policies, no_reboot, policy, review
from tests.support.reviewserver import ReviewClient, review_client


class Source:
    """PackagePolicies that a test changes, handed out as a new list each time (as the watcher)."""

    def __init__(self, items: Sequence[Any]) -> None:
        self.items: list[Any] | None = list(items)

    def policies(self) -> list[Any] | None:
        return None if self.items is None else list(self.items)


def _decider(source: Any = None, rbac: Any = None) -> Decider:
    return Decider(
        source or Source(gpu_policies()), rbac or LocalRbac(RbacEvaluator.from_objects(RBAC)), NODEGATE
    )


def _app(
    decider: Decider, cached: bool = True
) -> tuple[webhookapp.ReviewApp, decisioncache.DecisionCache | None]:
    cache = decisioncache.for_decider(decider.compiled_policies, decider.authorizer) if cached else None
    return webhookapp.make_app(decider, cache=cache), cache


def _body(doc: dict[str, Any], uid: str | None = None) -> bytes:
    doc = copy.deepcopy(doc)
    doc["request"]["uid"] = uid or str(uuid.uuid4())
    return json.dumps(doc, separators=(",", ":")).encode()


async def _post(client: ReviewClient, body: bytes) -> dict[str, Any]:
    resp = await client.post("/admission/validate", data=body, headers={"Content-Type": "application/json"})
    assert resp.status == 200, await resp.text()
    out: dict[str, Any] = await resp.json()
    return out


def _same_but_uid(a: dict[str, Any], b: dict[str, Any]) -> bool:
    a, b = copy.deepcopy(a), copy.deepcopy(b)
    a["response"].pop("uid")
    b["response"].pop("uid")
    return a == b


ALLOWED = review(no_reboot(SAMPLE), user="alice")
DENIED = review(no_reboot(SAMPLE), user="mallory")


async def test_a_repeated_review_gets_the_first_answer_with_its_own_uid() -> None:
    app, cache = _app(_decider())
    assert cache is not None
    async with review_client(app) as client:
        for doc in (ALLOWED, DENIED):
            first, second = _body(doc), _body(doc)
            one, two = await _post(client, first), await _post(client, second)
            assert two["response"]["uid"] == json.loads(second)["request"]["uid"]
            assert _same_but_uid(one, two)
    assert cache.hits == 2
    assert len(cache) == 2


async def test_a_policy_change_empties_the_cache() -> None:
    source = Source(gpu_policies())
    app, cache = _app(_decider(source))
    assert cache is not None
    async with review_client(app) as client:
        assert (await _post(client, _body(ALLOWED)))["response"]["allowed"]
        # The gpu policy now allows another registry only: the same review must be denied.
        source.items = [policy("gpu", nodeSelector=GPU, images={"registries": ["registry.example.com"]})]
        out = await _post(client, _body(ALLOWED))
    assert not out["response"]["allowed"]
    assert cache.hits == 0


async def test_an_rbac_change_empties_the_cache() -> None:
    rbac = LocalRbac(RbacEvaluator.from_objects(RBAC))
    app, cache = _app(_decider(rbac=rbac))
    assert cache is not None
    async with review_client(app) as client:
        assert (await _post(client, _body(ALLOWED)))["response"]["allowed"]
        rbac.evaluator = RbacEvaluator.from_objects([])  # alice's binding is gone
        out = await _post(client, _body(ALLOWED))
    assert not out["response"]["allowed"]
    assert "lacks verb deploy" in out["response"]["status"]["message"]
    assert cache.hits == 0


async def test_no_cache_without_policies_or_with_an_authorizer_that_can_change_unseen() -> None:
    class Sar:
        async def allowed(self, user: Any, attrs: Any) -> bool:
            return True

    assert decisioncache.for_decider(_decider().compiled_policies, Sar()) is None
    source = Source(gpu_policies())
    source.items = None  # not loaded: every review is denied as such, and none is kept
    app, cache = _app(_decider(source))
    assert cache is not None
    async with review_client(app) as client:
        for _ in range(2):
            assert "not loaded" in (await _post(client, _body(ALLOWED)))["response"]["status"]["message"]
    assert (cache.hits, len(cache)) == (0, 0)


@pytest.mark.parametrize(
    "uid",
    [
        "0F0E0D0C-1111-2222-3333-444455556666",  # not as the API server writes it (lowercase)
        "not-a-uuid",
        "0f0e0d0c111122223333444455556666",
    ],
)
async def test_only_an_api_server_uid_makes_a_key(uid: str) -> None:
    app, cache = _app(_decider())
    assert cache is not None
    async with review_client(app) as client:
        for _ in range(2):
            out = await _post(client, _body(ALLOWED, uid))
            assert out["response"]["uid"] == uid
    assert (cache.hits, len(cache)) == (0, 0)


def test_large_bodies_are_not_kept() -> None:
    cache = decisioncache.DecisionCache(lambda: None, max_body=100)
    assert cache.key(_body(ALLOWED)) is None


async def test_a_decoy_uid_member_cannot_stand_for_another_review() -> None:
    """A hand-made body with an earlier uid member: stored under that member's position, so the
    review as the API server writes it (no decoy) never finds it; and the decoy body itself is
    judged on its own request, whatever the decoy says."""
    app, cache = _app(_decider())
    assert cache is not None
    uid = str(uuid.uuid4())
    decoy = copy.deepcopy(DENIED)
    decoy["request"]["uid"] = uid
    crafted = json.dumps({"zzz": {"uid": uid}, **decoy}, separators=(",", ":")).encode()
    async with review_client(app) as client:
        assert not (await _post(client, crafted))["response"]["allowed"]
        genuine = await _post(client, _body(DENIED))  # the same request without the decoy
        assert not genuine["response"]["allowed"]
        allowed = copy.deepcopy(ALLOWED)
        allowed["request"]["uid"] = uid
        other = json.dumps({"zzz": {"uid": uid}, **allowed}, separators=(",", ":")).encode()
        assert (await _post(client, other))["response"]["allowed"]  # not the stored denial
    assert cache.hits == 0


def test_least_recently_used_goes_first() -> None:
    generation = (object(), object())
    cache = decisioncache.DecisionCache(lambda: generation, max_entries=2)
    keys = []
    for n in range(3):
        keyed = cache.key(_body(review(no_reboot(SAMPLE), user=f"user-{n}")))
        assert keyed is not None
        keys.append(keyed[0])
    entry = decisioncache.Cached(
        decision=Decision(True),
        head=b"",
        tail=b"",
        operation="CREATE",
        object="x",
        user="u",
        dry_run=False,
    )
    gen = cache.generation()
    cache.put(keys[0], entry, gen)
    cache.put(keys[1], entry, gen)
    assert cache.get(keys[0]) is entry  # used: keys[1] is now the oldest
    cache.put(keys[2], entry, gen)
    assert cache.get(keys[1]) is None
    assert cache.get(keys[0]) is entry
    assert cache.get(keys[2]) is entry
    cache.put(keys[1], entry, (object(), object()))  # judged under another generation: not kept
    assert cache.get(keys[1]) is None


async def test_a_cached_answer_is_logged_like_a_judged_one(caplog: pytest.LogCaptureFixture) -> None:
    app, _ = _app(_decider())
    bodies = [_body(DENIED), _body(DENIED)]
    with caplog.at_level(logging.INFO, logger="nodegate"):
        async with review_client(app) as client:
            for body in bodies:
                await _post(client, body)
    lines = [r for r in caplog.records if r.getMessage().startswith("admission ")]
    assert [r.getMessage() for r in lines] == ["admission denied", "admission denied"]
    assert [r.__dict__["uid"] for r in lines] == [json.loads(b)["request"]["uid"] for b in bodies]
    for name in ("user", "object", "operation", "rules", "dry_run"):
        assert lines[0].__dict__[name] == lines[1].__dict__[name]
    assert lines[0].__dict__["user"] == "mallory"


# -- any sequence of reviews: the cache answers as the webhook without it -------------------------

_USERS = st.sampled_from([("alice", ()), ("mallory", ()), ("bob", ("gpu-team",)), ("root", ())])


@st.composite
def _reviews(draw: st.DrawFn) -> dict[str, Any]:
    doc = no_reboot(SAMPLE) if draw(st.booleans()) else copy.deepcopy(SAMPLE)
    if draw(st.booleans()):
        doc["spec"]["packages"]["node-tuning"]["image"] = draw(
            st.sampled_from(["docker.io/evil/tuning", "ghcr.io/nvidia/skyhook-packages/tuning"])
        )
    if draw(st.booleans()):
        doc["metadata"]["labels"] = {"seq": draw(st.sampled_from(["1", "2"]))}
    user, groups = draw(_USERS)
    op = draw(st.sampled_from(["CREATE", "UPDATE"]))
    old = no_reboot(SAMPLE) if op == "UPDATE" else None
    return review(doc, user=user, groups=groups, op=op, old=old, dry_run=draw(st.booleans()))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(docs=st.lists(_reviews(), min_size=2, max_size=12), changes=st.lists(st.booleans(), max_size=12))
def test_any_sequence_is_answered_as_without_the_cache(
    docs: list[dict[str, Any]], changes: list[bool]
) -> None:
    bodies = [_body(d) for d in docs for _ in range(2)]  # each twice: hits are certain

    async def answers(cached: bool) -> list[dict[str, Any]]:
        source = Source(gpu_policies())
        app, _ = _app(_decider(source), cached)
        out = []
        async with review_client(app) as client:
            for n, body in enumerate(bodies):
                if n < len(changes) and changes[n]:  # a policy change between reviews
                    source.items = list(reversed(source.items or [])) if n % 2 else [gpu_policies()[0]]
                out.append(await _post(client, body))
        return out

    assert asyncio.run(answers(True)) == asyncio.run(answers(False))


# -- while repeats are rare, one review in SAMPLE is keyed ------------------------------------


def _cache() -> decisioncache.DecisionCache:
    generation = (object(), object())
    return decisioncache.DecisionCache(lambda: generation)


def _miss_window(cache: decisioncache.DecisionCache, count: int) -> None:
    """``count`` look-ups of reviews seen once each."""
    for n in range(count):
        cache.lookup((0, b"review %d" % n))


def test_a_window_without_repeats_keys_one_review_in_sample() -> None:
    cache = _cache()
    _miss_window(cache, decisioncache.WINDOW)
    assert cache.sampling
    keyed = [cache.key(_body(ALLOWED)) for _ in range(decisioncache.SAMPLE * 4)]
    assert sum(k is not None for k in keyed) == 4  # the other reviews are judged without a key


def test_a_repeat_among_the_sampled_reviews_keys_every_review_again() -> None:
    cache = _cache()
    _miss_window(cache, decisioncache.WINDOW)
    assert cache.sampling
    body = _body(ALLOWED)
    keyed = None
    while keyed is None:
        keyed = cache.key(body)
    entry = decisioncache.Cached(Decision(True), b"{", b"}", "CREATE", "o", "alice", False)
    hit, generation = cache.lookup(keyed[0])
    assert hit is None
    cache.put(keyed[0], entry, generation)
    again = None
    while again is None:
        again = cache.key(_body(ALLOWED, uid=json.loads(body)["request"]["uid"].replace("a", "b")))
    assert cache.lookup(again[0])[0] == entry  # the same review but for its uid: a hit
    assert not cache.sampling
    assert all(cache.key(_body(ALLOWED)) is not None for _ in range(decisioncache.SAMPLE))


def test_hits_in_a_window_keep_every_review_keyed() -> None:
    cache = _cache()
    keyed = cache.key(_body(ALLOWED))
    assert keyed is not None
    _, generation = cache.lookup(keyed[0])
    cache.put(
        keyed[0], decisioncache.Cached(Decision(True), b"{", b"}", "CREATE", "o", "a", False), generation
    )
    for n in range(decisioncache.WINDOW):
        if n % 64 == 0:
            assert cache.lookup(keyed[0])[0] is not None  # 16 hits a window: repeats are common
        else:
            cache.lookup((0, str(n).encode()))
    assert not cache.sampling


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(docs=st.lists(_reviews(), min_size=2, max_size=10))
def test_any_sequence_is_answered_as_without_the_cache_while_sampling(docs: list[dict[str, Any]]) -> None:
    """With windows of 4 look-ups and one review in 2 keyed while sampling, every mode switch
    happens within a short sequence: the answers stay those of no cache."""
    bodies = [_body(d) for d in docs for _ in range(3)]

    async def answers(cached: bool) -> list[dict[str, Any]]:
        app, _ = _app(_decider(Source(gpu_policies())), cached)
        async with review_client(app) as client:
            return [await _post(client, body) for body in bodies]

    saved = (decisioncache.WINDOW, decisioncache.QUIET_HITS, decisioncache.SAMPLE)
    decisioncache.WINDOW, decisioncache.QUIET_HITS, decisioncache.SAMPLE = 4, 2, 2
    try:
        assert asyncio.run(answers(True)) == asyncio.run(answers(False))
    finally:
        decisioncache.WINDOW, decisioncache.QUIET_HITS, decisioncache.SAMPLE = saved
