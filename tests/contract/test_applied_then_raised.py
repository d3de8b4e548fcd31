"""Writes applied and then raised to their caller (issue 49, section 2), on every backend.

botocore raises after its last attempt when the first one applied and its answer was lost (a read
timeout, then connection errors); redis-py raises once its retries cannot reconnect; pymongo
raises ``AutoReconnect``. The caller must treat such a write as "maybe applied", never as "not
written", and its next attempt must recognise it (DESIGN.md section 1). ``lossy.raise_next``
(tests/lossy.py) injects it; ``applied=False`` raises the same error with nothing sent.
"""

from __future__ import annotations

import pytest
from botocore.exceptions import EndpointConnectionError

from dynacoord import BreakerState, FailureRate, ManualClock
from dynacoord.errors import BackendError

CLOSED, OPEN = BreakerState.CLOSED, BreakerState.OPEN

#: what a caller sees when the client gave up: botocore's own error, or the backend's wrapper
RAISED = (EndpointConnectionError, BackendError)


class BoomError(Exception):
    pass


def _fail() -> None:
    raise BoomError("dependency failed")


# -- the fault itself ----------------------------------------------------------------------------


@pytest.mark.parametrize("applied", [True, False], ids=["applied", "unsent"])
def test_raise_next_raises_to_the_caller_with_the_write_applied_or_not(lossy, applied):
    counters = lossy.backend().counters
    counters.increment("c")
    lossy.raise_next(applied=applied)
    with pytest.raises(RAISED):
        counters.increment("c")
    assert lossy.raised == 1
    assert lossy.lost == (1 if applied else 0)
    assert counters.get("c") == (2 if applied else 1)
    assert counters.increment("c") == (3 if applied else 2)  # the client is usable again


# -- FailureRate flush ---------------------------------------------------------------------------


def _rate_breaker(lossy, clock):
    # flush_interval longer than the test: only flush() writes the counts
    policy = FailureRate(threshold=0.5, minimum_calls=5, window=60, flush_interval=30)
    return lossy.backend(clock=clock).breaker("svc", reset_timeout=10, policy=policy)


def test_a_flush_applied_and_raised_counts_once(lossy):
    # 3 calls and 3 failures, written once: 3/3 is below minimum_calls=5, the breaker stays
    # closed. Counted twice (the flush puts them back and the next one adds them under a new
    # token) they are 6/6 and it opens.
    clock = ManualClock()
    breaker = _rate_breaker(lossy, clock)
    for _ in range(3):
        with pytest.raises(BoomError):
            breaker.call(_fail)
    lossy.raise_next()
    with pytest.raises(RAISED):
        breaker.flush()
    assert lossy.lost == 1
    breaker.flush()
    assert breaker.state is CLOSED
    # the counts are not lost either: 2 more failures make 5 of 5
    for _ in range(2):
        with pytest.raises(BoomError):
            breaker.call(_fail)
    breaker.flush()
    assert breaker.state is OPEN


def test_a_flush_raised_unsent_is_written_by_the_next(lossy):
    clock = ManualClock()
    breaker = _rate_breaker(lossy, clock)
    for _ in range(3):
        with pytest.raises(BoomError):
            breaker.call(_fail)
    lossy.raise_next(applied=False)
    with pytest.raises(RAISED):
        breaker.flush()
    assert lossy.raised == 1 and lossy.lost == 0
    breaker.flush()
    assert breaker.state is CLOSED
    for _ in range(2):
        with pytest.raises(BoomError):
            breaker.call(_fail)
    breaker.flush()
    assert breaker.state is OPEN  # 5 of 5: the unsent 3 were written once


def test_calls_counted_while_a_flush_was_unanswered_are_written_once_too(lossy):
    clock = ManualClock()
    breaker = _rate_breaker(lossy, clock)
    for _ in range(2):
        with pytest.raises(BoomError):
            breaker.call(_fail)
    lossy.raise_next()
    with pytest.raises(RAISED):
        breaker.flush()
    for _ in range(2):
        with pytest.raises(BoomError):
            breaker.call(_fail)
    lossy.raise_next()
    with pytest.raises(RAISED):
        breaker.flush()  # the re-send of the first: applied again, raised again
    breaker.flush()
    assert breaker.state is CLOSED  # 4 of 4
    with pytest.raises(BoomError):
        breaker.call(_fail)
    breaker.flush()
    assert breaker.state is OPEN  # 5 of 5
