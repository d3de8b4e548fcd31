"""Half-open lets through at most ``half_open_max_calls`` trial calls, whatever the processes read.

A process decides whether to *try* for a trial slot from a read (eventually consistent); the slot
itself is taken by a conditional write on the stored count. Two processes whose reads both say
"one slot left" may both try: the store must let exactly one of them in. Each breaker here is one
process (its own backend object, one namespace); the stale read is made by hand, by answering
both processes' reads with the record as it was before either of them took the slot.
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
    """A breaker store whose reads all answer ``record`` (a read made before the others'
    writes landed); its writes go to the store."""

    def __init__(self, store: Any, record: Any) -> None:
        self._store = store
        self._record = record

    def get(self, *args: Any, **kwargs: Any) -> Any:
        return self._record

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def test_processes_that_read_one_free_slot_get_one_trial_between_them(make_backend: Any) -> None:
    clock = ManualClock()
    first = make_backend(clock=clock)
    backends = [first] + [make_backend(clock=clock, namespace=first.namespace) for _ in range(2)]
    a, b, c = (
        backend.breaker(
            "trial",
            failure_threshold=1,
            reset_timeout=5,
            success_threshold=3,
            half_open_max_calls=2,
        )
        for backend in backends
    )
    with pytest.raises(BoomError):
        a.call(_fail)
    clock.advance(5)
    ran: list[str] = []
    with a:  # the first trial slot (it starts the round)
        one_left = b._store.get("trial", consistent=True)
        assert one_left.trial_calls == 1
        b._store = _ReadsFrom(b._store, one_left)
        c._store = _ReadsFrom(c._store, one_left)
        with b:  # the second and last slot
            ran.append("b")
            try:
                with c:
                    ran.append("c")
            except CircuitOpenError:
                pass
    assert ran == ["b"], "three trial calls with half_open_max_calls=2"
