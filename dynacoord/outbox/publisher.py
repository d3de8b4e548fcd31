"""The publishing and management side: :class:`Outbox` (``backend.outbox``)."""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from typing_extensions import Unpack

from .. import keys, tracing
from .._clock import Clock, SystemClock, now_ms
from .._validate import (
    check_bool,
    check_int,
    check_iterable,
    check_utf8,
)
from ..errors import (
    ConfigurationError,
    DuplicateEventError,
    InvalidValueError,
    TransactionTooLargeError,
    ValueTooLargeError,
)
from ..metrics import NO_SCOPE, MetricsScope
from .event import Event, EventRecord, EventStatus, new_event_id
from .options import DeliveryHooks, WorkerKeywords, WorkerOptions, WorkerOptionValues
from .store import OutboxStats, OutboxStore, RetryReport, TransactionEntries
from .worker import Handler, OutboxWorker, WorkerGroup

if TYPE_CHECKING:
    from .stream import StreamHandler, SweepHandler

__all__ = ["MAX_EVENTS_PER_PUBLISH", "Outbox"]

logger = logging.getLogger(__name__)

#: DynamoDB's TransactWriteItems limit: one publish writes at most this many events.
MAX_EVENTS_PER_PUBLISH = 100


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


def _traced(event: Event, carrier: Mapping[str, str]) -> Event:
    """``event`` with the trace context ``carrier`` in its metadata (see :mod:`dynacoord.tracing`),
    or ``event`` itself when its metadata already holds a trace context of the caller's own."""
    metadata = event.metadata
    if metadata and tracing.has_trace(metadata):
        return event
    return Event._restore(
        type=event.type,
        payload=event.payload,
        id=event.id,
        occurred_at=event.occurred_at,
        metadata={**metadata, **carrier},
        group=event.group,
        attempt=event.attempt,
        ordered=event.ordered,
    )


def _untraced(event: Event) -> Event:
    """``event`` without the trace keys in its metadata: what a clash compares (a publish
    retried under another trace is the same event)."""
    if not event.metadata or not tracing.has_trace(event.metadata):
        return event
    return Event._restore(
        type=event.type,
        payload=event.payload,
        id=event.id,
        occurred_at=event.occurred_at,
        metadata=tracing.without_trace(event.metadata),
        group=event.group,
        attempt=event.attempt,
        ordered=event.ordered,
    )


