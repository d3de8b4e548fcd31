"""dynacoord.aws_lambda: SQS / Kinesis / DynamoDB Streams partial batch responses.

Redelivery runs on every contract backend (DynamoDB Local included); the rest on DynamoDB Local.
"""

from __future__ import annotations

import base64
import json
import logging

import pytest

from dynacoord import IdempotencyInProgressError, InvalidValueError, ManualClock
from dynacoord.aws_lambda import process_sqs_batch, process_stream_batch
from dynacoord.metrics import Metrics


class Context:
    """Lambda's context: the remaining time runs down with a ManualClock."""

    function_name = "fn"
    aws_request_id = "req"

    def __init__(self, clock: ManualClock, remaining_ms: int) -> None:
        self.clock = clock
        self.deadline = clock.monotonic() + remaining_ms / 1000

    def get_remaining_time_in_millis(self) -> int:
        return int((self.deadline - self.clock.monotonic()) * 1000)


def sqs_event(*bodies, fifo=False):
    arn = "arn:aws:sqs:eu-west-1:123456789012:orders" + (".fifo" if fifo else "")
    return {
        "Records": [
            {
                "messageId": f"m-{i}",
                "receiptHandle": f"rh-{i}",
                "body": json.dumps(body),
                "attributes": {"ApproximateReceiveCount": "1"},
                "eventSource": "aws:sqs",
                "eventSourceARN": arn,
            }
            for i, body in enumerate(bodies)
        ]
    }


def kinesis_event(*payloads):
    arn = "arn:aws:kinesis:eu-west-1:123456789012:stream/orders"
    return {
        "Records": [
            {
                "kinesis": {
                    "partitionKey": "p",
                    "sequenceNumber": f"4959{i:04d}",
                    "data": base64.b64encode(json.dumps(p).encode()).decode(),
                },
                "eventSource": "aws:kinesis",
                "eventID": f"shardId-000000000000:4959{i:04d}",
                "eventSourceARN": arn,
            }
            for i, p in enumerate(payloads)
        ]
    }


def ddb_stream_event(*ids):
    arn = "arn:aws:dynamodb:eu-west-1:123456789012:table/orders/stream/2026-01-01T00:00:00.000"
    return {
        "Records": [
            {
                "eventID": f"ev{i}",
                "eventName": "INSERT",
                "eventSource": "aws:dynamodb",
                "eventSourceARN": arn,
                "dynamodb": {
                    "Keys": {"id": {"S": ident}},
                    "NewImage": {"id": {"S": ident}},
                    "SequenceNumber": f"1000{i}",
                },
            }
            for i, ident in enumerate(ids)
        ]
    }


def failures(response):
    return [f["itemIdentifier"] for f in response["batchItemFailures"]]


def test_sqs_redelivered_batch_never_reruns_a_record_that_succeeded(make_backend):
    backend = make_backend()
    runs = []
    broken = {"m-1"}

    def record_handler(record):
        runs.append(record["messageId"])
        if record["messageId"] in broken:
            raise RuntimeError("downstream failed")

    event = sqs_event({"order": 1}, {"order": 2}, {"order": 3})
    assert process_sqs_batch(event, record_handler, backend=backend) == {
        "batchItemFailures": [{"itemIdentifier": "m-1"}]
    }
    assert runs == ["m-0", "m-1", "m-2"]
    # The whole batch comes back (a timeout, a crash): only the failed record runs again.
    broken.clear()
    assert process_sqs_batch(event, record_handler, backend=backend) == {"batchItemFailures": []}
    assert runs == ["m-0", "m-1", "m-2", "m-1"]
    assert process_sqs_batch(event, record_handler, backend=backend) == {"batchItemFailures": []}
    assert runs == ["m-0", "m-1", "m-2", "m-1"]


