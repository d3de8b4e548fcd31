"""Writes applied and then raised to their caller (issue 49, section 2), on every backend.

botocore raises after its last attempt when the first one applied and its answer was lost (a read
timeout, then connection errors); redis-py raises once its retries cannot reconnect; pymongo
raises ``AutoReconnect``. The caller must treat such a write as "maybe applied", never as "not
written", and its next attempt must recognise it (DESIGN.md section 1). ``lossy.raise_next``
(tests/lossy.py) injects it; ``applied=False`` raises the same error with nothing sent.
"""

from __future__ import annotations

import threading

import pytest
from botocore.exceptions import EndpointConnectionError

from dynacoord import BreakerState, CircuitOpenError, FailureRate, ManualClock
from dynacoord.errors import (
    BackendError,
    IdempotencyInProgressError,
    IdempotencyKeyMismatchError,
)

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


# -- locks, counters, idempotency: each write raised, applied or not --------------------------------


def _raise_in(lossy, store, method: str, *, applied: bool = True) -> None:
    """The next call of ``store.method`` raises after its write applied (or unsent)."""
    real = getattr(store, method)

    def raising(*args, **kwargs):
        setattr(store, method, real)  # once
        lossy.raise_next(applied=applied)
        return real(*args, **kwargs)

    setattr(store, method, raising)


@pytest.mark.parametrize("applied", [True, False], ids=["applied", "unsent"])
def test_lock_acquire_raised_is_recognised_by_the_next_attempt(lossy, applied):
    locks = lossy.backend().locks
    _raise_in(lossy, locks._store, "try_acquire", applied=applied)
    with pytest.raises(RAISED):
        locks.acquire("k", ttl=30, owner="me")
    lease = locks.acquire("k", ttl=30, owner="me")  # the same owner: its own lock, or a free one
    assert lease is not None
    assert locks.get("k").owner == "me"
    assert lease.release() is True
    assert locks.get("k") is None


@pytest.mark.parametrize("applied", [True, False], ids=["applied", "unsent"])
def test_lock_extend_raised_is_recognised_by_the_next_attempt(lossy, applied):
    locks = lossy.backend().locks
    lease = locks.acquire("k", ttl=30, owner="me")
    _raise_in(lossy, locks._store, "extend", applied=applied)
    with pytest.raises(RAISED):
        lease.extend(60)
    assert lease.extend(60) is True
    assert lease.is_held()
    assert lease.release() is True


@pytest.mark.parametrize("applied", [True, False], ids=["applied", "unsent"])
def test_lock_release_raised_leaves_the_lock_free_or_releasable(lossy, applied):
    locks = lossy.backend().locks
    lease = locks.acquire("k", ttl=30, owner="me")
    _raise_in(lossy, locks._store, "release", applied=applied)
    with pytest.raises(RAISED):
        lease.release()
    # the caller's next attempt: sent (unsent), or recognised as its own release (applied); the
    # answer is the one the first call would have given
    assert lease.release() is True
    assert locks.get("k") is None  # not held until its TTL by a release that never went out
    assert lease.release() is False  # answered once: a second release has nothing to free


@pytest.mark.parametrize("applied", [True, False], ids=["applied", "unsent"])
def test_lock_release_raised_then_retried_never_frees_the_next_owners_lock(lossy, applied):
    clock = ManualClock()
    locks = lossy.backend(clock=clock).locks
    lease = locks.acquire("k", ttl=10, owner="me")
    _raise_in(lossy, locks._store, "release", applied=applied)
    with pytest.raises(RAISED):
        lease.release()
    clock.advance(11)  # the lease ran out (or was released): another owner takes the lock
    other = locks.acquire("k", ttl=30, owner="other")
    assert other is not None
    # applied: the release was this lease's and did free its lock; unsent: the lock was lost
    assert lease.release() is applied
    assert lease.lost is not applied
    held = locks.get("k")
    assert held is not None and (held.owner, held.fence) == ("other", other.fence)


