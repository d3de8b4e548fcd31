"""An AWS Lambda handler that processes each order exactly once, resuming long jobs from checkpoints.

Deploy it with ``DYNACOORD_TABLE`` (and optionally ``DYNACOORD_NAMESPACE``) set and an IAM role
allowed to use the table (``dynacoord iam-policy``). Locally, point ``DYNACOORD_ENDPOINT_URL`` at
DynamoDB Local.

How the pieces fit:

* ``@backend.idempotent`` keys each invocation by ``detail.order_id``. A redelivered event (SQS,
  EventBridge and Lambda retries are at-least-once) replays the stored result in one request
  instead of processing the order again; the same order id with a different ``detail`` is refused
  with ``IdempotencyKeyMismatchError``. The in-progress lease is bounded by the invocation's
  remaining time, so if Lambda kills a timed-out invocation the retry can take the key over.
* The order's lines are processed in batches, with a checkpoint after each batch. When the
  invocation runs low on time it raises :class:`OutOfTime`: the idempotency claim is released
  (errors are not cached), Lambda retries the event, and the retry resumes after the last
  checkpoint instead of starting over. Once the order is done its checkpoints are deleted.
"""

from __future__ import annotations

from typing import Any

from dynacoord import DynamoDBBackend

# Built once per container at import time and reused by every warm invocation.
backend = DynamoDBBackend.from_env()

#: lines per checkpoint
BATCH = 10
#: stop and let Lambda retry when less time than this is left (milliseconds)
MIN_REMAINING_MS = 10_000


class OutOfTime(Exception):  # noqa: N818  (a signal to Lambda to retry, not a failure)
    """Raised when the invocation is about to time out; progress so far is checkpointed."""


def process_line(order_id: str, line: dict[str, Any]) -> int:
    """One line's work (here: its amount in cents); real code would call a downstream service."""
    return int(line["quantity"]) * int(line["unit_price_cents"])


@backend.idempotent(key="detail.order_id", payload="detail", ttl=24 * 3600)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    detail = event["detail"]
    order_id = detail["order_id"]
    lines = detail["lines"]
    with backend.checkpoints.task(
        f"order-lines:{order_id}", ttl=7 * 24 * 3600, cleanup_on_success=True
    ) as task:
        resumed_from = task.latest.data["next"] if task.latest else 0
        state = task.latest.data if task.latest else {"next": 0, "total_cents": 0}
        while state["next"] < len(lines):
            if context.get_remaining_time_in_millis() < MIN_REMAINING_MS:
                raise OutOfTime(
                    f"order {order_id}: {state['next']} of {len(lines)} lines done, retry resumes"
                )
            batch = lines[state["next"] : state["next"] + BATCH]
            total = state["total_cents"] + sum(process_line(order_id, line) for line in batch)
            state = {"next": state["next"] + len(batch), "total_cents": total}
            task.save(state, progress=100 * state["next"] / len(lines))
    return {
        "order_id": order_id,
        "lines": len(lines),
        "total_cents": state["total_cents"],
        "resumed_from_line": resumed_from,
    }