def test_sqs_without_backend_reports_failures_and_runs_everything(caplog):
    runs = []

    def record_handler(record):
        runs.append(record["messageId"])
        if record["messageId"] == "m-0":
            raise ValueError("bad body")

    event = sqs_event(1, 2)
    with caplog.at_level(logging.ERROR, logger="dynacoord.aws_lambda"):
        assert failures(process_sqs_batch(event, record_handler)) == ["m-0"]
    assert "record m-0 failed" in caplog.text
    assert runs == ["m-0", "m-1"]
    assert failures(process_sqs_batch(event, record_handler)) == ["m-0"]
    assert runs == ["m-0", "m-1", "m-0", "m-1"]  # no backend: no idempotency


def test_sqs_key_as_jmespath_over_the_body(ddb_backend):
    runs = []

    def record_handler(record):
        runs.append(json.loads(record["body"])["order_id"])

    # Two messages (two messageIds) carrying the same order: it runs once.
    event = sqs_event({"order_id": "A"}, {"order_id": "A"}, {"order_id": "B"})
    response = process_sqs_batch(
        event, record_handler, backend=ddb_backend, key="json(body).order_id"
    )
    assert failures(response) == []
    assert runs == ["A", "B"]
    assert ddb_backend.idempotency.get("A").completed
    # A callable key works the same way.
    response = process_sqs_batch(
        event,
        record_handler,
        backend=ddb_backend,
        key=lambda record: "cb:" + json.loads(record["body"])["order_id"],
    )
    assert runs == ["A", "B", "A", "B"]
    # A record whose key is missing is reported, the others run.
    event = sqs_event({"order_id": "C"}, {"other": 1})
    response = process_sqs_batch(
        event, record_handler, backend=ddb_backend, key="json(body).order_id"
    )
    assert failures(response) == ["m-1"]
    assert runs[-1] == "C"


def test_sqs_deadline_reports_records_not_started(ddb_backend):
    clock = ManualClock()
    context = Context(clock, remaining_ms=3_500)
    runs = []

    def record_handler(record):
        runs.append(record["messageId"])
        clock.advance(1.0)  # each record takes a second

    event = sqs_event(*range(5))
    response = process_sqs_batch(
        event, record_handler, backend=ddb_backend, context=context, margin_ms=1000
    )
    # starts with 3.5 s, 2.5 s, 1.5 s left; 0.5 s < margin: m-3 and m-4 are not started
    assert runs == ["m-0", "m-1", "m-2"]
    assert failures(response) == ["m-3", "m-4"]
    # The redelivery (a new invocation) runs only what was not done.
    response = process_sqs_batch(
        event, record_handler, backend=ddb_backend, context=Context(clock, 60_000)
    )
    assert failures(response) == []
    assert runs == ["m-0", "m-1", "m-2", "m-3", "m-4"]


def test_sqs_lease_is_bounded_by_the_invocation(make_backend):
    clock = ManualClock()
    backend = make_backend(clock=clock)
    leases = []

    def record_handler(record):
        leases.append(backend.idempotency.get(record["messageId"]).expires_at_ms)

    context = Context(clock, remaining_ms=9_000)
    process_sqs_batch(sqs_event(1), record_handler, backend=backend, context=context)
    assert leases == [int(clock.time() * 1000) + 9_000]


def test_sqs_record_in_progress_elsewhere_is_reported(ddb_backend):
    assert ddb_backend.idempotency.try_claim("m-0", lease=60).claimed  # another invocation
    runs = []
    response = process_sqs_batch(
        sqs_event(1, 2), lambda r: runs.append(r["messageId"]), backend=ddb_backend
    )
    assert failures(response) == ["m-0"]
    assert runs == ["m-1"]


def test_sqs_fifo_stops_at_the_first_failure():
    runs = []

    def record_handler(record):
        runs.append(record["messageId"])
        if record["messageId"] == "m-1":
            raise RuntimeError("x")

    response = process_sqs_batch(sqs_event(1, 2, 3, 4, fifo=True), record_handler)
    assert runs == ["m-0", "m-1"]
    assert failures(response) == ["m-1", "m-2", "m-3"]