@pytest.mark.parametrize("applied", [True, False], ids=["applied", "unsent"])
def test_set_if_absent_raised_is_recognised_by_the_next_attempt(lossy, applied):
    counters = lossy.backend().counters
    _raise_in(lossy, counters._store, "put_if_absent", applied=applied)
    with pytest.raises(RAISED):
        counters.set_if_absent("flag", "mine")
    assert counters.set_if_absent("flag", "mine") is True  # its own value: it set it
    assert counters.get("flag") == "mine"
    # recognised once: a later call of the process is another writer, refused
    assert counters.set_if_absent("flag", "mine") is False


@pytest.mark.parametrize("applied", [True, False], ids=["applied", "unsent"])
def test_set_if_absent_of_a_counter_raised_is_recognised_by_the_next_attempt(lossy, applied):
    counters = lossy.backend().counters
    _raise_in(lossy, counters._store, "put_if_absent", applied=applied)
    with pytest.raises(RAISED):
        counters.set_if_absent("c", 5, ttl=60)
    assert counters.set_if_absent("c", 5, ttl=60) is True
    assert counters.increment("c") == 6


def test_set_if_absent_raised_is_never_recognised_by_another_writer(lossy):
    # another process (its own backend object), and a call of this process with another value,
    # are other writers: refused while the raised write holds the key
    here = lossy.backend()
    elsewhere = lossy.backend(namespace=here.namespace)
    counters = here.counters
    _raise_in(lossy, counters._store, "put_if_absent")
    with pytest.raises(RAISED):
        counters.set_if_absent("flag", "mine")
    assert elsewhere.counters.set_if_absent("flag", "mine") is False
    assert counters.set_if_absent("flag", "another") is False
    assert counters.set_if_absent("flag", "mine") is True  # the raised call's retry
    assert counters.get("flag") == "mine"


@pytest.mark.parametrize("applied", [True, False], ids=["applied", "unsent"])
def test_join_arrival_raised_is_counted_once_and_fires(lossy, applied):
    counters = lossy.backend().counters
    counters.join("j", "a", expected=2)
    _raise_in(lossy, counters._store, "join_add", applied=applied)
    with pytest.raises(RAISED):
        counters.join("j", "b", expected=2)
    result = counters.join("j", "b", expected=2)  # redelivered
    assert (result.count, result.complete, result.fired) == (2, True, True)


@pytest.mark.parametrize("applied", [True, False], ids=["applied", "unsent"])
def test_idempotent_claim_raised_does_not_block_the_next_attempt(lossy, applied):
    backend = lossy.backend()
    runs = []

    @backend.idempotent(key=lambda x: f"k{x}")
    def work(x):
        runs.append(x)
        return x * 2

    _raise_in(lossy, backend.idempotency._store, "claim", applied=applied)
    with pytest.raises(RAISED):
        work(1)
    assert work(1) == 2
    assert runs == [1]


def test_idempotent_claim_raised_is_recognised_only_by_its_own_process(lossy):
    # "the same caller" is this process: another one (its own backend object) is refused while
    # the claim's lease runs, and this process's retry runs the function once
    clock = ManualClock()
    here = lossy.backend(clock=clock)
    elsewhere = lossy.backend(clock=clock, namespace=here.namespace)
    runs = []

    def work(x):
        runs.append(x)
        return x * 2

    mine = here.idempotent(key=lambda x: f"k{x}", in_progress_ttl=60)(work)
    theirs = elsewhere.idempotent(key=lambda x: f"k{x}", in_progress_ttl=60)(work)
    _raise_in(lossy, here.idempotency._store, "claim")
    with pytest.raises(RAISED):
        mine(1)
    with pytest.raises(IdempotencyInProgressError):
        theirs(1)
    assert mine(1) == 2
    assert theirs(1) == 2  # replayed
    assert runs == [1]


