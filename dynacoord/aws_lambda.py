"""Lambda event-source helpers: partial batch responses for SQS, Kinesis and DynamoDB Streams.

With ``ReportBatchItemFailures`` on the event source mapping, a handler returns the records that
failed and Lambda retries only those (SQS) or retries from the first of them (streams)::

    from dynacoord.aws_lambda import process_sqs_batch
    from dynacoord.backends.dynamodb import DynamoDBBackend

    backend = DynamoDBBackend.from_env()

    def record_handler(record):
        order = json.loads(record["body"])
        charge(order)

    def handler(event, context):
        return process_sqs_batch(event, record_handler, backend=backend, context=context)

With ``backend`` every record runs through ``backend.idempotency`` (key: the SQS
``messageId``, or ``key=`` a JMESPath expression or callable over the record), so a redelivered
batch (a timeout, a crash, a partial failure on an older runtime) never runs a record that
already succeeded: its stored result is replayed instead. A record whose handler raises is
reported in ``batchItemFailures`` and not retried in-process (its claim is released, so the
redelivery runs it again). A record that another invocation is running right now (its claim is
in progress) is reported too: SQS will deliver it again.

The remaining time of the invocation is honoured: a record is not started when less than
``margin_ms`` (default 1000 ms) remain, and every record not started is reported as failed, so a
batch cut short by the deadline is redelivered instead of lost. The Lambda context comes from
``context=`` or from :func:`dynacoord.idempotency.register_lambda_context`; it also bounds the
idempotency lease of each record (and of idempotent functions the record handler calls).

Ordering:

* SQS FIFO queues (``eventSourceARN`` ends in ``.fifo``): after the first failure no other
  record of the batch is started; all of them are reported, so the group's order is kept.
* Kinesis and DynamoDB Streams (``process_stream_batch``): processing stops at the first failure
  and that record's sequence number is reported: Lambda retries the shard from it, so a later
  record never runs before an earlier one succeeded.

When a ``backend`` is given, its metrics listener counts ``BatchRecordSucceeded``,
``BatchRecordFailed`` and ``BatchRecordNotStarted`` (``Primitive`` ``sqs`` or ``stream``) and
is flushed when the batch ends.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ._validate import check_int
from .errors import IdempotencyInProgressError, InvalidValueError
from .idempotency import _CURRENT_CONTEXT, IdempotencyOptions, compile_jmespath, lambda_context

if TYPE_CHECKING:
    from ._backend import Backend

__all__ = ["DEFAULT_MARGIN_MS", "process_sqs_batch", "process_stream_batch"]

logger = logging.getLogger(__name__)

#: A record is not started when less than this remains of the invocation (milliseconds).
DEFAULT_MARGIN_MS = 1000

RecordHandler = Callable[[dict[str, Any]], Any]
KeySpec = str | Callable[[dict[str, Any]], Any] | None


def process_sqs_batch(
    event: Mapping[str, Any],
    record_handler: RecordHandler,
    *,
    backend: Backend | None = None,
    key: KeySpec = None,
    context: Any = None,
    options: IdempotencyOptions | None = None,
    ttl: float | None = None,
    in_progress_ttl: float | None = None,
    output_type: Any = None,
    margin_ms: int = DEFAULT_MARGIN_MS,
) -> dict[str, list[dict[str, str]]]:
    """Run ``record_handler(record)`` for each SQS record; return the partial batch response
    ``{"batchItemFailures": [{"itemIdentifier": messageId}, ...]}``.

    ``backend``: run each record once per ``key`` (default the ``messageId``; a JMESPath
    expression such as ``"json(body).order_id"`` or a callable over the record), with
    ``options`` (an :class:`~dynacoord.idempotency.IdempotencyOptions`, as ``@idempotent``
    takes it); ``ttl``, ``in_progress_ttl`` and ``output_type``, when given, take the place of
    the options' own. Any of them without ``backend`` is refused. ``context``: the Lambda context
    (its remaining time decides which records still start). See the module docstring for
    ordering and deadline rules.
    """
    records = _records(event, "SQS")
    ids = [_field(r, ("messageId",), "SQS", i) for i, r in enumerate(records)]
    fifo = any(str(r.get("eventSourceARN", "")).endswith(".fifo") for r in records)
    failed = _process(
        records,
        ids,
        record_handler,
        backend=backend,
        key=key,
        default_key=lambda record: record["messageId"],
        context=context,
        options=options,
        option_values={"ttl": ttl, "in_progress_ttl": in_progress_ttl, "output_type": output_type},
        margin_ms=margin_ms,
        stop_on_failure=fifo,
        primitive="sqs",
    )
    return {"batchItemFailures": [{"itemIdentifier": ids[i]} for i in failed]}


def process_stream_batch(
    event: Mapping[str, Any],
    record_handler: RecordHandler,
    *,
    backend: Backend | None = None,
    key: KeySpec = None,
    context: Any = None,
    options: IdempotencyOptions | None = None,
    ttl: float | None = None,
    in_progress_ttl: float | None = None,
    output_type: Any = None,
    margin_ms: int = DEFAULT_MARGIN_MS,
) -> dict[str, list[dict[str, str]]]:
    """The same for Kinesis and DynamoDB Streams records: ``itemIdentifier`` is the record's
    sequence number (``kinesis.sequenceNumber`` / ``dynamodb.SequenceNumber``).

    Records run in order and processing stops at the first failure (or the deadline): only that
    record is reported, and Lambda retries the shard from it. With ``backend`` the default key is
    ``eventSourceARN#eventID`` (unique per stream record), so the retried batch replays the
    records that had succeeded before the failure.
    """
    records = _records(event, "stream")
    ids = [
        _field(r, ("kinesis", "sequenceNumber"), "Kinesis", i)
        if "kinesis" in r
        else _field(r, ("dynamodb", "SequenceNumber"), "DynamoDB Streams", i)
        for i, r in enumerate(records)
    ]

    def default_key(record: dict[str, Any]) -> str:
        ident = record.get("eventID") or _sequence(record)
        source = record.get("eventSourceARN")
        return f"{source}#{ident}" if source else str(ident)

    failed = _process(
        records,
        ids,
        record_handler,
        backend=backend,
        key=key,
        default_key=default_key,
        context=context,
        options=options,
        option_values={"ttl": ttl, "in_progress_ttl": in_progress_ttl, "output_type": output_type},
        margin_ms=margin_ms,
        stop_on_failure=True,
        primitive="stream",
    )
    # Lambda checkpoints at the lowest reported sequence number: the first failure is enough.
    return {"batchItemFailures": [{"itemIdentifier": ids[i]} for i in failed[:1]]}


def _sequence(record: Mapping[str, Any]) -> str:
    if "kinesis" in record:
        return str(record["kinesis"]["sequenceNumber"])
    return str(record["dynamodb"]["SequenceNumber"])


def _records(event: Any, source: str) -> list[dict[str, Any]]:
    records = event.get("Records") if isinstance(event, Mapping) else None
    if not isinstance(records, list) or not all(isinstance(r, Mapping) for r in records):
        raise InvalidValueError(
            f"event must be a {source} event: a mapping with a 'Records' list of records, got "
            f"{type(event).__name__}"
        )
    return records


def _field(record: Mapping[str, Any], path: Sequence[str], source: str, index: int) -> str:
    value: Any = record
    for part in path:
        value = value.get(part) if isinstance(value, Mapping) else None
    if not isinstance(value, str) or not value:
        raise InvalidValueError(
            f"record {index} of the batch has no {'.'.join(path)}: is this a {source} event? "
            "(nothing was processed)"
        )
    return value


def _key_function(key: KeySpec, default: Callable[[dict[str, Any]], Any]) -> Callable[..., Any]:
    if key is None:
        return default
    if isinstance(key, str):
        return compile_jmespath(key, "key")
    if callable(key):
        return key
    raise TypeError(
        f"key must be a JMESPath expression, a callable or None, got {type(key).__name__}"
    )


def _process(
    records: list[dict[str, Any]],
    ids: list[str],
    record_handler: RecordHandler,
    *,
    backend: Backend | None,
    key: KeySpec,
    default_key: Callable[[dict[str, Any]], Any],
    context: Any,
    options: IdempotencyOptions | None,
    option_values: dict[str, Any],
    margin_ms: int,
    stop_on_failure: bool,
    primitive: str,
) -> list[int]:
    """Indexes of the records to report (failed or not started), in batch order."""
    if not callable(record_handler):
        raise TypeError(f"record_handler must be callable, got {type(record_handler).__name__}")
    check_int(margin_ms, "margin_ms", minimum=0)
    if context is not None and not callable(getattr(context, "get_remaining_time_in_millis", None)):
        raise TypeError(
            "context must be the Lambda context object (it has get_remaining_time_in_millis), "
            f"got {type(context).__name__}"
        )
    handler: Callable[[dict[str, Any]], Any] = record_handler
    metrics = None
    given = {name: value for name, value in option_values.items() if value is not None}
    if backend is not None:
        handler = backend.idempotency.idempotent(
            IdempotencyOptions.of(options, **given), key=_key_function(key, default_key)
        )(record_handler)
        metrics = backend.metrics.scope(Primitive=primitive, DynacoordNamespace=backend.namespace)
    elif key is not None or options is not None or given:
        named = [n for n, v in (("key", key), ("options", options)) if v is not None] + list(given)
        raise TypeError(
            f"{', '.join(n + '=' for n in named)} need backend= (they are how each record runs "
            "once: its idempotency key and options)"
        )
    if context is None:
        context = lambda_context()
    registered = _CURRENT_CONTEXT.set(context) if context is not None else None
    failed: list[int] = []
    stopped = False
    try:
        for index, record in enumerate(records):
            if stopped:
                failed.append(index)
                continue
            if context is not None and context.get_remaining_time_in_millis() < margin_ms:
                logger.warning(
                    "%d ms left of the invocation: records %d..%d of %d not started, reported "
                    "as failed",
                    context.get_remaining_time_in_millis(),
                    index,
                    len(records) - 1,
                    len(records),
                )
                stopped = True
                failed.append(index)
                if metrics is not None:
                    metrics.count("BatchRecordNotStarted", len(records) - index)
                continue
            try:
                handler(record)
            except Exception as exc:
                if isinstance(exc, IdempotencyInProgressError):
                    logger.info("record %s is being processed by another invocation", ids[index])
                else:
                    logger.exception("record %s failed", ids[index])
                failed.append(index)
                stopped = stop_on_failure
                if metrics is not None:
                    metrics.count("BatchRecordFailed")
            else:
                if metrics is not None:
                    metrics.count("BatchRecordSucceeded")
    finally:
        if registered is not None:
            _CURRENT_CONTEXT.reset(registered)
        if backend is not None:
            backend.metrics.flush()
    return failed
