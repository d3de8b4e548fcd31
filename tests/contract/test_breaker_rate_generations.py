"""Counts made in one generation of a failure-rate window never trip the breaker in the next.

Every trip and reset starts a new window generation; a process's counts not written yet belong
to the generation they were made in. Written late, into a generation that is gone, they must be
refused, and they must not open the breaker that an operator just reset::

    P: 3 failures (not written yet, fewer than minimum_calls)   ... operator: reset (gen 1)
    P: a 4th failure: by P's own counts it could trip, so it writes at once, into gen 0
       -> refused: the breaker stays closed; gen 1 starts empty
"""

from __future__ import annotations

from dynacoord import BreakerState, FailureRate, ManualClock


def test_late_counts_of_the_generation_before_a_reset_never_trip(make_backend) -> None:
    clock = ManualClock()
    first = make_backend(clock=clock)
    other = make_backend(clock=clock, namespace=first.namespace)
    policy = FailureRate(threshold=0.5, minimum_calls=4, window=10.0, flush_interval=5.0)
    p = first.breaker("svc", reset_timeout=30, policy=policy)
    operator = other.breaker("svc", reset_timeout=30, policy=policy)
    operator.record_success()
    operator.flush()  # the breaker's item exists (a reset of one never written writes nothing)
    for _ in range(3):
        p.record_failure()  # pending in P, generation 0
    operator.reset()  # generation 1
    p.record_failure()  # 4 of 4 by P's counts: written at once, into generation 0
    assert p.state is BreakerState.CLOSED
    assert operator.state is BreakerState.CLOSED
    for _ in range(4):
        operator.record_failure()  # the new generation counts from zero, and trips
    assert operator.state is BreakerState.OPEN