def test_kinesis_stops_at_the_first_failure_and_replays_on_retry(ddb_backend):
    runs = []
    broken = {2}

    def record_handler(record):
        payload = json.loads(base64.b64decode(record["kinesis"]["data"]))
        runs.append(payload["n"])
        if payload["n"] in broken:
            raise RuntimeError("x")

    event = kinesis_event({"n": 0}, {"n": 1}, {"n": 2}, {"n": 3})
    response = process_stream_batch(event, record_handler, backend=ddb_backend)
    assert runs == [0, 1, 2]  # record 3 never runs before record 2 succeeded
    assert response == {"batchItemFailures": [{"itemIdentifier": "49590002"}]}
    broken.clear()
    # Lambda retries from the failed record; with the whole batch again, 0 and 1 are replays.
    assert failures(process_stream_batch(event, record_handler, backend=ddb_backend)) == []
    assert runs == [0, 1, 2, 2, 3]


def test_kinesis_key_with_base64_and_json(ddb_backend):
    runs = []
    event = kinesis_event({"id": "K-1"}, {"id": "K-1"})
    response = process_stream_batch(
        event,
        lambda r: runs.append(r["kinesis"]["sequenceNumber"]),
        backend=ddb_backend,
        key="json(base64(kinesis.data)).id",
    )
    assert failures(response) == [] and runs == ["49590000"]


def test_dynamodb_stream_records_and_deadline(ddb_backend):
    clock = ManualClock()
    runs = []

    def record_handler(record):
        runs.append(record["dynamodb"]["Keys"]["id"]["S"])
        clock.advance(2)

    event = ddb_stream_event("a", "b", "c")
    response = process_stream_batch(
        event, record_handler, backend=ddb_backend, context=Context(clock, 4_500)
    )
    assert runs == ["a", "b"]
    assert response == {"batchItemFailures": [{"itemIdentifier": "10002"}]}
    response = process_stream_batch(
        event, record_handler, backend=ddb_backend, context=Context(clock, 60_000)
    )
    assert failures(response) == [] and runs == ["a", "b", "c"]


def test_bad_events_are_refused_before_anything_runs():
    runs = []
    with pytest.raises(InvalidValueError, match="Records"):
        process_sqs_batch({"detail": {}}, runs.append)
    with pytest.raises(InvalidValueError, match="messageId"):
        process_sqs_batch({"Records": [{"messageId": "a"}, {"body": "x"}]}, runs.append)
    with pytest.raises(InvalidValueError, match="sequenceNumber|SequenceNumber"):
        process_stream_batch(sqs_event(1), runs.append)
    assert runs == []
    with pytest.raises(TypeError):
        process_sqs_batch(sqs_event(1), "not callable")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="backend"):
        process_sqs_batch(sqs_event(1), runs.append, key="body")


def test_batch_metrics_are_counted_and_flushed(ddb_table):
    from tests.conftest import _dynamodb_factory

    class Recorder(Metrics):
        def __init__(self):
            self.points = []
            self.flushes = 0

        def emit(self, name, value, unit, dimensions):
            if dimensions.get("Primitive") == "sqs":
                self.points.append((name, value))

        def flush(self):
            self.flushes += 1

    recorder = Recorder()
    backend = _dynamodb_factory(*ddb_table)(metrics=recorder)

    def record_handler(record):
        if record["messageId"] == "m-1":
            raise RuntimeError("x")

    process_sqs_batch(sqs_event(1, 2, 3), record_handler, backend=backend)
    assert sorted(recorder.points) == [
        ("BatchRecordFailed", 1),
        ("BatchRecordSucceeded", 1),
        ("BatchRecordSucceeded", 1),
    ]
    assert recorder.flushes == 1


