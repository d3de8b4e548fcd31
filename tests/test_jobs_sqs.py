"""SQSJobQueue against moto's SQS: send, batch send with partial failures, at-least-once consume."""

from __future__ import annotations

import threading
import time

import boto3
import pytest
from moto import mock_aws

from dynacoord import (
    ConsumeStats,
    InvalidValueError,
    JobSendError,
    SQSJobQueue,
    ValueTooLargeError,
)
from dynacoord.testing import DUMMY_CREDENTIALS


@pytest.fixture()
def sqs():
    with mock_aws():
        yield boto3.client("sqs", **DUMMY_CREDENTIALS)


@pytest.fixture()
def queue(sqs):
    url = sqs.create_queue(QueueName="jobs")["QueueUrl"]
    return SQSJobQueue(sqs, url)


def counts(queue: SQSJobQueue) -> tuple[int, int]:
    """(visible, in flight) messages of the queue."""
    attrs = queue.client.get_queue_attributes(
        QueueUrl=queue.queue_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]), int(
        attrs["ApproximateNumberOfMessagesNotVisible"]
    )


def drain(queue: SQSJobQueue, handler, **kwargs) -> ConsumeStats:
    kwargs.setdefault("wait_time", 0)
    kwargs.setdefault("max_batches", 1)
    return queue.consume(handler, **kwargs)


class Spy:
    """Wraps a boto3 client and records the operations called (optionally overriding some)."""

    def __init__(self, client, **overrides):
        self._client = client
        self._overrides = overrides
        self.calls: list[str] = []

    def __getattr__(self, name):
        self.calls.append(name)
        return self._overrides.get(name) or getattr(self._client, name)


# -- send -----------------------------------------------------------------------------------------


def test_send_and_consume_round_trip_deletes_after_success(queue):
    queue.send({"order": "o-1", "amount": 12.5, "raw": b"\x00"})
    got = []
    stats = drain(queue, got.append)
    assert got == [{"order": "o-1", "amount": 12.5, "raw": b"\x00"}]
    assert (stats.received, stats.succeeded, stats.failed) == (1, 1, 0)
    assert counts(queue) == (0, 0)  # deleted, not merely hidden


def test_message_is_deleted_only_after_the_handler_returned(queue):
    queue.send({"n": 1})
    during = []

    def handler(job):
        during.append(counts(queue))  # the message still exists, in flight

    drain(queue, handler)
    assert during == [(0, 1)]
    assert counts(queue) == (0, 0)


def test_failed_job_is_not_deleted_and_is_redelivered(queue):
    queue.send({"n": 1})
    attempts = []

    def flaky(job):
        attempts.append(job)
        if len(attempts) == 1:
            raise RuntimeError("downstream unavailable")

    first = drain(queue, flaky, visibility_timeout=1)
    assert (first.received, first.succeeded, first.failed) == (1, 0, 1)
    assert counts(queue) == (0, 1)  # still there, invisible until the timeout
    assert drain(queue, flaky).received == 0
    time.sleep(1.2)
    second = drain(queue, flaky, visibility_timeout=1)
    assert (second.received, second.succeeded) == (1, 1)
    assert attempts == [{"n": 1}, {"n": 1}]
    assert counts(queue) == (0, 0)


def test_retry_delay_zero_makes_a_failed_job_visible_at_once(queue):
    queue.send("job")
    calls = []

    def fail_once(job):
        calls.append(job)
        if len(calls) == 1:
            raise ValueError("bad luck")

    stats = queue.consume(fail_once, wait_time=0, max_batches=2, retry_delay=0)
    assert (stats.received, stats.succeeded, stats.failed) == (2, 1, 1)
    assert counts(queue) == (0, 0)


def test_undecodable_body_counts_as_failure_and_stays(queue, sqs):
    sqs.send_message(QueueUrl=queue.queue_url, MessageBody="not json {")
    stats = drain(queue, lambda job: pytest.fail("handler called"), visibility_timeout=5)
    assert (stats.received, stats.failed) == (1, 1)
    assert counts(queue) == (0, 1)


def test_send_refuses_bad_and_oversize_jobs(queue):
    with pytest.raises(InvalidValueError):
        queue.send({"s": {1, 2}})
    with pytest.raises(ValueTooLargeError):
        queue.send("x" * (256 * 1024 + 1))
    assert counts(queue) == (0, 0)


# -- send_many ------------------------------------------------------------------------------------


def test_send_many_batches_of_10_in_order(queue):
    spy = Spy(queue.client)
    batched = SQSJobQueue(spy, queue.queue_url)
    ids = batched.send_many({"i": i} for i in range(25))
    assert len(ids) == len(set(ids)) == 25
    assert spy.calls.count("send_message_batch") == 3
    got = []
    while len(got) < 25:
        assert queue.consume(got.append, wait_time=0, max_batches=1).received > 0
    assert sorted(j["i"] for j in got) == list(range(25))


def test_send_many_splits_by_payload_size(queue):
    spy = Spy(queue.client)
    batched = SQSJobQueue(spy, queue.queue_url)
    big = "x" * (100 * 1024)
    batched.send_many([big, big, big, big])  # 400 KB: cannot go in one 256 KB batch
    assert spy.calls.count("send_message_batch") == 2
    assert counts(queue) == (4, 0)


def test_send_many_checks_every_job_before_sending(queue):
    with pytest.raises(InvalidValueError):
        queue.send_many([{"ok": 1}, {"ok": 2}, {"bad": object()}])
    # A str is one job, not one job per character; a non-iterable is named, not a bare error.
    with pytest.raises(TypeError, match="jobs must be an iterable of jobs, not a str"):
        queue.send_many("abc")
    with pytest.raises(TypeError, match="jobs must be an iterable of jobs, got int"):
        queue.send_many(5)
    assert counts(queue) == (0, 0)


