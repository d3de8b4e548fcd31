"""The outbox stream relay against REAL stream records of Amazon DynamoDB Local.

Each test makes a table with a stream (NEW_IMAGE, as the bundled stack does), publishes and works
through dynacoord, reads what the stream recorded with the ``dynamodbstreams`` client and hands it
to the relay shaped as Lambda delivers it (``Records[]`` with ``eventSourceARN`` and the creation
time in epoch seconds). What Lambda itself adds (filter criteria, batching, retries of reported
records, bisecting) is played by the tests: a retry is the same batch (or its tail) handed again.
"""

from __future__ import annotations

import datetime
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dynacoord import DynamoDBBackend, Event, ManualClock
from dynacoord.errors import ConfigurationError, InvalidValueError, NotSupportedError
from dynacoord.outbox import EventStatus, Outbox
from dynacoord.provision import table_definition
from dynacoord.testing import DUMMY_CREDENTIALS, DynamoDBLocal, unique_name
from tests.outbox_helpers import drain

pytestmark = pytest.mark.integration


class FakeContext:
    """A Lambda context whose remaining time is given (and may shrink per call)."""

    aws_request_id = "req-1"

    def __init__(self, *remaining_ms: int) -> None:
        self._remaining = list(remaining_ms) or [900_000]

    def get_remaining_time_in_millis(self) -> int:
        return self._remaining.pop(0) if len(self._remaining) > 1 else self._remaining[0]


