"""Failure-rate breaker contract (``policy=FailureRate(...)``): every backend, public API plus the
store's request counts.

Each breaker instance stands for one process (its own backend and store, one namespace); the
``ManualClock`` is shared, so the window's buckets and the flush period are exact.
"""

from __future__ import annotations

import contextlib
import threading

import pytest

from dynacoord import BreakerState, CircuitOpenError, FailureRate, ManualClock
from tests.conftest import CountingStore, needs_atomic_store

CLOSED, OPEN, HALF_OPEN = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN


class BoomError(Exception):
    pass


def fail():
    raise BoomError("dependency failed")


def ok():
    return "ok"


def _processes(make_backend, n, *, clock=None, **policy):
    """``n`` breakers named ``svc`` on one store (one per simulated process) and the clock."""
    clock = clock or ManualClock()
    first = make_backend(clock=clock)
    backends = [first] + [
        make_backend(clock=clock, namespace=first.namespace) for _ in range(n - 1)
    ]
    policy.setdefault("threshold", 0.5)
    policy.setdefault("minimum_calls", 10)
    policy.setdefault("window", 10.0)
    breakers = [b.breaker("svc", reset_timeout=5, policy=FailureRate(**policy)) for b in backends]
    return breakers, clock


def _run(breaker, outcome):
    if outcome == "ok":
        return breaker.call(ok)
    with pytest.raises(BoomError):
        breaker.call(fail)
    return None


def test_trips_at_the_rate_once_minimum_calls_are_made_by_several_processes(make_backend):
    (a, b), clock = _processes(make_backend, 2, flush_interval=0)
    for _ in range(4):
        _run(a, "ok")
        _run(b, "fail")
        clock.advance(0.1)
    assert a.state is CLOSED  # 4/8 failed, but fewer than minimum_calls
    _run(a, "ok")
    assert a.state is CLOSED  # 4/9
    _run(b, "fail")  # 5/10: the rate and the minimum are met
    assert a.state is OPEN and b.state is OPEN
    with pytest.raises(CircuitOpenError):
        a.call(ok)


def test_below_the_threshold_it_stays_closed(make_backend):
    (a,), clock = _processes(make_backend, 1, flush_interval=0, threshold=0.5)
    for i in range(40):
        _run(a, "fail" if i % 3 == 0 else "ok")  # a third fail
        clock.advance(0.1)
    assert a.state is CLOSED


def test_failures_age_out_of_the_window(make_backend):
    # window 10 s in 10 buckets of 1 s: 9 failures, then 10 s later they no longer count
    (a,), clock = _processes(make_backend, 1, flush_interval=0, minimum_calls=10)
    for _ in range(9):
        _run(a, "fail")
    assert a.state is CLOSED
    clock.advance(10.0)
    _run(a, "fail")  # 1 call in the window, not 10
    assert a.state is CLOSED


def test_successes_far_from_a_decision_are_written_once_per_success_interval(make_backend):
    """Successes that change no decision wait for ``success_flush_interval`` (None: half the
    window, 5 s here), not ``flush_interval``: from every process of a fleet, a write a second
    each cost 0.6-0.8 WCU per call (issue 50). Before: one write per ``flush_interval``."""
    (a,), clock = _processes(make_backend, 1, flush_interval=1.0)
    store = CountingStore(a._store)
    a._store = store
    for _ in range(499):  # 100 calls/s for 5 s
        _run(a, "ok")
        clock.advance(0.01)
    assert "add_window" not in store.calls
    clock.advance(0.1)
    _run(a, "ok")
    assert store.calls.get("add_window") == 1
    assert store.calls.get("get") == 500  # one eventually consistent read per call, as before


def test_a_failure_is_written_within_flush_interval(make_backend):
    (a, b), clock = _processes(make_backend, 2, flush_interval=1.0, minimum_calls=100)
    store = CountingStore(a._store)
    a._store = store
    _run(a, "fail")
    for _ in range(110):
        _run(a, "ok")
        clock.advance(0.01)
    assert store.calls.get("add_window") == 1  # the failure and the calls after it
    assert b.status().state is CLOSED


def test_successes_near_a_decision_are_written_within_flush_interval(make_backend):
    """Once the window a process saw is near a decision (half of ``minimum_calls``, half of
    ``threshold`` failing), its successes count: they go every ``flush_interval``."""
    (a,), clock = _processes(make_backend, 1, flush_interval=1.0, minimum_calls=10)
    store = CountingStore(a._store)
    a._store = store
    for _ in range(3):
        _run(a, "fail")
        _run(a, "ok")
        clock.advance(0.6)
    writes = store.calls.get("add_window", 0)
    assert writes >= 1  # failures: within the interval; the window seen is now near a decision
    for _ in range(3):
        _run(a, "ok")
        clock.advance(0.6)
    assert store.calls.get("add_window", 0) > writes
    assert a.state is CLOSED


