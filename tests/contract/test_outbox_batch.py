"""Batched claims and completions, shard agreement, ordered groups and hooks, on every backend.

The cases the batch design must survive: a racing worker, a lost batch response, a handler
crash mid-batch, and ordered groups under 4 concurrent workers.
"""

from __future__ import annotations

import logging
import random
import threading
from collections import Counter, defaultdict
from typing import Any

import pytest

from dynacoord._clock import ManualClock
from dynacoord.errors import InvalidValueError, NotSupportedError
from dynacoord.keys import outbox_index_pk, shard_of
from dynacoord.outbox import DeliveryHooks, Event, EventStatus, OutboxStats
from tests.outbox_helpers import drain

from ..backends_fixtures import (  # noqa: F401  (fixtures are registered by import)
    dynamodb_layout_backend_factory,
    dynamodb_layout_table,
)
from ..conftest import _dynamodb_factory, needs_atomic_store

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")


@pytest.fixture()
def make_ddb(ddb_table: tuple[Any, str]) -> Any:
    """Backends on DynamoDB Local only, for what only the DynamoDB backend has (shards,
    caller transactions, IAM scoping)."""
    client, table = ddb_table
    return _dynamodb_factory(client, table)


def _raise(event: Event) -> None:
    raise RuntimeError(f"poison {event.id}")


class Crash(BaseException):
    """A handler that kills its worker (not an Exception: the worker does not catch it)."""


def _count_dynamodb_requests(backend: Any) -> Counter[str] | None:
    """A live count of the DynamoDB requests ``backend``'s client sends (None elsewhere)."""
    client = getattr(backend, "client", None)
    if client is None or not hasattr(client, "meta"):
        return None
    counts: Counter[str] = Counter()

    def count(event_name: str, **_: Any) -> None:
        counts[event_name.rsplit(".", 1)[-1]] += 1

    client.meta.events.register("before-send.dynamodb.*", count)
    return counts


def _batch_operation(outbox: Any) -> str:
    """The DynamoDB request a batch of conditional writes travels in on this endpoint (asked
    here, so that the one-time probe is not counted by the test)."""
    if outbox._store._statements_supported():
        return "BatchExecuteStatement"  # plain-write prices: DynamoDB, DynamoDB Local
    return "TransactWriteItems"  # moto runs no PartiQL updates


def test_a_batch_is_claimed_and_completed_in_one_request_each(make_backend):
    backend = make_backend()
    outbox = backend.outbox
    is_dynamodb = hasattr(getattr(backend, "client", None), "meta")  # a boto3 client
    batch_op = _batch_operation(outbox) if is_dynamodb else None
    outbox.publish([Event("t", i, id=f"b{i:02d}") for i in range(20)])
    got: list[str] = []
    worker = outbox.worker(lambda e: got.append(e.id), batch_size=50, heartbeat=False)
    counts = _count_dynamodb_requests(backend)
    assert worker.run_once() == 20
    assert sorted(got) == [f"b{i:02d}" for i in range(20)]
    assert outbox.stats() == OutboxStats(pending=0, due=0, in_flight=0, failed=0)
    if counts is not None:
        client = backend.client  # type: ignore[attr-defined]
        client.meta.events.unregister("before-send.dynamodb.*", counts)
        writes = (
            counts["TransactWriteItems"]
            + counts["BatchExecuteStatement"]
            + counts["UpdateItem"]
            + counts["DeleteItem"]
        )
        assert counts[batch_op] == 2, counts  # one claim, one completion
        assert writes == 2, counts


def test_conditional_batches_cost_plain_writes_where_the_endpoint_runs_them(make_ddb, moto_table):
    """DynamoDB Local (as DynamoDB) runs conditional PartiQL batches: a batch's claims and
    completions are sent that way, each billed as a plain write, not twice as in a
    transaction. moto's PartiQL cannot run them: the probe says so and transactions are used
    (the rest of this file runs the batch design on both)."""
    assert make_ddb().outbox._store._statements_supported() is True
    assert _dynamodb_factory(*moto_table)().outbox._store._statements_supported() is False


