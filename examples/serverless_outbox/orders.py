"""The publishing side of the serverless outbox example: an API Gateway handler.

``place_order`` stores an ``order.placed`` event in the outbox and returns. It does not talk to
SQS or EventBridge itself: the table's stream hands the new event to the bundled stack's relay
function within about a second, and the relay (``relay_handlers.HANDLERS``) sends it on. If
SQS is down, the publish still succeeds; the event waits in the table and the relay's retries
and the scheduled sweeper deliver it later.

To store the order itself in the same atomic write, publish inside a transaction (see
``examples/lambda_outbox.py``)::

    with backend.transaction() as tx:
        tx.put("orders", {"pk": f"order#{order_id}", ...}, condition="attribute_not_exists(pk)")
        tx.publish(event)

Environment (the stack's outputs): ``DYNACOORD_TABLE``, ``DYNACOORD_NAMESPACE`` (the stack's
``RelayNamespace``). Attach the stack's ``AccessPolicyArn`` to this function's role.

Try it from a shell: ``python orders.py o-1 alice 1250``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from dynacoord import DynamoDBBackend, Event

# Built once per container (at cold start), reused by every invocation.
backend = DynamoDBBackend.from_env()


def place_order(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """POST /orders with ``{"order_id", "customer", "total_cents"}``."""
    try:
        body = json.loads(event.get("body") or "{}")
        order = {
            "order_id": str(body["order_id"]),
            "customer": str(body["customer"]),
            "total_cents": int(body["total_cents"]),
        }
    except (ValueError, KeyError, TypeError) as exc:
        return {"statusCode": 400, "body": json.dumps({"error": f"bad order: {exc}"})}
    placed = Event(
        "order.placed",
        order,
        id=f"order-placed-{order['order_id']}",  # a client retry publishes nothing new
        # the message group on a FIFO queue; no order is promised here: these events are
        # unordered (ordered=True gives a group's order) and a standard queue ignores it
        group=order["customer"],
    )
    backend.outbox.publish(placed)
    return {"statusCode": 202, "body": json.dumps({"event": placed.id})}


if __name__ == "__main__":
    order_id, customer, total = sys.argv[1:4]
    request = {
        "body": json.dumps({"order_id": order_id, "customer": customer, "total_cents": total})
    }
    print(place_order(request, None))
