"""The public reads of what a semaphore and a rate limiter keep in the store, on every backend
(issue 51: ``dynacoord semaphore show`` and ``dynacoord ratelimit show`` read through them, not
through a backend's private store): ``semaphore.state()`` (docs/semaphore.md) and
``limiter.state()`` (docs/ratelimit.md)."""

from __future__ import annotations

from typing import Any

from dynacoord import ManualClock

START = 1_900_000_000.0  # epoch seconds


def test_semaphore_state_tells_no_item_from_no_holder(make_backend: Any) -> None:
    clock = ManualClock(START)
    backend = make_backend(clock=clock)
    sem = backend.semaphore("pool", limit=3, ttl=10)
    assert sem.state() is None  # never acquired: no item
    first = sem.acquire(owner="a", timeout=0)
    second = sem.acquire(owner="b", timeout=0)
    state = sem.state()
    assert state is not None
    assert [(p.owner, p.fence) for p in state.holders] == [
        ("a", first.fence),
        ("b", second.fence),
    ]
    assert list(state.holders) == sem.holders()
    assert state.last_fence == second.fence
    first.release()
    second.release()
    state = sem.state()
    assert state is not None and state.holders == () and state.last_fence == second.fence
    # a semaphore of another limit reads the same item (the store does not keep the limit)
    other = backend.semaphore("pool", limit=1, ttl=1).state()
    assert other is not None and other.last_fence == second.fence


def test_rate_limiter_state_is_each_shards_stored_time(make_backend: Any) -> None:
    clock = ManualClock(START)
    backend = make_backend(clock=clock)
    limiter = backend.rate_limiter("api", rate=10, per=1.0, burst=10)
    assert limiter.state() == [None]  # no call admitted: no item
    assert limiter.try_acquire(3)
    # GCRA's tat: when the bucket is full again, in epoch microseconds (3 calls at 10/s)
    assert limiter.state() == [int(START * 1_000_000) + 300_000]
    sharded = backend.rate_limiter("spread", rate=10, burst=10, shards=2)
    assert sharded.state() == [None, None]
    assert sharded.try_acquire()
    stored = sharded.state()
    assert len(stored) == 2 and sorted(stored, key=lambda t: t is None)[1] is None
    assert [t for t in stored if t is not None] == [int(START * 1_000_000) + 200_000]
