"""The worker group: the workers of a process on one store share a shard spread (offset and
worker numbers) and take turns at its queues; nothing is shared through module globals."""

from __future__ import annotations

import gc
from typing import Any

from dynacoord import ManualClock
from dynacoord.outbox import worker as worker_module
from dynacoord.outbox.worker import _ZOMBIE_TURN, OutboxWorker, _WorkerGroup


class Store:
    """Stands in for an outbox store: a worker reads nothing from it until it polls."""


class SlottedStore:
    __slots__ = ()  # cannot be weakly referenced


def make(store: Any, **options: Any) -> OutboxWorker:
    return OutboxWorker(store, print, clock=ManualClock(), **options)


def test_workers_on_one_store_share_its_group() -> None:
    store = Store()
    a, b = make(store), make(store)
    assert a._group is b._group
    assert (a._number, b._number) == (0, 1)  # adjacent home shards
    assert a._group.turn(3) is b._group.turn(3)
    assert a._group.turn(_ZOMBIE_TURN) is b._group.turn(_ZOMBIE_TURN)
    assert a._group.turn(3) is not a._group.turn(2)


def test_another_store_has_its_own_group() -> None:
    a, other = make(Store()), make(Store())
    assert a._group is not other._group
    assert other._number == 0
    assert a._group.turn(0) is not other._group.turn(0)


def test_a_group_passed_in_is_used() -> None:
    group = _WorkerGroup()
    a, b = make(Store(), group=group), make(Store(), group=group)
    assert a._group is group and b._group is group
    assert (a._number, b._number) == (0, 1)


def test_the_group_goes_with_its_store() -> None:
    store = Store()
    make(store)
    assert store in worker_module._groups
    gc.collect()  # groups of other tests' stores that are garbage already go first
    count = len(worker_module._groups)
    del store
    gc.collect()
    assert len(worker_module._groups) == count - 1


def test_a_store_that_cannot_be_weakly_referenced_shares_no_turn() -> None:
    a, b = make(SlottedStore()), make(SlottedStore())
    assert a._group is b._group
    assert b._number == a._number + 1  # still spread over the shards
    assert a._group.turn(0) is not a._group.turn(0)  # a fresh lock each time