class StreamReader:
    """Reads the table's stream from its start, returning only records not read before."""

    def __init__(self, endpoint_url: str, stream_arn: str) -> None:
        import boto3

        self.arn = stream_arn
        self._client = boto3.client(
            "dynamodbstreams", endpoint_url=endpoint_url, **DUMMY_CREDENTIALS
        )
        self._last: dict[str, str] = {}

    def read(self) -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = []
        shards = self._client.describe_stream(StreamArn=self.arn)["StreamDescription"]["Shards"]
        for shard in shards:
            shard_id = shard["ShardId"]
            position: dict[str, str] = (
                {
                    "ShardIteratorType": "AFTER_SEQUENCE_NUMBER",
                    "SequenceNumber": self._last[shard_id],
                }
                if shard_id in self._last
                else {"ShardIteratorType": "TRIM_HORIZON"}
            )
            iterator = self._client.get_shard_iterator(
                StreamArn=self.arn, ShardId=shard_id, **position
            )["ShardIterator"]
            while iterator:
                page = self._client.get_records(ShardIterator=iterator, Limit=1000)
                if not page["Records"]:
                    break
                records.extend(page["Records"])
                self._last[shard_id] = page["Records"][-1]["dynamodb"]["SequenceNumber"]
                iterator = page.get("NextShardIterator")
        return records

    def lambda_event(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """The records as Lambda hands them to a function."""
        shaped = []
        for record in records:
            stream = dict(record["dynamodb"])
            created = stream.get("ApproximateCreationDateTime")
            if isinstance(created, datetime.datetime):
                stream["ApproximateCreationDateTime"] = created.timestamp()
            shaped.append({**record, "dynamodb": stream, "eventSourceARN": self.arn})
        return {"Records": shaped}

    def next_batch(self) -> dict[str, Any]:
        return self.lambda_event(self.read())


class Env:
    def __init__(self, client: Any, table: str, reader: StreamReader) -> None:
        self.client = client
        self.table = table
        self.reader = reader

    def backend(self, *, clock: Any = None, namespace: str | None = None, client: Any = None):
        return DynamoDBBackend(
            client or self.client,
            table_name=self.table,
            namespace=namespace or unique_name("ns"),
            clock=clock,
        )


@pytest.fixture()
def env(dynamodb_local: DynamoDBLocal) -> Iterator[Env]:
    client = dynamodb_local.client()
    table = unique_name("stream")
    definition = table_definition(table)
    definition["StreamSpecification"] = {"StreamEnabled": True, "StreamViewType": "NEW_IMAGE"}
    client.create_table(**definition)
    stream_arn = client.describe_table(TableName=table)["Table"]["LatestStreamArn"]
    try:
        yield Env(client, table, StreamReader(dynamodb_local.endpoint_url, stream_arn))
    finally:
        client.delete_table(TableName=table)


class Recorder:
    """A handler that records deliveries (thread-safe) and can fail chosen event types."""

    def __init__(self, fail_types: set[str] | None = None) -> None:
        self.calls: list[tuple[str, int]] = []
        self.fail_types = fail_types or set()
        self._guard = threading.Lock()

    def __call__(self, event: Event) -> None:
        with self._guard:
            self.calls.append((event.id, event.attempt))
        if event.type in self.fail_types:
            raise RuntimeError(f"cannot handle {event.type}")

    def count(self) -> Counter[str]:
        return Counter(event_id for event_id, _ in self.calls)


def _failures(response: dict[str, Any]) -> list[str]:
    assert set(response) == {"batchItemFailures"}
    return [f["itemIdentifier"] for f in response["batchItemFailures"]]


def _event_id_of(record: dict[str, Any]) -> str | None:
    image = record["dynamodb"].get("NewImage", {})
    return image["event_id"]["S"] if "event_id" in image else None


def _sequence_of(batch: dict[str, Any], event_id: str) -> str:
    for record in batch["Records"]:
        image = record["dynamodb"].get("NewImage", {})
        if image.get("event_id") == {"S": event_id} and record["eventName"] == "INSERT":
            return str(record["dynamodb"]["SequenceNumber"])
    raise AssertionError(f"no INSERT record of {event_id}")


# --- delivery from the stream --------------------------------------------------------------------


def test_new_events_of_its_namespace_are_delivered_once_everything_else_is_skipped(
    env: Env,
) -> None:
    backend = env.backend()
    other = env.backend()  # another namespace on the same table and stream
    handler = Recorder()
    relay = backend.outbox.stream_handler(handler)

    single = backend.outbox.publish(Event("order.placed", {"n": 1}))
    many = backend.outbox.publish([Event("order.paid", {"n": 2}), Event("order.sent", {"n": 3})])
    with backend.transaction() as tx:
        tx.publish(Event("order.closed", {"n": 4}))
    (closed,) = [e.id for e in backend.outbox.pending(limit=10) if e.type == "order.closed"]
    other.outbox.publish(Event("order.placed", {"n": 99}))
    backend.locks.acquire("a-lock", 30)
    backend.cache().set("a-key", "a-value", ttl=60)

    batch = env.reader.next_batch()
    assert {r["eventName"] for r in batch["Records"]} == {"INSERT"}
    assert _failures(relay(batch, FakeContext())) == []

    mine = [*single, *many, closed]
    assert sorted(handler.count().items()) == sorted((i, 1) for i in mine)
    assert all(attempt == 1 for _, attempt in handler.calls)
    for event_id in mine:
        record = backend.outbox.get(event_id)
        assert record is not None and record.status is EventStatus.COMPLETED
    assert relay.skipped == len(batch["Records"]) - 4  # the other namespace, the lock, the entry
    assert other.outbox.stats().pending == 1  # never touched by this namespace's relay

    # The relay's own state changes (claim, completion) come through the stream as MODIFY
    # records: they are not new events and deliver nothing.
    follow_up = env.reader.next_batch()
    assert follow_up["Records"] and {r["eventName"] for r in follow_up["Records"]} == {"MODIFY"}
    assert _failures(relay(follow_up, FakeContext())) == []
    assert len(handler.calls) == 4


def test_a_lambda_retry_of_the_same_batch_delivers_nothing_twice(env: Env) -> None:
    backend = env.backend()
    handler = Recorder()
    relay = backend.outbox.stream_handler(handler)
    ids = backend.outbox.publish([Event("t", {"n": n}) for n in range(5)])
    batch = env.reader.next_batch()

    assert _failures(relay(batch, FakeContext())) == []
    assert _failures(relay(batch, FakeContext())) == []  # the retry: every claim is refused
    # a retry in another container (a new handler, same records)
    assert _failures(backend.outbox.stream_handler(handler)(batch, FakeContext())) == []

    assert handler.count() == Counter({i: 1 for i in ids})
    assert relay.not_claimed == 5


def test_a_new_event_costs_the_relay_one_write_its_outcome(env: Env) -> None:
    backend = env.backend()
    handler = Recorder()
    ids = backend.outbox.publish([Event("t", {"n": n}) for n in range(3)])
    batch = env.reader.next_batch()
    counts: Counter[str] = Counter()

    def count(event_name: str, **_: Any) -> None:
        counts[event_name.rsplit(".", 1)[-1]] += 1

    env.client.meta.events.register("before-send.dynamodb.*", count)
    try:
        assert _failures(backend.outbox.stream_handler(handler)(batch, FakeContext())) == []
    finally:
        env.client.meta.events.unregister("before-send.dynamodb.*", count)
    assert handler.count() == Counter({i: 1 for i in ids})
    # one consistent read of the batch, then one conditional write per event
    assert counts == Counter({"BatchGetItem": 1, "UpdateItem": 3}), counts
    for event_id in ids:
        record = backend.outbox.get(event_id)
        assert record is not None and record.status is EventStatus.COMPLETED
        assert record.attempts == 1


@pytest.mark.parametrize("claim", [False, True])
def test_stream_relays_and_sweepers_never_both_deliver(env: Env, claim: bool) -> None:
    """Lambda's invocation and sweepers polling at the same time. Without a claim the relay
    owns a new event for one lease (the sweepers leave it alone); with ``claim=True`` a
    concurrent retry of the same records and plain polling workers race it too, and the
    claims decide."""
    backend = env.backend()
    handler = Recorder()
    ids = backend.outbox.publish([Event("t", {"n": n}) for n in range(60)])
    batch = env.reader.next_batch()
    # the 60 events (and, with several shards, the namespace's recorded shard count)
    assert sum(_event_id_of(r) is not None for r in batch["Records"]) == 60

    start = threading.Barrier(4)
    errors: list[BaseException] = []

    def relay_batch(records: list[dict[str, Any]]) -> None:
        try:
            relay = backend.outbox.stream_handler(handler, heartbeat=False, claim=claim)
            start.wait()
            assert _failures(relay({"Records": records}, FakeContext())) == []
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def poll(sweeper: bool) -> None:
        try:
            if sweeper:
                worker = backend.outbox.sweep_handler(handler, batch_size=10).worker
            else:
                worker = backend.outbox.worker(handler, batch_size=10, heartbeat=False)
            start.wait()
            drain(worker)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    records = batch["Records"]
    threads = [
        threading.Thread(target=relay_batch, args=(records,)),  # Lambda's invocation
        # with claims: a concurrent retry of the same records, and a plain polling worker
        threading.Thread(target=relay_batch, args=(records[::-1],))
        if claim
        else threading.Thread(target=poll, args=(True,)),
        threading.Thread(target=poll, args=(not claim,)),
        threading.Thread(target=poll, args=(True,)),  # the sweeper
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    assert handler.count() == Counter({i: 1 for i in ids})
    stats = backend.outbox.stats()
    assert (stats.pending, stats.in_flight, stats.failed) == (0, 0, 0)


def test_an_event_the_stream_brings_late_is_claimed_before_its_handler_runs(env: Env) -> None:
    """Too little of the relay's lease is left to run the handler without a claim (the clock
    skew, the outcome's write and a heartbeat): the relay claims it first, as claim=True, and
    the sweeper, whose turn it would be after the lease, finds it taken."""
    clock = ManualClock(time.time())  # an event is due when it occurred (system time)
    backend = env.backend(clock=clock)
    handler = Recorder()
    (event_id,) = backend.outbox.publish([Event("t", 1)])
    batch = env.reader.next_batch()
    sweeper = backend.outbox.sweep_handler(handler, lease=30)
    assert sweeper({}, FakeContext())["handled"] == 0  # the relay's for one lease
    clock.advance(29.5)  # less than the margin to store an outcome is left
    relay = backend.outbox.stream_handler(handler, lease=30)
    assert _failures(relay(batch, FakeContext())) == []
    assert handler.count() == Counter({event_id: 1})
    record = backend.outbox.get(event_id)
    assert record is not None and record.status is EventStatus.COMPLETED
    clock.advance(1)
    assert sweeper({}, FakeContext())["handled"] == 0
    assert handler.count() == Counter({event_id: 1})


def test_a_handler_failure_is_rescheduled_by_the_outbox_and_the_sweeper_delivers_it(
    env: Env,
) -> None:
    clock = ManualClock(time.time())  # events are due when they occur (system time)
    backend = env.backend(clock=clock)
    handler = Recorder(fail_types={"flaky"})
    relay = backend.outbox.stream_handler(handler, backoff=10, max_backoff=10)
    good, flaky = backend.outbox.publish([Event("fine", 1), Event("flaky", 2)])
    batch = env.reader.next_batch()

    # The failure is the outbox's business: the batch succeeds, nothing is reported.
    assert _failures(relay(batch, FakeContext())) == []
    record = backend.outbox.get(flaky)
    assert record is not None and record.status is EventStatus.PENDING
    assert record.attempts == 1
    assert record.last_error == "RuntimeError: cannot handle flaky"
    assert record.due_at_ms >= clock.time() * 1000 + 5000  # backoff 10 s, equal jitter
    assert backend.outbox.get(good).status is EventStatus.COMPLETED  # type: ignore[union-attr]

    # The reschedule reaches the stream as a MODIFY to pending: not a new event, skipped.
    assert _failures(relay(env.reader.next_batch(), FakeContext())) == []
    # A Lambda retry of the first batch: the event is not due, its claim is refused.
    assert _failures(relay(batch, FakeContext())) == []
    assert handler.count() == Counter({good: 1, flaky: 1})

    # The sweeper delivers it once its backoff is over.
    handler.fail_types.clear()
    sweeper = backend.outbox.sweep_handler(handler)
    assert sweeper({}, FakeContext())["handled"] == 0  # not due yet
    clock.advance(11)
    result = sweeper({}, FakeContext())
    assert result["delivered"] == 1 and result["handled"] == 1
    assert handler.calls[-1] == (flaky, 2)
    assert backend.outbox.get(flaky).status is EventStatus.COMPLETED  # type: ignore[union-attr]


def test_a_failed_event_put_back_by_retry_is_delivered_by_the_relay(env: Env) -> None:
    backend = env.backend()
    handler = Recorder(fail_types={"t"})
    relay = backend.outbox.stream_handler(handler, max_attempts=1)
    (event_id,) = backend.outbox.publish(Event("t", 1))
    relay(env.reader.next_batch(), FakeContext())
    assert backend.outbox.get(event_id).status is EventStatus.FAILED  # type: ignore[union-attr]

    handler.fail_types.clear()
    assert backend.outbox.retry(event_id) == 1  # a MODIFY to pending with no attempt counted
    assert _failures(relay(env.reader.next_batch(), FakeContext())) == []
    assert handler.count() == Counter({event_id: 2})
    assert backend.outbox.get(event_id).status is EventStatus.COMPLETED  # type: ignore[union-attr]


def test_ordered_events_keep_their_group_order_through_the_relay(env: Env) -> None:
    clock = ManualClock()
    backend = env.backend(clock=clock)
    handler = Recorder(fail_types={"first"})
    relay = backend.outbox.stream_handler(handler, backoff=10, max_backoff=10)
    first, second, third = backend.outbox.publish(
        [
            Event("first", 1, group="order-7", ordered=True),
            Event("second", 2, group="order-7", ordered=True),
            Event("third", 3, group="order-7", ordered=True),
        ]
    )
    (other,) = backend.outbox.publish(Event("second", 4, group="order-8", ordered=True))
    batch = env.reader.next_batch()

    # The group's head fails: the events behind it wait for it, whatever the stream holds.
    assert _failures(relay(batch, FakeContext())) == []
    assert handler.count() == Counter({first: 1, other: 1})
    for waiting in (second, third):
        record = backend.outbox.get(waiting)
        assert record is not None and record.status is EventStatus.PENDING
        assert record.attempts == 0
    # A Lambda retry of the batch does not let them jump the head either.
    assert _failures(relay(batch, FakeContext())) == []
    assert handler.count() == Counter({first: 1, other: 1})

    # Once the head is delivered (by the sweeper, after its backoff), the group follows in order.
    handler.fail_types.clear()
    clock.advance(11)
    sweeper = backend.outbox.sweep_handler(handler)
    for _ in range(5):
        sweeper({}, FakeContext())
        clock.advance(2)
    assert [i for i, _ in handler.calls if i in (first, second, third)] == [
        first,
        first,
        second,
        third,
    ]


def test_the_relay_reports_outbox_metrics(env: Env) -> None:
    from dynacoord.metrics import Metrics

    class MetricsRecorder(Metrics):
        def __init__(self) -> None:
            self.points: list[tuple[str, float, str]] = []

        def emit(self, name: str, value: float, unit: str, dimensions: Any) -> None:
            if dimensions.get("Primitive") == "outbox":
                self.points.append((name, value, unit))

    recorder = MetricsRecorder()
    backend = DynamoDBBackend(
        env.client, table_name=env.table, namespace=unique_name("ns"), metrics=recorder
    )
    relay = backend.outbox.stream_handler(Recorder(fail_types={"bad"}), max_attempts=1)
    backend.outbox.publish([Event("ok", 1), Event("bad", 2), Event("ok", 3)])
    assert _failures(relay(env.reader.next_batch(), FakeContext())) == []
    names = [name for name, _, _ in recorder.points]
    assert names.count("OutboxDelivered") == 2 and names.count("OutboxFailed") == 1
    latency = [(v, u) for n, v, u in recorder.points if n == "OutboxDeliveryLatency"]
    assert len(latency) == 2 and all(u == "Milliseconds" and v >= 0 for v, u in latency)


# --- store errors: the only records reported --------------------------------------------------


def _failing_client(
    dynamodb_local: DynamoDBLocal, event_id: str, *, claim: bool, times: int = 1
) -> Any:
    """A client whose UpdateItem on ``event_id`` fails (a claim, or an outcome) ``times``."""
    from botocore.exceptions import ClientError

    client = dynamodb_local.client(config=None)
    left = [times]

    def fail(params: dict[str, Any], **_: Any) -> None:
        is_claim = params.get("UpdateExpression", "").startswith("SET #status = :in_flight")
        if params["Key"]["pk"]["S"].endswith(f"#{event_id}") and is_claim == claim and left[0]:
            left[0] -= 1
            raise ClientError(
                {"Error": {"Code": "InternalServerError", "Message": "injected"}}, "UpdateItem"
            )

    client.meta.events.register("provide-client-params.dynamodb.UpdateItem", fail)
    return client


def test_a_claim_that_cannot_be_stored_is_reported_and_the_retry_delivers_it(
    env: Env, dynamodb_local: DynamoDBLocal
) -> None:
    namespace = unique_name("ns")
    publisher = env.backend(namespace=namespace)
    ids = publisher.outbox.publish([Event("t", {"n": n}) for n in range(4)])
    victim = ids[1]
    failing = env.backend(
        namespace=namespace, client=_failing_client(dynamodb_local, victim, claim=True)
    )
    handler = Recorder()
    relay = failing.outbox.stream_handler(handler, claim=True)
    batch = env.reader.next_batch()

    failures = _failures(relay(batch, FakeContext()))
    assert failures == [_sequence_of(batch, victim)]
    assert relay.store_errors == 1
    assert publisher.outbox.get(victim).status is EventStatus.PENDING  # type: ignore[union-attr]

    # Lambda retries from the reported record on (the rest of the shard's batch comes again).
    position = [r["dynamodb"]["SequenceNumber"] for r in batch["Records"]].index(failures[0])
    retry = {"Records": batch["Records"][position:]}
    assert _failures(relay(retry, FakeContext())) == []
    assert handler.count() == Counter({i: 1 for i in ids})


def test_an_outcome_that_cannot_be_stored_is_reported_with_a_claim_never_delivered_twice(
    env: Env, dynamodb_local: DynamoDBLocal
) -> None:
    namespace = unique_name("ns")
    clock = ManualClock()
    publisher = env.backend(namespace=namespace, clock=clock)
    ids = publisher.outbox.publish([Event("t", {"n": n}) for n in range(3)])
    victim = ids[2]
    failing = env.backend(
        namespace=namespace,
        clock=clock,
        client=_failing_client(dynamodb_local, victim, claim=False),
    )
    handler = Recorder()
    relay = failing.outbox.stream_handler(handler, lease=30, claim=True)
    batch = env.reader.next_batch()

    assert _failures(relay(batch, FakeContext())) == [_sequence_of(batch, victim)]
    record = publisher.outbox.get(victim)
    assert record is not None and record.status is EventStatus.IN_FLIGHT  # handled, not stored

    # Lambda's retry: the claim still holds its lease, so the stream delivers nothing again.
    assert _failures(relay(batch, FakeContext())) == []
    assert handler.count() == Counter({i: 1 for i in ids})
    # After the lease, the sweeper recovers it (at least once: the handler ran, its outcome
    # was lost, so it runs again; handlers are idempotent on event.id).
    clock.advance(31)
    assert publisher.outbox.sweep_handler(handler)({}, FakeContext())["delivered"] == 1
    assert handler.count()[victim] == 2
    assert publisher.outbox.get(victim).status is EventStatus.COMPLETED  # type: ignore[union-attr]


def test_an_outcome_that_cannot_be_stored_is_reported_and_the_retry_delivers_it_again(
    env: Env, dynamodb_local: DynamoDBLocal
) -> None:
    """Without a claim nothing marks the handled event: Lambda's retry delivers it again at
    once (at least once, as after a lost claim's lease; handlers are idempotent on event.id)."""
    namespace = unique_name("ns")
    publisher = env.backend(namespace=namespace)
    ids = publisher.outbox.publish([Event("t", {"n": n}) for n in range(3)])
    victim = ids[2]
    failing = env.backend(
        namespace=namespace, client=_failing_client(dynamodb_local, victim, claim=False)
    )
    handler = Recorder()
    relay = failing.outbox.stream_handler(handler, lease=30)
    batch = env.reader.next_batch()

    assert _failures(relay(batch, FakeContext())) == [_sequence_of(batch, victim)]
    record = publisher.outbox.get(victim)
    assert record is not None and record.status is EventStatus.PENDING and record.attempts == 0

    assert _failures(relay(batch, FakeContext())) == []
    assert handler.count() == Counter({ids[0]: 1, ids[1]: 1, victim: 2})
    assert publisher.outbox.get(victim).status is EventStatus.COMPLETED  # type: ignore[union-attr]


# --- remaining time --------------------------------------------------------------------------


def test_no_event_is_claimed_once_a_lease_no_longer_fits_the_sweeper_delivers_the_rest(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    backend = env.backend()
    handler = Recorder()
    relay = backend.outbox.stream_handler(handler, lease=30)
    ids = backend.outbox.publish([Event("t", {"n": n}) for n in range(5)])
    batch = env.reader.next_batch()

    # 2 claims fit (31 s + some left), then the invocation has 20 s: no more claims.
    context = FakeContext(60_000, 45_000, 20_000)
    assert _failures(relay(batch, context)) == []
    assert len(handler.calls) == 2
    assert relay.left == 3
    assert backend.outbox.stats().pending == 3

    assert "timeout shorter than the lease" not in caplog.text  # some fitted: not a warning
    assert _failures(relay(batch, FakeContext(30_500))) == []  # under lease + margin: nothing
    assert len(handler.calls) == 2
    assert "is the function's timeout shorter than the lease?" in caplog.text

    # the relay left them: they are the sweeper's now (not waiting for the relay's lease)
    swept = backend.outbox.sweep_handler(handler, lease=30, leave_new_for=0)({}, FakeContext())
    assert swept["delivered"] == 3
    assert handler.count() == Counter({i: 1 for i in ids})


def test_the_sweeper_drains_a_backlog_in_full_batches_while_time_remains(env: Env) -> None:
    backend = env.backend()
    handler = Recorder()
    ids = backend.outbox.publish([Event("t", {"n": n}) for n in range(23)])
    sweeper = backend.outbox.sweep_handler(handler, batch_size=5, heartbeat=False, leave_new_for=0)
    result = sweeper({}, FakeContext())
    assert result["handled"] == 23 and result["delivered"] == 23
    assert result["passes"] == 5  # 5 + 5 + 5 + 5 + 3
    assert handler.count() == Counter({i: 1 for i in ids})
    assert sweeper({}, FakeContext(10_000))["passes"] == 0  # no lease fits: no pass at all


def test_the_sweeper_reconciles_stalled_runs_when_configured(env: Env) -> None:
    clock = ManualClock()
    backend = env.backend(clock=clock)
    backend.runs.start("run-1", context={"step": 1})
    stalled: list[str] = []
    sweeper = backend.outbox.sweep_handler(
        Recorder(),
        runs=backend.runs,
        stalled_after=60,
        on_stalled=lambda r: stalled.append(r.run_id),
    )
    assert sweeper({}, FakeContext())["reconcile"]["stalled"] == 0
    clock.advance(61)
    result = sweeper({}, FakeContext())
    assert result["reconcile"]["reconciled"] == 1
    assert stalled == ["run-1"]
    with pytest.raises(TypeError, match="both runs="):
        backend.outbox.sweep_handler(Recorder(), runs=backend.runs)


# --- the bundled stack's entry points ------------------------------------------------------------


def test_the_stack_entry_points_deliver_with_the_configuration_of_the_environment(
    env: Env, dynamodb_local: DynamoDBLocal, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dynacoord import serverless

    namespace = unique_name("ns")
    module = unique_name("handlers_")
    (tmp_path / f"{module}.py").write_text(
        "SEEN = []\n"
        "def on_stalled(run):\n"
        "    SEEN.append(('stalled', run.run_id))\n"
        "HANDLERS = {'t': lambda event: SEEN.append((event.id, event.attempt))}\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("DYNACOORD_ENDPOINT_URL", dynamodb_local.endpoint_url)
    monkeypatch.setenv("DYNACOORD_TABLE", env.table)
    monkeypatch.setenv("DYNACOORD_NAMESPACE", namespace)
    monkeypatch.setenv("DYNACOORD_OUTBOX_HANDLERS", f"{module}:HANDLERS")
    monkeypatch.setenv("DYNACOORD_OUTBOX_OPTIONS", '{"max_attempts": 3, "lease": 20}')
    monkeypatch.setenv("DYNACOORD_RECONCILE_HANDLER", f"{module}:on_stalled")
    monkeypatch.setenv("DYNACOORD_RECONCILE_AFTER", "600")
    serverless._reset()
    try:
        backend = env.backend(namespace=namespace)
        (event_id,) = backend.outbox.publish(Event("t", {"n": 1}))
        assert serverless.relay(env.reader.next_batch(), FakeContext()) == {"batchItemFailures": []}
        seen = sys.modules[module].SEEN
        assert seen == [(event_id, 1)]
        assert serverless._relay is not None and serverless._relay.worker.options.max_attempts == 3

        result = serverless.sweep({}, FakeContext())
        assert result["handled"] == 0 and result["reconcile"]["scanned"] == 0
        assert serverless._sweep is not None and serverless._sweep.worker.lease_ms == 20_000
    finally:
        serverless._reset()
        sys.modules.pop(module, None)


def test_the_entry_points_refuse_a_bad_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    from dynacoord import serverless
    from dynacoord.errors import ConfigurationError

    monkeypatch.setenv("DYNACOORD_TABLE", "unused-table")
    monkeypatch.delenv("DYNACOORD_OUTBOX_HANDLERS", raising=False)
    serverless._reset()
    try:
        with pytest.raises(ConfigurationError, match="DYNACOORD_OUTBOX_HANDLERS is not set"):
            serverless.relay({"Records": []}, FakeContext())
        monkeypatch.setenv("DYNACOORD_OUTBOX_HANDLERS", "no_such_module_here:HANDLERS")
        with pytest.raises(ConfigurationError, match="cannot import handlers"):
            serverless.relay({"Records": []}, FakeContext())
        monkeypatch.setenv("DYNACOORD_OUTBOX_HANDLERS", "json:dumps")
        monkeypatch.setenv("DYNACOORD_OUTBOX_OPTIONS", '{"lease": 5, "lesae": 6}')
        with pytest.raises(ConfigurationError, match=r"unknown outbox option\(s\) \['lesae'\]"):
            serverless.relay({"Records": []}, FakeContext())
        monkeypatch.setenv("DYNACOORD_OUTBOX_OPTIONS", "[]")
        with pytest.raises(ConfigurationError, match="JSON object"):
            serverless.sweep({}, FakeContext())
        monkeypatch.setenv("DYNACOORD_OUTBOX_OPTIONS", "{}")
        monkeypatch.setenv("DYNACOORD_RECONCILE_AFTER", "-1")
        with pytest.raises(ConfigurationError, match="RECONCILE_AFTER"):
            serverless.sweep({}, FakeContext())
        with pytest.raises(ConfigurationError, match="MODULE:ATTRIBUTE"):
            serverless.load_object("not a spec")
    finally:
        serverless._reset()


# --- bad input ----------------------------------------------------------------------------------


def test_events_that_are_not_dynamodb_stream_events_are_refused(env: Env) -> None:
    relay = env.backend().outbox.stream_handler(Recorder())
    with pytest.raises(InvalidValueError, match="not a DynamoDB Streams event"):
        relay({"body": "{}"}, FakeContext())
    sqs = {"Records": [{"eventSource": "aws:sqs", "messageId": "m-1", "body": "{}"}]}
    with pytest.raises(InvalidValueError, match="eventSource 'aws:sqs'"):
        relay(sqs, FakeContext())
    assert relay({"Records": []}, FakeContext()) == {"batchItemFailures": []}


def test_a_stream_without_new_images_is_a_configuration_error(env: Env) -> None:
    relay = env.backend().outbox.stream_handler(Recorder())
    keys_only = {
        "eventName": "INSERT",
        "eventSource": "aws:dynamodb",
        "dynamodb": {
            "Keys": {"pk": {"S": "OUTBOX#ns#e"}, "sk": {"S": "EVENT"}},
            "SequenceNumber": "1",
            "StreamViewType": "KEYS_ONLY",
        },
    }
    with pytest.raises(ConfigurationError, match="StreamViewType 'KEYS_ONLY'"):
        relay({"Records": [keys_only]}, FakeContext())
    removal = {**keys_only, "eventName": "REMOVE"}
    assert relay({"Records": [removal]}, FakeContext()) == {"batchItemFailures": []}


def test_backends_without_a_stream_refuse_to_make_a_relay() -> None:
    class NoStreamStore:
        shards = 1

    with pytest.raises(NotSupportedError, match="stream_handler needs a store with a DynamoDB"):
        Outbox(NoStreamStore()).stream_handler(Recorder())  # type: ignore[arg-type]


@pytest.mark.parametrize("make_backend", ["moto", "redis", "mongo"], indirect=True)
def test_the_sweeper_works_on_every_backend(make_backend: Any) -> None:
    backend = make_backend()
    handler = Recorder()
    ids = backend.outbox.publish([Event("t", {"n": n}) for n in range(3)])
    # no stream relay here: the sweeper takes new events at once
    result = backend.outbox.sweep_handler(handler, heartbeat=False, leave_new_for=0)(
        {}, FakeContext()
    )
    assert result["delivered"] == 3
    assert handler.count() == Counter({i: 1 for i in ids})
