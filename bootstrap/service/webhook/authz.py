"""Authorizers for the admission webhook: SubjectAccessReview through the API, with a short cache.

"No opinion" is a denial. An API that cannot answer raises AuthorizerUnavailable, which the
webhook turns into a denial that says why (fail closed). Only answers are cached, never errors.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from admission.decision.decider import AuthorizerUnavailable
from admission.rbac.evaluator import ResourceAttributes, UserInfo
from bootstrap.kube import Kube, KubeUnavailable

CacheKey = tuple[str, str, tuple[str, ...], tuple[tuple[str, tuple[str, ...]], ...], ResourceAttributes]


class SarAuthorizer:
    def __init__(
        self,
        kube: Kube,
        *,
        ttl: float = 5.0,
        max_entries: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube = kube
        self._ttl = ttl
        self._max = max_entries
        self._clock = clock
        self._cache: OrderedDict[CacheKey, tuple[float, bool]] = OrderedDict()

    async def allowed(self, user: UserInfo, attrs: ResourceAttributes) -> bool:
        # Every part of the identity is in the key: a group or extra change is a new question.
        key: CacheKey = (
            user.username,
            user.uid,
            tuple(sorted(user.groups)),
            tuple(sorted((k, tuple(v)) for k, v in user.extra.items())),
            attrs,
        )
        now = self._clock()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            self._cache.move_to_end(key)
            return hit[1]
        try:
            decision = await self._kube.subject_access_review(user, attrs)
        except KubeUnavailable as exc:
            raise AuthorizerUnavailable(str(exc)) from None
        allowed = decision.allowed and not decision.denied
        self._cache[key] = (now + self._ttl, allowed)
        self._cache.move_to_end(key)
        while len(self._cache) > self._max:
            self._cache.popitem(last=False)
        return allowed
