"""``outbox.retry(group=...)``: an ordered group's failed events go back to the end of the
group, in their original order, and the group's own order machinery delivers them one after
another; on every backend, also when the answer to the move was lost."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

from dynacoord._clock import ManualClock
from dynacoord.errors import InvalidValueError
from dynacoord.outbox import Event, EventStatus
from tests.outbox_helpers import drain

from ..conftest import needs_atomic_store

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")

#: places 1, 3 and 4 of group "g" fail; 2 and 5 are delivered
DOOMED = {"g1", "g3", "g4", "h1", "u1"}


def _fail_some(outbox: Any, clock: ManualClock | None = None, groups: tuple[str, ...] = ("g",)):
    """Publish ``g1..g5`` in each of ``groups`` (ordered), ``h1`` (ordered, group "h") and ``u1``
    (unordered, group "g"); deliver them with max_attempts=1 so that places 1, 3, 4 of each
    group, ``h1`` and ``u1`` fail. Returns the ids delivered, in order."""
    for group in groups:
        prefix = "g" if group == "g" else f"{group}-"
        outbox.publish(
            [Event("t", i, group=group, ordered=True, id=f"{prefix}{i}") for i in range(1, 6)]
        )
    outbox.publish(Event("t", 1, group="h", ordered=True, id="h1"))
    outbox.publish(Event("t", 1, group="g", id="u1"))  # unordered, same group name
    delivered: list[str] = []

    def handle(event: Event) -> None:
        if event.id in DOOMED or event.id.endswith(("-1", "-3", "-4")):
            raise RuntimeError(f"poison {event.id}")
        delivered.append(event.id)

    worker = outbox.worker(handle, max_attempts=1, heartbeat=False)
    for _ in range(20):
        if not worker.run_once() and not outbox.stats().pending:
            break
        if clock is not None:
            clock.advance(2)
    stats = outbox.stats()
    assert (stats.pending, stats.in_flight) == (0, 0), stats
    return delivered


def _drain(outbox: Any, clock: ManualClock, batch_size: int) -> list[str]:
    got: list[str] = []
    drain(
        outbox.worker(lambda e: got.append(e.id), batch_size=batch_size, heartbeat=False),
        clock=clock,
    )
    return got


@pytest.mark.parametrize("batch_size", [1, 25])
def test_a_groups_failed_events_are_delivered_again_in_their_order(make_backend, batch_size):
    clock = ManualClock()
    outbox = make_backend(clock=clock).outbox
    assert _fail_some(outbox, clock) == ["g2", "g5"]
    assert {r.id for r in outbox.failed()} == DOOMED
    report = outbox.retry_report(group="g")
    assert report.retried == ["g1", "g3", "g4"]
    assert (report.not_found, report.not_failed) == ([], [])
    # Each took a new place at the group's tail, in the old order, attempts reset, due now.
    records = [outbox.get(i) for i in ("g1", "g3", "g4")]
    assert [r.seq for r in records] == [6, 7, 8]
    assert all(r.status is EventStatus.PENDING and r.attempts == 0 for r in records)
    assert all(r.due_at_ms <= int(clock.time() * 1000) for r in records)
    # Other groups' and unordered failed events are untouched.
    assert {r.id for r in outbox.failed()} == {"h1", "u1"}
    assert _drain(outbox, clock, batch_size) == ["g1", "g3", "g4"]
    assert all(outbox.get(i).status is EventStatus.COMPLETED for i in ("g1", "g3", "g4"))
    # Nothing left to redrive: 0, and the group goes on numbering after them.
    assert outbox.retry(group="g") == 0
    outbox.publish(Event("t", 6, group="g", ordered=True, id="g6"))
    assert outbox.get("g6").seq == 9


def test_redriven_events_come_after_the_groups_pending_events(make_backend):
    clock = ManualClock()
    outbox = make_backend(clock=clock).outbox
    _fail_some(outbox, clock)
    outbox.publish([Event("t", i, group="g", ordered=True, id=f"n{i}") for i in range(2)])
    assert outbox.retry(group="g") == 3
    assert [outbox.get(i).seq for i in ("n0", "n1", "g1", "g3", "g4")] == [6, 7, 8, 9, 10]
    assert _drain(outbox, clock, 25) == ["n0", "n1", "g1", "g3", "g4"]


def test_a_redriven_event_that_fails_again_lets_the_rest_go_on(make_backend):
    clock = ManualClock()
    outbox = make_backend(clock=clock).outbox
    _fail_some(outbox, clock)
    assert outbox.retry(group="g") == 3
    got: list[str] = []

    def handle(event: Event) -> None:
        if event.id == "g3":
            raise RuntimeError("still poison")
        got.append(event.id)

    worker = outbox.worker(handle, max_attempts=1, heartbeat=False)
    for _ in range(10):
        worker.run_once()
        clock.advance(2)
    assert got == ["g1", "g4"]
    # once more: only g3, at the tail again
    assert outbox.retry_report(group="g").retried == ["g3"]
    assert outbox.get("g3").seq == 9
    assert _drain(outbox, clock, 1) == ["g3"]


def test_retry_takes_ids_or_a_group_never_both(make_backend):
    outbox = make_backend().outbox
    with pytest.raises(TypeError, match="ids or group"):
        outbox.retry()
    with pytest.raises(TypeError, match="ids or group"):
        outbox.retry(["a"], group="g")
    with pytest.raises(TypeError, match="ids or group"):
        outbox.retry_report()
    with pytest.raises(InvalidValueError):
        outbox.retry(group="")
    with pytest.raises(InvalidValueError, match="event group"):
        outbox.retry(group=3)
    assert outbox.retry(group="nobody") == 0  # an unknown (or empty) group moves nothing
    assert outbox.retry_report(group="nobody").retried == []


def test_four_workers_deliver_redriven_groups_in_order(make_backend):
    needs_atomic_store(make_backend)
    outbox = make_backend().outbox
    groups = ("g", "k", "m")
    _fail_some(outbox, None, groups)
    for group in groups:
        assert outbox.retry(group=group) == 3
    order: dict[str, list[str]] = {g: [] for g in groups}
    counts: Counter[str] = Counter()
    lock = threading.Lock()
    errors: list[BaseException] = []

    def handle(event: Event) -> None:
        with lock:
            counts[event.id] += 1
            if event.group in order:
                order[event.group].append(event.id)

    def run() -> None:
        worker = outbox.worker(handle, batch_size=1, heartbeat=False)
        try:
            idle = 0
            while idle < 30:
                if worker.run_once():
                    idle = 0
                else:
                    idle += 1
                    threading.Event().wait(0.05)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert order == {
        "g": ["g1", "g3", "g4"],
        "k": ["k-1", "k-3", "k-4"],
        "m": ["m-1", "m-3", "m-4"],
    }
    assert set(counts.values()) == {1}
    assert {r.id for r in outbox.failed()} == {"h1", "u1"}


def test_more_events_than_one_transaction_keep_their_order(make_backend):
    """Beyond 99 events the DynamoDB store moves them in several transactions, each after the
    previous one: the order holds across them."""
    if getattr(make_backend, "kind", "").startswith("moto"):
        pytest.skip("130 failed events take half a minute on moto; chunks: the next test")
    clock = ManualClock()
    outbox = make_backend(clock=clock).outbox
    count = 130
    for start in range(0, count, 50):
        outbox.publish(
            [
                Event("t", i, group="big", ordered=True, id=f"b{i:03d}")
                for i in range(start, min(count, start + 50))
            ]
        )

    def poison(event: Event) -> None:
        raise RuntimeError("poison")

    worker = outbox.worker(poison, max_attempts=1, batch_size=50, heartbeat=False)
    drain(worker, clock=clock)
    assert outbox.stats().failed == count
    assert outbox.retry(group="big") == count
    assert [outbox.get(f"b{i:03d}").seq for i in range(count)] == list(
        range(count + 1, 2 * count + 1)
    )
    got = _drain(outbox, clock, 50)
    assert got == [f"b{i:03d}" for i in range(count)]


def test_small_chunks_keep_the_order_across_transactions(make_backend, monkeypatch):
    """The DynamoDB store's chunks, made 2 events long: 3 transactions, each one's places after
    the previous one's (the other stores move a group in one step anyway)."""
    from dynacoord.backends.dynamodb import outbox as dynamodb_outbox

    monkeypatch.setattr(dynamodb_outbox, "_REDRIVE_CHUNK", 2)
    clock = ManualClock()
    outbox = make_backend(clock=clock).outbox
    _fail_some(outbox, clock)
    outbox.publish(Event("t", 6, group="g", ordered=True, id="g6"))
    outbox.publish(Event("t", 7, group="g", ordered=True, id="g7"))

    def poison(event: Event) -> None:
        raise RuntimeError("poison")

    worker = outbox.worker(poison, max_attempts=1, heartbeat=False)
    drain(worker, clock=clock)
    assert outbox.retry_report(group="g").retried == ["g1", "g3", "g4", "g6", "g7"]
    assert [outbox.get(i).seq for i in ("g1", "g3", "g4", "g6", "g7")] == [8, 9, 10, 11, 12]
    assert _drain(outbox, clock, 1) == ["g1", "g3", "g4", "g6", "g7"]


