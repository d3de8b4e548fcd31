"""A failure rate spread across the whole window trips the breaker, on every backend.

The window is ``buckets`` buckets wide, the current one and the ``buckets - 1`` before it; a
window write drops the counts no window needs any more. Counts spread one per bucket reach the
threshold only if every live bucket is still counted when the last one lands: a store that drops
one bucket too many (the oldest live one) never sees ``minimum_calls`` calls.
"""

from __future__ import annotations

import math

import pytest

from dynacoord import BreakerState, FailureRate, ManualClock


class BoomError(Exception):
    pass


def _fail() -> None:
    raise BoomError("dependency failed")


@pytest.mark.parametrize("processes", [1, 2])
def test_failures_one_per_bucket_across_the_window_trip(make_backend, processes: int) -> None:
    clock = ManualClock()
    clock.advance(math.ceil(clock.time()) - clock.time() + 0.5)  # the middle of a 1 s bucket
    first = make_backend(clock=clock)
    backends = [first] + [
        make_backend(clock=clock, namespace=first.namespace) for _ in range(processes - 1)
    ]
    policy = FailureRate(threshold=0.5, minimum_calls=10, window=10.0, flush_interval=0)
    breakers = [b.breaker("svc", reset_timeout=30, policy=policy) for b in backends]
    for i in range(10):  # 10 s window of 10 buckets of 1 s: one failure in each
        if i:
            clock.advance(1.0)
        assert all(b.state is BreakerState.CLOSED for b in breakers), f"open after {i} calls"
        with pytest.raises(BoomError):
            breakers[i % processes].call(_fail)
    assert all(b.state is BreakerState.OPEN for b in breakers), "10 failures in the window"


def test_the_oldest_bucket_ages_out_one_bucket_later(make_backend) -> None:
    """The other side of the same edge: the failure of the bucket that just left the window no
    longer counts (9 failures in the window, then 9 + the new one)."""
    clock = ManualClock()
    clock.advance(math.ceil(clock.time()) - clock.time() + 0.5)
    backend = make_backend(clock=clock)
    policy = FailureRate(threshold=0.5, minimum_calls=10, window=10.0, flush_interval=0)
    breaker = backend.breaker("svc", reset_timeout=30, policy=policy)
    for i in range(9):
        if i:
            clock.advance(1.0)
        with pytest.raises(BoomError):
            breaker.call(_fail)
    clock.advance(2.0)  # the first failure's bucket leaves the window: 8 left, then the 9th
    with pytest.raises(BoomError):
        breaker.call(_fail)
    assert breaker.state is BreakerState.CLOSED
    clock.advance(1.0)
    with pytest.raises(BoomError):
        breaker.call(_fail)  # 9 in the window again (the second left, this one came)
    assert breaker.state is BreakerState.CLOSED
