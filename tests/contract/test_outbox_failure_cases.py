"""The store-level cases of issue 28 ("The outbox under failure"), each a history that broke a
promise of docs/outbox.md before its fix: a wedge behind dead workers' ordered followers, shard
counts that disagree, ordered publishes past the item limit or under contention, and batched
writes whose later part is refused or raises.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import defaultdict
from typing import Any

import pytest

from dynacoord._clock import ManualClock
from dynacoord.errors import TransactionTooLargeError
from dynacoord.keys import shard_of
from dynacoord.outbox import ORDERED_RECHECK_MS, Event, OutboxStats, Outcome

from ..conftest import _dynamodb_factory

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")

LEASE_S = 30


def _drained(stats: OutboxStats) -> bool:
    return (stats.pending, stats.in_flight, stats.failed) == (0, 0, 0)


@pytest.fixture()
def make_ddb(ddb_table: tuple[Any, str]) -> Any:
    """Backends on DynamoDB Local only (shards exist on the DynamoDB backend only)."""
    client, table = ddb_table
    return _dynamodb_factory(client, table)


def _die_holding(outbox: Any, ids: list[str], clock: ManualClock) -> None:
    """A worker claims ``ids`` (as they are stored now) and dies: it never finishes them."""
    store = outbox._store
    now = int(clock.time() * 1000)
    seen = [outbox.get(i) for i in ids]
    claimed = store.claim_many(seen, [f"dead-{i}" for i in ids], now + LEASE_S * 1000, now)
    assert sorted(r.id for r in claimed) == sorted(ids)


def _poll_gap_s(worker: Any) -> float:
    """More than a recheck of a blocked group and than the expired-lease scan's interval."""
    return max(ORDERED_RECHECK_MS, worker.lease_ms // 2) / 1000 + 1


# -- case 1: blocked ordered followers with expired leases wedged the in-flight queue -----------


@pytest.mark.parametrize("batch_size", [25, 1])
def test_dead_workers_blocked_followers_do_not_wedge_the_outbox(make_backend, batch_size):
    # Two workers die holding the heads and followers of 2 groups (on one shard of 4); every
    # follower's id sorts before its head's, so the expired-lease scan (lease end, then id)
    # sees only followers of a group whose head is not done: a full page of blocked events.
    clock = ManualClock()
    outbox = make_backend(clock=clock).outbox
    assert shard_of("a", 4) == shard_of("c", 4)
    groups = {g: [f"zz-{g}"] + [f"{g}-{i:02d}" for i in range(1, 25)] for g in ("a", "c")}
    for g, ids in groups.items():
        outbox.publish([Event("t", n, group=g, ordered=True, id=i) for n, i in enumerate(ids)])
    for ids in groups.values():
        _die_holding(outbox, ids, clock)
    outbox.publish(Event("t", "free", id="free"))
    clock.advance(LEASE_S + 1)  # the dead workers' leases ran out
    delivered: dict[str, list[int]] = defaultdict(list)

    def handle(event: Event) -> None:
        delivered[event.group or "-"].append(event.payload)

    worker = outbox.worker(handle, batch_size=batch_size, heartbeat=False)
    for poll in range(200):  # bounded: a wedged outbox never drains
        worker.run_once()
        clock.advance(_poll_gap_s(worker))
        if poll % 10 == 9 and _drained(outbox.stats()):
            break
    assert outbox.stats() == OutboxStats(pending=0, due=0, in_flight=0, failed=0)
    assert delivered == {"a": list(range(25)), "c": list(range(25)), "-": ["free"]}


# -- case 4: a worker with more shards than the namespace's recorded count ---------------------


class Crash(BaseException):
    """A handler that kills its worker (not an Exception: the worker does not record it)."""


def _crash(event: Event) -> None:
    raise Crash()


def test_a_worker_with_more_shards_than_recorded_strands_nothing(make_ddb):
    # A 4-shard publisher records 4; a worker configured with 8 claims a batch and dies on its
    # first event: the batch's rest is given back (pending) and the first stays in flight, each
    # placed by the worker's own 8 shards. Readers and workers with 4 (and the default) must see
    # them all and recover them.
    clock = ManualClock()
    publisher = make_ddb(shards=4, clock=clock)
    ns = publisher.namespace
    ids = [f"e{i:02d}" for i in range(20)]
    assert any(shard_of(i, 8) >= 4 for i in ids)  # some land on shards a 4-shard reader skips
    publisher.outbox.publish([Event("t", i, id=i) for i in ids])
    wide = make_ddb(namespace=ns, shards=8, clock=clock).outbox.worker(_crash, heartbeat=False)
    with pytest.raises(Crash):
        wide.run_once()
    for reader in (
        make_ddb(namespace=ns, shards=4, clock=clock),
        make_ddb(namespace=ns, clock=clock),
    ):
        stats = reader.outbox.stats()
        assert (stats.pending, stats.in_flight) == (19, 1), reader.shards
    clock.advance(LEASE_S + 1)  # the dead worker's lease ran out
    got: list[str] = []
    narrow = make_ddb(namespace=ns, shards=4, clock=clock).outbox
    worker = narrow.worker(lambda e: got.append(e.id), heartbeat=False)
    for _ in range(10):
        worker.run_once()
        clock.advance(_poll_gap_s(worker))
    assert sorted(got) == ids
    assert _drained(narrow.stats())


# -- case 5: a long-lived reader kept the shard count it read first -----------------------------


def test_a_long_lived_reader_counts_events_of_a_publisher_with_more_shards(make_ddb):
    reader = make_ddb(shards=4)
    assert reader.outbox.stats().pending == 0  # reads the namespace's shard count once
    publisher = make_ddb(namespace=reader.namespace, shards=8)
    ids = [f"p{i:02d}" for i in range(40)]
    assert any(shard_of(i, 8) >= 4 for i in ids)
    publisher.outbox.publish([Event("t", i, id=i) for i in ids])
    outbox = reader.outbox
    assert outbox.stats().pending == 40
    assert sorted(r.id for r in outbox.pending()) == ids
    assert outbox.failed() == [] and outbox.in_flight() == []


# -- case 9a: a group's gate moved past an outcome that was refused -----------------------------


def test_a_refused_outcome_does_not_move_its_groups_gate(make_backend):
    # A worker holds places 1 and 2 of a group and has lost the lease on place 2 (another claim
    # holds it now): its outcomes are written for place 1 only, and the gate must stop at 2.
    clock = ManualClock()
    outbox = make_backend(clock=clock).outbox
    outbox.publish([Event("t", n, group="g", ordered=True, id=f"g{n}") for n in (1, 2, 3)])
    store = outbox._store
    now = int(clock.time() * 1000)
    seen = [outbox.get("g1"), outbox.get("g2")]
    held = store.claim_many(seen, ["t1", "t2"], now + LEASE_S * 1000, now)
    assert [r.id for r in held] == ["g1", "g2"]
    lost = dataclasses.replace(held[1], lease_token="someone-else")
    written = store.finish_many(
        [Outcome(held[0], "completed"), Outcome(lost, "completed")], now, None
    )
    assert written == [True, False]
    got: list[str] = []
    worker = outbox.worker(lambda e: got.append(e.id), heartbeat=False)
    worker.run_once()
    assert got == []  # place 3 waits: place 2 is still in flight, not delivered
    clock.advance(LEASE_S + 1)
    for _ in range(5):
        worker.run_once()
        clock.advance(_poll_gap_s(worker))
    assert got == ["g2", "g3"]


# -- case 7: the item limit of an ordered publish counts its groups' gates ---------------------


def test_an_ordered_publish_counts_one_item_per_group_on_every_backend(make_backend):
    outbox = make_backend().outbox
    too_many = [Event("t", i, group=f"g{i}", ordered=True, id=f"big{i}") for i in range(60)]
    with pytest.raises(TransactionTooLargeError, match="60 events in 60 ordered groups") as err:
        outbox.publish(too_many)
    assert (err.value.size, err.value.limit) == (120, 100)
    assert all(outbox.get(e.id) is None for e in too_many)
    assert outbox.stats().pending == 0
    fits = [Event("t", i, group=f"g{i}", ordered=True, id=f"fit{i}") for i in range(50)]
    outbox.publish(fits)  # 50 events and 50 gates: 100 items
    assert outbox.stats().pending == 50
    assert {outbox.get(e.id).seq for e in fits} == {1}


# -- case 8: ordered publishes to one group under contention ---------------------------------


@pytest.fixture(params=["dynamodb", "redis", "mongo"])
def make_atomic(request: pytest.FixtureRequest) -> Any:
    """Backends whose conditional writes are atomic across threads (not moto)."""
    if request.param == "dynamodb":
        client, table = request.getfixturevalue("ddb_table")
        return _dynamodb_factory(client, table)
    return request.getfixturevalue(f"{request.param}_backend_factory")


def test_racing_ordered_publishers_to_one_group_all_get_their_places(make_atomic):
    outbox = make_atomic().outbox
    threads, each = 8, 15
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads)

    def publish(t: int) -> None:
        barrier.wait()
        try:
            for i in range(each):
                outbox.publish(Event("t", [t, i], group="hot", ordered=True, id=f"h{t}-{i:02d}"))
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=publish, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert errors == []
    places = [outbox.get(f"h{t}-{i:02d}").seq for t in range(threads) for i in range(each)]
    assert sorted(places) == list(range(1, threads * each + 1))
    for t in range(threads):  # one publisher's events keep its order
        mine = places[t * each : (t + 1) * each]
        assert mine == sorted(mine)


