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
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from . import codec, keys
from ._clock import Clock, SystemClock, now_ms
from ._compat import StrEnum
from ._items import is_live, optional_int, optional_str
from ._validate import (
    check_bool,
    check_int,
    check_iterable,
    check_utf8,
    non_negative_seconds,
    ttl_to_ms,
)
from .errors import (
    ConfigurationError,
    DuplicateEventError,
    InvalidValueError,
    TransactionTooLargeError,
)

if TYPE_CHECKING:
    from .transaction import Transaction

__all__ = [
    "MAX_EVENTS_PER_PUBLISH",
    "Event",
    "EventRecord",
    "EventStatus",
    "Handler",
    "MissingHandlerPolicy",
    "Outbox",
    "OutboxStats",
    "OutboxStore",
    "OutboxWorker",
    "RetryOutcome",
    "RetryReport",
]

logger = logging.getLogger(__name__)

#: DynamoDB's TransactWriteItems limit: one publish writes at most this many events.
MAX_EVENTS_PER_PUBLISH = 100
#: ``last_error`` is cut to this many characters.
MAX_ERROR_CHARS = 2000
DEFAULT_RETENTION_SECONDS = 7 * 24 * 3600

Handler = Callable[["Event"], Any]
MissingHandlerPolicy = Literal["fail", "retry", "skip"]
RetryOutcome = Literal["retried", "not_found", "not_failed"]


class EventStatus(StrEnum):
    """Where an event is in its life."""

    PENDING = "pending"
    IN_FLIGHT = "in_flight"
    COMPLETED = "completed"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True, init=False)
class Event:
    """One outbox event. ``Event(type, payload, *, id=None, occurred_at=None, metadata=None,
    group=None)``.

    ``id`` defaults to a random UUID (hex) and identifies the event everywhere (store key, relay
    deduplication id): a retried publish of the same event is recognised by it. ``occurred_at``
    (epoch seconds) defaults to now. ``payload`` and ``metadata`` are any values the codec stores
    (JSON-compatible, plus bytes and Decimal); both are delivered as they went in. ``group`` is an
    ordering/partition hint for relays (the SQS FIFO message group). ``attempt`` is set by the
    worker on delivery: 1 on the first delivery, 2 on the first retry, ...
    """

    type: str
    payload: Any
    id: str
    occurred_at: float
    metadata: Mapping[str, Any]
    group: str | None
    attempt: int = field(default=0, compare=False)

    def __init__(
        self,
        type: str,
        payload: Any = None,
        *,
        id: str | None = None,
        occurred_at: float | None = None,
        metadata: Mapping[str, Any] | None = None,
        group: str | None = None,
        attempt: int = 0,
    ) -> None:
        if not isinstance(type, str) or not type:
            raise InvalidValueError(f"event type must be a non-empty str, got {type!r}")
        check_utf8(type, "event type")
        event_id = uuid.uuid4().hex if id is None else keys.validate_key(id, "event id")
        if occurred_at is None:
            occurred = time.time()
        else:
            if isinstance(occurred_at, bool) or not isinstance(occurred_at, (int, float)):
                raise TypeError(
                    f"occurred_at must be epoch seconds (int or float), got "
                    f"{occurred_at.__class__.__name__}"
                )
            occurred = float(occurred_at)
            if not math.isfinite(occurred):
                raise InvalidValueError(
                    f"occurred_at must be finite epoch seconds, got {occurred_at!r}"
                )
        if metadata is None:
            meta: dict[str, Any] = {}
        elif isinstance(metadata, Mapping):
            meta = dict(metadata)
        else:
            raise InvalidValueError(
                f"event metadata must be a mapping, got {metadata.__class__.__name__}"
            )
        if group is not None and (not isinstance(group, str) or not group):
            raise InvalidValueError(f"event group must be a non-empty str or None, got {group!r}")
        if group is not None:
            check_utf8(group, "event group")
        check_int(attempt, "attempt", minimum=0)
        # Refuse values that cannot be stored now, not when the worker reads them back.
        codec.encode(payload)
        codec.encode(meta)
        object.__setattr__(self, "type", type)
        object.__setattr__(self, "payload", payload)
        object.__setattr__(self, "id", event_id)
        object.__setattr__(self, "occurred_at", occurred)
        object.__setattr__(self, "metadata", meta)
        object.__setattr__(self, "group", group)
        object.__setattr__(self, "attempt", attempt)

    @classmethod
    def _restore(
        cls,
        *,
        type: str,
        payload: Any,
        id: str,
        occurred_at: float,
        metadata: Mapping[str, Any],
        group: str | None,
        attempt: int,
    ) -> Event:
        """Rebuild a stored event without re-validating it (it was validated when published)."""
        event = object.__new__(cls)
        for name, value in (
            ("type", type),
            ("payload", payload),
            ("id", id),
            ("occurred_at", occurred_at),
            ("metadata", dict(metadata)),
            ("group", group),
            ("attempt", attempt),
        ):
            object.__setattr__(event, name, value)
        return event

    def with_attempt(self, attempt: int) -> Event:
        """A copy with ``attempt`` set (what a handler receives)."""
        return Event._restore(
            type=self.type,
            payload=self.payload,
            id=self.id,
            occurred_at=self.occurred_at,
            metadata=self.metadata,
            group=self.group,
            attempt=attempt,
        )

    @property
    def occurred_at_ms(self) -> int:
        return int(self.occurred_at * 1000)

    def same_content(self, other: Event) -> bool:
        """True if ``other`` is this event published again (same id, type, payload, metadata,
        group; ``occurred_at`` and ``attempt`` are not compared)."""
        return (
            self.id == other.id
            and self.type == other.type
            and self.group == other.group
            and codec.encode(self.payload) == codec.encode(other.payload)
            and codec.encode(dict(self.metadata)) == codec.encode(dict(other.metadata))
        )

    def to_message(self) -> dict[str, Any]:
        """The envelope relays send: id, type, occurred_at, group, payload, metadata."""
        return {
            "id": self.id,
            "type": self.type,
            "occurred_at": self.occurred_at,
            "group": self.group,
            "payload": self.payload,
            "metadata": dict(self.metadata),
        }


