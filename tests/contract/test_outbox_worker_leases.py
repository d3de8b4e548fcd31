"""The prototype outbox store with one lease item per worker (issue 50; KCL's shape):
``dynacoord.backends.dynamodb._outbox_worker_leases.WorkerLeaseOutboxStore``, on moto and on
DynamoDB Local.

What it must keep of the default store's promises, each at the point where the shape could
break it: a dead worker's events are found (also those claimed right after its item's write),
a renewal between a recoverer's read and its claim keeps the event, a fenced worker loses what
it held, a claim whose call raised is given back without its attempt; and what it is for: an
event's whole life and one renewal, counted by AWS's rules (bench/_units.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from bench._units import UnitMeter
from dynacoord import ManualClock
from dynacoord.backends.dynamodb import DynamoDBBackend
from dynacoord.backends.dynamodb._outbox_worker_leases import (
    DEAD_ITEM_GRACE_MS,
    WorkerLeaseOutboxStore,
)
from dynacoord.backends.dynamodb.outbox import DynamoDBOutboxStore
from dynacoord.outbox import Event, EventStatus
from dynacoord.outbox.delivery import claim_token
from dynacoord.outbox.event import new_event_id
from dynacoord.testing import unique_name
from tests.contract.test_applied_then_raised import RAISED

LEASE_MS = 6000


@pytest.fixture(params=["moto", "dynamodb"])
def table(request: pytest.FixtureRequest) -> tuple[Any, str]:
    name = "moto_table" if request.param == "moto" else "ddb_table"
    got: tuple[Any, str] = request.getfixturevalue(name)
    return got


def _outbox(client: Any, table: str, clock: ManualClock, namespace: str) -> Any:
    return DynamoDBBackend(client, table_name=table, namespace=namespace, clock=clock).outbox


def _store(outbox: Any) -> WorkerLeaseOutboxStore:
    base = outbox._store
    return WorkerLeaseOutboxStore(base._table, base._ns, shards=base._own_shards)


def _setup(table: tuple[Any, str], events: int = 3) -> tuple[Any, ManualClock, list[str]]:
    client, name = table
    clock = ManualClock()
    outbox = _outbox(client, name, clock, unique_name("wl"))
    ids = [outbox.publish(Event("t", {"n": i}))[0] for i in range(events)]
    return outbox, clock, ids


def _claim_all(store: WorkerLeaseOutboxStore, outbox: Any, clock: ManualClock) -> list[Any]:
    now = int(clock.time() * 1000)
    seen = [r for shard in range(store.shards) for r in _page(store, shard, now)]
    return store.claim_many(seen, [new_event_id() for _ in seen], now + LEASE_MS, now)


def _page(store: WorkerLeaseOutboxStore, shard: int, now: int) -> list[Any]:
    page, _ = store.query_page(EventStatus.PENDING, shard, due_before_ms=now, limit=25)
    return page


def _expired(store: WorkerLeaseOutboxStore, clock: ManualClock) -> list[Any]:
    now = int(clock.time() * 1000)
    page, _ = store.query_page(EventStatus.IN_FLIGHT, 0, due_before_ms=now, limit=25)
    return page


def test_a_claim_takes_the_event_out_of_the_index_and_lists_it_on_the_worker_item(table):
    outbox, clock, ids = _setup(table)
    store = _store(outbox)
    got = _claim_all(store, outbox, clock)
    assert sorted(r.id for r in got) == sorted(ids)
    # no pending entry left, and no in-flight index entry either: the worker item holds them
    assert outbox.pending() == []
    client, name = table
    item = client.get_item(TableName=name, Key=store._worker_key(store._gen), ConsistentRead=True)[
        "Item"
    ]
    assert sorted(v["S"] for v in item["ids"]["L"]) == sorted(ids)
    # the default store's readers see none of them (they are in no index): readers of a
    # namespace delivered this way must read through the worker items too
    assert outbox.stats().in_flight == 0
    outbox._store = _store(outbox)
    assert outbox.stats().in_flight == 3
    assert sorted(r.id for r in outbox.in_flight()) == sorted(ids)
    for event_id in ids:
        raw = client.get_item(
            TableName=name, Key=outbox._store._key(event_id), ConsistentRead=True
        )["Item"]
        assert "gsi1pk" not in raw and raw["held_by"]["S"] == store._gen


def test_a_dead_workers_events_are_found_after_its_lease_and_taken_over(table):
    outbox, clock, ids = _setup(table)
    dead = _store(outbox)
    _claim_all(dead, outbox, clock)  # then it dies: no renewal, no outcome
    rescuer = _store(outbox)
    assert _expired(rescuer, clock) == []  # the lease holds
    clock.advance(LEASE_MS / 1000)
    seen = _expired(rescuer, clock)
    assert sorted(r.id for r in seen) == sorted(ids)
    now = int(clock.time() * 1000)
    for record in seen:
        got = rescuer.claim(record, claim_token(record), now + LEASE_MS, now)
        assert got is not None and got.attempts == 2
    # the dead worker's item is fenced: a renewal (it was only frozen) loses everything
    assert dead.extend_many(seen, now + LEASE_MS, now) == [False] * len(seen)
    assert _expired(rescuer, clock) == []


def test_a_renewal_between_the_recoverers_read_and_its_claim_keeps_the_event(table):
    outbox, clock, ids = _setup(table, events=1)
    holder = _store(outbox)
    held = _claim_all(holder, outbox, clock)
    clock.advance(LEASE_MS / 1000)
    rescuer = _store(outbox)
    (seen,) = _expired(rescuer, clock)
    now = int(clock.time() * 1000)
    assert holder.extend_many(held, now + LEASE_MS, now) == [True]  # late, but before the fence
    assert rescuer.claim(seen, claim_token(seen), now + LEASE_MS, now) is None
    assert outbox.get(ids[0]).lease_token == held[0].lease_token


def test_a_fenced_worker_starts_a_new_item_for_its_next_claims(table):
    outbox, clock, _ = _setup(table, events=2)
    frozen = _store(outbox)
    now = int(clock.time() * 1000)
    first = _all_pending(frozen, now)
    got = frozen.claim_many(first[:1], [new_event_id()], now + LEASE_MS, now)
    old_gen = frozen._gen
    clock.advance(LEASE_MS / 1000)
    rescuer = _store(outbox)
    (seen,) = _expired(rescuer, clock)
    now = int(clock.time() * 1000)
    assert rescuer.claim(seen, claim_token(seen), now + LEASE_MS, now) is not None
    # the frozen worker comes back and claims the other event: a new generation holds it
    rest = [r for s in range(frozen.shards) for r in _page(frozen, s, now)]
    assert [r.id for r in rest] == [first[1].id]
    again = frozen.claim_many(rest, [new_event_id()], now + LEASE_MS, now)
    assert [r.id for r in again] == [first[1].id] and frozen._gen != old_gen
    assert frozen.extend_many(got + again, now + LEASE_MS, now) == [False, True]


@pytest.mark.parametrize("lossy", ["dynamodb"], indirect=True)
def test_a_claim_whose_call_raised_after_applying_is_given_back_with_its_attempt(lossy):
    clock = ManualClock()
    outbox = lossy.backend(clock=clock).outbox
    first = outbox.publish(Event("t", {"n": 1}))[0]
    second = outbox.publish(Event("t", {"n": 2}))[0]
    store = _store(outbox)
    now = int(clock.time() * 1000)
    (seen,) = [r for r in _all_pending(store, now) if r.id == first]
    write_item = store._write_item

    def then_raise(ids: list[str], until_ms: int) -> bool:
        written = write_item(ids, until_ms)
        lossy.raise_next(operation="UpdateItem")  # the claim after this pre-claim write
        return written

    store._write_item = then_raise  # type: ignore[method-assign]
    with pytest.raises(RAISED):
        store.claim(seen, claim_token(), now + LEASE_MS, now)
    store._write_item = write_item  # type: ignore[method-assign]
    assert outbox.get(first).status is EventStatus.IN_FLIGHT  # applied: held, out of the index
    (other,) = [r for r in _all_pending(store, now) if r.id == second]
    assert store.claim(other, claim_token(), now + LEASE_MS, now) is not None
    back = outbox.get(first)
    assert back.status is EventStatus.PENDING and back.attempts == 0


def _all_pending(store: WorkerLeaseOutboxStore, now: int) -> list[Any]:
    return [r for shard in range(store.shards) for r in _page(store, shard, now)]


# -- what it costs (AWS's rules; PartiQL batches, so DynamoDB Local: moto has no PartiQL) ----------


@pytest.mark.parametrize("batch", [1, 25])
def test_one_renewal_is_one_write_unit_whatever_the_batch(ddb_table, batch):
    client, name = ddb_table
    clock = ManualClock()
    outbox = _outbox(client, name, clock, unique_name("wl"))
    for i in range(batch):
        outbox.publish(Event("t", {"n": i, "pad": "p" * 384}))
    store = _store(outbox)
    held = _claim_all(store, outbox, clock)
    assert len(held) == batch
    meter = UnitMeter(client, client, name)
    try:
        clock.advance(2)
        now = int(clock.time() * 1000)
        assert store.extend_many(held, now + LEASE_MS, now) == [True] * batch
    finally:
        meter.close()
    assert (meter.wcu, meter.index_wcu) == (1, 0)


def test_an_events_whole_life_is_at_most_5_write_units_and_a_share_of_the_batch_write(ddb_table):
    from bench._delivery_shapes import life_cost

    client, name = ddb_table
    row = life_cost(client, client, name, shape="worker", batch=25, handler_s=0.05, batches=1)
    # publish 1 + 1 index, claim 1 + 1 index (out of the index), completion 1, the batch's
    # worker item write 1/25; the handler outlives no beat (no extension)
    assert row["extensions"]["table_wcu"] == 0
    # + the namespace's shard record, written once by the first publish: 1/25
    assert row["wcu_per_event"] <= 5 + 2 / 25


def test_an_expired_lease_of_the_default_store_is_recovered_by_this_shape(table):
    """A namespace moving to this shape: an event the default store claimed (its lease in the
    index) whose worker died is found and taken over by a worker-lease store."""
    outbox, clock, ids = _setup(table, events=1)
    base = outbox._store
    now = int(clock.time() * 1000)
    seen = [r for shard in range(base.shards) for r in _page(base, shard, now)]
    assert len(base.claim_many(seen, [new_event_id()], now + LEASE_MS, now)) == 1
    store = _store(outbox)
    assert _expired(store, clock) == []
    clock.advance(LEASE_MS / 1000)
    now = int(clock.time() * 1000)
    (found,) = [
        r
        for shard in range(store.shards)
        for r in store.query_page(EventStatus.IN_FLIGHT, shard, due_before_ms=now, limit=25)[0]
    ]
    assert found.id == ids[0]
    got = store.claim(found, claim_token(found), now + LEASE_MS, now)
    assert got is not None and got.attempts == 2
    outbox._store = store
    assert outbox.stats().in_flight == 1


def test_an_event_held_through_a_worker_item_is_never_claimed_on_its_own_due_time(table):
    """An in-flight event read without its worker item (a stale index entry, another reader's
    record): its own due time is its claim's, not its lease's, so its claim is refused while
    the item that holds it is renewed."""
    outbox, clock, ids = _setup(table, events=1)
    holder = _store(outbox)
    held = _claim_all(holder, outbox, clock)
    clock.advance(LEASE_MS / 1000)
    now = int(clock.time() * 1000)
    assert holder.extend_many(held, now + LEASE_MS, now) == [True]
    clock.advance(1)
    now = int(clock.time() * 1000)
    stale = outbox._store.get(ids[0], now)  # the default reader: the claim's due time
    assert stale.status is EventStatus.IN_FLIGHT and stale.due_at_ms <= now
    other = _store(outbox)
    assert other.claim(stale, claim_token(stale), now + LEASE_MS, now) is None
    assert outbox.get(ids[0]).lease_token == held[0].lease_token


def test_a_claim_applied_after_its_paused_workers_item_was_swept_is_refused(table):
    """The late claim: a worker writes its item listing an event, then pauses before its claim
    is applied; its item expires and, the grace over, a recoverer's scan deletes it (it holds
    nothing). The claim that lands afterwards must be refused, the event left pending in the
    index; applied, it would hold the event out of the index with no item listing it."""
    outbox, clock, ids = _setup(table, events=1)
    paused = _store(outbox)
    now = int(clock.time() * 1000)
    seen = _all_pending(paused, now)
    paused._pre_claim([r.id for r in seen], now + LEASE_MS, now)
    clock.advance((LEASE_MS + DEAD_ITEM_GRACE_MS) / 1000)
    rescuer = _store(outbox)
    assert _expired(rescuer, clock) == []  # the scan sweeps the paused worker's item
    client, name = table
    gone = client.get_item(TableName=name, Key=paused._worker_key(paused._gen), ConsistentRead=True)
    assert "Item" not in gone
    # the paused claim lands now (the request as sent before the pause: its own clock)
    late = DynamoDBOutboxStore.claim_many(paused, seen, [new_event_id()], now + LEASE_MS, now)
    assert late == []
    assert [r.id for r in outbox.pending()] == ids
