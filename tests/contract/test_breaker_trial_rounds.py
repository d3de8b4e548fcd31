"""A breaker open past ``reset_timeout`` starts one trial round, whatever the processes read.

Each process decides from its own read (eventually consistent, or simply made a moment before
another process's write) that the breaker is open long enough and tries to start a round; the
store starts it for exactly one of them (the others find it half-open with a fresh round). The
stale read is made by hand: every process's read answers the record as it was before any of them
started the round. Each breaker here is one process (its own backend object, one namespace).

tests/contract/test_store_rules.py lists this rule; tests/mutations/guards.d/every-backend.toml
breaks the round's check on each backend.
"""

from __future__ import annotations

from typing import Any

import pytest

from dynacoord import CircuitOpenError, ManualClock


class BoomError(Exception):
    pass


def _fail() -> None:
    raise BoomError("dependency failed")


class _ReadsFrom:
    """A breaker store whose reads all answer ``record``; its writes go to the store."""

    def __init__(self, store: Any, record: Any) -> None:
        self._store = store
        self._record = record

    def get(self, *args: Any, **kwargs: Any) -> Any:
        return self._record

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def test_processes_that_read_the_breaker_open_start_one_trial_round(make_backend: Any) -> None:
    clock = ManualClock()
    first = make_backend(clock=clock)
    backends = [first] + [make_backend(clock=clock, namespace=first.namespace) for _ in range(3)]
    breakers = [
        backend.breaker("rounds", failure_threshold=1, reset_timeout=5, half_open_max_calls=1)
        for backend in backends
    ]
    with pytest.raises(BoomError):
        breakers[0].call(_fail)
    clock.advance(6)
    open_long_enough = breakers[0]._store.get("rounds", consistent=True)
    assert open_long_enough.state.value == "open"
    for breaker in breakers:
        breaker._store = _ReadsFrom(breaker._store, open_long_enough)
    ran: list[int] = []
    refused = 0
    entered = []
    try:
        for number, breaker in enumerate(breakers):
            try:
                breaker.__enter__()
            except CircuitOpenError:
                refused += 1
                continue
            entered.append(breaker)
            ran.append(number)
    finally:
        for breaker in entered:
            breaker.__exit__(None, None, None)
    assert ran == [0], "trial calls with half_open_max_calls=1"
    assert refused == 3
    assert first.breaker("rounds").state.value == "closed"