def test_in_progress_error_is_a_failure_not_a_crash(ddb_backend):
    def record_handler(record):
        raise IdempotencyInProgressError("busy", key="k")

    assert failures(process_sqs_batch(sqs_event(1), record_handler)) == ["m-0"]


def test_sqs_partial_batch_response_with_real_redelivery(ddb_backend):
    """A real queue (moto's SQS) played as Lambda's event source mapping does: receive a batch,
    invoke, delete what succeeded; what was reported comes back after its visibility timeout,
    and a whole batch comes back when an invocation dies before answering. The idempotency
    records are on DynamoDB Local."""
    import boto3
    from moto import mock_aws

    from dynacoord.testing import DUMMY_CREDENTIALS

    config = {"core": {"mock_credentials": False, "passthrough": {"services": ["dynamodb"]}}}
    with mock_aws(config=config):  # type: ignore[arg-type]
        sqs = boto3.client("sqs", **DUMMY_CREDENTIALS)
        url = sqs.create_queue(QueueName="orders")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        for n in range(4):
            sqs.send_message(QueueUrl=url, MessageBody=json.dumps({"order": n}))

        def poll():
            """Lambda's poller: the visible messages as one event (seen again after 0 s)."""
            got = sqs.receive_message(
                QueueUrl=url,
                MaxNumberOfMessages=10,
                VisibilityTimeout=0,
                AttributeNames=["All"],
            ).get("Messages", [])
            return {
                "Records": [
                    {
                        "messageId": m["MessageId"],
                        "receiptHandle": m["ReceiptHandle"],
                        "body": m["Body"],
                        "attributes": m.get("Attributes", {}),
                        "messageAttributes": {},
                        "md5OfBody": m["MD5OfBody"],
                        "eventSource": "aws:sqs",
                        "eventSourceARN": arn,
                        "awsRegion": DUMMY_CREDENTIALS["region_name"],
                    }
                    for m in got
                ]
            }

        def settle(event, response):
            """Lambda deletes every message of the batch that was not reported."""
            failed = {f["itemIdentifier"] for f in response["batchItemFailures"]}
            for record in event["Records"]:
                if record["messageId"] not in failed:
                    sqs.delete_message(QueueUrl=url, ReceiptHandle=record["receiptHandle"])

        runs = []
        broken = {1}

        def record_handler(record):
            order = json.loads(record["body"])["order"]
            runs.append(order)
            if order in broken:
                raise RuntimeError("downstream failed")

        first = poll()
        assert len(first["Records"]) == 4
        by_order = {json.loads(r["body"])["order"]: r["messageId"] for r in first["Records"]}
        # The invocation runs every record but dies before Lambda reads its answer: nothing is
        # deleted and the whole batch is delivered again.
        died = process_sqs_batch(first, record_handler, backend=ddb_backend)
        assert failures(died) == [by_order[1]]
        assert sorted(runs) == [0, 1, 2, 3]
        again = poll()
        assert {r["messageId"] for r in again["Records"]} == set(by_order.values())
        response = process_sqs_batch(again, record_handler, backend=ddb_backend)
        assert failures(response) == [by_order[1]]
        assert sorted(runs) == [0, 1, 1, 2, 3]  # only the failed record ran again
        settle(again, response)

        # Only the reported message comes back; it succeeds now and the queue is empty.
        broken.clear()
        retry = poll()
        assert [r["messageId"] for r in retry["Records"]] == [by_order[1]]
        assert int(retry["Records"][0]["attributes"]["ApproximateReceiveCount"]) == 3
        response = process_sqs_batch(retry, record_handler, backend=ddb_backend)
        assert failures(response) == []
        settle(retry, response)
        assert sorted(runs) == [0, 1, 1, 1, 2, 3]
        assert poll()["Records"] == []