@dataclass(frozen=True, slots=True)
class EventRecord:
    """A stored event with its delivery state (what ``get``/``failed``/``pending`` return).

    ``due_at_ms`` means: next attempt time (pending), lease expiry (in_flight), failure time
    (failed), completion time (completed).
    """

    event: Event
    status: EventStatus
    attempts: int
    due_at_ms: int
    lease_token: str | None = None
    last_error: str | None = None
    updated_at_ms: int | None = None

    @property
    def id(self) -> str:
        return self.event.id

    @property
    def type(self) -> str:
        return self.event.type

    @property
    def due_at(self) -> float:
        return self.due_at_ms / 1000

    @classmethod
    def from_item(cls, item: Mapping[str, Any] | None, now_ms: int) -> EventRecord | None:
        """The record a stored event holds (the same field names on every backend), or None if
        there is no event or it expired (a completed event past its retention)."""
        if not item or "event_id" not in item or not is_live(item, now_ms):
            return None
        metadata = item.get("metadata")
        attempts = int(item.get("attempts", 0))
        event = Event._restore(
            type=str(item["event_type"]),
            payload=codec.decode(str(item["payload"])),
            id=str(item["event_id"]),
            occurred_at=int(item["occurred_at_ms"]) / 1000,
            metadata=codec.decode(str(metadata)) if metadata is not None else {},
            group=optional_str(item, "event_group"),
            attempt=attempts,
        )
        due = item.get("due_ms", item.get("completed_ms", 0))
        return cls(
            event=event,
            status=EventStatus(str(item["status"])),
            attempts=attempts,
            due_at_ms=int(due),
            lease_token=str(item["lease_token"]) if item.get("lease_token") else None,
            last_error=str(item["last_error"]) if item.get("last_error") else None,
            updated_at_ms=optional_int(item, "updated_ms"),
        )

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly view (used by the CLI)."""
        return {
            "id": self.event.id,
            "type": self.event.type,
            "status": self.status.value,
            "attempts": self.attempts,
            "due_at": self.due_at,
            "occurred_at": self.event.occurred_at,
            "group": self.event.group,
            "last_error": self.last_error,
            "payload": self.event.payload,
            "metadata": dict(self.event.metadata),
        }


def pending_fields(event: Event, due_ms: int) -> dict[str, Any]:
    """The stored fields (keys aside) of a newly published event, pending and due at ``due_ms``:
    the same field names on every backend, read back by :meth:`EventRecord.from_item`."""
    fields: dict[str, Any] = {
        "event_id": event.id,
        "event_type": event.type,
        "payload": codec.encode(event.payload),
        "occurred_at_ms": event.occurred_at_ms,
        "status": EventStatus.PENDING.value,
        "attempts": 0,
        "due_ms": due_ms,
    }
    if event.metadata:
        fields["metadata"] = codec.encode(dict(event.metadata))
    if event.group is not None:
        fields["event_group"] = event.group
    return fields


@dataclass(frozen=True, slots=True)
class OutboxStats:
    """Event counts by status. ``due`` is the part of ``pending`` whose next attempt time has come.

    Completed events are not counted: they leave the listing index, and counting them would need
    a table scan.
    """

    pending: int
    due: int
    in_flight: int
    failed: int

    def as_dict(self) -> dict[str, int]:
        return {
            "pending": self.pending,
            "due": self.due,
            "in_flight": self.in_flight,
            "failed": self.failed,
        }


@dataclass(frozen=True, slots=True)
class RetryReport:
    """What :meth:`Outbox.retry_report` did with each id."""

    retried: list[str]
    not_found: list[str]
    not_failed: list[str]


class OutboxStore(Protocol):
    """Storage for outbox events. Every method is one request to the store.

    ``now_ms`` is passed in so that time is decided by the caller's injected clock. Index queries
    return ``(records, cursor)``; pass the cursor back for the next page, None means no more.
    """

    @property
    def shards(self) -> int:
        """How many index partitions each status is spread over."""
        ...

    def publish(self, events: Sequence[Event], now_ms: int) -> dict[str, EventRecord | None]:
        """Store ``events`` as pending and due now, all or nothing.

        Returns ``{}`` when written. If some ids are already stored, nothing is written and the
        result maps each clashing id to its stored record (None if the store could not say).
        """
        ...

    def transaction_entry(self, event: Event, now_ms: int) -> Any:
        """The backend's transaction entry that stores ``event`` as pending (no request)."""
        ...

    def get(self, event_id: str, now_ms: int) -> EventRecord | None:
        """The stored event, read consistently; completed events past retention are absent."""
        ...

    def query_page(
        self,
        status: EventStatus,
        shard: int,
        *,
        due_before_ms: int | None,
        limit: int,
        cursor: Any = None,
    ) -> tuple[list[EventRecord], Any]:
        """One page of the index of ``status`` in ``shard``, oldest due first, optionally only
        events with ``due_at_ms <= due_before_ms``."""
        ...

    def count_page(
        self, status: EventStatus, shard: int, *, due_before_ms: int | None, cursor: Any = None
    ) -> tuple[int, Any]:
        """How many events one page of that index holds."""
        ...

    def claim(
        self, seen: EventRecord, token: str, lease_until_ms: int, now_ms: int
    ) -> EventRecord | None:
        """Make the event in_flight under ``token`` if it is still as ``seen`` (same status and
        lease token) and due; count the attempt. None if someone else got it first."""
        ...

    def extend(self, event_id: str, token: str, lease_until_ms: int, now_ms: int) -> bool:
        """Move the lease expiry while ``token`` holds the claim."""
        ...

    def complete(self, event_id: str, token: str, now_ms: int, retention_ms: int | None) -> bool:
        """Mark completed (kept ``retention_ms``, or deleted when None) while ``token`` holds it."""
        ...

    def reschedule(
        self,
        event_id: str,
        token: str,
        due_ms: int,
        error: str | None,
        now_ms: int,
        *,
        count_attempt: bool = True,
    ) -> bool:
        """Back to pending, due at ``due_ms``, while ``token`` holds it. With
        ``count_attempt=False`` the claim's attempt is given back (released unhandled)."""
        ...

    def fail(self, event_id: str, token: str, error: str, now_ms: int) -> bool:
        """Mark failed (listed under failed, kept forever) while ``token`` holds it."""
        ...

    def retry_failed(self, event_id: str, now_ms: int) -> RetryOutcome:
        """Move an existing failed event back to pending with its attempts reset; never creates."""
        ...


