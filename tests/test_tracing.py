"""A trace across the outbox (dynacoord.tracing): the publisher's context recorded in the event
on every backend, each delivery (worker, stream relay, sweeper, a retry) in a consumer span
linked to it, the AWS relays forwarding it, and nothing breaking without OpenTelemetry. Spans
are read from the OpenTelemetry SDK's in-memory exporter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from dynacoord import (
    DynamoDBBackend,
    Event,
    EventBridgeRelay,
    ManualClock,
    SNSRelay,
    SQSRelay,
    tracing,
)
from dynacoord.errors import ValueTooLargeError
from dynacoord.outbox import EventStatus
from dynacoord.testing import DUMMY_CREDENTIALS, unique_name
from tests.stream_records import insert_record

XRAY = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"


class Spans:
    """The in-memory exporter of a provider of the test's own, given to ``tracing.enable`` (no
    global provider is set: other tests are left alone)."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("app")

    def finished(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def consumers(self) -> list[ReadableSpan]:
        return [s for s in self.finished() if s.kind is SpanKind.CONSUMER]


@pytest.fixture()
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[Spans]:
    monkeypatch.delenv("DYNACOORD_TRACING", raising=False)
    monkeypatch.delenv("AWS_LAMBDA_FUNCTION_NAME", raising=False)
    recorded = Spans()
    tracing.enable(tracer_provider=recorded.provider)
    assert tracing.is_enabled()
    yield recorded
    tracing.enable()  # the next test decides again


def _linked_to(span: ReadableSpan, publisher: Any) -> bool:
    return [link.context for link in span.links] == [publisher] or (
        len(span.links) == 1
        and span.links[0].context.trace_id == publisher.trace_id
        and span.links[0].context.span_id == publisher.span_id
    )


def _check_consumer(span: ReadableSpan, publisher: Any, event_id: str, attempt: int) -> None:
    assert span.kind is SpanKind.CONSUMER
    assert span.name == "process order.placed"
    assert _linked_to(span, publisher)
    assert span.attributes is not None
    assert span.attributes["messaging.message.id"] == event_id
    assert span.attributes["messaging.operation.type"] == "process"
    assert span.attributes["dynacoord.outbox.attempt"] == attempt
    assert span.attributes["dynacoord.outbox.event_type"] == "order.placed"


# -- publish -> worker, on every backend ----------------------------------------------------------


def test_a_worker_delivers_in_a_span_of_the_publishers_trace(
    make_backend: Any, spans: Spans
) -> None:
    outbox = make_backend().outbox
    with spans.tracer.start_as_current_span("place order") as publishing:
        (event_id,) = outbox.publish(Event("order.placed", {"n": 1}, group="cust-1"))
    publisher = publishing.get_span_context()
    stored = outbox.get(event_id)
    assert stored is not None
    metadata = dict(stored.event.metadata)
    assert metadata == {
        "traceparent": f"00-{publisher.trace_id:032x}-{publisher.span_id:016x}-{int(publisher.trace_flags):02x}"
    }

    seen: list[dict[str, Any]] = []
    outbox.worker(lambda e: seen.append(dict(e.metadata))).run_once()
    assert seen == [metadata]  # the handler sees the carrier too
    (span,) = spans.consumers()
    _check_consumer(span, publisher, event_id, attempt=1)
    assert span.attributes is not None and span.attributes["dynacoord.outbox.group"] == "cust-1"
    # no span around the worker: the publisher's span is the parent, one trace
    assert span.context.trace_id == publisher.trace_id
    assert span.parent is not None and span.parent.span_id == publisher.span_id
    assert span.status.status_code is StatusCode.UNSET


def test_a_publish_inside_a_transaction_records_the_context(
    moto_table: tuple[Any, str], spans: Spans
) -> None:
    client, table = moto_table
    backend = DynamoDBBackend(client, table_name=table, namespace=unique_name("tx"))
    with spans.tracer.start_as_current_span("place order") as publishing:
        with backend.transaction() as tx:
            (one,) = backend.outbox.publish(Event("order.placed", {"n": 1}), tx=tx)
            two, three = backend.outbox.publish(
                [Event("order.placed", {"n": 2}), Event("order.placed", {"n": 3})], tx=tx
            )
    publisher = publishing.get_span_context()
    backend.outbox.worker(lambda e: None).run_once()
    consumers = spans.consumers()
    assert sorted(s.attributes["messaging.message.id"] for s in consumers) == sorted(  # type: ignore[index]
        [one, two, three]
    )
    for span in consumers:
        assert _linked_to(span, publisher)
        assert span.context.trace_id == publisher.trace_id


# -- a failure, a retry ----------------------------------------------------------------------------


def test_a_failure_is_recorded_and_the_retry_links_to_the_publisher_too(
    make_backend: Any, spans: Spans
) -> None:
    clock = ManualClock()
    outbox = make_backend(clock=clock).outbox
    with spans.tracer.start_as_current_span("place order") as publishing:
        (event_id,) = outbox.publish(Event("order.placed", {}, occurred_at=clock.time()))
    publisher = publishing.get_span_context()
    attempts: list[int] = []

    def flaky(event: Event) -> None:
        attempts.append(event.attempt)
        if event.attempt == 1:
            raise RuntimeError("mail server down")

    worker = outbox.worker(flaky, backoff=1, max_backoff=1)
    worker.run_once()
    clock.advance(5)
    worker.run_once()
    assert attempts == [1, 2]
    record = outbox.get(event_id)
    assert record is not None and record.status is EventStatus.COMPLETED

    first, second = spans.consumers()
    _check_consumer(first, publisher, event_id, attempt=1)
    _check_consumer(second, publisher, event_id, attempt=2)
    assert first.status.status_code is StatusCode.ERROR
    assert first.status.description == "RuntimeError: mail server down"
    assert first.attributes is not None and first.attributes["error.type"] == "RuntimeError"
    (exception,) = [e for e in first.events if e.name == "exception"]
    assert exception.attributes is not None
    assert exception.attributes["exception.message"] == "mail server down"
    assert second.status.status_code is StatusCode.UNSET
    assert first.context.trace_id == second.context.trace_id == publisher.trace_id


# -- the stream relay and the sweeper (DynamoDB Local) ---------------------------------------------


@pytest.mark.integration
def test_the_stream_relay_delivers_in_a_span_linked_to_the_publisher(
    ddb_table: tuple[Any, str], spans: Spans
) -> None:
    client, table = ddb_table
    clock = ManualClock()
    outbox = DynamoDBBackend(
        client, table_name=table, namespace=unique_name("tr"), clock=clock
    ).outbox
    with spans.tracer.start_as_current_span("place order") as publishing:
        first, second = outbox.publish(
            [
                Event("order.placed", {}, id="e1", occurred_at=clock.time()),
                Event("order.placed", {}, id="e2", occurred_at=clock.time()),
            ]
        )
    publisher = publishing.get_span_context()
    relay = outbox.stream_handler(lambda e: None)
    records = [
        insert_record(client, table, outbox._store._key(i), n) for n, i in enumerate(["e1", "e2"])
    ]

    # no span around the relay: one trace with the publisher
    assert relay({"Records": records[:1]}) == {"batchItemFailures": []}
    (span,) = spans.consumers()
    _check_consumer(span, publisher, first, attempt=1)
    assert span.context.trace_id == publisher.trace_id

    # inside the invocation's own span: that span stays the parent, the link joins the traces
    with spans.tracer.start_as_current_span("invocation", kind=SpanKind.SERVER) as invocation:
        assert relay({"Records": records[1:]}) == {"batchItemFailures": []}
    span = spans.consumers()[-1]
    _check_consumer(span, publisher, second, attempt=1)
    assert span.context.trace_id == invocation.get_span_context().trace_id
    assert span.parent is not None and span.parent.span_id == invocation.get_span_context().span_id
    assert outbox.get(second).status is EventStatus.COMPLETED  # type: ignore[union-attr]


@pytest.mark.integration
def test_the_sweeper_delivers_in_a_span_linked_to_the_publisher(
    ddb_table: tuple[Any, str], spans: Spans
) -> None:
    client, table = ddb_table
    clock = ManualClock()
    outbox = DynamoDBBackend(
        client, table_name=table, namespace=unique_name("ts"), clock=clock
    ).outbox
    with spans.tracer.start_as_current_span("place order") as publishing:
        (event_id,) = outbox.publish(Event("order.placed", {}, occurred_at=clock.time()))
    clock.advance(60)  # past the relay's share: the sweeper's
    result = outbox.sweep_handler(lambda e: None)({}, None)
    assert result["delivered"] == 1
    (span,) = spans.consumers()
    _check_consumer(span, publishing.get_span_context(), event_id, attempt=1)


# -- X-Ray only (Lambda without OpenTelemetry spans) -----------------------------------------------


def test_in_lambda_without_a_span_the_xray_header_is_recorded_and_linked(
    moto_table: tuple[Any, str], spans: Spans, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "orders")
    monkeypatch.setenv("_X_AMZN_TRACE_ID", XRAY)
    tracing.enable(tracer_provider=spans.provider)  # decided again, in Lambda
    client, table = moto_table
    outbox = DynamoDBBackend(client, table_name=table, namespace=unique_name("xr")).outbox
    (event_id,) = outbox.publish(Event("order.placed", {}))
    record = outbox.get(event_id)
    assert record is not None and dict(record.event.metadata) == {"X-Amzn-Trace-Id": XRAY}
    # a span is active: OpenTelemetry's context wins, the X-Ray header is not recorded
    with spans.tracer.start_as_current_span("place order"):
        (other,) = outbox.publish(Event("order.placed", {}))
    assert set(outbox.get(other).event.metadata) == {"traceparent"}  # type: ignore[union-attr]

    outbox.worker(lambda e: None).run_once()
    linked = [s for s in spans.consumers() if s.attributes["messaging.message.id"] == event_id]  # type: ignore[index]
    (link,) = linked[0].links
    assert f"{link.context.trace_id:032x}" == "5759e988bd862e3fe1be46a994272793"
    assert f"{link.context.span_id:016x}" == "53995c3f42cd8ad8"
    assert link.context.trace_flags.sampled


# -- the size budget, retried publishes, the caller's own context ----------------------------------


def _largest_payload(outbox: Any) -> int:
    """The longest string payload an event of this outbox can carry (no trace context)."""
    now = int(time.time() * 1000)  # the item's numbers count by their digits
    low, high = 1, 420_000
    while low < high:
        middle = (low + high + 1) // 2
        try:
            outbox._store.transaction_entry(Event("order.placed", "x" * middle, id="full"), now)
        except ValueTooLargeError:
            high = middle - 1
        else:
            low = middle
    return low


@pytest.mark.integration
def test_an_event_that_fits_only_without_its_trace_context_is_stored_without_it(
    ddb_table: tuple[Any, str], spans: Spans
) -> None:
    client, table = ddb_table  # DynamoDB Local: moto counts item sizes its own way
    backend = DynamoDBBackend(client, table_name=table, namespace=unique_name("sz"))
    outbox = backend.outbox
    largest = _largest_payload(outbox)
    with spans.tracer.start_as_current_span("place order"):
        (full,) = outbox.publish(Event("order.placed", "x" * largest, id="full"))
        (small,) = outbox.publish(Event("order.placed", "x", id="small"))
        with backend.transaction() as tx:
            outbox.publish(Event("order.placed", "x" * largest, id="fult"), tx=tx)
        with pytest.raises(ValueTooLargeError):  # too large without it too: refused as before
            outbox.publish(Event("order.placed", "x" * (largest + 1), id="too-big"))
    assert dict(outbox.get(full).event.metadata) == {}  # type: ignore[union-attr]
    assert dict(outbox.get("fult").event.metadata) == {}  # type: ignore[union-attr]
    assert set(outbox.get(small).event.metadata) == {"traceparent"}  # type: ignore[union-attr]
    assert outbox.get("too-big") is None


def test_a_publish_retried_under_another_trace_is_the_same_event(
    make_backend: Any, spans: Spans
) -> None:
    outbox = make_backend().outbox
    with spans.tracer.start_as_current_span("first try"):
        outbox.publish(Event("order.placed", {"n": 1}, id="o-1", metadata={"by": "api"}))
    with spans.tracer.start_as_current_span("second try"):
        assert outbox.publish(
            Event("order.placed", {"n": 1}, id="o-1", metadata={"by": "api"})
        ) == ["o-1"]
    with spans.tracer.start_as_current_span("third try"), pytest.raises(Exception) as refused:
        outbox.publish(Event("order.placed", {"n": 2}, id="o-1", metadata={"by": "api"}))
    assert type(refused.value).__name__ == "DuplicateEventError"


def test_the_callers_own_context_in_metadata_wins(make_backend: Any, spans: Spans) -> None:
    outbox = make_backend().outbox
    own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with spans.tracer.start_as_current_span("place order"):
        (event_id,) = outbox.publish(Event("order.placed", {}, metadata={"traceparent": own}))
    assert dict(outbox.get(event_id).event.metadata) == {"traceparent": own}  # type: ignore[union-attr]


# -- the AWS relays forward the context -----------------------------------------------------------


@pytest.fixture()
def aws() -> Iterator[None]:
    with mock_aws():
        yield


def _publish_and_relay(make_outbox: Any, relay: Any, spans: Spans) -> tuple[Any, str]:
    outbox = make_outbox()
    with spans.tracer.start_as_current_span("place order") as publishing:
        (event_id,) = outbox.publish(Event("order.placed", {"n": 1}))
    outbox.worker(relay).run_once()
    assert outbox.get(event_id).status is EventStatus.COMPLETED  # type: ignore[union-attr]
    (span,) = spans.consumers()
    _check_consumer(span, publishing.get_span_context(), event_id, attempt=1)
    return publishing.get_span_context(), event_id


def _xray_of(context: Any) -> str:
    trace_id = f"{context.trace_id:032x}"
    return f"Root=1-{trace_id[:8]}-{trace_id[8:]};Parent={context.span_id:016x};Sampled=1"


def test_the_sqs_relay_forwards_aws_trace_header_and_traceparent(aws: None, spans: Spans) -> None:
    from dynacoord.provision import create_table

    ddb = boto3.client("dynamodb", **DUMMY_CREDENTIALS)
    create_table(ddb, "dynacoord-test")
    sqs = boto3.client("sqs", **DUMMY_CREDENTIALS)
    url = sqs.create_queue(QueueName="orders")["QueueUrl"]
    sent: list[dict[str, Any]] = []  # moto keeps no system attributes of a batch: read the request
    sqs.meta.events.register(
        "provide-client-params.sqs.SendMessageBatch",
        lambda params, **_: sent.extend(params["Entries"]),
    )
    publisher, event_id = _publish_and_relay(
        lambda: DynamoDBBackend(ddb, table_name="dynacoord-test", namespace="sqs").outbox,
        SQSRelay(sqs, url),
        spans,
    )
    (message,) = sqs.receive_message(
        QueueUrl=url, MessageAttributeNames=["All"], MessageSystemAttributeNames=["All"]
    )["Messages"]
    traceparent = (
        f"00-{publisher.trace_id:032x}-{publisher.span_id:016x}-{int(publisher.trace_flags):02x}"
    )
    (entry,) = sent
    assert entry["MessageSystemAttributes"] == {
        "AWSTraceHeader": {"DataType": "String", "StringValue": _xray_of(publisher)}
    }
    assert message["MessageAttributes"]["traceparent"]["StringValue"] == traceparent
    assert json.loads(message["Body"])["metadata"] == {"traceparent": traceparent}
    assert message["MessageAttributes"]["event_id"]["StringValue"] == event_id


class Capturing:
    """A client that records the entries it is sent and accepts them all."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []

    def publish_batch(self, **kwargs: Any) -> dict[str, Any]:
        self.entries.extend(kwargs["PublishBatchRequestEntries"])
        return {"Successful": [], "Failed": []}

    def put_events(self, **kwargs: Any) -> dict[str, Any]:
        self.entries.extend(kwargs["Entries"])
        return {"FailedEntryCount": 0, "Entries": [{"EventId": "x"} for _ in kwargs["Entries"]]}


def test_the_sns_relay_forwards_message_attributes(
    moto_table: tuple[Any, str], spans: Spans
) -> None:
    client, table = moto_table
    captured = Capturing()
    publisher, _ = _publish_and_relay(
        lambda: DynamoDBBackend(client, table_name=table, namespace="sns").outbox,
        SNSRelay(captured, "arn:aws:sns:us-east-1:123456789012:orders"),
        spans,
    )
    (entry,) = captured.entries
    attributes = {k: v["StringValue"] for k, v in entry["MessageAttributes"].items()}
    assert (
        attributes["traceparent"]
        == f"00-{publisher.trace_id:032x}-{publisher.span_id:016x}-{int(publisher.trace_flags):02x}"
    )
    assert attributes["X-Amzn-Trace-Id"] == _xray_of(publisher)


def test_the_eventbridge_relay_sets_the_trace_header(
    moto_table: tuple[Any, str], spans: Spans
) -> None:
    client, table = moto_table
    captured = Capturing()
    publisher, _ = _publish_and_relay(
        lambda: DynamoDBBackend(client, table_name=table, namespace="eb").outbox,
        EventBridgeRelay(captured),
        spans,
    )
    (entry,) = captured.entries
    assert entry["TraceHeader"] == _xray_of(publisher)


def test_the_eventbridge_relay_is_accepted_by_the_service_model(aws: None) -> None:
    events = boto3.client("events", **DUMMY_CREDENTIALS)
    metadata = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    EventBridgeRelay(events).send_many([Event("order.placed", {}, metadata=metadata)])


def test_an_event_without_a_context_is_relayed_as_before() -> None:
    captured = Capturing()
    SNSRelay(captured, "arn:aws:sns:us-east-1:123456789012:orders")(Event("t", {}))
    EventBridgeRelay(captured)(Event("t", {}, metadata={"traceparent": "not a traceparent"}))
    sns, bridge = captured.entries
    assert set(sns["MessageAttributes"]) == {"event_type", "event_id"}
    assert "TraceHeader" not in bridge


# -- off, and absent --------------------------------------------------------------------------------


def test_turned_off_nothing_is_recorded_and_no_span_opened(make_backend: Any, spans: Spans) -> None:
    tracing.disable()
    outbox = make_backend().outbox
    with spans.tracer.start_as_current_span("place order"):
        (event_id,) = outbox.publish(Event("order.placed", {}))
    outbox.worker(lambda e: None).run_once()
    assert dict(outbox.get(event_id).event.metadata) == {}  # type: ignore[union-attr]
    assert spans.consumers() == []
    assert tracing.forwarded(
        {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    ) == (None, None, None)


def test_without_opentelemetry_publish_and_delivery_work(
    moto_table: tuple[Any, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [m for m in sys.modules if m == "opentelemetry" or m.startswith("opentelemetry.")]:
        monkeypatch.setitem(sys.modules, name, None)  # type: ignore[arg-type]
    monkeypatch.delenv("AWS_LAMBDA_FUNCTION_NAME", raising=False)
    tracing.enable()
    try:
        client, table = moto_table
        outbox = DynamoDBBackend(client, table_name=table, namespace=unique_name("no")).outbox
        (event_id,) = outbox.publish(Event("order.placed", {}))
        handled: list[str] = []

        def fails_once(event: Event) -> None:
            handled.append(event.id)
            if event.attempt == 1:
                raise RuntimeError("down")

        worker = outbox.worker(fails_once, backoff=0, max_backoff=0)
        worker.run_once()
        worker.run_once()
        assert handled == [event_id, event_id]
        assert (tracing.capturing, tracing.spanning) == (False, False)
        assert dict(outbox.get(event_id).event.metadata) == {}  # type: ignore[union-attr]
    finally:
        tracing.enable()


def test_import_and_a_traced_off_run_import_no_opentelemetry() -> None:
    script = textwrap.dedent(
        """
        import sys
        import dynacoord
        from dynacoord import tracing
        assert "opentelemetry" not in sys.modules, "import dynacoord"
        import boto3
        from moto import mock_aws
        from dynacoord import DynamoDBBackend, Event
        from dynacoord.provision import create_table
        with mock_aws():
            client = boto3.client("dynamodb", region_name="us-east-1")
            create_table(client, "dynacoord-test")
            outbox = DynamoDBBackend(client, table_name="dynacoord-test").outbox
            outbox.publish(Event("t", {}))
            assert outbox.worker(lambda e: None).run_once() == 1
        assert "opentelemetry" not in sys.modules, "publish and delivery, tracing off"
        assert (tracing.capturing, tracing.spanning) == (False, False)
        print("ok")
        """
    )
    env = {**os.environ, "DYNACOORD_TRACING": "off"}
    env.pop("AWS_LAMBDA_FUNCTION_NAME", None)
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_a_traceparent_that_is_not_valid_is_neither_linked_nor_forwarded(spans: Spans) -> None:
    seen: list[int] = []
    bad = [
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
        "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
    ]
    for value in bad:
        event = Event("order.placed", {}, metadata={"traceparent": value}, attempt=1)
        assert tracing.forwarded(event.metadata) == (None, None, None)
        tracing.run_handler(lambda e: seen.append(1), event)
    assert len(seen) == len(bad)
    assert all(not s.links and s.parent is None for s in spans.consumers())


def test_forwarded_converts_between_the_two_formats(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DYNACOORD_TRACING", raising=False)
    tracing.enable()
    w3c = "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01"
    assert tracing.forwarded({"traceparent": w3c, "tracestate": "vendor=1"}) == (
        w3c,
        "vendor=1",
        XRAY,
    )
    assert tracing.forwarded({"X-Amzn-Trace-Id": XRAY + ";Lineage=a1b2c3d4:0"}) == (
        w3c,
        None,
        XRAY + ";Lineage=a1b2c3d4:0",  # forwarded as Lambda gave it
    )
    assert tracing.forwarded({"X-Amzn-Trace-Id": "Root=1-5759e988-bd862e3fe1be46a994272793"}) == (
        None,
        None,
        None,
    )  # no Parent: nothing to link to
    monkeypatch.setenv("DYNACOORD_TRACING", "off")
    tracing.enable()
    try:
        assert tracing.forwarded({"traceparent": w3c}) == (None, None, None)
    finally:
        monkeypatch.delenv("DYNACOORD_TRACING")
        tracing.enable()


def test_the_tracestate_travels_to_the_link(spans: Spans) -> None:
    metadata = {
        "traceparent": "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01",
        "tracestate": "vendor=abc,other=1",
    }
    tracing.run_handler(lambda e: None, Event("order.placed", {}, metadata=metadata, attempt=3))
    (span,) = spans.consumers()
    (link,) = span.links
    assert link.context.trace_state.to_header() == "vendor=abc,other=1"
    assert span.attributes is not None and span.attributes["dynacoord.outbox.attempt"] == 3
