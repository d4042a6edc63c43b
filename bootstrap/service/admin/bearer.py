"""The admin API's bearer-token checks (TokenReview, then SubjectAccessReview), within a budget.

Each check is a call on the Kubernetes client that the joins' Node and CSR writes, the gate and the
webhook's SubjectAccessReviews share, and anyone can send a token. So that junk tokens cannot
spend that client (issue 33, finding 3):

- **at most ``budget`` calls in flight** for bearer tokens; a token that finds none free is answered
  429 ``rate_limited`` at once, never queued (a queue would hold its connection and handler);
- **refusals are remembered** for ``ttl`` seconds: a token TokenReview did not accept is answered
  401 again without asking. The cache is keyed by HMAC-SHA256 of the token under a key drawn at
  start: the token is never kept, and the dictionary lookup's timing depends only on digests no
  caller can compute, so it tells nothing about the tokens remembered. Bounded: the oldest
  refusals go first. Accepted tokens are never cached (a revoked token stops working at once).

The per-address rate of the admin routes is ``Service.admin_rate`` (``limits.admin_rate``); this
module bounds what all addresses together cost the API.
"""

from __future__ import annotations

import contextlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence

from admission.rbac.evaluator import ResourceAttributes, UserInfo
from bootstrap.kube import AccessDecision, Kube
from bootstrap.problems import RateLimited

REFUSAL_TTL = 10.0
MAX_REFUSALS = 10_000


class TokenChecks:
    def __init__(
        self,
        kube: Kube,
        *,
        budget: int,
        ttl: float = REFUSAL_TTL,
        max_refusals: int = MAX_REFUSALS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if budget < 1:
            raise ValueError("the token check budget is at least 1")
        self._kube = kube
        self._budget = budget
        self._ttl = ttl
        self._max = max_refusals
        self._clock = clock
        self._key = secrets.token_bytes(32)
        self._refused: OrderedDict[bytes, float] = OrderedDict()  # digest -> until
        self.inflight = 0

    async def user(self, token: str, audiences: Sequence[str]) -> UserInfo | None:
        """Who the token belongs to, or None when the cluster does not accept it (now or within
        the last ``ttl`` seconds). RateLimited when the budget is spent; KubeUnavailable when the
        API cannot answer (not remembered)."""
        digest = hmac.digest(self._key, token.encode("utf-8", "surrogateescape"), "sha256")
        now = self._clock()
        until = self._refused.get(digest)
        if until is not None:
            if until > now:
                return None
            del self._refused[digest]
        with self._slot():
            user = await self._kube.token_review(token, audiences)
        if user is None:
            self._refused[digest] = self._clock() + self._ttl
            while len(self._refused) > self._max:
                self._refused.popitem(last=False)
        return user

    async def decision(self, user: UserInfo, attrs: ResourceAttributes) -> AccessDecision:
        """A SubjectAccessReview within the same budget."""
        with self._slot():
            return await self._kube.subject_access_review(user, attrs)

    @contextlib.contextmanager
    def _slot(self) -> Iterator[None]:
        if self.inflight >= self._budget:
            raise RateLimited(
                "too many bearer tokens are being checked; retry shortly (an admin SVID is not "
                "limited by this)",
                retry_after=1,
            )
        self.inflight += 1
        try:
            yield
        finally:
            self.inflight -= 1