def _error_text(exc: BaseException) -> str:
    # A handler's message may hold lone surrogates (bytes decoded with surrogateescape); escape
    # them, or the store write that records the failure would itself fail.
    text = f"{type(exc).__name__}: {exc}".encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def _as_events(events: Event | Iterable[Event]) -> list[Event]:
    items = (
        [events]
        if isinstance(events, Event)
        else check_iterable(events, "events", "Event objects", hint="pass one Event or a list")
    )
    for item in items:
        if not isinstance(item, Event):
            raise TypeError(f"publish takes Event objects, got {type(item).__name__}")
    seen: set[str] = set()
    for item in items:
        if item.id in seen:
            raise InvalidValueError(f"event id {item.id!r} appears twice in one publish")
        seen.add(item.id)
    return items


class Outbox:
    """The outbox of one namespace. Reached as ``backend.outbox``."""

    def __init__(self, store: OutboxStore, *, clock: Clock | None = None) -> None:
        self._store = store
        self.clock: Clock = clock or SystemClock()

    # -- publishing ---------------------------------------------------------------------------

    def publish(
        self, events: Event | Iterable[Event], *, tx: Transaction | None = None
    ) -> list[str]:
        """Store one or many events for delivery; return their ids.

        Without ``tx``: one atomic write of up to 100 events (more raise
        :class:`TransactionTooLargeError` before anything is written). Publishing an event whose id
        is already stored with the same content is a no-op (a retry after a lost response does not
        duplicate it); the same id with different content raises
        :class:`~dynacoord.errors.DuplicateEventError` and writes nothing.

        With ``tx`` (from ``backend.transaction()``): the events are added to that transaction and
        written when it commits, together with the caller's own writes.
        """
        items = _as_events(events)
        if tx is not None:
            now = now_ms(self.clock)
            tx._add_entries(
                [
                    (f"publish event {e.id!r}", e.id, self._store.transaction_entry(e, now))
                    for e in items
                ]
            )
            return [e.id for e in items]
        if len(items) > MAX_EVENTS_PER_PUBLISH:
            raise TransactionTooLargeError(
                f"publish of {len(items)} events: at most {MAX_EVENTS_PER_PUBLISH} events are "
                "written in one transaction; split them into several publish calls",
                size=len(items),
                limit=MAX_EVENTS_PER_PUBLISH,
            )
        if not items:
            return []
        self._publish(items)
        return [e.id for e in items]

    def _publish(self, items: list[Event]) -> None:
        clashes = self._store.publish(items, now_ms(self.clock))
        if not clashes:
            return
        by_id = {e.id: e for e in items}
        conflicting = [
            event_id
            for event_id, stored in clashes.items()
            if stored is None or not by_id[event_id].same_content(stored.event)
        ]
        if conflicting:
            raise DuplicateEventError(
                f"event id(s) {conflicting!r} already stored with different content; nothing "
                "was written",
                event_ids=conflicting,
            )
        # Every clash is this very event, stored by an earlier attempt whose answer was lost:
        # that is success for it. The first round wrote nothing, so publish the rest again.
        logger.info("events %r were already published", sorted(clashes))
        rest = [e for e in items if e.id not in clashes]
        if rest:
            self._publish(rest)

    # -- delivering ---------------------------------------------------------------------------

    def worker(
        self,
        handlers: Handler | Mapping[str, Handler],
        *,
        batch_size: int = 25,
        lease: float = 30.0,
        max_attempts: int = 5,
        backoff: float = 1.0,
        max_backoff: float = 300.0,
        poll_interval: float = 1.0,
        on_missing_handler: MissingHandlerPolicy = "fail",
        retention: float | None = DEFAULT_RETENTION_SECONDS,
        heartbeat: bool = True,
        name: str | None = None,
    ) -> OutboxWorker:
        """A worker that delivers due events to ``handlers`` (see :class:`OutboxWorker`)."""
        return OutboxWorker(
            self,
            handlers,
            batch_size=batch_size,
            lease=lease,
            max_attempts=max_attempts,
            backoff=backoff,
            max_backoff=max_backoff,
            poll_interval=poll_interval,
            on_missing_handler=on_missing_handler,
            retention=retention,
            heartbeat=heartbeat,
            name=name,
        )

    # -- management ---------------------------------------------------------------------------

    def get(self, event_id: str) -> EventRecord | None:
        """The stored event and its state, or None (never published, or completed and past its
        retention)."""
        keys.validate_key(event_id, "event id")
        return self._store.get(event_id, now_ms(self.clock))

    def failed(self, limit: int = 100) -> list[EventRecord]:
        """Failed events, oldest failure first, up to ``limit`` (every shard and page read)."""
        return self._list(EventStatus.FAILED, limit, None)

    def pending(self, limit: int = 100, *, due_only: bool = False) -> list[EventRecord]:
        """Pending events, earliest next attempt first, up to ``limit``."""
        due = check_bool(due_only, "due_only")
        return self._list(EventStatus.PENDING, limit, now_ms(self.clock) if due else None)

    def in_flight(self, limit: int = 100) -> list[EventRecord]:
        """Claimed events, earliest lease expiry first, up to ``limit``."""
        return self._list(EventStatus.IN_FLIGHT, limit, None)

    def _list(
        self, status: EventStatus, limit: int, due_before_ms: int | None
    ) -> list[EventRecord]:
        check_int(limit, "limit", minimum=1)
        found: list[EventRecord] = []
        for shard in range(self._store.shards):
            cursor: Any = None
            taken = 0
            while taken < limit:
                page, cursor = self._store.query_page(
                    status, shard, due_before_ms=due_before_ms, limit=limit - taken, cursor=cursor
                )
                found.extend(page)
                taken += len(page)
                if cursor is None:
                    break
        found.sort(key=lambda r: (r.due_at_ms, r.id))
        return found[:limit]

    def retry(self, ids: str | Iterable[str]) -> int:
        """Put failed events back to pending (due now, attempts reset); return how many moved.

        Only existing, failed events move; unknown ids and events in another state are logged
        and left alone (never created). :meth:`retry_report` says which id went where.
        """
        return len(self.retry_report(ids).retried)

    def retry_report(self, ids: str | Iterable[str]) -> RetryReport:
        """Like :meth:`retry`, reporting each id as retried, not_found or not_failed."""
        id_list = [ids] if isinstance(ids, str) else check_iterable(ids, "ids", "event ids")
        for event_id in id_list:
            keys.validate_key(event_id, "event id")
        report = RetryReport([], [], [])
        for event_id in dict.fromkeys(id_list):
            outcome = self._store.retry_failed(event_id, now_ms(self.clock))
            if outcome == "retried":
                report.retried.append(event_id)
            elif outcome == "not_found":
                report.not_found.append(event_id)
            else:
                report.not_failed.append(event_id)
        if report.not_found:
            logger.warning("retry: no such events %r (nothing created)", report.not_found)
        if report.not_failed:
            logger.warning("retry: events %r are not failed; left as they are", report.not_failed)
        return report

    def stats(self) -> OutboxStats:
        """Counts of pending (and due), in-flight and failed events (COUNT queries, every shard
        and page). Completed events are not counted (that would need a scan)."""
        now = now_ms(self.clock)

        def count(status: EventStatus, due_before: int | None = None) -> int:
            total = 0
            for shard in range(self._store.shards):
                cursor: Any = None
                while True:
                    n, cursor = self._store.count_page(
                        status, shard, due_before_ms=due_before, cursor=cursor
                    )
                    total += n
                    if cursor is None:
                        break
            return total

        return OutboxStats(
            pending=count(EventStatus.PENDING),
            due=count(EventStatus.PENDING, now),
            in_flight=count(EventStatus.IN_FLIGHT),
            failed=count(EventStatus.FAILED),
        )


