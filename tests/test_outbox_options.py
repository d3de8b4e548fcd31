"""A worker's options as objects (``WorkerOptions``, ``DeliveryHooks``) and its one lease keeper
for life (``dynacoord.outbox.delivery.LeaseKeeper``)."""

from __future__ import annotations

import dataclasses
import inspect
import threading
from typing import Any

import pytest

from dynacoord import ManualClock
from dynacoord.errors import ConfigurationError, InvalidValueError
from dynacoord.outbox import DeliveryHooks, Event, OutboxWorker, WorkerOptions
from dynacoord.outbox.options import STACK_OPTIONS, stack_options
from dynacoord.outbox.stream import OUTBOX_OPTIONS


def lease_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("dynacoord-outbox-lease")]


def test_options_by_name_and_as_an_object_make_the_same_worker(mongo_backend_factory: Any) -> None:
    outbox = mongo_backend_factory().outbox
    by_name = outbox.worker(print, batch_size=7, lease=12, max_attempts=3)
    as_object = outbox.worker(print, WorkerOptions(batch_size=7, lease=12, max_attempts=3))
    assert by_name.options == as_object.options
    assert (by_name.batch_size, by_name.lease_ms) == (7, 12_000)
    # a name given beside an object wins over the object's own value
    mixed = outbox.worker(print, WorkerOptions(batch_size=7, lease=12), lease=20)
    assert (mixed.options.batch_size, mixed.lease_ms) == (7, 20_000)


def test_an_unknown_option_is_refused_with_the_known_ones(mongo_backend_factory: Any) -> None:
    outbox = mongo_backend_factory().outbox
    with pytest.raises(ConfigurationError, match=r"unknown worker option\(s\) \['lesae'\]"):
        outbox.worker(print, lesae=5)
    with pytest.raises(TypeError, match="options must be a WorkerOptions"):
        outbox.worker(print, {"lease": 5})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("values", "error", "match"),
    [
        ({"batch_size": 0}, InvalidValueError, "batch_size"),
        ({"batch_size": 1001}, InvalidValueError, "batch_size"),
        ({"lease": 0}, InvalidValueError, "lease"),
        ({"max_attempts": True}, TypeError, "max_attempts"),
        ({"backoff": -1}, InvalidValueError, "backoff"),
        ({"on_missing_handler": "drop"}, ConfigurationError, "on_missing_handler"),
        ({"heartbeat": 1}, TypeError, "heartbeat"),
        ({"leave_new_for": -0.5}, InvalidValueError, "leave_new_for"),
    ],
)
def test_a_wrong_value_is_refused_when_the_options_are_made(
    values: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        WorkerOptions(**values)


def test_options_are_frozen() -> None:
    options = WorkerOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.lease = 5  # type: ignore[misc]


def test_a_hook_that_is_not_callable_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="on_failed must be callable"):
        DeliveryHooks(on_failed="log")  # type: ignore[arg-type]


def test_the_stack_options_are_the_ones_marked_for_it() -> None:
    assert OUTBOX_OPTIONS == STACK_OPTIONS
    assert set(STACK_OPTIONS) < {f.name for f in dataclasses.fields(WorkerOptions)}
    assert "poll_interval" not in STACK_OPTIONS and "lease" in STACK_OPTIONS
    assert stack_options({"lease": 20}) == {"lease": 20}
    with pytest.raises(ConfigurationError, match="unknown outbox option"):
        stack_options({"poll_interval": 2})
    with pytest.raises(InvalidValueError, match="max_attempts"):
        stack_options({"max_attempts": 0})  # a wrong value is refused before any handler runs


def test_the_worker_takes_its_options_as_objects() -> None:
    # Options grow in WorkerOptions, not in the worker's signature.
    assert len(inspect.signature(OutboxWorker.__init__).parameters) <= 10


def test_one_lease_keeper_for_the_workers_life_with_a_thread_only_while_it_holds(
    mongo_backend_factory: Any,
) -> None:
    clock = ManualClock()
    outbox = mongo_backend_factory(clock=clock).outbox
    outbox.publish([Event("t", i) for i in range(3)])
    seen_threads: list[list[str]] = []
    worker = outbox.worker(lambda e: seen_threads.append(lease_threads()), lease=3)
    keeper = worker.delivery.keeper
    assert keeper is not None and lease_threads() == []
    assert worker.run_once() == 3
    assert worker.delivery.keeper is keeper  # the same keeper, batch after batch
    assert all(names == [f"dynacoord-outbox-lease-{worker.name}"] for names in seen_threads)
    assert lease_threads() == []  # idle: no thread
    outbox.publish(Event("t", "again"))
    assert worker.run_once() == 1
    assert worker.delivery.keeper is keeper and lease_threads() == []


def test_no_keeper_without_heartbeat(mongo_backend_factory: Any) -> None:
    worker = mongo_backend_factory().outbox.worker(print, heartbeat=False)
    assert worker.delivery.keeper is None


def test_taking_an_event_back_waits_for_the_beat_in_flight(mongo_backend_factory: Any) -> None:
    """The relay decides how to store an unclaimed event's outcome from what the keeper did to
    it: a beat claiming it at that moment must be finished first, or the relay would write the
    outcome as unclaimed over its own claim and lose it."""
    clock = ManualClock()
    backend = mongo_backend_factory(clock=clock)
    outbox = backend.outbox
    outbox.publish(Event("t", 1, id="e1"))
    (seen,) = outbox.pending()
    worker = outbox.worker(print, lease=3)
    keeper = worker.delivery.keeper
    assert keeper is not None
    in_claim = threading.Event()
    go_on = threading.Event()
    store = worker.delivery.store
    real_claim_many = store.claim_many

    def slow_claim_many(*args: Any) -> Any:
        in_claim.set()
        go_on.wait(5)
        return real_claim_many(*args)

    store.claim_many = slow_claim_many  # type: ignore[method-assign]
    record = dataclasses.replace(seen, lease_token="relay-token", due_at_ms=seen.due_at_ms + 3000)
    keeper.hold_unclaimed(seen, record, seen.due_at_ms + 3000)
    clock.advance(2)  # less than half a lease left: the next beat claims it
    beat = threading.Thread(target=keeper.beat)
    beat.start()
    assert in_claim.wait(5)
    taken: list[Any] = []
    taker = threading.Thread(target=lambda: taken.append(keeper.take_back("e1")))
    taker.start()
    taker.join(0.3)
    assert taker.is_alive()  # waits for the beat
    go_on.set()
    beat.join(5)
    taker.join(5)
    ((lost, claimed),) = taken
    assert not lost and claimed is not None and claimed.lease_token == "relay-token"
    assert lease_threads() == []