def test_conditional_batches_run_in_an_applications_own_table(dynamodb_layout_backend_factory):
    """With a TableLayout the statements name the table's own keys (PK/SK, prefixed values)."""
    backend = dynamodb_layout_backend_factory()
    outbox = backend.outbox
    assert outbox._store._statements_supported() is True
    outbox.publish([Event("t", i, id=f"p{i:02d}") for i in range(30)])
    got: list[str] = []
    counts = _count_dynamodb_requests(backend)
    worker = outbox.worker(lambda e: got.append(e.id), batch_size=30, heartbeat=False)
    assert worker.run_once() == 30
    assert sorted(got) == [f"p{i:02d}" for i in range(30)]
    assert counts is not None and counts["BatchExecuteStatement"] == 4, counts  # 25 + 5, twice
    assert counts["TransactWriteItems"] == 0, counts
    assert outbox.stats() == OutboxStats(pending=0, due=0, in_flight=0, failed=0)


def test_per_event_design_is_kept_with_batch_claim_false(make_backend):
    backend = make_backend()
    outbox = backend.outbox
    outbox.publish([Event("t", i) for i in range(5)])
    got: list[int] = []
    worker = outbox.worker(lambda e: got.append(e.payload), batch_claim=False, heartbeat=False)
    counts = _count_dynamodb_requests(backend)
    assert worker.run_once() == 5
    assert sorted(got) == list(range(5))
    if counts is not None:
        assert counts["TransactWriteItems"] == 0, counts
        assert counts["UpdateItem"] == 10, counts  # a claim and a completion per event


def test_two_racing_batches_deliver_each_event_once(make_backend):
    needs_atomic_store(make_backend)
    outbox = make_backend().outbox
    outbox.publish([Event("t", i, id=f"r{i:03d}") for i in range(60)])
    delivered: Counter[str] = Counter()
    lock = threading.Lock()

    def handle(event: Event) -> None:
        with lock:
            delivered[event.id] += 1

    barrier = threading.Barrier(4)

    def run() -> None:
        worker = outbox.worker(handle, batch_size=60, heartbeat=False)
        barrier.wait()
        drain(worker)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(delivered) == {f"r{i:03d}" for i in range(60)}
    assert max(delivered.values()) == 1
    assert outbox.stats().pending == 0


def _lossy_batch_operation(lossy: Any, outbox: Any) -> dict[str, str]:
    batch_op = _batch_operation(outbox) if lossy.kind == "dynamodb" else ""
    return {"dynamodb": batch_op, "redis": "EVALSHA", "mongo": "bulk_write"}


def _lossy_claim_operation(lossy: Any, outbox: Any) -> str:
    """The request of a batch claim on ``lossy``'s backend: on Redis the claim script's only
    (the poll before it is a script too)."""
    if lossy.kind == "redis":
        from dynacoord.backends.redis.outbox import _CLAIM_MANY

        return str(lossy.script(_CLAIM_MANY))
    return _lossy_batch_operation(lossy, outbox)[lossy.kind]


def test_a_lost_batch_claim_response_is_recognised(lossy):
    outbox = lossy.backend().outbox
    outbox.publish([Event("t", i, id=f"l{i}") for i in range(5)])
    got: list[tuple[str, int]] = []
    worker = outbox.worker(lambda e: got.append((e.id, e.attempt)), heartbeat=False)
    lossy.lose_next(operation=_lossy_claim_operation(lossy, outbox))
    assert worker.run_once() == 5
    assert lossy.lost == 1
    assert sorted(got) == [(f"l{i}", 1) for i in range(5)]
    assert worker.lost == 0
    for i in range(5):
        record = outbox.get(f"l{i}")
        assert record is None or record.status is EventStatus.COMPLETED