class _LeaseKeeper(threading.Thread):
    """Extends one claim every ``interval`` seconds while its handler runs."""

    def __init__(self, worker: OutboxWorker, event_id: str, token: str, interval: float) -> None:
        super().__init__(name=f"dynacoord-outbox-lease-{event_id}", daemon=True)
        self._worker = worker
        self._event_id = event_id
        self._token = token
        self._interval = interval
        self._done = threading.Event()
        self.lost = False

    def run(self) -> None:
        worker = self._worker
        while not self._done.wait(self._interval):
            now = now_ms(worker.clock)
            try:
                ok = worker._store.extend(self._event_id, self._token, now + worker.lease_ms, now)
            except Exception:  # transient: the next beat may work, the lease still has time
                logger.exception("extending the lease of event %r failed", self._event_id)
                continue
            if not ok:
                self.lost = True
                logger.warning(
                    "event %r: lease lost while its handler runs (another worker may deliver it)",
                    self._event_id,
                )
                return

    def stop(self) -> None:
        self._done.set()
        if self.is_alive():
            self.join()


class OutboxWorker:
    """Delivers due events to handlers. Made by :meth:`Outbox.worker`.

    ``handlers`` maps an event type to a callable taking the :class:`Event` (key ``"*"`` catches
    every other type), or is one callable for every type. A handler that returns normally
    completes the event; one that raises schedules a retry after
    ``min(max_backoff, backoff * 2**(attempt-1))`` seconds (equal jitter: between half and all of
    it), and after ``max_attempts`` attempts the event is ``failed`` (listed by
    ``outbox.failed()``, never deleted).

    ``on_missing_handler`` decides about an event whose type has no handler: ``"fail"`` (default)
    marks it failed at once with an explaining ``last_error``; ``"retry"`` treats it like a
    handler error (backoff, then failed: for rolling deployments where a newer worker knows the
    type); ``"skip"`` completes it without delivery, with a warning in the log.

    Completed events are kept ``retention`` seconds (then DynamoDB's TTL removes them), or
    deleted at once with ``retention=None``.

    One worker runs its events one after another; run several workers (threads, processes,
    Lambdas) for parallelism. A worker is not meant to be shared between threads.
    """

    def __init__(
        self,
        outbox: Outbox,
        handlers: Handler | Mapping[str, Handler],
        *,
        batch_size: int = 25,
        lease: float = 30.0,
        max_attempts: int = 5,
        backoff: float = 1.0,
        max_backoff: float = 300.0,
        poll_interval: float = 1.0,
        on_missing_handler: MissingHandlerPolicy = "fail",
        retention: float | None = DEFAULT_RETENTION_SECONDS,
        heartbeat: bool = True,
        name: str | None = None,
    ) -> None:
        if isinstance(handlers, Mapping):
            for event_type, handler in handlers.items():
                if not isinstance(event_type, str) or not event_type:
                    raise ConfigurationError(
                        f"handler keys must be event types (non-empty str), got {event_type!r}"
                    )
                if not callable(handler):
                    raise ConfigurationError(f"handler for {event_type!r} is not callable")
            self._handlers: Mapping[str, Handler] | None = dict(handlers)
            self._handler: Handler | None = None
        elif callable(handlers):
            self._handlers = None
            self._handler = handlers
        else:
            raise ConfigurationError(
                f"handlers must be a callable or a mapping of event type to callable, got "
                f"{type(handlers).__name__}"
            )
        if on_missing_handler not in ("fail", "retry", "skip"):
            raise ConfigurationError(
                f"on_missing_handler must be 'fail', 'retry' or 'skip', got {on_missing_handler!r}"
            )
        self._outbox = outbox
        self._store = outbox._store
        self.clock = outbox.clock
        self.batch_size = check_int(batch_size, "batch_size", minimum=1, maximum=1000)
        self.lease_ms = ttl_to_ms(lease, "lease")
        self.max_attempts = check_int(max_attempts, "max_attempts", minimum=1)
        self.backoff = non_negative_seconds(backoff, "backoff")
        self.max_backoff = non_negative_seconds(max_backoff, "max_backoff")
        self.poll_interval = non_negative_seconds(poll_interval, "poll_interval")
        self.on_missing_handler: MissingHandlerPolicy = on_missing_handler
        self.retention_ms = None if retention is None else ttl_to_ms(retention, "retention")
        self.heartbeat = check_bool(heartbeat, "heartbeat")
        self.name = name or f"outbox-worker-{uuid.uuid4().hex[:8]}"
        # A plain flag, not a threading.Event: stop() may run in a signal handler, and Event.set()
        # there can deadlock on the lock the interrupted main thread holds inside Event.wait().
        self._stop_requested = False
        self._external_stop: threading.Event | None = None
        #: running totals since the worker was made
        self.delivered = 0
        self.retried = 0
        self.failed = 0
        self.lost = 0

    # -- loop -----------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the worker to stop: the event being handled is finished, no new one is claimed.

        Safe to call from a signal handler or another thread (it only sets a flag; a waiting
        :meth:`run` notices it within 50 ms). A stopped worker stays stopped.
        """
        self._stop_requested = True

    @property
    def stopping(self) -> bool:
        external = self._external_stop
        return self._stop_requested or (external is not None and external.is_set())

    def run(self, stop_event: threading.Event | None = None) -> None:
        """Poll and deliver until :meth:`stop` is called or ``stop_event`` is set.

        Sleeps ``poll_interval`` between polls that found nothing. Installs no signal handlers;
        for SIGTERM (containers, ECS) do it yourself::

            signal.signal(signal.SIGTERM, lambda signum, frame: worker.stop())
            worker.run()
        """
        self._external_stop = stop_event
        logger.info("%s: started", self.name)
        try:
            while not self.stopping:
                try:
                    handled = self.run_once()
                except Exception:  # a store outage must not end the loop; botocore retried
                    logger.exception("%s: poll failed", self.name)
                    handled = 0
                if handled == 0:
                    self._wait(self.poll_interval)
        finally:
            self._external_stop = None
            logger.info("%s: stopped", self.name)

    def _wait(self, seconds: float) -> None:
        # Short slices so that a stop() from a signal handler (a plain flag) is seen promptly.
        deadline = time.monotonic() + seconds
        while not self.stopping:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            external = self._external_stop
            if external is None:
                time.sleep(min(remaining, 0.05))
            else:
                external.wait(min(remaining, 0.05))

    def run_once(self, *, keep_going: Callable[[], bool] | None = None) -> int:
        """One poll: claim and handle up to ``batch_size`` due events; return how many were
        handled (successfully or not). For Lambda / cron: call it once per invocation.

        ``keep_going`` is asked before each claim; once it returns False nothing more is claimed
        (the event in hand is finished). In Lambda, stop while a whole lease still fits::

            worker.run_once(keep_going=lambda: context.get_remaining_time_in_millis() > 35_000)
        """
        if keep_going is not None and not callable(keep_going):
            raise TypeError(f"keep_going must be callable, got {type(keep_going).__name__}")
        if keep_going is not None and not keep_going():
            return 0
        handled = 0
        candidates = self._poll()
        # Workers polling together see the same oldest events; a shuffled order spreads them.
        random.shuffle(candidates)
        for seen in candidates:
            if self.stopping or (keep_going is not None and not keep_going()):
                break
            token = uuid.uuid4().hex
            now = now_ms(self.clock)
            record = self._store.claim(seen, token, now + self.lease_ms, now)
            if record is None:
                continue  # someone else claimed it first, or it is not due any more
            self._process(record, token)
            handled += 1
        return handled

    def _poll(self) -> list[EventRecord]:
        now = now_ms(self.clock)
        shards = self._store.shards
        start = random.randrange(shards)
        found: list[EventRecord] = []
        # Expired leases first: they are older than anything pending.
        for status in (EventStatus.IN_FLIGHT, EventStatus.PENDING):
            for i in range(shards):
                shard = (start + i) % shards
                cursor: Any = None
                while len(found) < self.batch_size:
                    page, cursor = self._store.query_page(
                        status,
                        shard,
                        due_before_ms=now,
                        limit=self.batch_size - len(found),
                        cursor=cursor,
                    )
                    found.extend(page)
                    if cursor is None:
                        break
                if len(found) >= self.batch_size:
                    return found
        return found

    # -- one event --------------------------------------------------------------------------------

    def _handler_for(self, event_type: str) -> Handler | None:
        if self._handler is not None:
            return self._handler
        assert self._handlers is not None
        return self._handlers.get(event_type) or self._handlers.get("*")

    def _process(self, record: EventRecord, token: str) -> None:
        event = record.event.with_attempt(record.attempts)
        if record.status is EventStatus.IN_FLIGHT and record.attempts > 1:
            logger.debug("%s: event %r attempt %d", self.name, event.id, record.attempts)
        if record.attempts > self.max_attempts:
            # Every earlier claim ended without an outcome: the worker was killed, ran out of
            # Lambda time or memory, or overran its lease. Each expired lease counted an attempt;
            # without this check an event that kills its worker would be redelivered forever
            # instead of ending in failed().
            self._failure(
                record,
                token,
                f"claimed {record.attempts} times; the last attempt ended without an outcome "
                "(worker crashed or overran its lease)",
            )
            return
        handler = self._handler_for(event.type)
        if handler is None:
            self._missing_handler(record, token)
            return
        keeper = (
            _LeaseKeeper(self, event.id, token, self.lease_ms / 3000) if self.heartbeat else None
        )
        if keeper is not None:
            keeper.start()
        try:
            handler(event)
        except Exception as exc:
            if keeper is not None:
                keeper.stop()
            logger.warning(
                "%s: handler for event %r (%s) failed on attempt %d: %s",
                self.name,
                event.id,
                event.type,
                record.attempts,
                _error_text(exc),
            )
            self._failure(record, token, _error_text(exc))
            return
        except BaseException:
            # KeyboardInterrupt / SystemExit: leave the claim; the lease runs out and any worker
            # recovers the event.
            if keeper is not None:
                keeper.stop()
            raise
        if keeper is not None:
            keeper.stop()
        now = now_ms(self.clock)
        if self._store.complete(event.id, token, now, self.retention_ms):
            self.delivered += 1
        else:
            self.lost += 1
            logger.warning(
                "%s: event %r was handled but its lease had been taken over; the new claimant "
                "owns it now (it may be delivered again)",
                self.name,
                event.id,
            )

    def _delay_ms(self, attempt: int) -> int:
        delay = min(self.max_backoff, self.backoff * 2 ** max(0, attempt - 1))
        # Equal jitter: at least half the delay (backoff is kept), the rest spread out.
        jittered = delay / 2 + random.uniform(0, delay / 2)
        return int(jittered * 1000)

    def _failure(self, record: EventRecord, token: str, error: str) -> None:
        now = now_ms(self.clock)
        if record.attempts >= self.max_attempts:
            ok = self._store.fail(record.id, token, error, now)
            if ok:
                self.failed += 1
                logger.error(
                    "%s: event %r (%s) failed after %d attempts: %s",
                    self.name,
                    record.id,
                    record.type,
                    record.attempts,
                    error,
                )
        else:
            ok = self._store.reschedule(
                record.id, token, now + self._delay_ms(record.attempts), error, now
            )
            if ok:
                self.retried += 1
        if not ok:
            self.lost += 1
            logger.warning(
                "%s: event %r: lease lost before the failure was recorded", self.name, record.id
            )

    def _missing_handler(self, record: EventRecord, token: str) -> None:
        error = f"no handler for event type {record.type!r}"
        policy = self.on_missing_handler
        if policy == "skip":
            logger.warning("%s: event %r skipped: %s", self.name, record.id, error)
            if not self._store.complete(record.id, token, now_ms(self.clock), self.retention_ms):
                self.lost += 1
            return
        if policy == "retry":
            logger.warning("%s: event %r: %s (will retry)", self.name, record.id, error)
            self._failure(record, token, error)
            return
        logger.error("%s: event %r marked failed: %s", self.name, record.id, error)
        if self._store.fail(record.id, token, error, now_ms(self.clock)):
            self.failed += 1
        else:
            self.lost += 1

    def __repr__(self) -> str:
        return f"OutboxWorker(name={self.name!r}, batch_size={self.batch_size})"
