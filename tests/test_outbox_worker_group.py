"""The worker group: the workers an Outbox makes share a shard spread (offset and worker
numbers) and take turns at its queues. The group belongs to the Outbox: nothing is shared
through module globals, and another Outbox (another backend) has a group of its own."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from dynacoord import ManualClock
from dynacoord.outbox import Outbox
from dynacoord.outbox import worker as worker_module
from dynacoord.outbox.worker import _ZOMBIE_TURN, OutboxWorker, WorkerGroup


class Store:
    """Stands in for an outbox store: a worker reads nothing from it until it polls."""


def make(store: Any, **options: Any) -> OutboxWorker:
    return OutboxWorker(store, print, clock=ManualClock(), **options)


def test_workers_of_one_outbox_share_its_group() -> None:
    outbox = Outbox(Store(), clock=ManualClock())  # type: ignore[arg-type]
    a, b = outbox.worker(print), outbox.worker(print)
    assert a._group is b._group is outbox._workers
    assert (a._number, b._number) == (0, 1)  # adjacent home shards
    assert a._group.turn(3) is b._group.turn(3)
    assert a._group.turn(_ZOMBIE_TURN) is b._group.turn(_ZOMBIE_TURN)
    assert a._group.turn(3) is not a._group.turn(2)


def test_another_outbox_has_its_own_group() -> None:
    store = Store()
    one = Outbox(store, clock=ManualClock())  # type: ignore[arg-type]
    other = Outbox(store, clock=ManualClock())  # type: ignore[arg-type]
    a, b = one.worker(print), other.worker(print)
    assert a._group is not b._group
    assert b._number == 0
    assert a._group.turn(0) is not b._group.turn(0)


def test_a_worker_made_alone_is_a_group_of_one() -> None:
    store = Store()
    a, b = make(store), make(store)
    assert a._group is not b._group
    assert (a._number, b._number) == (0, 0)


def test_a_group_passed_in_is_used() -> None:
    group = WorkerGroup()
    a, b = make(Store(), group=group), make(Store(), group=group)
    assert a._group is group and b._group is group
    assert (a._number, b._number) == (0, 1)


def test_the_worker_module_keeps_no_registry_of_groups() -> None:
    outbox = Outbox(Store(), clock=ManualClock())  # type: ignore[arg-type]
    outbox.worker(print)
    held = [
        name
        for name, value in vars(worker_module).items()
        if isinstance(value, (MutableMapping, WorkerGroup)) and not name.startswith("__")
    ]
    assert held == []