def test_send_many_retries_entries_sqs_failed(queue):
    real = queue.client.send_message_batch
    attempts = []

    def failing_first_time(**kwargs):
        attempts.append([e["Id"] for e in kwargs["Entries"]])
        if len(attempts) > 1:
            return real(**kwargs)
        entries = kwargs["Entries"]
        response = real(QueueUrl=kwargs["QueueUrl"], Entries=entries[:7])
        response["Failed"] = [
            {"Id": e["Id"], "Code": "InternalError", "SenderFault": False, "Message": "try again"}
            for e in entries[7:]
        ]
        return response

    flaky = SQSJobQueue(Spy(queue.client, send_message_batch=failing_first_time), queue.queue_url)
    flaky.send_backoff = 0.001
    ids = flaky.send_many(list(range(10)))
    assert attempts == [[str(i) for i in range(10)], ["7", "8", "9"]]
    assert len(ids) == 10
    assert counts(queue) == (10, 0)  # each sent exactly once


def test_send_many_raises_for_entries_that_keep_failing(queue):
    real = queue.client.send_message_batch

    def refuse_index_1(**kwargs):
        entries = [e for e in kwargs["Entries"] if e["Id"] != "1"]
        response = real(QueueUrl=kwargs["QueueUrl"], Entries=entries)
        if len(entries) < len(kwargs["Entries"]):
            response["Failed"] = [
                {"Id": "1", "Code": "InvalidMessageContents", "SenderFault": True, "Message": "no"}
            ]
        return response

    spy = Spy(queue.client, send_message_batch=refuse_index_1)
    with pytest.raises(JobSendError) as info:
        SQSJobQueue(spy, queue.queue_url).send_many(["a", "b", "c"])
    assert info.value.failed == [(1, "InvalidMessageContents", "no")]
    assert spy.calls.count("send_message_batch") == 1  # sender faults are not retried
    assert counts(queue) == (2, 0)


# -- long handlers, stopping, idempotency ----------------------------------------------------------


def test_heartbeat_keeps_the_whole_batch_invisible_during_a_long_handler(queue, sqs):
    queue.send_many(["slow", "next"])
    peeks = []

    def handler(job):
        if job == "slow":
            time.sleep(2.2)  # twice the visibility timeout
            # Another consumer looking now must not get either message of this batch.
            peeks.append(
                sqs.receive_message(
                    QueueUrl=queue.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0
                ).get("Messages", [])
            )

    stats = drain(queue, handler, visibility_timeout=1, heartbeat_interval=0.2)
    assert peeks == [[]]
    assert (stats.received, stats.succeeded) == (2, 2)
    assert counts(queue) == (0, 0)


def test_stop_event_hands_the_rest_of_the_batch_back(queue):
    queue.send_many([1, 2, 3, 4])
    stop = threading.Event()
    handled = []

    def handler(job):
        handled.append(job)
        stop.set()

    stats = queue.consume(handler, wait_time=0, visibility_timeout=60, stop_event=stop)
    assert len(handled) == 1
    assert stats.received == 4 and stats.released == 3 and stats.succeeded == 1
    assert counts(queue) == (3, 0)  # visible again at once, not after 60 s


def test_max_batches_bounds_the_loop(queue):
    stats = queue.consume(lambda job: None, wait_time=0, max_batches=3)
    assert (stats.batches, stats.received) == (3, 0)


def test_consume_refuses_bad_arguments(queue):
    with pytest.raises(ValueError):
        queue.consume(print, max_messages=11)
    with pytest.raises(ValueError):
        queue.consume(print, wait_time=21)
    with pytest.raises(TypeError):
        queue.consume("not callable")


def test_idempotency_hook_wraps_the_handler_once(queue):
    done: dict[str, object] = {}
    wraps = []

    def once_per_id(handler):  # a stand-in for backend.idempotent(key=...)
        wraps.append(handler)

        def wrapper(job):
            if job["id"] not in done:
                done[job["id"]] = handler(job)
            return done[job["id"]]

        return wrapper

    runs = []
    queue.send_many([{"id": "a"}, {"id": "a"}, {"id": "b"}])  # "a" delivered twice
    stats = queue.consume(runs.append, wait_time=0, max_batches=2, idempotency=once_per_id)
    assert len(wraps) == 1
    assert stats.succeeded == 3
    assert sorted(j["id"] for j in runs) == ["a", "b"]


def test_backend_idempotent_decorator_absorbs_redeliveries(moto_table):
    from dynacoord.backends.dynamodb import DynamoDBBackend

    client, table = moto_table  # inside moto's mock_aws: SQS is mocked too
    backend = DynamoDBBackend(client, table_name=table, namespace="jobs")
    sqs = boto3.client("sqs", **DUMMY_CREDENTIALS)
    queue = SQSJobQueue(sqs, sqs.create_queue(QueueName="idem")["QueueUrl"])
    charged = []

    def charge(job):
        charged.append(job["order"])
        return {"charged": job["amount"]}

    queue.send_many([{"order": "o-1", "amount": 5}, {"order": "o-2", "amount": 7}])
    queue.send({"order": "o-1", "amount": 5})  # a duplicate, as after a redelivery
    stats = queue.consume(
        charge,
        wait_time=0,
        max_batches=2,
        idempotency=backend.idempotent(key=lambda job: "charge:" + job["order"]),
    )
    assert stats.succeeded == 3 and stats.failed == 0
    assert sorted(charged) == ["o-1", "o-2"]  # o-1 ran once
    assert backend.idempotency.get("charge:o-1").result == {"charged": 5}