def test_a_failure_that_could_trip_is_written_at_once(make_backend):
    (a,), _clock = _processes(make_backend, 1, flush_interval=5.0, minimum_calls=4)
    store = CountingStore(a._store)
    a._store = store
    for _ in range(3):
        _run(a, "fail")  # fewer than minimum_calls: not yet due
    assert "add_window" not in store.calls
    assert a.state is CLOSED
    _run(a, "fail")  # 4/4 by this process's own counts: could trip, written now
    assert store.calls.get("add_window") == 1
    assert a.state is OPEN


def test_another_process_sees_a_trip_up_to_one_flush_interval_late(make_backend):
    (a, b), clock = _processes(make_backend, 2, flush_interval=1.0, minimum_calls=6)
    for _ in range(4):
        _run(a, "ok")  # a's counts wait for its flush
    for _ in range(5):
        _run(b, "fail")  # b: 5/5 of its own, but fewer than 6 calls: not written yet
    assert b.state is CLOSED  # 4 successes and 5 failures made, nothing written yet
    clock.advance(1.0)
    a.flush()  # (a's next call would: its interval has passed)
    assert b.state is CLOSED
    _run(b, "fail")  # due: 6 failures + a's 4 successes = 6/10 >= 0.5
    assert a.state is OPEN


def test_slow_calls_count_as_failures(make_backend):
    (a,), clock = _processes(
        make_backend, 1, flush_interval=0, minimum_calls=4, slow_call_seconds=0.5
    )

    def slow():
        clock.advance(0.6)
        return "late"

    for _ in range(3):
        assert a.call(slow) == "late"  # the result is returned; the call counts as failed
        assert a.state is CLOSED
    assert a.call(slow) == "late"
    assert a.state is OPEN


def test_a_slow_trial_reopens(make_backend):
    (a,), clock = _processes(
        make_backend, 1, flush_interval=0, minimum_calls=1, slow_call_seconds=0.5
    )
    _run(a, "fail")
    assert a.state is OPEN
    clock.advance(5)

    def slow():
        clock.advance(1)
        return "late"

    assert a.call(slow) == "late"
    assert a.state is OPEN


def test_ignored_exceptions_count_as_successes(make_backend):
    clock = ManualClock()
    breaker = make_backend(clock=clock).breaker(
        "svc",
        ignore=(KeyError,),
        policy=FailureRate(threshold=0.5, minimum_calls=4, window=10, flush_interval=0),
    )

    def missing():
        raise KeyError("x")

    for _ in range(3):
        with pytest.raises(KeyError):
            breaker.call(missing)
    _run(breaker, "fail")
    assert breaker.state is CLOSED  # 1/4 failed
    _run(breaker, "fail")
    assert breaker.state is CLOSED  # 2/5
    _run(breaker, "fail")
    assert breaker.state is OPEN  # 3/6


def test_half_open_trial_closes_with_an_empty_window(make_backend):
    (a, b), clock = _processes(make_backend, 2, flush_interval=0, minimum_calls=4)
    transitions = []
    a.on_transition = lambda name, old, new: transitions.append((old, new))
    for _ in range(4):
        _run(a, "fail")
    assert a.state is OPEN
    clock.advance(5)
    _run(a, "ok")  # the trial
    assert a.state is CLOSED
    assert transitions == [(CLOSED, OPEN), (OPEN, HALF_OPEN), (HALF_OPEN, CLOSED)]
    for _ in range(3):
        _run(b, "fail")  # the 4 failures before the trip are not in this window
    assert a.state is CLOSED
    _run(b, "fail")
    assert a.state is OPEN


def test_counts_from_before_a_trip_never_land_in_the_next_window(make_backend):
    (a, b), clock = _processes(make_backend, 2, flush_interval=1.0, minimum_calls=4)
    for _ in range(3):
        _run(a, "fail")  # not written yet (3 < minimum_calls)
    b.trip()
    clock.advance(5)
    _run(b, "ok")  # the trial closes it: a new generation of the window
    assert b.state is CLOSED
    # a's next call reads the new generation and drops its 3 old failures
    _run(a, "fail")
    a.flush()
    assert a.state is CLOSED
    _run(b, "fail")
    b.flush()
    assert a.state is CLOSED  # 2 failures in the window, not 5


def test_counts_from_before_a_reset_are_refused(make_backend):
    (a, b), _clock = _processes(make_backend, 2, flush_interval=1.0, minimum_calls=4)
    b.record_success()
    b.flush()  # the item exists (a reset of a breaker never written writes nothing)
    for _ in range(3):
        a.record_failure()  # pending in a, generation 0
    b.reset()  # the operator: a new generation
    b.record_failure()
    b.flush()
    a.flush()  # refused: a's counts belong to the old generation
    assert a.state is CLOSED
    for _ in range(2):
        b.record_failure()
    b.flush()
    assert a.state is CLOSED  # 3 failures in the window
    b.record_failure()
    b.flush()
    assert a.state is OPEN


