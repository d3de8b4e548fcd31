"""Relays: outbox handlers that forward events to SQS, SNS or EventBridge.

Each relay is a callable taking one :class:`~dynacoord.outbox.Event` (so it can be the handler of
an outbox worker) and has ``send_many(events)`` for batches (10 per request, the services' limit).
When a batch is partly refused, only the refused entries are sent again (up to ``max_attempts``
rounds, with a short exponential pause); entries the service calls the sender's fault are not
retried. Whatever is still unsent then raises :class:`~dynacoord.errors.RelayError`, so the
outbox worker retries the event later with its own backoff.

What is sent (all three): the event envelope as JSON text, ``{"id", "type", "occurred_at",
"group", "payload", "metadata"}`` (values in dynacoord's codec: bytes and Decimal are tagged, see
:mod:`dynacoord.codec`). SQS and SNS messages also carry the message attributes ``event_type`` and
``event_id``; on FIFO queues/topics the message group is ``event.group`` (or ``default_group``)
and the deduplication id is the event id, so a redelivered event is dropped by the service within
its 5-minute deduplication window. EventBridge entries use ``DetailType = event.type``.

Trace context (see :mod:`dynacoord.tracing`): each relay forwards the publisher's context
recorded in the event, the way its service expects, so the message's consumer joins the
publisher's trace: SQS messages carry the X-Ray header as the ``AWSTraceHeader`` system
attribute and W3C ``traceparent`` (and ``tracestate``) message attributes; SNS messages carry
``traceparent``, ``tracestate`` and ``X-Amzn-Trace-Id`` message attributes; EventBridge entries
carry the X-Ray header as ``TraceHeader``. Where only one format was recorded, the other is
made from it (the same ids). The envelope's ``metadata`` holds the recorded keys too.

Clients are injected (``boto3.client("sqs")`` ...); this module imports no AWS SDK itself.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from . import codec, tracing
from ._validate import check_bool, check_int, check_iterable, non_negative_seconds
from .errors import ConfigurationError, RelayError
from .outbox import Event

__all__ = ["BATCH_LIMIT", "EventBridgeRelay", "SNSRelay", "SQSRelay"]

logger = logging.getLogger(__name__)

#: SendMessageBatch, PublishBatch and PutEvents take at most 10 entries.
BATCH_LIMIT = 10
_FIFO_ID = re.compile(r"^[A-Za-z0-9!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]{1,128}$")


def _fifo_id(value: str) -> str:
    """``value`` if SQS/SNS accept it as a group or deduplication id, else a stable hash of it."""
    if _FIFO_ID.match(value):
        return value
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True, slots=True)
class _Failure:
    entry_id: str
    code: str
    message: str
    retryable: bool


class _BatchRelay:
    """Batching, partial-failure retry and the handler interface shared by the relays."""

    service = "relay"

    def __init__(
        self,
        client: Any,
        *,
        max_attempts: int = 3,
        retry_delay: float = 0.1,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if client is None:
            raise ConfigurationError(f"{type(self).__name__} needs a boto3 client")
        self.client = client
        self.max_attempts = check_int(max_attempts, "max_attempts", minimum=1)
        self.retry_delay = non_negative_seconds(retry_delay, "retry_delay")
        self._sleep = sleep

    def __call__(self, event: Event) -> None:
        """Send one event (the outbox handler interface)."""
        self.send_many([event])

    def send_many(self, events: Iterable[Event]) -> None:
        """Send ``events`` in batches of 10; raise :class:`RelayError` for what could not be sent.

        Every batch is attempted even if an earlier one had failures; the error lists them all.
        """
        items = check_iterable(
            events, "events", "Event objects", hint="for one event call the relay: relay(event)"
        )
        for item in items:
            if not isinstance(item, Event):
                raise TypeError(f"relays send Event objects, got {type(item).__name__}")
        unsent: list[tuple[str, str, str]] = []
        for start in range(0, len(items), BATCH_LIMIT):
            unsent.extend(self._send_batch(items[start : start + BATCH_LIMIT]))
        if unsent:
            raise RelayError(
                f"{self.service}: {len(unsent)} of {len(items)} event(s) not sent: "
                + "; ".join(f"{eid}: {code} {msg}".strip() for eid, code, msg in unsent[:5]),
                failed=unsent,
            )

    def _send_batch(self, batch: Sequence[Event]) -> list[tuple[str, str, str]]:
        pending = {str(index): event for index, event in enumerate(batch)}
        given_up: list[tuple[str, str, str]] = []
        for attempt in range(1, self.max_attempts + 1):
            failures = self._send([(entry_id, e) for entry_id, e in pending.items()])
            retry: dict[str, Event] = {}
            for failure in failures:
                event = pending.get(failure.entry_id)
                if event is None:  # an id we did not send: the service's answer is not ours
                    continue
                if failure.retryable and attempt < self.max_attempts:
                    retry[failure.entry_id] = event
                else:
                    given_up.append((event.id, failure.code, failure.message))
            if not retry:
                break
            logger.info(
                "%s: %d of %d entries refused on attempt %d, sending them again",
                self.service,
                len(retry),
                len(pending),
                attempt,
            )
            pending = retry
            self._sleep(self.retry_delay * 2 ** (attempt - 1))
        return given_up

    def _send(self, entries: list[tuple[str, Event]]) -> list[_Failure]:
        raise NotImplementedError

    @staticmethod
    def _body(event: Event) -> str:
        return codec.encode(event.to_message())

    @staticmethod
    def _attributes(event: Event) -> dict[str, Any]:
        return {
            "event_type": {"DataType": "String", "StringValue": event.type},
            "event_id": {"DataType": "String", "StringValue": event.id},
        }


class _MessageRelay(_BatchRelay):
    """What the SQS and SNS relays share: the target check, FIFO message group and deduplication
    ids, and the batch answer's ``Failed`` list."""

    #: the entry field that carries the envelope
    body_field = ""

    def __init__(
        self,
        client: Any,
        target: str,
        what: str,
        *,
        fifo: bool | None,
        default_group: str,
        max_attempts: int,
        retry_delay: float,
        sleep: Callable[[float], None],
    ) -> None:
        super().__init__(client, max_attempts=max_attempts, retry_delay=retry_delay, sleep=sleep)
        if not isinstance(target, str) or not target:
            raise ConfigurationError(f"{what} must be a non-empty str, got {target!r}")
        self.fifo = target.endswith(".fifo") if fifo is None else check_bool(fifo, "fifo")
        self.default_group = default_group

    def _batch(self, entries: list[tuple[str, Event]]) -> list[dict[str, Any]]:
        batch = []
        for entry_id, event in entries:
            entry: dict[str, Any] = {
                "Id": entry_id,
                self.body_field: self._body(event),
                "MessageAttributes": self._attributes(event),
            }
            if event.metadata:
                self._trace(entry, *tracing.forwarded(event.metadata))
            if self.fifo:
                entry["MessageGroupId"] = _fifo_id(event.group or self.default_group)
                entry["MessageDeduplicationId"] = _fifo_id(event.id)
            batch.append(entry)
        return batch

    def _trace(
        self, entry: dict[str, Any], traceparent: str | None, state: str | None, xray: str | None
    ) -> None:
        """Add the trace context to a batch entry, as the service expects it."""
        attributes = entry["MessageAttributes"]
        if traceparent is not None:
            attributes[tracing.TRACEPARENT] = {"DataType": "String", "StringValue": traceparent}
        if state is not None:
            attributes[tracing.TRACESTATE] = {"DataType": "String", "StringValue": state}

    @staticmethod
    def _failures(response: dict[str, Any]) -> list[_Failure]:
        return [
            _Failure(
                str(f["Id"]),
                str(f.get("Code", "")),
                str(f.get("Message", "")),
                retryable=not f.get("SenderFault", False),
            )
            for f in response.get("Failed", [])
        ]


