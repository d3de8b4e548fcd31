"""The transactional outbox: publish events with (or inside) your writes, deliver them with workers.

Policy lives here (claiming, leases and heartbeats, backoff with jitter, the failed state, missing
handlers, graceful stop); a backend supplies an :class:`OutboxStore` whose methods are one request
each.

Life of an event::

    publish ──> pending ──claim──> in_flight ──handler ok──> completed (TTL after ``retention``)
                  ^  ^                 │  │
                  │  └──backoff────────┘  └──attempts == max_attempts──> failed ──retry()──┐
                  │                                                                      │
                  └──────────────────────────────────────────────────────────────────────┘
    in_flight whose lease expired (worker crashed) ──claim by any worker──> in_flight

Each status has its own listing index partition (sharded), sorted by a due time: the next attempt
for ``pending``, the lease expiry for ``in_flight`` (so zombies are found with the same query), the
failure time for ``failed``. ``completed`` events leave the index.

The races the conditions close:

* Two workers see the same due event and both try to claim it: the claim is a conditional write on
  the status and due time (and the lease token they saw), so exactly one wins; the loser skips it.
* Worker A's lease expires mid-handler, worker B claims the event (new lease token), then A
  finishes: A's completion is conditional on *its* token, so it changes nothing (B's claim stands;
  the event was delivered twice, which at-least-once delivery allows and the log reports).
* A worker sees a stale copy of an event in the (eventually consistent) index after someone else
  already handled it: the claim condition re-checks status and due time on the item itself.

Delivery is at least once: no duplicates while no worker crashes or overruns its lease (long
handlers extend the lease with a heartbeat every ``lease / 3``). Make handlers idempotent on
``event.id`` for the remaining cases.

The package's parts: :mod:`.event` (the event model), :mod:`.store` (the storage protocol a
backend implements), :mod:`.publisher` (``backend.outbox``: publish and manage) and
:mod:`.worker` (polling), :mod:`.delivery` (the engine the worker and the stream relay share),
:mod:`.options` (a worker's options). Imports run event → options → store → delivery → worker →
publisher.
"""

from __future__ import annotations

from .event import DELIVERY_ROOM, Event, EventRecord, EventStatus, order_key, pending_fields
from .options import DEFAULT_RETENTION_SECONDS, DeliveryHooks, MissingHandlerPolicy, WorkerOptions
from .publisher import MAX_EVENTS_PER_PUBLISH, Outbox
from .store import (
    ORDERED_RECHECK_MS,
    OutboxStats,
    OutboxStore,
    Outcome,
    OutcomeKind,
    RetryOutcome,
    RetryReport,
    TransactionEntries,
)
from .worker import Handler, OutboxWorker

__all__ = [
    "DEFAULT_RETENTION_SECONDS",
    "DELIVERY_ROOM",
    "MAX_EVENTS_PER_PUBLISH",
    "ORDERED_RECHECK_MS",
    "DeliveryHooks",
    "Event",
    "EventRecord",
    "EventStatus",
    "Handler",
    "MissingHandlerPolicy",
    "Outbox",
    "OutboxStats",
    "OutboxStore",
    "OutboxWorker",
    "Outcome",
    "OutcomeKind",
    "RetryOutcome",
    "RetryReport",
    "TransactionEntries",
    "WorkerOptions",
    "order_key",
    "pending_fields",
]