def test_a_lost_batch_completion_response_is_recognised(lossy):
    outbox = lossy.backend().outbox
    outbox.publish([Event("t", i, id=f"c{i}") for i in range(4)])
    got: list[str] = []
    worker = outbox.worker(lambda e: got.append(e.id), heartbeat=False, retention=3600)
    claim_op = _lossy_batch_operation(lossy, outbox)
    # The second write of the pass is the completion of the batch.
    lossy.lose_next(2, operation=claim_op[lossy.kind])
    assert worker.run_once() == 4
    assert lossy.lost == 2
    assert worker.delivered == 4 and worker.lost == 0
    assert worker.run_once() == 0
    assert sorted(got) == [f"c{i}" for i in range(4)]
    assert all(outbox.get(f"c{i}").status is EventStatus.COMPLETED for i in range(4))


def test_a_crash_mid_batch_loses_nothing(make_backend):
    clock = ManualClock()
    outbox = make_backend(clock=clock).outbox
    outbox.publish([Event("t", i, id=f"m{i}") for i in range(6)])
    seen: list[str] = []

    def handle(event: Event) -> None:
        if len(seen) == 2:
            seen.append(event.id)
            raise Crash()
        seen.append(event.id)

    worker = outbox.worker(handle, lease=30, heartbeat=False)
    with pytest.raises(Crash):
        worker.run_once()
    crashed = seen[-1]
    # The two handled events are stored as completed, the three not started are back and due,
    # the crashed one waits for its lease.
    stats = outbox.stats()
    assert stats.in_flight == 1 and stats.pending == 3 and stats.due == 3
    assert outbox.get(crashed).status is EventStatus.IN_FLIGHT
    rest: list[str] = []
    rescuer = outbox.worker(rest.append, lease=30, heartbeat=False)
    assert rescuer.run_once() == 3
    clock.advance(31)
    assert rescuer.run_once() == 1
    assert sorted(seen[:2] + [e.id for e in rest]) == [f"m{i}" for i in range(6)]
    assert [e.attempt for e in rest if e.id == crashed] == [2]
    assert outbox.stats() == OutboxStats(pending=0, due=0, in_flight=0, failed=0)


def test_keep_going_gives_back_what_was_not_started(make_backend):
    outbox = make_backend().outbox
    outbox.publish([Event("t", i) for i in range(6)])
    answers = iter([True, True, False])
    got: list[int] = []
    worker = outbox.worker(lambda e: got.append(e.payload), heartbeat=False)
    assert worker.run_once(keep_going=lambda: next(answers)) == 1
    stats = outbox.stats()
    assert stats.pending == 5 and stats.due == 5 and stats.in_flight == 0
    # Given back unstarted: the attempt is not counted.
    assert all(r.attempts == 0 for r in outbox.pending())


def test_a_publisher_with_more_shards_than_the_worker_strands_nothing(make_ddb):
    # Only the DynamoDB backend spreads the outbox over shards.
    publisher = make_ddb(shards=8)
    worker_backend = make_ddb(namespace=publisher.namespace, shards=1)
    publisher.outbox.publish([Event("t", i) for i in range(40)])
    got: list[int] = []
    worker = worker_backend.outbox.worker(lambda e: got.append(e.payload), heartbeat=False)
    drain(worker)
    assert sorted(got) == list(range(40))
    assert worker_backend.outbox.stats().pending == 0


def test_hooks_are_called_and_their_errors_are_logged(make_backend, caplog):
    outbox = make_backend().outbox
    outbox.publish([Event("ok", 1, id="h1"), Event("bad", 2, id="h2")])
    calls: list[tuple[str, str]] = []

    def handle(event: Event) -> None:
        if event.type == "bad":
            raise ValueError("nope")

    def delivered(event: Event) -> None:
        calls.append(("delivered", event.id))
        raise RuntimeError("hook bug")

    worker = outbox.worker(
        handle,
        max_attempts=1,
        heartbeat=False,
        hooks=DeliveryHooks(
            on_delivered=delivered,
            on_error=lambda e, exc: calls.append(("error", f"{e.id}:{exc}")),
            on_failed=lambda e: calls.append(("failed", e.id)),
        ),
    )
    with caplog.at_level(logging.ERROR):
        assert worker.run_once() == 2
    assert sorted(calls) == [("delivered", "h1"), ("error", "h2:nope"), ("failed", "h2")]
    assert "on_delivered hook raised" in caplog.text
    assert worker.delivered == 1 and worker.failed == 1
    with pytest.raises(Exception, match="on_failed must be callable"):
        outbox.worker(handle, hooks=DeliveryHooks(on_failed=5))  # type: ignore[arg-type]