#: the writes of ``retry(group=...)`` whose answers are lost, in order (on Redis the failed
#: index is read by a script too: its answer is lost first, then the move's)
_MOVE = {
    "dynamodb": ["TransactWriteItems"],
    "redis": ["EVALSHA", "EVALSHA"],
    "mongo": ["find_one_and_update", "bulk_write"],
}


def test_a_lost_answer_moves_each_event_once(lossy):
    clock = ManualClock()
    outbox = lossy.backend(clock=clock).outbox
    _fail_some(outbox, clock)
    for operation in _MOVE[lossy.kind]:
        lossy.lose_next(operation=operation)
    report = outbox.retry_report(group="g")
    assert lossy.lost == len(_MOVE[lossy.kind])
    assert report.retried == ["g1", "g3", "g4"]
    assert [outbox.get(i).seq for i in ("g1", "g3", "g4")] == [6, 7, 8]
    assert _drain(outbox, clock, 25) == ["g1", "g3", "g4"]
    assert outbox.retry(group="g") == 0


def test_a_lost_answer_does_not_move_an_event_that_failed_again_in_the_gap(lossy):
    """The move applied, its answer was lost, and before the client's retry a worker delivered
    the group again and its first event failed again: the retry recognises its own move and
    does not move that event a second time."""
    clock = ManualClock()
    outbox = lossy.backend(clock=clock).outbox
    _fail_some(outbox, clock)

    def fail_g1_again() -> None:
        def handle(event: Event) -> None:
            if event.id == "g1":
                raise RuntimeError("poison again")

        outbox.worker(handle, max_attempts=1, batch_size=1, heartbeat=False).run_once()

    *before, move = _MOVE[lossy.kind]
    for operation in before:
        lossy.lose_next(operation=operation)
    lossy.lose_next(operation=move, then=fail_g1_again)
    assert outbox.retry_report(group="g").retried == ["g1", "g3", "g4"]
    assert lossy.lost == len(_MOVE[lossy.kind])
    g1 = outbox.get("g1")
    assert g1.status is EventStatus.FAILED and g1.seq == 6
    assert _drain(outbox, clock, 25) == ["g3", "g4"]


