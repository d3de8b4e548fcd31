"""The transactional outbox in two Lambda functions.

``place_order`` (behind API Gateway) writes the order to the application's own table AND publishes
an ``order.placed`` event in ONE DynamoDB transaction: either both are stored or neither, so there
is never an order without its event, nor an event for an order that was rolled back.

``deliver_events`` (on an EventBridge schedule, e.g. ``rate(1 minute)``) claims due events and
hands them to handlers; with ``OUTBOX_QUEUE_URL`` set it relays every event to SQS instead.
Failed handlers are retried with backoff; after 5 attempts events are ``failed`` and listed by
``dynacoord outbox failed`` (``dynacoord outbox retry ID`` sends them again).

Environment: ``DYNACOORD_TABLE`` (the dynacoord table), ``ORDERS_TABLE`` (your table, key ``pk``),
optional ``OUTBOX_QUEUE_URL``. Keep the worker's ``lease`` below the function timeout, and give
the function at least ``lease`` seconds more than one poll needs.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from dynacoord import DynamoDBBackend, Event, SQSRelay, TransactionCancelledError

logger = logging.getLogger(__name__)

# Built once per container (at cold start), reused by every invocation.
backend = DynamoDBBackend.from_env()
ORDERS_TABLE = os.environ.get("ORDERS_TABLE", "orders")

#: what send_confirmation did (a stand-in for an e-mail service in this example)
CONFIRMATIONS: list[dict[str, Any]] = []


def place_order(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """POST /orders: store the order and its ``order.placed`` event atomically."""
    try:
        body = json.loads(event.get("body") or "{}")
        order_id = str(body["order_id"])
        customer = str(body["customer"])
        total_cents = int(body["total_cents"])
    except (ValueError, KeyError, TypeError) as exc:
        return {"statusCode": 400, "body": json.dumps({"error": f"bad order: {exc}"})}

    placed = Event(
        "order.placed",
        {"order_id": order_id, "customer": customer, "total_cents": total_cents},
        id=f"order-placed-{order_id}",  # one event per order, whatever happens
        # the message group on a FIFO queue; no order is promised here: these events are
        # unordered (ordered=True gives a group's order) and a standard queue ignores it
        group=customer,
        metadata={"request_id": getattr(context, "aws_request_id", None)},
    )
    try:
        with backend.transaction() as tx:
            tx.put(
                ORDERS_TABLE,
                {"pk": f"order#{order_id}", "customer": customer, "total_cents": total_cents},
                condition="attribute_not_exists(pk)",
            )
            tx.publish(placed)
    except TransactionCancelledError as exc:
        # The order exists already (a client retry): nothing was written this time.
        logger.info("order %r not placed: %s", order_id, exc)
        return {"statusCode": 409, "body": json.dumps({"error": "order exists"})}
    return {"statusCode": 201, "body": json.dumps({"order_id": order_id, "event": placed.id})}


def send_confirmation(event: Event) -> None:
    """Handler of ``order.placed``. Make handlers idempotent on ``event.id``: delivery is at
    least once (a worker that dies mid-event has it delivered again after its lease)."""
    if any(c["event_id"] == event.id for c in CONFIRMATIONS):
        return
    CONFIRMATIONS.append(
        {"event_id": event.id, "order_id": event.payload["order_id"], "attempt": event.attempt}
    )


def _handlers() -> Any:
    queue_url = os.environ.get("OUTBOX_QUEUE_URL")
    if queue_url:
        import boto3

        return SQSRelay(boto3.client("sqs"), queue_url)
    return {"order.placed": send_confirmation}


def deliver_events(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Scheduled worker: poll until nothing is due or the invocation is about to time out."""
    worker = backend.outbox.worker(_handlers(), batch_size=25, lease=30.0, max_attempts=5)
    handled = 0
    # Stop claiming while a whole lease still fits in the remaining time (checked before every
    # claim, not only between polls: one poll can hold 25 events).
    def time_for_one_more() -> bool:
        return bool(context.get_remaining_time_in_millis() > 35_000)

    while time_for_one_more():
        n = worker.run_once(keep_going=time_for_one_more)
        handled += n
        if n == 0:
            break
    return {
        "handled": handled,
        "delivered": worker.delivered,
        "retried": worker.retried,
        "failed": worker.failed,
    }