# -- ordered groups -------------------------------------------------------------------------------


def test_an_ordered_event_needs_a_group():
    with pytest.raises(InvalidValueError, match="needs a group"):
        Event("t", 1, ordered=True)


def test_ordered_events_get_their_place_in_the_group(make_backend):
    outbox = make_backend().outbox
    outbox.publish([Event("t", i, group="g", ordered=True, id=f"o{i}") for i in range(3)])
    outbox.publish(Event("t", 3, group="g", ordered=True, id="o3"))
    outbox.publish(Event("t", 9, group="g", id="free"))  # unordered: no place
    assert [outbox.get(f"o{i}").seq for i in range(4)] == [1, 2, 3, 4]
    assert outbox.get("free").seq is None
    # Publishing an identical event again is a no-op: it keeps its place.
    outbox.publish(Event("t", 3, group="g", ordered=True, id="o3"))
    outbox.publish(Event("t", 4, group="g", ordered=True, id="o4"))
    assert outbox.get("o4").seq == 5


def test_an_ordered_group_waits_for_its_head_to_be_retried(make_backend):
    clock = ManualClock()
    outbox = make_backend(clock=clock).outbox
    outbox.publish([Event("t", i, group="acct-1", ordered=True, id=f"s{i}") for i in range(4)])
    outbox.publish(Event("t", "other", id="x"))
    delivered: list[str] = []
    fail_once = {"s0"}

    def handle(event: Event) -> None:
        if event.id in fail_once:
            fail_once.discard(event.id)
            raise RuntimeError("downstream down")
        delivered.append(event.id)

    worker = outbox.worker(handle, backoff=10, max_backoff=10, heartbeat=False)
    worker.run_once()
    # The head failed: its followers were given back, nothing after it was delivered.
    assert delivered == ["x"]
    for _ in range(3):
        worker.run_once()
    assert delivered == ["x"]
    clock.advance(11)
    drain(worker, clock=clock)
    assert delivered == ["x", "s0", "s1", "s2", "s3"]


def test_a_failed_head_lets_its_group_go_on(make_backend):
    clock = ManualClock()
    outbox = make_backend(clock=clock).outbox
    outbox.publish([Event("t", i, group="g", ordered=True, id=f"f{i}") for i in range(3)])
    delivered: list[str] = []

    def handle(event: Event) -> None:
        if event.id == "f0":
            raise RuntimeError("poison")
        delivered.append(event.id)

    worker = outbox.worker(handle, max_attempts=1, heartbeat=False)
    drain(worker, clock=clock)
    assert delivered == ["f1", "f2"]
    assert outbox.get("f0").status is EventStatus.FAILED
    # Retried by hand, the poison event is delivered although its group moved past it.
    outbox.retry("f0")
    ok = outbox.worker(lambda e: delivered.append(e.id), heartbeat=False)
    assert ok.run_once() == 1
    assert delivered == ["f1", "f2", "f0"]


