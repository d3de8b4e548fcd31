"""A small SQS job queue for queue-driven workflows: send jobs, consume them at least once.

``consume`` deletes a message only after its handler returned, so a crash or an exception makes
SQS deliver it again once its visibility timeout runs out (send it to a dead-letter queue with a
redrive policy on the queue after N receives). While a handler runs, a heartbeat thread keeps
extending the visibility of every message of the batch that is not finished yet, so a long handler
does not let SQS hand the same message (or the rest of its batch) to another consumer.

At-least-once means a handler can see a job twice (a crash after the work but before the delete, a
visibility that lapsed). Pass ``idempotency=backend.idempotency.idempotent(...)`` (any decorator
``wrap(handler) -> handler``) to make a redelivered job return the stored result instead of running
again.

Jobs are JSON-compatible values encoded with :mod:`dynacoord.codec` (plain JSON text for plain
values; bytes and Decimals round-trip).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from . import codec
from ._clock import Clock, SystemClock
from ._validate import check_int, check_iterable, non_negative_seconds
from .errors import JobSendError, ValueTooLargeError

__all__ = ["MAX_MESSAGE_BYTES", "ConsumeStats", "Handler", "SQSJobQueue"]

logger = logging.getLogger(__name__)

#: SQS's limit on one message body and on the sum of one SendMessageBatch (bytes).
MAX_MESSAGE_BYTES = 256 * 1024
#: SQS's limit on entries per batch request.
BATCH_SIZE = 10
#: SQS's maximum visibility timeout (12 hours).
MAX_VISIBILITY_TIMEOUT = 43200

Handler = Callable[[Any], Any]


@dataclass(slots=True)
class ConsumeStats:
    """What one :meth:`SQSJobQueue.consume` call did."""

    batches: int = 0
    received: int = 0
    succeeded: int = 0
    failed: int = 0
    #: messages received but handed back unprocessed because the consumer was stopped
    released: int = 0


class _VisibilityKeeper(threading.Thread):
    """Extends the visibility of the pending messages of a batch every ``interval`` seconds."""

    def __init__(self, queue: SQSJobQueue, timeout: int, interval: float) -> None:
        super().__init__(name="dynacoord-sqs-visibility", daemon=True)
        self._queue = queue
        self._timeout = timeout
        self._interval = interval
        self._pending: dict[str, str] = {}
        self._mutex = threading.Lock()
        self._stop_event = threading.Event()

    def add(self, message_id: str, receipt: str) -> None:
        with self._mutex:
            self._pending[message_id] = receipt

    def discard(self, message_id: str) -> None:
        with self._mutex:
            self._pending.pop(message_id, None)

    def run(self) -> None:
        while not self._stop_event.wait(self._interval):
            with self._mutex:
                receipts = list(self._pending.values())
            if not receipts:
                continue
            try:
                response = self._queue.client.change_message_visibility_batch(
                    QueueUrl=self._queue.queue_url,
                    Entries=[
                        {"Id": str(i), "ReceiptHandle": r, "VisibilityTimeout": self._timeout}
                        for i, r in enumerate(receipts)
                    ],
                )
            except Exception:  # a transient error must not kill the heartbeat
                logger.exception("extending message visibility failed")
                continue
            for failure in response.get("Failed", []):
                logger.warning(
                    "visibility of a message could not be extended: %r %r",
                    failure.get("Code"),
                    failure.get("Message"),
                )

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join()


class SQSJobQueue:
    """Jobs on one SQS queue. ``client`` is a ``boto3.client("sqs")``.

    For a FIFO queue pass ``group_id`` to :meth:`send`/:meth:`send_many` and enable content-based
    deduplication on the queue (or pass ``deduplication_id`` to :meth:`send`).
    """

    #: attempts of a batch send for entries SQS failed on its side (SenderFault=false)
    max_send_attempts = 4
    #: first delay of the backoff between those attempts (seconds)
    send_backoff = 0.1

    def __init__(self, client: Any, queue_url: str, *, clock: Clock | None = None) -> None:
        if client is None:
            raise TypeError("client is required: pass boto3.client('sqs')")
        if not isinstance(queue_url, str) or not queue_url:
            raise ValueError("queue_url must be a non-empty str")
        self.client = client
        self.queue_url = queue_url
        self.clock: Clock = clock or SystemClock()

    @property
    def fifo(self) -> bool:
        return self.queue_url.endswith(".fifo")

    def __repr__(self) -> str:
        return f"SQSJobQueue(queue_url={self.queue_url!r})"

    # -- sending -------------------------------------------------------------------------------

    @staticmethod
    def _body(job: Any, index: int | None = None) -> str:
        body = codec.encode(job)  # refuses values that are not JSON-compatible
        size = len(body.encode("utf-8"))
        if size > MAX_MESSAGE_BYTES:
            where = "" if index is None else f" (job {index})"
            raise ValueTooLargeError(
                f"the job{where} encodes to {size} bytes, over SQS's {MAX_MESSAGE_BYTES}-byte "
                "message limit; store large payloads elsewhere (for example S3) and send a "
                "reference",
                size=size,
                limit=MAX_MESSAGE_BYTES,
            )
        return body

    def send(
        self,
        job: Any,
        *,
        delay_seconds: int = 0,
        group_id: str | None = None,
        deduplication_id: str | None = None,
    ) -> str:
        """Send one job; returns the SQS message id."""
        params: dict[str, Any] = {"QueueUrl": self.queue_url, "MessageBody": self._body(job)}
        check_int(delay_seconds, "delay_seconds", minimum=0, maximum=900)
        if delay_seconds:
            params["DelaySeconds"] = delay_seconds
        if group_id is not None:
            params["MessageGroupId"] = group_id
        if deduplication_id is not None:
            params["MessageDeduplicationId"] = deduplication_id
        response = self.client.send_message(**params)
        return str(response["MessageId"])

    def send_many(self, jobs: Iterable[Any], *, group_id: str | None = None) -> list[str]:
        """Send jobs in SendMessageBatch requests (10 entries and 256 KB each).

        Entries SQS fails on its side are retried with backoff; entries it refuses as the sender's
        fault are not. Raises :class:`JobSendError` listing what was not sent (every job is
        encoded and checked before the first request). Returns message ids in job order.
        """
        given = check_iterable(jobs, "jobs", "jobs", hint="for one job use send()")
        bodies = [self._body(job, i) for i, job in enumerate(given)]
        ids: list[str | None] = [None] * len(bodies)
        failed: list[tuple[int, str, str]] = []
        for chunk in self._chunks(bodies):
            failed.extend(self._send_chunk(chunk, bodies, ids, group_id))
        if failed:
            raise JobSendError(
                f"{len(failed)} of {len(bodies)} jobs were not sent: "
                + ", ".join(f"job {i}: {code}" for i, code, _ in failed[:5]),
                failed=failed,
            )
        return [i for i in ids if i is not None]

    @staticmethod
    def _chunks(bodies: Sequence[str]) -> Iterable[list[int]]:
        chunk: list[int] = []
        size = 0
        for index, body in enumerate(bodies):
            body_size = len(body.encode("utf-8"))
            if chunk and (len(chunk) == BATCH_SIZE or size + body_size > MAX_MESSAGE_BYTES):
                yield chunk
                chunk, size = [], 0
            chunk.append(index)
            size += body_size
        if chunk:
            yield chunk

    def _send_chunk(
        self,
        chunk: list[int],
        bodies: Sequence[str],
        ids: list[str | None],
        group_id: str | None,
    ) -> list[tuple[int, str, str]]:
        pending = list(chunk)
        delay = self.send_backoff
        errors: dict[int, tuple[str, str]] = {}
        for attempt in range(1, self.max_send_attempts + 1):
            entries = []
            for index in pending:
                entry: dict[str, Any] = {"Id": str(index), "MessageBody": bodies[index]}
                if group_id is not None:
                    entry["MessageGroupId"] = group_id
                entries.append(entry)
            response = self.client.send_message_batch(QueueUrl=self.queue_url, Entries=entries)
            for ok in response.get("Successful", []):
                index = int(ok["Id"])
                ids[index] = str(ok["MessageId"])
                errors.pop(index, None)
            retry: list[int] = []
            for failure in response.get("Failed", []):
                index = int(failure["Id"])
                errors[index] = (str(failure.get("Code")), str(failure.get("Message", "")))
                if not failure.get("SenderFault"):
                    retry.append(index)
            if not retry:
                break
            logger.warning(
                "SQS failed %r of %r batch entries (attempt %r); retrying",
                len(retry),
                len(pending),
                attempt,
            )
            pending = retry
            if attempt < self.max_send_attempts:
                self.clock.sleep(delay)
                delay *= 2
        return [(index, code, message) for index, (code, message) in sorted(errors.items())]

    # -- consuming -----------------------------------------------------------------------------

    def consume(
        self,
        handler: Handler,
        *,
        max_messages: int = 10,
        visibility_timeout: int = 30,
        wait_time: int = 20,
        max_batches: int | None = None,
        stop_event: threading.Event | None = None,
        idempotency: Callable[[Handler], Handler] | None = None,
        heartbeat_interval: float | None = None,
        retry_delay: int | None = None,
    ) -> ConsumeStats:
        """Receive jobs and call ``handler(job)`` for each; delete a message only on success.

        Runs until ``stop_event`` is set or ``max_batches`` receive calls were made (an empty
        receive counts). ``visibility_timeout`` (seconds) is asked for on receive and renewed by a
        heartbeat every ``heartbeat_interval`` (default a third of it) while the batch is being
        handled. A handler that raises is logged and counted; its message is not deleted and comes
        back after its visibility timeout, or after ``retry_delay`` seconds when given. On stop,
        the unprocessed rest of a batch is made visible again at once. ``idempotency`` wraps the
        handler once (``idempotency(handler)``), e.g. ``backend.idempotency.idempotent(...)``.
        """
        if not callable(handler):
            raise TypeError("handler must be callable")
        check_int(max_messages, "max_messages", minimum=1, maximum=BATCH_SIZE)
        check_int(
            visibility_timeout, "visibility_timeout", minimum=0, maximum=MAX_VISIBILITY_TIMEOUT
        )
        check_int(wait_time, "wait_time", minimum=0, maximum=20)
        if max_batches is not None:
            check_int(max_batches, "max_batches", minimum=1)
        if retry_delay is not None:
            check_int(retry_delay, "retry_delay", minimum=0, maximum=MAX_VISIBILITY_TIMEOUT)
        interval = (
            visibility_timeout / 3
            if heartbeat_interval is None
            else non_negative_seconds(heartbeat_interval, "heartbeat_interval")
        )
        run = idempotency(handler) if idempotency is not None else handler
        stop = stop_event or threading.Event()
        stats = ConsumeStats()
        while not stop.is_set() and (max_batches is None or stats.batches < max_batches):
            response = self.client.receive_message(
                QueueUrl=self.queue_url,
                MaxNumberOfMessages=max_messages,
                VisibilityTimeout=visibility_timeout,
                WaitTimeSeconds=wait_time,
                MessageSystemAttributeNames=["ApproximateReceiveCount"],
            )
            stats.batches += 1
            messages: list[dict[str, Any]] = response.get("Messages", [])
            stats.received += len(messages)
            if messages:
                self._handle_batch(
                    messages, run, stop, stats, visibility_timeout, interval, retry_delay
                )
        return stats

    def _handle_batch(
        self,
        messages: list[dict[str, Any]],
        handler: Handler,
        stop: threading.Event,
        stats: ConsumeStats,
        visibility_timeout: int,
        interval: float,
        retry_delay: int | None,
    ) -> None:
        keeper: _VisibilityKeeper | None = None
        if visibility_timeout > 0 and interval > 0:
            keeper = _VisibilityKeeper(self, visibility_timeout, interval)
            for message in messages:
                keeper.add(message["MessageId"], message["ReceiptHandle"])
            keeper.start()
        try:
            for position, message in enumerate(messages):
                if stop.is_set():
                    self._release(messages[position:], stats)
                    return
                try:
                    self._handle_one(message, handler, stats, retry_delay)
                finally:
                    if keeper is not None:
                        keeper.discard(message["MessageId"])
        finally:
            if keeper is not None:
                keeper.stop()

    def _handle_one(
        self,
        message: dict[str, Any],
        handler: Handler,
        stats: ConsumeStats,
        retry_delay: int | None,
    ) -> None:
        message_id = message["MessageId"]
        receives = message.get("Attributes", {}).get("ApproximateReceiveCount")
        try:
            job = codec.decode(message["Body"])
            handler(job)
        except Exception:
            stats.failed += 1
            logger.exception(
                "job %r failed (receive %r); it will be redelivered", message_id, receives
            )
            if retry_delay is not None:
                try:
                    self.client.change_message_visibility(
                        QueueUrl=self.queue_url,
                        ReceiptHandle=message["ReceiptHandle"],
                        VisibilityTimeout=retry_delay,
                    )
                except Exception:
                    logger.exception("could not set the retry delay of job %r", message_id)
            return
        stats.succeeded += 1
        try:
            self.client.delete_message(
                QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"]
            )
        except Exception:
            # The work is done but SQS will deliver the job again: idempotent handlers absorb it.
            logger.exception("job %r succeeded but could not be deleted", message_id)

    def _release(self, messages: list[dict[str, Any]], stats: ConsumeStats) -> None:
        stats.released += len(messages)
        try:
            self.client.change_message_visibility_batch(
                QueueUrl=self.queue_url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0}
                    for i, m in enumerate(messages)
                ],
            )
        except Exception:
            logger.exception("could not hand back %r unprocessed jobs", len(messages))
