"""Delivery under histories found outside the fault model (issue 36), each on DynamoDB Local:
an event at the size limit, a sweeper under a backlog, a relay at its lease's end, a replayed
stream image, conflict storms on a group's gate, a PartiQL permission taken away.

Each test states the promise it holds (docs/guarantees.md) and fails on the code before its fix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any
from zlib import crc32

import pytest
from botocore.awsrequest import AWSResponse

from dynacoord import DynamoDBBackend, Event, ManualClock, codec
from dynacoord.backends.dynamodb import _batch, _partiql
from dynacoord.backends.dynamodb._marshal import unmarshal
from dynacoord.backends.dynamodb._table import DynamoTable
from dynacoord.errors import BackendError, ValueTooLargeError
from dynacoord.outbox import DELIVERY_ROOM, EventStatus
from dynacoord.testing import DynamoDBLocal, unique_name
from tests.stream_records import insert_record

LEASE = 30.0
#: an ordered group's outcome-and-gate transaction cancelled by another transaction
_CONFLICT = {
    "Error": {"Code": "TransactionCanceledException", "Message": "conflict"},
    "CancellationReasons": [{"Code": "TransactionConflict"}, {"Code": "None"}],
}


class OffsetClock:
    """A clock ``offset`` seconds away from ``base`` (another host's)."""

    def __init__(self, base: ManualClock, offset: float) -> None:
        self._base = base
        self._offset = offset

    def time(self) -> float:
        return self._base.time() + self._offset

    def monotonic(self) -> float:
        return self._base.monotonic()

    def sleep(self, seconds: float) -> None:
        self._base.sleep(seconds)


@pytest.fixture()
def own_client(dynamodb_local: DynamoDBLocal, ddb_table: tuple[Any, str]) -> Iterator[Any]:
    """A client of the test's own on the session table (its event hooks touch no other test)."""
    yield dynamodb_local.client()


@pytest.fixture()
def make(own_client: Any, ddb_table: tuple[Any, str]) -> Callable[..., DynamoDBBackend]:
    _, table = ddb_table

    def backend(**kwargs: Any) -> DynamoDBBackend:
        return DynamoDBBackend(own_client, table_name=table, **kwargs)

    return backend


def _answer(status: int, parsed: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
    return AWSResponse("https://injected", status, {}, None), parsed


def _inject(client: Any, operation: str, answers: list[dict[str, Any]]) -> Callable[[], None]:
    """Answer the next ``len(answers)`` calls of ``operation`` with these error bodies (the
    request is not sent: nothing is written); returns the unregister function."""

    def hook(**_: Any) -> Any:
        if not answers:
            return None
        return _answer(400, answers.pop(0))

    client.meta.events.register(f"before-call.dynamodb.{operation}", hook)
    return lambda: client.meta.events.unregister(f"before-call.dynamodb.{operation}", hook)


def _count(client: Any, operation: str) -> list[int]:
    calls = [0]

    def hook(**_: Any) -> None:
        calls[0] += 1

    client.meta.events.register(f"before-call.dynamodb.{operation}", hook)
    return calls


# -- 1. an event at the size limit ------------------------------------------------------------------


def test_publish_refuses_an_event_that_leaves_no_room_for_delivery(make: Any) -> None:
    """An event whose item would leave less than DELIVERY_ROOM bytes for delivery's own
    attributes is refused before anything is written, with the margin named; one just under it
    is published and delivered, its outcome stored with a long error first."""
    outbox = make(namespace=unique_name("h1"), clock=ManualClock()).outbox
    limit = codec.DYNAMODB_ITEM_LIMIT - DELIVERY_ROOM
    with pytest.raises(ValueTooLargeError, match=f"{DELIVERY_ROOM} bytes for what delivery"):
        outbox.publish(Event("big", {"x": "y" * (limit - 200)}, id="too-big"))
    assert outbox.get("too-big") is None
    outbox.publish(Event("big", {"x": "y" * (limit - 600)}, id="fits"))
    attempts: list[int] = []

    def handler(event: Event) -> None:
        attempts.append(event.attempt)
        if len(attempts) == 1:
            raise RuntimeError("\u00e9" * 5000)  # a 2,000-byte last_error

    worker = outbox.worker(handler, backoff=0)
    assert worker.run_once() == 1
    record = outbox.get("fits")
    assert record is not None and record.status is EventStatus.PENDING, record
    assert record.last_error is not None and len(record.last_error.encode()) <= 2000
    assert worker.run_once() == 1
    assert outbox.get("fits").status is EventStatus.COMPLETED  # type: ignore[union-attr]


def test_an_event_filling_its_item_fails_alone_and_the_batch_goes_on(
    make: Any, ddb_table: tuple[Any, str]
) -> None:
    """An event already stored at the item limit (written by hand or by a version that left no
    room) cannot be claimed: that event is marked failed with a clear last_error, and the small
    events of the same batch are delivered, their handlers run once each."""
    client, table = ddb_table
    ns = unique_name("h1b")
    outbox = make(namespace=ns, clock=ManualClock()).outbox
    outbox.publish([Event("t", {"n": n}, id=f"small-{n}") for n in range(5)])
    outbox.publish(Event("t", {"n": "big"}, id="big"))
    key = outbox._store._key("big")
    item = unmarshal(client.get_item(TableName=table, Key=key, ConsistentRead=True)["Item"])
    room = codec.DYNAMODB_ITEM_LIMIT - codec.estimate_item_size(item) - 45
    client.update_item(
        TableName=table,
        Key=key,
        UpdateExpression="SET payload = :p",
        ExpressionAttributeValues={":p": {"S": codec.encode("x" * room)}},
    )
    handled: list[str] = []
    worker = outbox.worker(lambda e: handled.append(e.id), lease=LEASE)
    for _ in range(3):
        worker.run_once()
    assert sorted(handled) == [f"small-{n}" for n in range(5)]
    big = outbox.get("big")
    assert big is not None and big.status is EventStatus.FAILED, big
    assert big.last_error == "too large to claim"  # what fits in the item
    assert all(outbox.get(f"small-{n}").status is EventStatus.COMPLETED for n in range(5))  # type: ignore[union-attr]


# -- 2. a sweeper under the relay's backlog ------------------------------------------------------


def test_a_sweeper_reads_past_young_events_to_the_old_ones_of_every_shard(make: Any) -> None:
    """While new events (the relay's for a lease) fill the head of every shard's queue, events
    old enough for the sweeper (the relay missed them) are still found and delivered: the
    sweeper reads past the young ones, and turns to the next shard."""
    clock = ManualClock()
    backend = make(namespace=unique_name("h2"), shards=4, clock=clock)
    outbox = backend.outbox
    old = [f"old-{n}" for n in range(3)]
    outbox.publish([Event("t", {}, id=i, occurred_at=clock.time() - 120) for i in old])
    young: list[str] = []
    n = 0
    while min(sum(1 for y in young if crc32(y.encode()) % 4 == s) for s in range(4)) < 3:
        young.append(f"young-{n}")
        n += 1
    outbox.publish([Event("t", {}, id=i, occurred_at=clock.time()) for i in young])
    handled: list[str] = []
    sweeper = outbox.worker(lambda e: handled.append(e.id), batch_size=2, leave_new_for=LEASE)
    for _ in range(4):
        sweeper.run_once()
    assert sorted(handled) == old  # and no young one: those are the relay's


# -- 3. the relay at its lease's end ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("late", "handler_s", "skew"),
    [
        (28.5, 2.0, 0.0),  # a stream record 28.5 s late and a 2 s handler
        (28.0, 0.5, 2.0),  # the sweeper's clock 2 s ahead and a 0.5 s handler
    ],
)
def test_the_relay_and_the_sweeper_never_both_run_a_handler(
    make: Any, ddb_table: tuple[Any, str], late: float, handler_s: float, skew: float
) -> None:
    """A relay without a claim starts a handler only while its implicit lease (due + lease)
    holds the documented skew, the outcome's write and a heartbeat; otherwise it claims first.
    A sweeper that polls while the relay's handler runs never runs it too."""
    client, table = ddb_table
    ns = unique_name("h3")
    clock = ManualClock()
    relay_side = make(namespace=ns, clock=clock).outbox
    sweeper_side = make(namespace=ns, clock=OffsetClock(clock, skew)).outbox
    relay_side.publish(Event("t", {}, id="e1", occurred_at=clock.time()))
    record = insert_record(client, table, relay_side._store._key("e1"), 1)
    runs: list[str] = []
    sweeper = sweeper_side.worker(
        lambda e: runs.append("sweeper"), lease=LEASE, leave_new_for=LEASE, heartbeat=False
    )

    def relay_handler(event: Event) -> None:
        runs.append("relay")
        clock.advance(handler_s)
        sweeper.run_once()  # the schedule fires while the handler runs

    relay = relay_side.stream_handler(relay_handler, lease=LEASE)
    clock.advance(late)
    assert relay({"Records": [record]}) == {"batchItemFailures": []}
    assert runs == ["relay"]
    assert relay_side.get("e1").status is EventStatus.COMPLETED  # type: ignore[union-attr]


def test_a_long_stream_batch_claims_what_its_lease_cannot_cover(
    make: Any, ddb_table: tuple[Any, str]
) -> None:
    """14 events of one stream batch at 2.5 s each (35 s, longer than the 30 s lease): the
    sweeper polling after every handler runs none of them, and each runs once."""
    client, table = ddb_table
    ns = unique_name("h3b")
    clock = ManualClock()
    outbox = make(namespace=ns, clock=clock).outbox
    ids = [f"e{n:02d}" for n in range(14)]
    outbox.publish([Event("t", {}, id=i, occurred_at=clock.time()) for i in ids])
    records = [insert_record(client, table, outbox._store._key(i), n) for n, i in enumerate(ids)]
    runs: list[tuple[str, str]] = []
    sweeper = make(namespace=ns, clock=clock).outbox.worker(
        lambda e: runs.append(("sweeper", e.id)), lease=LEASE, leave_new_for=LEASE
    )

    def relay_handler(event: Event) -> None:
        runs.append(("relay", event.id))
        clock.advance(2.5)
        sweeper.run_once()

    relay = outbox.stream_handler(relay_handler, lease=LEASE)
    assert relay({"Records": records}) == {"batchItemFailures": []}
    # Each ran once: the relay's, or (not started before the relay's lease ended) the sweeper's.
    assert sorted(i for _, i in runs) == ids, runs
    assert [i for who, i in runs if who == "relay"][:7] == ids[:7]  # while its lease was young
    assert {outbox.get(i).status for i in ids} == {EventStatus.COMPLETED}  # type: ignore[union-attr]


# -- 4. a replayed stream image ------------------------------------------------------------------


def test_a_replayed_image_does_not_deliver_a_redriven_event_ahead_of_its_group(
    make: Any, ddb_table: tuple[Any, str]
) -> None:
    """e1 failed and ``retry(group=...)`` put it behind e2 and e3; the stream hands e1's
    original INSERT image again (a TRIM_HORIZON start, a Lambda retry): the relay must not claim
    e1 at its old place. The group is delivered e2, e3, e1."""
    client, table = ddb_table
    clock = ManualClock()
    outbox = make(namespace=unique_name("h4"), clock=clock).outbox
    events = [Event("t", {}, id=f"e{n}", group="G", ordered=True) for n in (1, 2, 3)]
    outbox.publish(events)
    old_image = insert_record(client, table, outbox._store._key("e1"), 1)
    order: list[str] = []

    def refuse_e1(event: Event) -> None:
        raise RuntimeError("down")

    failing = outbox.worker(refuse_e1, batch_size=1, max_attempts=1)
    assert failing.run_once() == 1
    assert outbox.get("e1").status is EventStatus.FAILED  # type: ignore[union-attr]
    assert outbox.retry(group="G") == 1
    relay = outbox.stream_handler(lambda e: order.append(e.id), lease=LEASE)
    relay({"Records": [old_image]})
    worker = outbox.worker(lambda e: order.append(e.id))
    for _ in range(6):
        worker.run_once()
        clock.advance(1)
    assert order == ["e2", "e3", "e1"]


# -- 5. conflicts on a group's gate ------------------------------------------------------------


def test_outcomes_in_a_conflict_storm_are_stored_not_reported_lost(
    make: Any, own_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ordered event's outcome travels with its group's gate in one transaction. Eight
    TransactionConflicts in a row (a hot gate) make the store pause and try again; the lease
    is never reported lost and the event is never delivered twice."""
    monkeypatch.setattr(_batch, "_sleep", lambda _: None)
    clock = ManualClock()
    outbox = make(namespace=unique_name("h5"), clock=clock).outbox
    outbox.publish(Event("t", {}, id="e1", group="G", ordered=True))
    runs: list[str] = []
    stop: list[Callable[[], None]] = []

    def handler(event: Event) -> None:
        runs.append(event.id)
        stop.append(_inject(own_client, "TransactWriteItems", [dict(_CONFLICT)] * 8))

    worker = outbox.worker(handler, lease=LEASE)
    try:
        worker.run_once()
    finally:
        for unregister in stop:
            unregister()
    assert worker.lost == 0
    assert outbox.get("e1").status is EventStatus.COMPLETED  # type: ignore[union-attr]
    clock.advance(2 * LEASE)
    worker.run_once()
    assert runs == ["e1"]


def test_outcomes_that_cannot_be_stored_raise_and_are_not_reported_lost(
    make: Any, own_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the rounds run out (conflicts without end), the outcome is not written: the worker
    raises (a store failure, as botocore's own retries running out) instead of taking the
    event for a lease taken over; the event stays held until its lease ends."""
    monkeypatch.setattr(_batch, "_sleep", lambda _: None)
    clock = ManualClock()
    outbox = make(namespace=unique_name("h5b"), clock=clock).outbox
    outbox.publish(Event("t", {}, id="e1", group="G", ordered=True))
    stop: list[Callable[[], None]] = []

    def handler(event: Event) -> None:
        stop.append(_inject(own_client, "TransactWriteItems", [dict(_CONFLICT)] * 100))

    worker = outbox.worker(handler, lease=LEASE)
    try:
        with pytest.raises(BackendError, match="kept meeting throttling or other transactions"):
            worker.run_once()
    finally:
        for unregister in stop:
            unregister()
    assert worker.lost == 0
    record = outbox.get("e1")
    assert record is not None and record.status is EventStatus.IN_FLIGHT


# -- 6. PartiQL: a probe's answer and a permission taken away ------------------------------------


class _ProbeClient:
    def __init__(self, code: str) -> None:
        self.code = code
        self.calls = 0

    def batch_execute_statement(self, **_: Any) -> Any:
        self.calls += 1
        return {"Responses": [{"Error": {"Code": self.code}}]}


@pytest.mark.parametrize(
    "code",
    [
        "ThrottlingError",
        "ProvisionedThroughputExceeded",
        "RequestLimitExceeded",
        "InternalServerError",
    ],
)
def test_a_probe_throttled_per_statement_is_asked_again(code: str) -> None:
    client = _ProbeClient(code)
    key = {"pk": {"S": "OUTBOX#x#~"}, "sk": {"S": "PARTIQL-PROBE"}}
    assert DynamoTable(client, "t").statements_supported(key) is False  # transactions this time
    client.code = "ConditionalCheckFailed"
    assert DynamoTable(client, "t").statements_supported(key) is True
    assert client.calls == 2


def test_a_no_is_asked_again_after_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(_partiql, "_monotonic", lambda: now[0])
    client = _ProbeClient("AccessDeniedException-like")  # anything but a refusal: no
    key = {"pk": {"S": "OUTBOX#x#~"}, "sk": {"S": "PARTIQL-PROBE"}}
    assert DynamoTable(client, "t").statements_supported(key) is False
    assert DynamoTable(client, "t").statements_supported(key) is False
    assert client.calls == 1
    client.code = "ConditionalCheckFailed"
    now[0] += _partiql.ASK_AGAIN_AFTER
    assert DynamoTable(client, "t").statements_supported(key) is True
    assert client.calls == 2


def test_partiql_denied_after_the_probe_falls_back_to_transactions_at_once(
    make: Any, own_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PartiQL allowed at the probe, then denied (a policy rolled back): the next batch goes as
    transactions at once and delivers; once allowed again, batches go back to statements
    after ASK_AGAIN_AFTER."""
    now = [1000.0]
    monkeypatch.setattr(_partiql, "_monotonic", lambda: now[0])
    clock = ManualClock()
    outbox = make(namespace=unique_name("h6"), clock=clock).outbox
    handled: list[str] = []
    worker = outbox.worker(lambda e: handled.append(e.id))
    outbox.publish([Event("t", {}, id=f"a{n}") for n in range(4)])
    statements = _count(own_client, "BatchExecuteStatement")
    assert worker.run_once() == 4  # the probe and the batches: statements
    used = statements[0]
    assert used >= 2
    denied = {"Error": {"Code": "AccessDeniedException", "Message": "not authorized"}}
    stop = _inject(own_client, "BatchExecuteStatement", [dict(denied) for _ in range(100)])
    try:
        outbox.publish([Event("t", {}, id=f"b{n}") for n in range(4)])
        assert worker.run_once() == 4
        assert statements[0] == used + 1  # one denied batch, then transactions
        outbox.publish([Event("t", {}, id=f"c{n}") for n in range(4)])
        assert worker.run_once() == 4
        assert statements[0] == used + 1  # not asked again within ASK_AGAIN_AFTER
    finally:
        stop()
    now[0] += _partiql.ASK_AGAIN_AFTER
    outbox.publish([Event("t", {}, id=f"d{n}") for n in range(4)])
    assert worker.run_once() == 4
    assert statements[0] > used + 1  # granted again: statements
    assert len(handled) == 16 and len(set(handled)) == 16