def test_a_sharded_outbox_redrives_the_group_into_its_shard(ddb_table):
    """With shards, the listing reads every shard's failed index and the events go back to
    their group's queue (a worker with a different shard count drains them in order)."""
    from dynacoord.keys import outbox_index_pk, shard_of

    from ..conftest import _dynamodb_factory

    client, table = ddb_table
    make = _dynamodb_factory(client, table)
    clock = ManualClock()
    backend = make(shards=8, clock=clock)
    outbox = backend.outbox
    _fail_some(outbox, clock)
    assert outbox.retry(group="g") == 3
    item = client.get_item(TableName=table, Key=outbox._store._key("g3"))["Item"]
    assert item["gsi1pk"]["S"] == outbox_index_pk(backend.namespace, "pending", shard_of("g", 8))
    other = make(shards=8, clock=clock, namespace=backend.namespace).outbox
    assert _drain(other, clock, 1) == ["g1", "g3", "g4"]


def test_the_cost_on_dynamodb_is_the_failed_index_read_and_one_transaction(ddb_table):
    """The shard count read, one Query of the failed index per shard (4 by default: a worker
    with another shard count may have failed the group's events on another shard), the gate's
    read and one transaction of the gate and the group's events (2 write units per item)."""
    from collections import Counter

    from ..conftest import _dynamodb_factory

    client, table = ddb_table
    clock = ManualClock()
    backend = _dynamodb_factory(client, table)(clock=clock)
    outbox = backend.outbox
    _fail_some(outbox, clock)
    sent: Counter[str] = Counter()
    items: list[int] = []

    def count(event_name: str, params: dict[str, Any], **_: Any) -> None:
        sent[event_name.rsplit(".", 1)[-1]] += 1
        if "TransactItems" in params:
            items.append(len(params["TransactItems"]))

    client.meta.events.register("provide-client-params.dynamodb.*", count)
    try:
        assert outbox.retry(group="g") == 3
    finally:
        client.meta.events.unregister("provide-client-params.dynamodb.*", count)
    assert backend.shards == 4
    assert sent == {"GetItem": 2, "Query": 4, "TransactWriteItems": 1}
    assert items == [4]  # the gate and the three events
