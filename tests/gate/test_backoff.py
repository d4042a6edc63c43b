"""The retry delay of the gate and the webhook's watches stays bounded however long an outage
lasts (an uncapped exponent overflowed the float after about 1,000 failures in a row and ended
the watch task)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bootstrap.gate.backoff import MAX_BACKOFF, failure_delay


@given(st.integers(0, 10**6))
def test_the_delay_after_any_number_of_failures_is_within_the_cap(failures: int) -> None:
    assert 0 < failure_delay(failures) <= MAX_BACKOFF