def test_idempotent_claim_raised_is_retried_by_one_call_of_the_process_at_a_time(lossy):
    # the retry holds the raised claim's token while it runs: a second call of this process
    # meanwhile (here re-entrant, as a second thread would be) claims with a fresh token and is
    # refused; both never run
    backend = lossy.backend()
    runs, refused = [], []

    @backend.idempotent(key=lambda x: f"k{x}")
    def work(x):
        runs.append(x)
        if len(runs) == 1:
            with pytest.raises(IdempotencyInProgressError):
                work(x)
            refused.append(x)
        return x * 2

    _raise_in(lossy, backend.idempotency._store, "claim")
    with pytest.raises(RAISED):
        work(1)
    assert work(1) == 2
    assert (runs, refused) == ([1], [1])


def test_idempotent_claim_raised_then_retried_by_racing_threads_runs_once(lossy):
    # 8 threads of the process retry the raised call at once: one takes the raised claim's
    # token and runs; the others are refused (in progress) or replay its result
    backend = lossy.backend()
    runs, outcomes = [], []
    gate = threading.Barrier(8)

    @backend.idempotent(key=lambda x: f"k{x}")
    def work(x):
        runs.append(x)
        return x * 2

    _raise_in(lossy, backend.idempotency._store, "claim")
    with pytest.raises(RAISED):
        work(1)

    def retry():
        gate.wait()
        try:
            outcomes.append(work(1))
        except IdempotencyInProgressError:
            outcomes.append("in progress")

    threads = [threading.Thread(target=retry) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert runs == [1]
    assert len(outcomes) == 8 and set(outcomes) <= {2, "in progress"} and 2 in outcomes


def test_idempotent_claim_raised_then_a_different_payload_is_refused(lossy):
    backend = lossy.backend()
    runs = []

    @backend.idempotent(key=lambda x, amount: f"k{x}", payload=lambda x, amount: amount)
    def work(x, amount):
        runs.append((x, amount))
        return amount

    _raise_in(lossy, backend.idempotency._store, "claim")
    with pytest.raises(RAISED):
        work(1, 10)
    with pytest.raises(IdempotencyKeyMismatchError):
        work(1, 20)  # another call under the same key: never taken for the raised one's retry
    assert work(1, 10) == 10
    assert runs == [(1, 10)]


@pytest.mark.parametrize("applied", [True, False], ids=["applied", "unsent"])
def test_idempotent_complete_raised_returns_the_result_and_never_runs_twice(lossy, applied):
    clock = ManualClock()
    backend = lossy.backend(clock=clock)
    runs = []

    @backend.idempotent(key=lambda x: f"k{x}", in_progress_ttl=60)
    def work(x):
        runs.append(x)
        return x * 2

    _raise_in(lossy, backend.idempotency._store, "complete", applied=applied)
    assert work(1) == 2  # the function ran: its result reaches the caller (logged, not raised)
    assert lossy.raised == 1
    if applied:
        assert work(1) == 2  # the stored result, replayed
    else:
        # documented: the claim stays in progress until its lease ends, then the key is free
        with pytest.raises(IdempotencyInProgressError):
            work(1)
        clock.advance(61)
        assert work(1) == 2
    assert runs == ([1] if applied else [1, 1])


# -- the default breaker: the failure that reaches the threshold ------------------------------------


def test_a_failure_counted_at_the_threshold_and_raised_trips_at_the_next_call(lossy):
    clock = ManualClock()
    transitions = []
    breaker = lossy.backend(clock=clock).breaker(
        "svc",
        failure_threshold=3,
        reset_timeout=10,
        on_transition=lambda name, old, new: transitions.append((str(old), str(new))),
    )
    for _ in range(2):
        with pytest.raises(BoomError):
            breaker.call(_fail)
    _raise_in(lossy, breaker._store, "record_failure")
    with pytest.raises(RAISED):  # the third failure is counted; its caller gets the error
        breaker.call(_fail)
    calls = []
    with pytest.raises(CircuitOpenError):
        breaker.call(lambda: calls.append(1))  # the count is seen: tripped, not let through
    assert calls == []
    assert breaker.state is OPEN
    assert transitions == [("closed", "open")]
