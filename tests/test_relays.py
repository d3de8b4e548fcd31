"""Relays to SQS, SNS and EventBridge (moto), and partial-batch retries (a scripted client)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from dynacoord import (
    ConfigurationError,
    Event,
    EventBridgeRelay,
    EventStatus,
    RelayError,
    SNSRelay,
    SQSRelay,
)
from dynacoord.codec import decode
from dynacoord.testing import DUMMY_CREDENTIALS


@pytest.fixture()
def aws() -> Iterator[None]:
    with mock_aws():
        yield


def _receive_all(sqs: Any, url: str, expected: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for _ in range(10):
        response = sqs.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            MessageAttributeNames=["All"],
            AttributeNames=["All"],
        )
        batch = response.get("Messages", [])
        messages.extend(batch)
        if batch:
            sqs.delete_message_batch(
                QueueUrl=url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(batch)
                ],
            )
        if len(messages) >= expected:
            break
    return messages


def test_sqs_relay_sends_body_and_attributes(aws):
    sqs = boto3.client("sqs", **DUMMY_CREDENTIALS)
    url = sqs.create_queue(QueueName="events")["QueueUrl"]
    relay = SQSRelay(sqs, url)
    assert relay.fifo is False
    event = Event(
        "order.created",
        {"order": "o-1", "blob": b"\x01"},
        id="evt-1",
        metadata={"trace": "t"},
        group="g",
    )
    relay(event)
    (message,) = _receive_all(sqs, url, 1)
    body = decode(message["Body"])
    assert body["id"] == "evt-1" and body["type"] == "order.created"
    assert body["payload"] == {"order": "o-1", "blob": b"\x01"}
    assert body["metadata"] == {"trace": "t"} and body["group"] == "g"
    assert body["occurred_at"] == event.occurred_at
    attrs = message["MessageAttributes"]
    assert attrs["event_type"] == {"DataType": "String", "StringValue": "order.created"}
    assert attrs["event_id"] == {"DataType": "String", "StringValue": "evt-1"}


def test_sqs_relay_batches_of_ten(aws):
    sqs = boto3.client("sqs", **DUMMY_CREDENTIALS)
    url = sqs.create_queue(QueueName="many")["QueueUrl"]
    calls = []
    original = sqs.send_message_batch

    def counting(**kwargs):
        calls.append(len(kwargs["Entries"]))
        return original(**kwargs)

    sqs.send_message_batch = counting
    SQSRelay(sqs, url).send_many([Event("t", i) for i in range(23)])
    assert calls == [10, 10, 3]
    bodies = [decode(m["Body"])["payload"] for m in _receive_all(sqs, url, 23)]
    assert sorted(bodies) == list(range(23))


def test_sqs_fifo_relay_sets_group_and_deduplication_id(aws):
    sqs = boto3.client("sqs", **DUMMY_CREDENTIALS)
    url = sqs.create_queue(QueueName="events.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    relay = SQSRelay(sqs, url)
    assert relay.fifo is True
    relay.send_many(
        [
            Event("t", 1, id="a-1", group="customer-1"),
            Event("t", 2, id="a-2"),
            Event("t", 1, id="a-1", group="customer-1"),  # redelivered: dropped by the queue
        ]
    )
    messages = _receive_all(sqs, url, 2)
    by_id = {m["Attributes"]["MessageDeduplicationId"]: m for m in messages}
    assert sorted(by_id) == ["a-1", "a-2"]
    assert by_id["a-1"]["Attributes"]["MessageGroupId"] == "customer-1"
    assert by_id["a-2"]["Attributes"]["MessageGroupId"] == "dynacoord"


def test_sqs_relay_as_an_outbox_handler(aws):
    from dynacoord import DynamoDBBackend
    from dynacoord.provision import create_table

    ddb = boto3.client("dynamodb", **DUMMY_CREDENTIALS)
    create_table(ddb, "relay-table")
    sqs = boto3.client("sqs", **DUMMY_CREDENTIALS)
    url = sqs.create_queue(QueueName="from-outbox")["QueueUrl"]
    outbox = DynamoDBBackend(ddb, table_name="relay-table").outbox
    outbox.publish([Event("a", 1, id="r1"), Event("b", 2, id="r2")])
    worker = outbox.worker(SQSRelay(sqs, url))
    assert worker.run_once() == 2
    messages = _receive_all(sqs, url, 2)
    assert sorted(m["MessageAttributes"]["event_id"]["StringValue"] for m in messages) == [
        "r1",
        "r2",
    ]
    assert outbox.get("r1").status is EventStatus.COMPLETED


def test_sns_relay_publishes_to_subscribers(aws):
    sns = boto3.client("sns", **DUMMY_CREDENTIALS)
    sqs = boto3.client("sqs", **DUMMY_CREDENTIALS)
    topic = sns.create_topic(Name="events")["TopicArn"]
    url = sqs.create_queue(QueueName="subscriber")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    sns.subscribe(
        TopicArn=topic, Protocol="sqs", Endpoint=arn, Attributes={"RawMessageDelivery": "true"}
    )
    relay = SNSRelay(sns, topic)
    relay.send_many([Event("user.signed_up", {"user": i}, id=f"u-{i}") for i in range(12)])
    messages = _receive_all(sqs, url, 12)
    assert sorted(decode(m["Body"])["payload"]["user"] for m in messages) == list(range(12))
    first = next(m for m in messages if decode(m["Body"])["id"] == "u-0")
    assert first["MessageAttributes"]["event_type"]["StringValue"] == "user.signed_up"


def test_eventbridge_relay_puts_events_on_the_bus(aws):
    events = boto3.client("events", **DUMMY_CREDENTIALS)
    sqs = boto3.client("sqs", **DUMMY_CREDENTIALS)
    events.create_event_bus(Name="orders-bus")
    url = sqs.create_queue(QueueName="bus-target")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    events.put_rule(
        Name="all-orders",
        EventBusName="orders-bus",
        EventPattern=json.dumps({"source": ["shop.orders"]}),
    )
    events.put_targets(
        Rule="all-orders", EventBusName="orders-bus", Targets=[{"Id": "q", "Arn": arn}]
    )
    relay = EventBridgeRelay(events, "orders-bus", source="shop.orders")
    relay(Event("order.paid", {"order": "o-9"}, id="p-9"))
    (message,) = _receive_all(sqs, url, 1)
    envelope = json.loads(message["Body"])
    assert envelope["source"] == "shop.orders"
    assert envelope["detail-type"] == "order.paid"
    assert envelope["detail"]["id"] == "p-9"
    assert envelope["detail"]["payload"] == {"order": "o-9"}


class ScriptedSQS:
    """Answers send_message_batch with scripted failures: ``script`` is one set of entry
    positions (in the request) to fail per call; SenderFault marks them permanent."""

    def __init__(self, script: list[set[int]], sender_fault: bool = False) -> None:
        self.script = list(script)
        self.sender_fault = sender_fault
        self.requests: list[list[str]] = []
        self.delivered: list[str] = []

    def send_message_batch(self, **kwargs: Any) -> dict[str, Any]:
        Entries = kwargs["Entries"]
        self.requests.append([decode(e["MessageBody"])["id"] for e in Entries])
        failing = self.script.pop(0) if self.script else set()
        failed = []
        for position, entry in enumerate(Entries):
            if position in failing:
                failed.append(
                    {
                        "Id": entry["Id"],
                        "Code": "InternalError",
                        "Message": "try again",
                        "SenderFault": self.sender_fault,
                    }
                )
            else:
                self.delivered.append(decode(entry["MessageBody"])["id"])
        return {"Successful": [], "Failed": failed}


def test_partial_failures_are_retried_for_the_failed_entries_only():
    client = ScriptedSQS([{1, 3}, {0}, set()])
    pauses: list[float] = []
    relay = SQSRelay(client, "https://sqs/q", sleep=pauses.append, retry_delay=0.5)
    relay.send_many([Event("t", i, id=f"e{i}") for i in range(5)])
    assert client.requests == [["e0", "e1", "e2", "e3", "e4"], ["e1", "e3"], ["e1"]]
    assert sorted(client.delivered) == ["e0", "e1", "e2", "e3", "e4"]
    assert pauses == [0.5, 1.0]


def test_entries_still_failing_after_max_attempts_raise():
    client = ScriptedSQS([{2}, {0}, {0}])
    relay = SQSRelay(client, "https://sqs/q", sleep=lambda s: None, max_attempts=3)
    with pytest.raises(RelayError) as info:
        relay.send_many([Event("t", i, id=f"e{i}") for i in range(4)])
    assert [f[0] for f in info.value.failed] == ["e2"]
    assert info.value.failed[0][1] == "InternalError"
    assert len(client.requests) == 3


def test_sender_fault_is_not_retried():
    client = ScriptedSQS([{0}], sender_fault=True)
    relay = SQSRelay(client, "https://sqs/q", sleep=lambda s: None)
    with pytest.raises(RelayError) as info:
        relay(Event("t", 1, id="bad"))
    assert info.value.failed[0][0] == "bad"
    assert len(client.requests) == 1


def test_a_relay_error_makes_the_outbox_retry_the_event(aws):
    from dynacoord import DynamoDBBackend, ManualClock
    from dynacoord.provision import create_table

    ddb = boto3.client("dynamodb", **DUMMY_CREDENTIALS)
    create_table(ddb, "relay-retry")
    clock = ManualClock()
    outbox = DynamoDBBackend(ddb, table_name="relay-retry", clock=clock).outbox
    outbox.publish(Event("t", 1, id="x"))
    client = ScriptedSQS([{0}, {0}, {0}])  # the first call's three attempts all fail
    worker = outbox.worker(SQSRelay(client, "https://sqs/q", sleep=lambda s: None))
    assert worker.run_once() == 1
    record = outbox.get("x")
    assert record.status is EventStatus.PENDING and "RelayError" in record.last_error
    clock.advance(2)
    assert worker.run_once() == 1
    assert outbox.get("x").status is EventStatus.COMPLETED
    assert client.delivered == ["x"]


def test_eventbridge_failed_entries_are_retried():
    class ScriptedEvents:
        def __init__(self) -> None:
            self.calls: list[list[str]] = []

        def put_events(self, **kwargs: Any) -> dict[str, Any]:
            ids = [json.loads(e["Detail"])["id"] for e in kwargs["Entries"]]
            self.calls.append(ids)
            if len(self.calls) == 1:
                results = [
                    {"ErrorCode": "InternalFailure", "ErrorMessage": "x"}
                    if i == "b"
                    else {"EventId": "ok"}
                    for i in ids
                ]
                return {"FailedEntryCount": 1, "Entries": results}
            return {"FailedEntryCount": 0, "Entries": [{"EventId": "ok"} for _ in ids]}

    client = ScriptedEvents()
    EventBridgeRelay(client, "bus", sleep=lambda s: None).send_many(
        [Event("t", 1, id="a"), Event("t", 2, id="b"), Event("t", 3, id="c")]
    )
    assert client.calls == [["a", "b", "c"], ["b"]]


def test_relay_configuration_is_checked():
    with pytest.raises(ConfigurationError):
        SQSRelay(None, "url")
    with pytest.raises(ConfigurationError):
        SQSRelay(object(), "")
    with pytest.raises(ConfigurationError):
        SNSRelay(object(), "")
    with pytest.raises(ConfigurationError):
        EventBridgeRelay(object(), "bus", source="")
    with pytest.raises(TypeError):
        SQSRelay(object(), "url").send_many(["not an event"])
    with pytest.raises(TypeError, match="events must be an iterable of Event objects, got int"):
        SQSRelay(object(), "url").send_many(5)
    with pytest.raises(TypeError, match="fifo must be True or False"):
        SQSRelay(object(), "url", fifo="yes")


def test_long_or_unusual_event_ids_are_hashed_for_fifo():
    client = ScriptedSQS([])
    sent: list[dict[str, Any]] = []
    original = client.send_message_batch

    def capture(**kwargs: Any) -> dict[str, Any]:
        sent.extend(kwargs["Entries"])
        return original(**kwargs)

    client.send_message_batch = capture  # type: ignore[method-assign]
    SQSRelay(client, "https://sqs/q.fifo").send_many(
        [Event("t", 1, id="ünïcode id"), Event("t", 2, id="x" * 200)]
    )
    for entry in sent:
        assert len(entry["MessageDeduplicationId"]) <= 128
        assert entry["MessageDeduplicationId"].isascii()