class SQSRelay(_MessageRelay):
    """Forward events to an SQS queue with ``SendMessageBatch``.

    FIFO queues (URL ending in ``.fifo``, or ``fifo=True``) get ``MessageGroupId = event.group``
    (``default_group`` when the event has none) and ``MessageDeduplicationId = event.id``.
    """

    service = "SQS"
    body_field = "MessageBody"

    def __init__(
        self,
        client: Any,
        queue_url: str,
        *,
        fifo: bool | None = None,
        default_group: str = "dynacoord",
        max_attempts: int = 3,
        retry_delay: float = 0.1,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(
            client,
            queue_url,
            "queue_url",
            fifo=fifo,
            default_group=default_group,
            max_attempts=max_attempts,
            retry_delay=retry_delay,
            sleep=sleep,
        )
        self.queue_url = queue_url

    def _trace(
        self, entry: dict[str, Any], traceparent: str | None, state: str | None, xray: str | None
    ) -> None:
        super()._trace(entry, traceparent, state, xray)
        if xray is not None:  # the system attribute SQS, Lambda and X-Ray read
            entry["MessageSystemAttributes"] = {
                "AWSTraceHeader": {"DataType": "String", "StringValue": xray}
            }

    def _send(self, entries: list[tuple[str, Event]]) -> list[_Failure]:
        response = self.client.send_message_batch(
            QueueUrl=self.queue_url, Entries=self._batch(entries)
        )
        return self._failures(response)

    def __repr__(self) -> str:
        return f"SQSRelay(queue_url={self.queue_url!r}, fifo={self.fifo})"


class SNSRelay(_MessageRelay):
    """Forward events to an SNS topic with ``PublishBatch``.

    FIFO topics (ARN ending in ``.fifo``) get the message group and deduplication id as for SQS.
    """

    service = "SNS"
    body_field = "Message"

    def __init__(
        self,
        client: Any,
        topic_arn: str,
        *,
        fifo: bool | None = None,
        default_group: str = "dynacoord",
        max_attempts: int = 3,
        retry_delay: float = 0.1,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(
            client,
            topic_arn,
            "topic_arn",
            fifo=fifo,
            default_group=default_group,
            max_attempts=max_attempts,
            retry_delay=retry_delay,
            sleep=sleep,
        )
        self.topic_arn = topic_arn

    def _trace(
        self, entry: dict[str, Any], traceparent: str | None, state: str | None, xray: str | None
    ) -> None:
        super()._trace(entry, traceparent, state, xray)
        if xray is not None:  # PublishBatch has no trace header field: a message attribute
            entry["MessageAttributes"][tracing.XRAY_TRACE_HEADER] = {
                "DataType": "String",
                "StringValue": xray,
            }

    def _send(self, entries: list[tuple[str, Event]]) -> list[_Failure]:
        response = self.client.publish_batch(
            TopicArn=self.topic_arn, PublishBatchRequestEntries=self._batch(entries)
        )
        return self._failures(response)

    def __repr__(self) -> str:
        return f"SNSRelay(topic_arn={self.topic_arn!r}, fifo={self.fifo})"


class EventBridgeRelay(_BatchRelay):
    """Forward events to an EventBridge bus with ``PutEvents``.

    Each entry: ``Source = source``, ``DetailType = event.type``, ``Detail`` = the envelope,
    ``Time = event.occurred_at``. Failed entries are retried (EventBridge does not say whose
    fault they are), then raised.
    """

    service = "EventBridge"

    def __init__(
        self,
        client: Any,
        bus_name: str = "default",
        *,
        source: str = "dynacoord",
        max_attempts: int = 3,
        retry_delay: float = 0.1,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(client, max_attempts=max_attempts, retry_delay=retry_delay, sleep=sleep)
        if not isinstance(bus_name, str) or not bus_name:
            raise ConfigurationError(f"bus_name must be a non-empty str, got {bus_name!r}")
        if not isinstance(source, str) or not source:
            raise ConfigurationError(f"source must be a non-empty str, got {source!r}")
        self.bus_name = bus_name
        self.source = source

    def _send(self, entries: list[tuple[str, Event]]) -> list[_Failure]:
        batch = []
        for _, event in entries:
            entry: dict[str, Any] = {
                "Source": self.source,
                "DetailType": event.type,
                "Detail": self._body(event),
                "EventBusName": self.bus_name,
                "Time": datetime.datetime.fromtimestamp(
                    event.occurred_at, tz=datetime.timezone.utc
                ),
            }
            if event.metadata:
                xray = tracing.forwarded(event.metadata)[2]
                if xray is not None:  # PutEvents' field for the X-Ray header
                    entry["TraceHeader"] = xray
            batch.append(entry)
        response = self.client.put_events(Entries=batch)
        if not response.get("FailedEntryCount"):
            return []
        failures = []
        # PutEvents answers in request order, one result per entry.
        for (entry_id, _), result in zip(entries, response.get("Entries", []), strict=False):
            code = result.get("ErrorCode")
            if code:
                failures.append(
                    _Failure(entry_id, str(code), str(result.get("ErrorMessage", "")), True)
                )
        return failures

    def __repr__(self) -> str:
        return f"EventBridgeRelay(bus_name={self.bus_name!r}, source={self.source!r})"