def test_a_retried_ordered_event_goes_back_to_its_groups_shard(make_ddb):
    # With shards, a group's events share one index partition (one worker sees the group); a
    # failed event retried by hand goes back to that partition, not to its own id's.
    clock = ManualClock()
    backend = make_ddb(shards=8, clock=clock)
    outbox = backend.outbox
    # ids whose own shard differs from the group's
    store = outbox._store
    ids = [f"r{i}" for i in range(40)]
    group_shard = shard_of("grp", 8)
    ids = [i for i in ids if shard_of(i, 8) != group_shard][:2]
    outbox.publish([Event("t", n, group="grp", ordered=True, id=i) for n, i in enumerate(ids)])
    outbox.publish(Event("t", "plain", id="u0"))
    worker = outbox.worker(_raise, max_attempts=1, heartbeat=False)
    drain(worker, clock=clock)
    assert outbox.retry_report([ids[0], "u0"]).retried == [ids[0], "u0"]

    def partition(event_id: str) -> str:
        item = backend.client.get_item(TableName=backend.table_name, Key=store._key(event_id))
        return str(item["Item"]["gsi1pk"]["S"])

    assert partition(ids[0]) == outbox_index_pk(backend.namespace, "pending", group_shard)
    assert partition("u0") == outbox_index_pk(backend.namespace, "pending", shard_of("u0", 8))
    report = outbox.retry_report([ids[0], "nope"])
    assert report.not_failed == [ids[0]] and report.not_found == ["nope"]
    got: list[str] = []
    ok = outbox.worker(lambda e: got.append(e.id), heartbeat=False)
    drain(ok, clock=clock)
    assert sorted(got) == sorted([ids[0], "u0"])


def test_a_follower_is_not_claimed_while_its_head_is_in_flight(make_backend):
    clock = ManualClock()
    outbox = make_backend(clock=clock).outbox
    outbox.publish(Event("t", 0, group="g", ordered=True, id="head"))
    holder = outbox.worker(lambda e: None, heartbeat=False)

    def die(event: Event) -> None:
        raise Crash()

    crashed = outbox.worker(die, lease=30, heartbeat=False)
    with pytest.raises(Crash):
        crashed.run_once()  # the head is now in flight
    outbox.publish(Event("t", 1, group="g", ordered=True, id="next"))
    assert holder.run_once() == 0  # the follower waits
    assert outbox.get("next").status is EventStatus.PENDING
    clock.advance(45)  # the head's lease ran out
    got: list[str] = []
    rescuer = outbox.worker(lambda e: got.append(e.id), heartbeat=False)
    drain(rescuer, clock=clock)
    assert got == ["head", "next"]


def test_ordered_groups_under_four_workers_keep_their_order(make_backend):
    needs_atomic_store(make_backend)
    outbox = make_backend().outbox
    groups = [f"agg-{g}" for g in range(4)]
    per_group = 15
    for i in range(per_group):
        outbox.publish(
            [Event("t", {"g": g, "i": i}, group=g, ordered=True, id=f"{g}-{i:02d}") for g in groups]
        )
    outbox.publish([Event("t", {"free": i}) for i in range(20)])
    order: dict[str, list[int]] = defaultdict(list)
    lock = threading.Lock()
    rng = random.Random(7)

    def handle(event: Event) -> None:
        with lock:
            fail = rng.random() < 0.15
        if fail:
            raise RuntimeError("flaky downstream")
        if "g" in event.payload:
            with lock:
                order[event.payload["g"]].append(event.payload["i"])

    errors: list[BaseException] = []

    def run() -> None:
        worker = outbox.worker(
            handle, batch_size=10, backoff=0.01, max_backoff=0.02, max_attempts=50
        )
        try:
            idle = 0
            while idle < 40:
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
    for g in groups:
        assert order[g] == list(range(per_group)), (g, order[g])
    stats = outbox.stats()
    assert stats.pending == 0 and stats.in_flight == 0 and stats.failed == 0


def test_an_ordered_event_cannot_join_a_caller_transaction(make_ddb):
    backend = make_ddb()  # caller transactions exist on the DynamoDB backend only
    with backend.transaction() as tx:
        with pytest.raises(NotSupportedError, match="ordered"):
            backend.outbox.publish(Event("t", 1, group="g", ordered=True), tx=tx)


