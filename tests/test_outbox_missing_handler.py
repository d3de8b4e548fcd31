"""Events of a type a Python worker has no handler for (issue 52, item 8): by default they are
left alone, for a worker that has the handler (given back unhandled, no attempt counted, due
again after one lease), never failed for good with two ERROR lines each (the old default,
``on_missing_handler="fail"``, which ``dynacoord outbox work`` refuses to pick for the
operator). ``"fail"``, ``"retry"`` and ``"skip"`` still do what they say when asked for. The
stream relay leaves such an event to the sweeper, writing nothing."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from dynacoord import ManualClock
from dynacoord.outbox import Event, EventStatus, WorkerOptions
from tests.stream_records import insert_record

LEASE = 30.0


@pytest.fixture()
def env(moto_table: tuple[Any, str]) -> tuple[Any, ManualClock, Any, str]:
    from dynacoord.backends.dynamodb import DynamoDBBackend

    client, table = moto_table
    clock = ManualClock()
    return DynamoDBBackend(client, table_name=table, clock=clock).outbox, clock, client, table


def test_the_default_leaves_other_types_to_a_worker_that_has_their_handler(
    env: Any, caplog: pytest.LogCaptureFixture
) -> None:
    outbox, clock, _, _ = env
    outbox.publish([Event("order.placed", 1, id="p1"), Event("order.paid", 2, id="q1")])
    placed: list[str] = []
    caplog.set_level(logging.WARNING, logger="dynacoord")
    worker = outbox.worker({"order.placed": lambda e: placed.append(e.id)}, lease=LEASE)
    assert WorkerOptions().on_missing_handler == "leave"
    worker.run_once()
    assert placed == ["p1"]
    left = outbox.get("q1")
    assert left.status is EventStatus.PENDING, left
    assert left.attempts == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert worker.failed == 0
    # Not claimed again by the same worker at its next poll: due again after one lease.
    assert worker.run_once() == 0
    assert outbox.get("q1").attempts == 0
    clock.advance(LEASE)
    paid: list[str] = []
    assert outbox.worker({"order.paid": lambda e: paid.append(e.id)}).run_once() == 1
    assert paid == ["q1"]
    assert outbox.get("q1").status is EventStatus.COMPLETED
    assert outbox.stats().failed == 0


def test_an_explicit_fail_still_fails_them(env: Any) -> None:
    outbox, _, _, _ = env
    outbox.publish(Event("order.paid", 2, id="q1"))
    outbox.worker({"order.placed": print}, on_missing_handler="fail").run_once()
    failed = outbox.get("q1")
    assert failed.status is EventStatus.FAILED
    assert "no handler for event type 'order.paid'" in (failed.last_error or "")


def test_leave_is_refused_nowhere_and_a_wrong_policy_is(env: Any) -> None:
    outbox, _, _, _ = env
    outbox.worker({"a": print}, on_missing_handler="leave")
    with pytest.raises(Exception, match="on_missing_handler"):
        outbox.worker({"a": print}, on_missing_handler="drop")


def test_the_stream_relay_leaves_them_to_the_sweeper(env: Any) -> None:
    outbox, clock, client, table = env
    outbox.publish(Event("order.paid", 2, id="q1", occurred_at=clock.time()))
    record = insert_record(client, table, outbox._store._key("q1"), 1)
    relay = outbox.stream_handler({"order.placed": print}, lease=LEASE)
    assert relay({"Records": [record]}) == {"batchItemFailures": []}
    left = outbox.get("q1")
    assert (left.status, left.attempts) == (EventStatus.PENDING, 0)
    clock.advance(2 * LEASE)
    paid: list[Event] = []
    assert outbox.sweep_handler({"order.paid": paid.append}, lease=LEASE)({}, None) is not None
    assert [e.id for e in paid] == ["q1"]