def test_dynamodb_stream_batch_from_real_stream_records(ddb_backend, dynamodb_local):
    """Records read from DynamoDB Local's stream with the dynamodbstreams client, shaped as
    Lambda hands them: a failure is reported by its real SequenceNumber, the records after it
    do not run, and Lambda's retry from there replays nothing that succeeded."""
    from dynacoord.testing import unique_name
    from tests.integration.test_outbox_stream import StreamReader

    client = dynamodb_local.client()
    table = unique_name("orders")
    client.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
        StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
    )
    try:
        arn = client.describe_table(TableName=table)["Table"]["LatestStreamArn"]
        for ident in ("a", "b", "c", "d"):
            client.put_item(TableName=table, Item={"id": {"S": ident}})
        event = StreamReader(dynamodb_local.endpoint_url, arn).next_batch()
        sequence = {r["dynamodb"]["Keys"]["id"]["S"]: r["dynamodb"]["SequenceNumber"]
                    for r in event["Records"]}  # fmt: skip
        assert list(sequence) == ["a", "b", "c", "d"]
        runs = []
        broken = {"c"}

        def record_handler(record):
            ident = record["dynamodb"]["NewImage"]["id"]["S"]
            runs.append(ident)
            if ident in broken:
                raise RuntimeError("downstream failed")

        response = process_stream_batch(event, record_handler, backend=ddb_backend)
        assert response == {"batchItemFailures": [{"itemIdentifier": sequence["c"]}]}
        assert runs == ["a", "b", "c"]
        broken.clear()
        # Lambda's retry of the whole batch (a bisect, or an invocation that timed out).
        assert failures(process_stream_batch(event, record_handler, backend=ddb_backend)) == []
        assert runs == ["a", "b", "c", "c", "d"]
    finally:
        client.delete_table(TableName=table)


def test_idempotency_options_come_as_an_object_and_keywords_override_them(ddb_backend):
    from dynacoord.idempotency import IdempotencyOptions

    replays = []

    def hook(result, record):
        replays.append(record.key)
        return result

    options = IdempotencyOptions(ttl=120, response_hook=hook)
    runs = []
    event = sqs_event({"order": 1}, {"order": 2})
    for _ in range(2):
        response = process_sqs_batch(
            event, lambda r: runs.append(r["messageId"]), backend=ddb_backend, options=options
        )
        assert failures(response) == []
    assert runs == ["m-0", "m-1"]
    assert replays == ["m-0", "m-1"]  # the options object's hook ran on each replay
    stored = ddb_backend.idempotency.get("m-0")
    assert stored is not None and stored.expires_at - ddb_backend.clock.time() <= 120
    # a keyword in place of the object's value, the rest of the object kept
    kinesis = kinesis_event({"order": 3})
    assert failures(
        process_stream_batch(kinesis, lambda r: None, backend=ddb_backend, options=options, ttl=5)
    ) == []
    [key] = [f"{r['eventSourceARN']}#{r['eventID']}" for r in kinesis["Records"]]
    stored = ddb_backend.idempotency.get(key)
    assert stored is not None and stored.expires_at - ddb_backend.clock.time() <= 5
    process_stream_batch(kinesis, lambda r: None, backend=ddb_backend, options=options, ttl=5)
    assert replays[-1] == key


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"ttl": 60}, TypeError, "need backend="),
        ({"options": "ttl=60"}, TypeError, "need backend="),
        ({"backend": "ddb", "options": {"ttl": 60}}, TypeError, "must be an IdempotencyOptions"),
        ({"backend": "ddb", "ttl": -1}, InvalidValueError, "ttl"),
    ],
    ids=["ttl without backend", "options without backend", "options not an object", "bad ttl"],
)
def test_idempotency_options_without_a_backend_or_wrong_are_refused_before_anything_runs(
    ddb_backend, arguments, error, message
):
    runs = []
    if arguments.get("backend") == "ddb":
        arguments = {**arguments, "backend": ddb_backend}
    with pytest.raises(error, match=message):
        process_sqs_batch(sqs_event(1), lambda r: runs.append(r), **arguments)
    assert runs == []