# -- case 9b: a claim batch over 100 items whose later transaction raises ----------------------


class ThrottledError(Exception):
    """What the table raised for the second transaction of a batch."""


def test_a_claim_batch_whose_later_transaction_raises_gives_back_what_it_got(make_ddb, monkeypatch):
    clock = ManualClock()
    outbox = make_ddb(clock=clock, shards=1).outbox
    for start in (0, 100):
        outbox.publish([Event("t", i, id=f"c{i:03d}") for i in range(start, start + 60)])
    seen = outbox.pending(limit=120)
    # several requests: 5 conditional batches of at most 25 (or transactions of 100 and 20
    # where the endpoint runs no PartiQL)
    assert len(seen) == 120
    table = outbox._store._table
    call = table.call
    sent: list[str] = []

    def flaky(operation: str, **kwargs: Any) -> Any:
        if operation in ("transact_write_items", "batch_execute_statement"):
            sent.append(operation)
            if len(sent) == 2:
                raise ThrottledError("the second request of the claim")
        return call(operation, **kwargs)

    monkeypatch.setattr(table, "call", flaky)
    now = int(clock.time() * 1000)
    with pytest.raises(ThrottledError):
        outbox._store.claim_many(seen, [f"t{i}" for i in range(120)], now + 30_000, now)
    monkeypatch.undo()
    stats = outbox.stats()
    assert (stats.pending, stats.due, stats.in_flight) == (120, 120, 0)
    assert all(r.attempts == 0 for r in outbox.pending(limit=120))
