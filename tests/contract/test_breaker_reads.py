"""The breaker's read per protected call: eventually consistent by default, none at all within
``state_cache`` (issue 29). Every backend: the cache is policy, not storage."""

from __future__ import annotations

import pytest

from dynacoord import CircuitOpenError, ManualClock
from dynacoord.breaker import State
from tests.conftest import CountingStore


class BoomError(Exception):
    pass


def _fail() -> None:
    raise BoomError


def _breaker(backend, **options):
    breaker = backend.breaker("svc", **options)
    breaker._store = store = CountingStore(breaker._store)
    return breaker, store


def test_a_closed_state_is_reused_without_a_read_within_state_cache(make_backend):
    clock = ManualClock()
    backend = make_backend(clock=clock)
    breaker, store = _breaker(backend, failure_threshold=3, state_cache=2.0)
    for _ in range(5):
        assert breaker.call(lambda: "ok") == "ok"
    assert store.calls.get("get", 0) == 1
    clock.advance(2.5)
    breaker.call(lambda: "ok")
    assert store.calls.get("get", 0) == 2


def test_without_state_cache_every_call_reads(make_backend):
    backend = make_backend()
    breaker, store = _breaker(backend, failure_threshold=3)
    for _ in range(3):
        breaker.call(lambda: "ok")
    assert store.calls.get("get", 0) == 3


def test_a_trip_elsewhere_reaches_a_cached_process_within_state_cache(make_backend):
    clock = ManualClock()
    backend = make_backend(clock=clock)
    cached, _ = _breaker(backend, failure_threshold=2, state_cache=1.0)
    other = backend.breaker("svc", failure_threshold=2)  # another process
    cached.call(lambda: None)
    for _ in range(2):
        with pytest.raises(BoomError):
            other.call(_fail)
    assert other.state is State.OPEN
    cached.call(lambda: "still cached")  # within state_cache: the documented staleness
    clock.advance(1.1)
    with pytest.raises(CircuitOpenError):
        cached.call(lambda: None)


def test_own_failures_are_counted_while_cached_and_trip_at_once(make_backend):
    clock = ManualClock()
    backend = make_backend(clock=clock)
    breaker, store = _breaker(backend, failure_threshold=3, state_cache=30.0)
    breaker.call(lambda: None)
    for _ in range(3):
        with pytest.raises(BoomError):
            breaker.call(_fail)
    assert breaker.state is State.OPEN
    reads = store.calls.get("get", 0)
    with pytest.raises(CircuitOpenError):  # the trip dropped the cached state
        breaker.call(lambda: None)
    assert store.calls.get("get", 0) == reads + 1


def test_a_refused_failure_drops_the_cached_state(make_backend):
    clock = ManualClock()
    backend = make_backend(clock=clock)
    breaker, _ = _breaker(backend, failure_threshold=5, state_cache=30.0)
    breaker.call(lambda: None)
    backend.breaker("svc").trip()  # another process trips it by hand
    with pytest.raises(BoomError):
        breaker.call(_fail)  # admitted from the cache; its failure write sees it open
    with pytest.raises(CircuitOpenError):
        breaker.call(lambda: None)


@pytest.mark.parametrize("bad", [-1, 61, "1"])
def test_state_cache_is_checked(make_backend, bad):
    with pytest.raises((ValueError, TypeError)):
        make_backend().breaker("svc", state_cache=bad)