class Outbox:
    """The outbox of one namespace. Reached as ``backend.outbox``."""

    def __init__(
        self, store: OutboxStore, *, clock: Clock | None = None, metrics: MetricsScope | None = None
    ) -> None:
        self._store = store
        self.clock: Clock = clock or SystemClock()
        self._metrics = metrics if metrics is not None else NO_SCOPE
        #: the workers this outbox makes: they spread over the shards and take turns at them
        self._workers = WorkerGroup()

    # -- publishing ---------------------------------------------------------------------------

    def publish(
        self, events: Event | Iterable[Event], *, tx: TransactionEntries | None = None
    ) -> list[str]:
        """Store one or many events for delivery; return their ids.

        Without ``tx``: one atomic write of up to 100 items, one per event and one per ordered
        group (its gate); more raise :class:`TransactionTooLargeError` before anything is
        written. Publishing an event whose id is already stored with the same content is a
        no-op (a retry after a lost response does not duplicate it); the same id with different
        content raises
        :class:`~dynacoord.errors.DuplicateEventError` and writes nothing.

        With ``tx`` (from ``backend.transaction()``): the events are added to that transaction and
        written when it commits, together with the caller's own writes.

        Both ways record the caller's trace context in each event's metadata (see
        :mod:`dynacoord.tracing`; with tracing off or unavailable, nothing).
        """
        if tx is not None:
            carrier = tracing.capture() if tracing.capturing else None
            items = _as_events(events)
            now = now_ms(self.clock)
            tx._add_entries(
                [(("publish event", e.id), e.id, *self._entry(e, carrier, now)) for e in items]
            )
            ids = [e.id for e in items]
            if self._metrics.enabled and ids:  # counted once written, as a direct publish is
                count = functools.partial(self._metrics.count, "OutboxPublished", len(ids))
                tx._on_commit(count)
            return ids
        items = _as_events(events)
        if len(items) > MAX_EVENTS_PER_PUBLISH:
            raise TransactionTooLargeError(
                f"publish of {len(items)} events: at most {MAX_EVENTS_PER_PUBLISH} events are "
                "written in one transaction; split them into several publish calls",
                size=len(items),
                limit=MAX_EVENTS_PER_PUBLISH,
            )
        groups = {e.group for e in items if e.ordered}
        if len(items) + len(groups) > MAX_EVENTS_PER_PUBLISH:
            # Each ordered group's gate is one more item of the publish's transaction on
            # DynamoDB: checked here, before anything is sent, so that every backend refuses the
            # same publishes (Redis and MongoDB could write more, DynamoDB cannot).
            raise TransactionTooLargeError(
                f"publish of {len(items)} events in {len(groups)} ordered groups: "
                f"{len(items) + len(groups)} items (one per event and one per ordered group's "
                f"gate), at most {MAX_EVENTS_PER_PUBLISH} are written in one transaction; "
                "split them into several publish calls (an ordered group's events keep their "
                "order across calls)",
                size=len(items) + len(groups),
                limit=MAX_EVENTS_PER_PUBLISH,
            )
        if not items:
            return []
        ids = [e.id for e in items]
        # Captured once the events are known good: a refused publish records nothing.
        carrier = tracing.capture() if tracing.capturing else None
        if carrier is None:
            self._publish(items)
        else:
            self._publish_traced(items, carrier)
        if self._metrics.enabled:
            self._metrics.count("OutboxPublished", len(ids))
        return ids

    def _entry(self, event: Event, carrier: Mapping[str, str] | None, now: int) -> tuple[Any, int]:
        """The transaction entry of ``event``, with the trace context when it fits."""
        if carrier is not None:
            traced = _traced(event, carrier)
            if traced is not event:
                try:
                    return self._store.transaction_entry(traced, now)
                except ValueTooLargeError:
                    logger.debug("event %r stored without its trace context: no room", event.id)
        return self._store.transaction_entry(event, now)

    def _publish_traced(self, items: list[Event], carrier: Mapping[str, str]) -> None:
        """:meth:`_publish` of ``items`` with the trace context; an event that fits only
        without it is stored without it (every store checks sizes before writing anything)."""
        traced = [_traced(e, carrier) for e in items]
        while True:
            try:
                self._publish(traced)
                return
            except ValueTooLargeError as exc:
                index = next(
                    (
                        i
                        for i, (e, t) in enumerate(zip(items, traced, strict=True))
                        if e.id == exc.key and t is not e
                    ),
                    None,
                )
                if index is None:
                    raise  # too large without the trace context too
                logger.debug("event %r stored without its trace context: no room", exc.key)
                traced[index] = items[index]

    def _publish(self, items: list[Event]) -> None:
        clashes = self._store.publish(items, now_ms(self.clock))
        if not clashes:
            return
        by_id = {e.id: e for e in items}
        conflicting = [
            event_id
            for event_id, stored in clashes.items()
            if stored is None
            or not _untraced(by_id[event_id]).same_content(_untraced(stored.event))
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
        options: WorkerOptions | None = None,
        *,
        name: str | None = None,
        hooks: DeliveryHooks | None = None,
        on_delivered: Callable[[Event], Any] | None = None,
        on_error: Callable[[Event, Exception], Any] | None = None,
        on_failed: Callable[[Event], Any] | None = None,
        **option_values: Unpack[WorkerOptionValues],
    ) -> OutboxWorker:
        """A worker that delivers due events to ``handlers`` (see :class:`OutboxWorker`).

        Its options are ``options`` (a :class:`WorkerOptions`) with ``option_values`` in place
        of its own, by name (``batch_size=10, lease=60``: each name of :class:`WorkerOptions`);
        an unknown name is refused. ``hooks`` (a :class:`DeliveryHooks`) are called with the
        event after its outcome; the ``on_delivered`` / ``on_error`` / ``on_failed`` keywords
        are its deprecated spelling (a ``DeprecationWarning``; refused beside ``hooks``)."""
        return OutboxWorker(
            self._store,
            handlers,
            clock=self.clock,
            options=WorkerOptions.of(options, **option_values),
            hooks=_hooks(hooks, on_delivered, on_error, on_failed),
            name=name,
            metrics=self._metrics,
            group=self._workers,
        )

    def stream_handler(
        self,
        handlers: Handler | Mapping[str, Handler],
        *,
        claim: bool = False,
        clock_skew: float = 2.0,
        **worker_options: Unpack[WorkerKeywords],
    ) -> StreamHandler:
        """A Lambda handler for the table's DynamoDB stream that delivers each new event of this
        namespace as it is published and returns ``{"batchItemFailures": [...]}`` listing only
        records whose outcome could not be stored. ``worker_options`` are :meth:`worker`'s.

        By default an event costs one write, its outcome: the relay owns a new event for one
        lease after it became due, and polling workers made by :meth:`sweep_handler` leave it
        alone meanwhile (their ``leave_new_for``); give both the same ``lease``. The relay
        starts a handler without a claim only while enough of that lease is left: the
        ``clock_skew`` to the sweepers (seconds), a second for the outcome and one heartbeat
        (a third of the lease); a handler still running at its first heartbeat gets its event
        claimed and kept as a worker keeps it, and an event with less time left is claimed
        before its handler starts. ``claim=True`` claims every event first (two writes per
        event). Ordered events are always claimed (their group's gate moves with the claim).
        DynamoDB backend only. See :mod:`dynacoord.outbox.stream`."""
        from .stream import StreamHandler

        return StreamHandler(
            self.worker(handlers, **worker_options),
            self._store,
            claim=check_bool(claim, "claim"),
            clock_skew=clock_skew,
        )

    def sweep_handler(
        self,
        handlers: Handler | Mapping[str, Handler],
        *,
        runs: Any = None,
        stalled_after: float = 300.0,
        on_stalled: Callable[[Any], Any] | None = None,
        **worker_options: Unpack[WorkerKeywords],
    ) -> SweepHandler:
        """A Lambda handler for a schedule: polling passes for due retries, expired leases and
        events the stream relay missed, then (with ``runs=backend.runs`` and ``on_stalled``)
        ``runs.reconcile(stalled_after, on_stalled)``. Its worker leaves a new event to the
        stream relay for one lease after it became due (``leave_new_for``: by default the lease
        where the store has a stream, the DynamoDB backend, else 0). See :mod:`dynacoord.outbox.stream`."""
        base = worker_options.get("options")
        base_share = base.leave_new_for if isinstance(base, WorkerOptions) else 0
        if worker_options.get("leave_new_for") is None and not base_share:
            # The relay's share: only a store with a stream (DynamoDB) has a relay.
            has_stream = callable(getattr(self._store, "stream_record", None))
            lease = worker_options.get("lease")
            if lease is None:
                lease = base.lease if isinstance(base, WorkerOptions) else WorkerOptions().lease
            worker_options["leave_new_for"] = lease if has_stream else 0
        return self._make_sweep_handler(
            self.worker(handlers, **worker_options),
            runs=runs,
            stalled_after=stalled_after,
            on_stalled=on_stalled,
        )

    def _make_sweep_handler(self, worker: OutboxWorker, **options: Any) -> SweepHandler:
        """The sweep handler around ``worker`` (a subclass may report more after a sweep)."""
        from .stream import SweepHandler

        return SweepHandler(worker, **options)

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
        for shard in range(self._shards()):
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

    def _shards(self) -> int:
        """The namespace's shard count, read again for every listing and count: a publisher (or
        a worker) with more shards may have started since this process last read it, and a
        count kept from then misses the events on the newer shards. One
        GetItem on DynamoDB (none on Redis and MongoDB), against one Query per shard and status
        that the listing costs anyway."""
        return max(1, self._store.refresh_shards())

    def retry(self, ids: str | Iterable[str] | None = None, *, group: str | None = None) -> int:
        """Put failed events back to pending (due now, attempts reset); return how many moved.

        ``retry(ids)``: only existing, failed events move; unknown ids and events in another
        state are logged and left alone (never created). A retried ordered event the group has
        already moved past is claimable at once, out of the group's order.

        ``retry(group=g)``: every failed ordered event of group ``g`` goes back to the end of the
        group in its original order: each takes a new place at the group's tail, as an ordered
        publish would, so the group delivers them one after another, after its events pending
        now. It reads every page of the failed index (every shard) to find them.

        :meth:`retry_report` says which id went where.
        """
        return len(self.retry_report(ids, group=group).retried)

    def retry_report(
        self, ids: str | Iterable[str] | None = None, *, group: str | None = None
    ) -> RetryReport:
        """Like :meth:`retry`, reporting each id as retried, not_found or not_failed (with
        ``group``: the ids moved, in their new order; not_failed lists events found failed that
        someone else moved before this call could)."""
        if (ids is None) == (group is None):
            raise TypeError(
                "retry takes ids or group=, exactly one of them: retry(['id-1']) moves those "
                "failed events, retry(group='g') every failed ordered event of group 'g'"
            )
        if group is not None:
            return self._retry_group(group)
        assert ids is not None
        id_list = [ids] if isinstance(ids, str) else check_iterable(ids, "ids", "event ids")
        for event_id in id_list:
            keys.validate_key(event_id, "event id")
        report = RetryReport([], [], [])
        for event_id in dict.fromkeys(id_list):
            outcome = self._store.retry_failed(event_id, now_ms(self.clock), new_event_id())
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

    def _retry_group(self, group: str) -> RetryReport:
        if not isinstance(group, str) or not group:
            raise InvalidValueError(f"event group must be a non-empty str, got {group!r}")
        check_utf8(group, "event group")
        # No index holds a group's failed events: read the whole failed index (every shard and
        # page) and keep the group's ordered ones, in their old order.
        found: dict[str, EventRecord] = {}
        for shard in range(self._shards()):
            cursor: Any = None
            while True:
                page, cursor = self._store.query_page(
                    EventStatus.FAILED, shard, due_before_ms=None, limit=1000, cursor=cursor
                )
                for record in page:
                    if record.seq is not None and record.event.group == group:
                        found.setdefault(record.id, record)
                if cursor is None:
                    break
        records = sorted(found.values(), key=lambda r: r.seq or 0)
        if not records:
            return RetryReport([], [], [])
        # One token for the call: a move sent again after its answer was lost finds it on the
        # events it moved, and neither moves them twice nor reports them missing.
        moved = self._store.retry_group(group, records, now_ms(self.clock), new_event_id())
        taken = set(moved)
        report = RetryReport(list(moved), [], [r.id for r in records if r.id not in taken])
        if report.not_failed:
            logger.warning(
                "retry: events %r of group %r were moved by someone else meanwhile; left as "
                "they are",
                report.not_failed,
                group,
            )
        return report

    def _lag_ms(self, shards: int, now: int) -> tuple[int | None, int | None]:
        """The age (ms) of the oldest due pending event and of the earliest expired lease (None
        where there is none): one one-item index query per shard and status (the index is
        ordered by due time)."""

        def oldest_age_ms(status: EventStatus) -> int | None:
            earliest: int | None = None
            for shard in range(shards):
                page, _ = self._store.query_page(status, shard, due_before_ms=now, limit=1)
                for record in page:
                    if earliest is None or record.due_at_ms < earliest:
                        earliest = record.due_at_ms
            return None if earliest is None else max(0, now - earliest)

        return oldest_age_ms(EventStatus.PENDING), oldest_age_ms(EventStatus.IN_FLIGHT)

    def stats(self) -> OutboxStats:
        """Counts of pending (and due), in-flight and failed events (COUNT queries, every shard
        and page), and the lag: the age of the oldest due pending event and of the earliest
        expired lease (the index is ordered by due time: one one-item query per shard and
        status, no scan). Completed events are not counted (that would need a scan). The ages
        are also reported to the metrics listener (``OutboxOldestDueAge``,
        ``OutboxExpiredLeaseAge``, milliseconds) when there is one."""
        now = now_ms(self.clock)
        shards = self._shards()

        def count(status: EventStatus, due_before: int | None = None) -> int:
            total = 0
            for shard in range(shards):
                cursor: Any = None
                while True:
                    n, cursor = self._store.count_page(
                        status, shard, due_before_ms=due_before, cursor=cursor
                    )
                    total += n
                    if cursor is None:
                        break
            return total

        due_age, lease_age = self._lag_ms(shards, now)
        if self._metrics.enabled:
            if due_age is not None:
                self._metrics.milliseconds("OutboxOldestDueAge", due_age)
            if lease_age is not None:
                self._metrics.milliseconds("OutboxExpiredLeaseAge", lease_age)
        return OutboxStats(
            pending=count(EventStatus.PENDING),
            due=count(EventStatus.PENDING, now),
            in_flight=count(EventStatus.IN_FLIGHT),
            failed=count(EventStatus.FAILED),
            oldest_due_age=None if due_age is None else due_age / 1000,
            expired_lease_age=None if lease_age is None else lease_age / 1000,
        )


def _hooks(
    hooks: DeliveryHooks | None,
    on_delivered: Callable[[Event], Any] | None,
    on_error: Callable[[Event, Exception], Any] | None,
    on_failed: Callable[[Event], Any] | None,
) -> DeliveryHooks:
    """``hooks``, or the deprecated per-hook keywords made into one (warned: one way to say it)."""
    given = [
        name
        for name, hook in (
            ("on_delivered", on_delivered),
            ("on_error", on_error),
            ("on_failed", on_failed),
        )
        if hook is not None
    ]
    if not given:
        return hooks if hooks is not None else DeliveryHooks()
    if hooks is not None:
        raise ConfigurationError(
            f"give the hooks as hooks=DeliveryHooks(...) only, not {given[0]}= beside it"
        )
    warnings.warn(
        f"worker({given[0]}=...) is deprecated: pass hooks=DeliveryHooks({given[0]}=...)",
        DeprecationWarning,
        stacklevel=3,
    )
    return DeliveryHooks(on_delivered, on_error, on_failed)