def test_one_lease_keeper_holds_a_slow_batch_against_a_racing_worker(make_backend):
    needs_atomic_store(make_backend)
    outbox = make_backend().outbox
    outbox.publish([Event("t", i, id=f"slow{i}") for i in range(4)])
    delivered: Counter[str] = Counter()
    lock = threading.Lock()
    done = threading.Event()

    def race() -> None:
        thief = outbox.worker(lambda e: delivered.update([e.id]), lease=1.5, heartbeat=False)
        while not done.is_set():
            thief.run_once()
            threading.Event().wait(0.1)

    racer = threading.Thread(target=race)

    def slow(event: Event) -> None:
        if not racer.is_alive() and not done.is_set():
            racer.start()  # the batch is claimed: from now on someone races for it
        threading.Event().wait(0.7)  # four of these outlast the 1.5 s lease
        with lock:
            delivered[event.id] += 1

    holder = outbox.worker(slow, lease=1.5)
    try:
        assert holder.run_once() == 4
    finally:
        done.set()
        if racer.is_alive():
            racer.join()
    assert dict(delivered) == {f"slow{i}": 1 for i in range(4)}
    assert holder.lost == 0 and holder.delivered == 4
    threads = [t.name for t in threading.enumerate() if t.name.startswith("dynacoord-outbox-lease")]
    assert threads == []  # the keeper ended with the batch


def test_an_ordered_publish_with_a_lost_response_takes_its_places_once(lossy):
    clock = ManualClock()
    outbox = lossy.backend(clock=clock).outbox
    publish_op = {
        "dynamodb": "TransactWriteItems",
        "redis": "EVALSHA",
        "mongo": "find_one_and_update",
    }
    lossy.lose_next(operation=publish_op[lossy.kind])
    outbox.publish([Event("t", i, group="g", ordered=True, id=f"p{i}") for i in range(2)])
    assert lossy.lost == 1
    outbox.publish(Event("t", 2, group="g", ordered=True, id="p2"))
    seqs = [outbox.get(f"p{i}").seq for i in range(3)]
    if lossy.kind == "mongo":
        # No multi-document atomicity: the replayed place-taking leaves an empty place, which
        # the next claim skips once it is 60 s old.
        assert seqs[0] < seqs[1] < seqs[2]
    else:
        assert seqs == [1, 2, 3]
    got: list[str] = []
    worker = outbox.worker(lambda e: got.append(e.id), heartbeat=False)
    for _ in range(10):
        worker.run_once()
        clock.advance(31)
    assert got == ["p0", "p1", "p2"]


def test_workers_of_one_process_never_claim_over_each_other(make_backend):
    needs_atomic_store(make_backend)
    backend = make_backend()
    outbox = backend.outbox
    outbox.publish([Event("t", i) for i in range(100)])
    store = outbox._store
    refused = Counter()
    original = store.claim_many
    guard = threading.Lock()

    def counting(seen, tokens, until, now):
        got = original(seen, tokens, until, now)
        with guard:
            refused["seen"] += len(seen)
            refused["refused"] += len(seen) - len(got)
        return got

    store.claim_many = counting  # type: ignore[method-assign]
    delivered: list[int] = []

    def run() -> None:
        worker = outbox.worker(lambda e: delivered.append(e.payload), batch_size=10)
        drain(worker)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(delivered) == list(range(100))
    # They take turns to poll and claim their queue: no claim is refused to a sibling.
    assert refused["refused"] == 0, refused