def test_the_item_holds_about_one_window_of_buckets(make_backend):
    (a, b), clock = _processes(make_backend, 2, flush_interval=0, threshold=1.0, window=2.0)
    for _ in range(25):  # 5 s at 5 calls/s: 25 buckets of 0.2 s, the window holds 10
        _run(a, "ok")
        _run(b, "ok")
        clock.advance(0.2)
    a.trip()
    a.reset()
    _run(a, "ok")
    _run(a, "ok")
    seen = a._window.seen
    assert seen is not None
    # counts of older generations and aged-out buckets were dropped by the writes that saw them
    assert len(seen.names) <= 2 * 11
    assert seen.totals(0) == (2, 0)


def test_concurrent_writes_that_cross_the_threshold_trip_once(make_backend):
    needs_atomic_store(make_backend)
    breakers, _clock = _processes(make_backend, 4, flush_interval=0, minimum_calls=8)
    transitions = []
    for br in breakers:
        br.on_transition = lambda name, old, new: transitions.append((old, new))
    barrier = threading.Barrier(4)

    def worker(br):
        barrier.wait()
        for _ in range(4):
            with contextlib.suppress(BoomError, CircuitOpenError):
                br.call(fail)

    threads = [threading.Thread(target=worker, args=(br,)) for br in breakers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert breakers[0].state is OPEN
    assert transitions == [(CLOSED, OPEN)]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"threshold": 0}, ValueError),
        ({"threshold": 1.5}, ValueError),
        ({"threshold": "half"}, TypeError),
        ({"minimum_calls": 0}, ValueError),
        ({"window": 0}, ValueError),
        ({"window": 1.0, "buckets": 3}, ValueError),  # 333.33 ms buckets
        ({"buckets": 0}, ValueError),
        ({"slow_call_seconds": 0}, ValueError),
        ({"flush_interval": -1}, ValueError),
        ({"flush_interval": 60.0}, ValueError),  # not shorter than the window
    ],
)
def test_bad_policy_raises(kwargs, error):
    with pytest.raises(error) as err:
        FailureRate(**kwargs)
    assert str(err.value)


def test_policy_and_failure_threshold_together_are_refused(make_backend):
    backend = make_backend()
    with pytest.raises(ValueError, match="failure_threshold"):
        backend.breaker("b", failure_threshold=3, policy=FailureRate())
    with pytest.raises(TypeError, match="policy"):
        backend.breaker("b", policy=0.5)  # type: ignore[arg-type]


def _lose_in(lossy, store, method):
    """The next write of ``store.method`` loses its response (the client's own retry runs)."""
    real = getattr(store, method)

    def losing(*args, **kwargs):
        lossy.lose_next()
        return real(*args, **kwargs)

    setattr(store, method, losing)


def test_a_window_write_whose_answer_was_lost_counts_once(lossy):
    breaker = lossy.backend(clock=ManualClock()).breaker(
        "svc", policy=FailureRate(minimum_calls=4, window=10, flush_interval=0)
    )
    breaker.record_failure()  # 1 of 1 failed
    _lose_in(lossy, breaker._store, "add_window")
    breaker.record_success()  # written, its answer lost, sent again: 1 of 2
    assert lossy.lost == 1
    assert breaker._window.seen.totals(0) == (2, 1)
    breaker.record_failure()  # 2 of 3 (counted twice, the success would make it 2 of 4: open)
    assert breaker.state is CLOSED
    breaker.record_success()  # 2 of 4
    assert breaker.state is OPEN


def test_a_rate_trip_whose_answer_was_lost_reports_its_transition(lossy):
    transitions = []
    breaker = lossy.backend(clock=ManualClock()).breaker(
        "svc",
        policy=FailureRate(minimum_calls=2, window=10, flush_interval=0),
        on_transition=lambda name, old, new: transitions.append((old, new)),
    )
    breaker.record_failure()
    _lose_in(lossy, breaker._store, "trip_window")
    breaker.record_failure()
    assert lossy.lost == 1
    assert breaker.state is OPEN
    assert transitions == [(CLOSED, OPEN)]


@pytest.mark.parametrize("operation", ["trip", "reset"])
def test_a_trip_or_reset_whose_answer_was_lost_knows_the_new_generation(lossy, operation):
    breaker = lossy.backend(clock=ManualClock()).breaker(
        "svc", policy=FailureRate(minimum_calls=4, window=10, flush_interval=0)
    )
    breaker.record_success()  # the item exists, generation 0
    _lose_in(lossy, breaker._store, operation)
    getattr(breaker, operation)()
    assert lossy.lost == 1
    stored = breaker._store.get("svc")
    assert stored.window_gen == 1
    assert breaker._window.gen == 1  # not 2: the answer is the one the first attempt would give
