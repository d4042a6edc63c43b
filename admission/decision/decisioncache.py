"""Answers for reviews the webhook has judged before, byte for byte but for their uid.

The key is the review's body with its uid cut out (where and what is below), so two reviews share
an answer only when every other byte is the same: user, groups, uid and extra of the requester,
kind, operation, name, namespace, object, oldObject, dryRun and options. The answer is the one
computed for the first of them, with the new uid put in.

Why that is the same decision (docs/admission.md, "The decision cache"):

- The uid is found as the first ``"uid":"<lowercase UUID>"`` in the body (what the API server
  writes: ``request.uid`` is the envelope's first uid member, a UUID, written raw). In valid JSON
  that text can only be an object member ``"uid"`` whose string value is exactly those 36
  characters (a quote after a closed string, or inside a string unescaped, is not JSON). Another
  body with the same key differs only in that value's characters, which are hex digits and
  hyphens: it is the same JSON document, member for member, but for that one string.
- An entry is stored only after the full parse of its review found ``request.uid`` equal to the
  matched value. For a review as the API server sends it, the matched member is ``request.uid``,
  so the two reviews are the same request but for their uid, which the decision never reads. A
  hand-made body that puts an earlier decoy uid member before its real one can at worst be
  answered with the decoy's value, to its own sender (the API server never writes such a body,
  so its reviews cannot be given an answer computed for one: they would differ in more bytes).
- The decision is a pure function of the request, the compiled PackagePolicies and the
  authorizer's answers (``admission.decision.decider``: no clock, no I/O besides the authorizer). Entries
  are kept for one *generation*: the compiled policies object (the decider compiles a new one
  whenever any policy object changes) and the RBAC evaluator. Any change of either empties the
  cache before the next look-up. An authorizer without a generation (SubjectAccessReview: the
  cluster's RBAC can change at any time, unseen) turns the cache off.

Bounded: at most ``max_entries`` entries of bodies up to ``max_body`` bytes; the least recently
used entry goes first. Pure bookkeeping: no I/O, no clock, no globals (one instance per app).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

from admission.decision.decider import Authorizer, LocalRbac
from admission.decision.response import Decision

MAX_ENTRIES = 256
MAX_BODY = 32 * 1024  # larger reviews are judged every time (a few per cluster; their memory matters)
# While repeats are rare the cache only costs (a key of the whole body, an entry nobody asks for:
# about 9 µs a review, docs/benchmarks.md): after a window of WINDOW look-ups with fewer than
# QUIET_HITS hits, one review in SAMPLE is keyed; the first hit among those keys every review again.
WINDOW = 1024
QUIET_HITS = 8
SAMPLE = 16

# The API server's request uid: a lowercase UUID, the first uid member of the envelope.
_UID = re.compile(rb'"uid":"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"')

Key = tuple[int, bytes]
Generation = tuple[object, object]


class Cached(NamedTuple):
    """A judged review: its decision, its answer split around the uid, what its log line says."""

    decision: Decision  # never changed once stored (read by the metrics only)
    head: bytes
    tail: bytes
    operation: str
    object: str
    user: str
    dry_run: bool


def authorizer_generation(authorizer: Authorizer) -> object | None:
    """What identifies the authorizer's answers: the offline RBAC evaluator (it never changes once
    built); None for an authorizer whose answers can change unseen (no caching)."""
    if isinstance(authorizer, LocalRbac):
        return authorizer.evaluator
    return None


class DecisionCache:
    def __init__(
        self,
        generation: Callable[[], Generation | None],
        *,
        max_entries: int = MAX_ENTRIES,
        max_body: int = MAX_BODY,
    ) -> None:
        if max_entries < 1 or max_body < 1:
            raise ValueError("decision cache: max_entries and max_body are positive")
        self._generation = generation
        self._max_entries = max_entries
        self._max_body = max_body
        self._entries: OrderedDict[Key, Cached] = OrderedDict()
        # The generation the entries belong to, held (not its id): a freed object's id can return.
        self._current: Generation | None = None
        self.hits = 0
        self.misses = 0
        self.sampling = False  # repeats are rare: one review in SAMPLE is keyed
        self._skipped = 0
        self._window = 0  # look-ups in the current window
        self._window_hits = 0

    def key(self, body: bytes) -> tuple[Key, str] | None:
        """The body's key and its uid; None for a body that is not cached (too large, no API
        server uid, or not sampled while repeats are rare)."""
        if self.sampling:
            self._skipped += 1
            if self._skipped < SAMPLE:
                return None
            self._skipped = 0
        if len(body) > self._max_body:
            return None
        found = _UID.search(body)
        if found is None:
            return None
        start, end = found.span(1)
        return (start, body[:start] + body[end:]), found.group(1).decode("ascii")

    def generation(self) -> Generation | None:
        """The current generation (None: do not cache now); a new one empties the cache."""
        now = self._generation()
        current = self._current
        if now is None or current is None or now[0] is not current[0] or now[1] is not current[1]:
            self._entries.clear()
            self._current = now
        return self._current

    def get(self, key: Key) -> Cached | None:
        return self.lookup(key)[0]

    def lookup(self, key: Key) -> tuple[Cached | None, Generation | None]:
        """The entry for ``key`` (None: judge it), and the generation to store a judgement under."""
        generation = self.generation()
        if generation is None:
            return None, None
        found = self._entries.get(key)
        self._observe(found is not None)
        if found is None:
            self.misses += 1
            return None, generation
        self._entries.move_to_end(key)
        self.hits += 1
        return found, generation

    def _observe(self, hit: bool) -> None:
        """Whether repeats are rare now (``sampling``), from the hits of the last window."""
        self._window += 1
        self._window_hits += hit
        if self.sampling:
            if hit:
                self.sampling = False  # repeats are back: key every review
            elif self._window < WINDOW // SAMPLE:
                return
        elif self._window < WINDOW:
            return
        else:
            self.sampling = self._window_hits < QUIET_HITS
        self._window = self._window_hits = 0

    def put(self, key: Key, entry: Cached, generation: Generation | None) -> None:
        """Store ``entry``, judged under ``generation``, unless the generation moved meanwhile."""
        # Every look-up checks the generation first and empties the cache when it moved, so an
        # entry judged under an older one would be dropped before any look-up could find it.
        if generation is None or generation is not self._current:
            return
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


def for_decider(compiled: Callable[[], object | None], authorizer: Authorizer) -> DecisionCache | None:
    """A cache whose generation is (compiled policies, RBAC evaluator); None when the authorizer
    has no generation (its answers may change unseen)."""
    if authorizer_generation(authorizer) is None:
        return None

    def generation() -> Generation | None:
        policies, rbac = compiled(), authorizer_generation(authorizer)
        return None if policies is None or rbac is None else (policies, rbac)

    return DecisionCache(generation)