def test_every_outbox_item_is_inside_the_namespace_scoped_policy(make_ddb):
    import fnmatch

    from dynacoord.provision import iam_policy

    backend = make_ddb(shards=8)  # dynamodb:LeadingKeys scopes DynamoDB tables only
    ns = backend.namespace
    backend.outbox.publish([Event("t", i, group="g-1", ordered=True) for i in range(3)])
    backend.outbox.publish(Event("t", "free"))
    backend.outbox.worker(lambda e: None, heartbeat=False).run_once()
    policy = iam_policy("arn:aws:dynamodb:eu-west-1:123456789012:table/t", [ns])
    [items] = [s for s in policy["Statement"] if s.get("Sid") == "DynacoordItems"]
    patterns = items["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]
    pages = backend.client.get_paginator("scan").paginate(
        TableName=backend.table_name,
        ConsistentRead=True,
        FilterExpression="contains(pk, :ns)",
        ExpressionAttributeValues={":ns": {"S": f"#{ns}"}},
    )
    found = [item for page in pages for item in page["Items"]]
    mine = [i["pk"]["S"] for i in found]
    assert {i["sk"]["S"] for i in found} >= {
        "EVENT",
        "GROUP",
        "SHARDS",
    }
    outside = [pk for pk in mine if not any(fnmatch.fnmatchcase(pk, p) for p in patterns)]
    assert outside == []


def test_the_per_event_design_keeps_ordered_groups_in_order(make_backend):
    clock = ManualClock()
    outbox = make_backend(clock=clock).outbox
    outbox.publish([Event("t", i, group="g", ordered=True, id=f"q{i}") for i in range(3)])
    delivered: list[str] = []
    fail_once = {"q0"}

    def handle(event: Event) -> None:
        if event.id in fail_once:
            fail_once.discard(event.id)
            raise RuntimeError("downstream down")
        delivered.append(event.id)

    worker = outbox.worker(handle, backoff=10, max_backoff=10, heartbeat=False, batch_claim=False)
    worker.run_once()
    assert delivered == []  # the head failed: its followers wait
    clock.advance(11)
    for _ in range(5):
        worker.run_once()
        clock.advance(2)
    assert delivered == ["q0", "q1", "q2"]


def test_one_event_outcomes_keep_an_ordered_group_going(make_backend):
    """Outcomes of events claimed one at a time (``claim``, the ``batch_claim=False`` design),
    each written alone with ``finish_many``, move an ordered group's gate as a batch's outcomes
    do: completing or failing the head lets its follower be claimed; each recognises its own
    write when the answer to it was lost."""
    import dataclasses
    import uuid

    from dynacoord.outbox import ORDERED_RECHECK_MS, Outcome

    clock = ManualClock()
    outbox = make_backend(clock=clock).outbox
    store = outbox._store
    outbox.publish([Event("t", i, group="g", ordered=True, id=f"o{i}") for i in range(3)])

    def now() -> int:
        return int(clock.time() * 1000)

    def claim(event_id: str) -> Any:
        seen = store.get(event_id, now())
        return store.claim(seen, uuid.uuid4().hex, now() + 30_000, now())

    def finish(outcome: Outcome, retention_ms: int | None = 60_000) -> bool:
        [written] = store.finish_many([outcome], now(), retention_ms)
        return written

    head = claim("o0")
    assert head is not None
    assert claim("o1") is None, "behind its head"
    clock.advance(ORDERED_RECHECK_MS / 1000 + 1)
    retry = Outcome(head, "pending", due_ms=now() + 5_000, error="downstream down")
    assert finish(retry, None) is True
    assert outbox.get("o0").status is EventStatus.PENDING
    clock.advance(6)
    head = claim("o0")
    assert head is not None
    assert finish(Outcome(head, "completed")) is True
    assert finish(Outcome(head, "completed")) is True, "its own write, seen again"
    clock.advance(ORDERED_RECHECK_MS / 1000 + 1)
    follower = claim("o1")
    assert follower is not None, "the gate moved past the completed head"
    assert finish(Outcome(follower, "failed", error="poison"), None) is True
    assert finish(Outcome(follower, "failed", error="poison"), None) is True, (
        "its own write, seen again"
    )
    assert outbox.get("o1").status is EventStatus.FAILED
    clock.advance(ORDERED_RECHECK_MS / 1000 + 1)
    last = claim("o2")
    assert last is not None, "a failed event lets its group go on"
    assert finish(Outcome(last, "completed"), None) is True
    assert outbox.get("o2") is None
    not_its_claim = dataclasses.replace(last, lease_token=uuid.uuid4().hex)
    assert finish(Outcome(not_its_claim, "completed")) is False, "gone, and not its claim"
