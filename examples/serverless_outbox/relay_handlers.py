"""The delivering side of the serverless outbox example: the handlers the bundled stack's relay
and sweeper run (``dynacoord stack deploy --relay relay_handlers:HANDLERS``).

Every event goes to the SQS queue and/or the EventBridge bus named in the stack parameter
``HandlerSettings`` (``{"queue_url": "...", "event_bus": "..."}``, read with
``handler_settings()``). A send that fails raises, so the outbox reschedules the event with
backoff and the sweeper retries it; after ``max_attempts`` it is listed by
``dynacoord outbox failed``. Delivery is at least once: on a FIFO queue the event id is the
deduplication id, so a repeat within SQS's 5 minutes is dropped; otherwise make consumers
idempotent on the event id.

The functions' role needs permission to send: pass a managed policy that allows
``sqs:SendMessage`` / ``events:PutEvents`` in the stack parameter ``RelayPolicyArns``.

``on_stalled`` is the sweeper's callback for workflow runs without a heartbeat for
``ReconcileAfter`` seconds (``--reconcile relay_handlers:on_stalled``): here it publishes a
``run.stalled`` event, which this relay then delivers like any other.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import boto3

from dynacoord import DynamoDBBackend, Event, EventBridgeRelay, SQSRelay
from dynacoord.errors import ConfigurationError
from dynacoord.serverless import handler_settings

logger = logging.getLogger(__name__)

settings = handler_settings()
targets: list[Any] = []
if settings.get("queue_url"):
    targets.append(SQSRelay(boto3.client("sqs"), settings["queue_url"]))
if settings.get("event_bus"):
    targets.append(EventBridgeRelay(boto3.client("events"), settings["event_bus"], source="orders"))
if not targets:
    raise ConfigurationError(
        'HandlerSettings names no target: give {"queue_url": ...} and/or {"event_bus": ...}'
    )


def relay(event: Event) -> None:
    """Send one event to every target (a failure raises: the outbox retries the event)."""
    for target in targets:
        target(event)


#: what the relay and the sweeper deliver with (``--relay relay_handlers:HANDLERS``)
HANDLERS = relay


@functools.cache
def _backend() -> DynamoDBBackend:
    return DynamoDBBackend.from_env()


def on_stalled(run: Any) -> None:
    """A workflow run stopped sending heartbeats: announce it (delivered by the relay)."""
    logger.warning("run %r stalled since %r", run.run_id, run.updated_at)
    _backend().outbox.publish(
        Event(
            "run.stalled", {"run_id": run.run_id}, id=f"run-stalled-{run.run_id}-{run.reconciles}"
        )
    )
